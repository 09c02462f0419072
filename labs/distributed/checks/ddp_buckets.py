"""Checks of ``distributed.ddp-buckets``: ``predict_buckets(model, sample, bucket_cap_mb)`` must
return the gradient buckets ``DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)``
all-reduces, as ``{"first": [[name, ...], ...], "rebuilt": [[name, ...], ...]}``: parameter names
(``model.named_parameters()``), bucket by bucket in the order DDP all-reduces them, each bucket's
parameters in the order ``GradBucket.parameters()`` lists them; ``first`` for the first
iteration, ``rebuilt`` for the iterations after DDP rebuilt its buckets from the order the
gradients became ready. The oracle is DDP itself: two gloo ranks train a copy of the model for
two iterations (loss ``model(x).sum()``, ``x`` shaped like ``sample``) with a comm hook that
records every bucket it is given, started by the judge in its own process. The answer runs in
the kernel (the probe :func:`labs.distributed.probes.ddp_buckets`) on its own copy of the model,
built from the same plain spec (:func:`labs.distributed.models.build`).
(torch/nn/parallel/distributed.py: DistributedDataParallel._ddp_init_helper,
_BucketCapacityConfig; torch/csrc/distributed/c10d/reducer.cpp: Reducer::rebuild_buckets,
compute_bucket_assignment_by_size.)"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from grader.checks import CheckFailure, ahead, check
from labs.distributed import probes
from labs.distributed.checks._oracles import oracle
from labs.distributed.models import Crossed, Reused, build, mlp

EXERCISE = "distributed.ddp-buckets"
MIB = 1024 * 1024


def _spec(model: nn.Module, **spec) -> dict:
    """A plain spec of ``model`` (built as ``spec`` says), its weights as they are."""
    return spec | {"state": dict(model.state_dict())}


def _record(spec: dict, sample: torch.Tensor, cap) -> dict:
    """On every rank: DDP's buckets in iterations 1 and 2 of the model ``spec`` builds, by
    name."""
    model = build(spec)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
    names = {id(p): n for n, p in model.named_parameters()}
    seen: list[tuple[int, list[str]]] = []

    def hook(state, bucket):
        seen.append((bucket.index(), [names[id(p)] for p in bucket.parameters()]))
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda f: f.value()[0] / dist.get_world_size())

    ddp.register_comm_hook(None, hook)
    found = {}
    for key in ("first", "rebuilt"):
        seen.clear()
        x = sample + dist.get_rank()
        ddp(x).sum().backward()
        found[key] = [params for _, params in sorted(seen)]
    return found


def _compare(predict_buckets, spec: dict, sample: torch.Tensor, cap, what: str) -> None:
    real_run = oracle(_record, 2, spec, sample, cap)
    got = predict_buckets.probe(probes.ddp_buckets, spec, sample, cap)
    real = real_run.result()[0]
    if not isinstance(got, dict) or set(got) != {"first", "rebuilt"}:
        raise CheckFailure(f"for {what}, predict_buckets returned {type(got).__name__} "
                           f"{sorted(got) if isinstance(got, dict) else ''}; return a dict with "
                           "the keys 'first' and 'rebuilt'.".replace(" ;", ";"))
    for key, when in (("first", "in the first iteration"),
                      ("rebuilt", "after DDP rebuilt its buckets (iteration 2 on)")):
        mine = got[key]
        if not (isinstance(mine, list) and all(isinstance(b, list) for b in mine)):
            raise CheckFailure(f"for {what}, got[{key!r}] must be a list of buckets, each a "
                               "list of parameter names.")
        if mine != real[key]:
            raise CheckFailure(
                f"for {what}, {when}: you predicted {len(mine)} bucket(s) {_short(mine)}; DDP "
                f"all-reduced {len(real[key])}: {_short(real[key])}.")


def _short(buckets: list[list]) -> str:
    text = " | ".join(", ".join(map(str, b)) for b in buckets)
    return f"[{text}]" if len(text) <= 300 else f"[{text[:297]}...]"


def _public(seed: int) -> list[tuple[dict, torch.Tensor, float | None, str]]:
    """(model spec, sample, bucket_cap_mb, what) of the public check's cases."""
    g = torch.Generator().manual_seed(seed)
    widths = [32, 64, 64, 10]
    model = _spec(mlp(widths, g), kind="mlp", widths=widths)
    cases = [(model, torch.randn(4, 32, generator=g), 0.01,
              "Sequential(32 -> 64 -> 64 -> 10), bucket_cap_mb=0.01")]
    crossed = _spec(Crossed(48, g), kind="crossed", width=48)
    return cases + [(crossed, torch.randn(2, 48, generator=g), 0.01,
                     "Crossed(48): layers defined inp, late, early, out and run inp, early, "
                     "late, out; bucket_cap_mb=0.01")]


def _hidden(seed: int) -> list[tuple[dict, torch.Tensor, float | None, str]]:
    """(model spec, sample, bucket_cap_mb, what) of the hidden check's cases: seeded MLPs and
    caps, a frozen layer, a cap met exactly, the default cap, a layer run twice."""
    g = torch.Generator().manual_seed(seed)
    widths = [int(w) for w in torch.randint(8, 80, (5,), generator=g)]
    cap = float(torch.empty(()).uniform_(0.005, 0.03, generator=g))
    exact = (widths[-2] + 1) * widths[-1] * 4 / MIB  # (a power of 2 apart: exact in a float)
    big = [600, 640, 600, 8]
    cases = [
        (_spec(mlp(widths, g), kind="mlp", widths=widths),
         f"a seeded MLP {widths}, bucket_cap_mb={cap:.4f}", cap, widths[0]),
        (_spec(mlp(widths, g), kind="mlp", widths=widths, frozen=[1]),
         f"the MLP {widths} with layer 1 frozen, bucket_cap_mb={cap:.4f}", cap, widths[0]),
        (_spec(mlp(widths, g), kind="mlp", widths=widths),
         f"the MLP {widths}, bucket_cap_mb={exact} (the last layer exactly)", exact, widths[0]),
        (_spec(mlp(big, g), kind="mlp", widths=big),
         "an MLP of 3.1 MB with the default bucket_cap_mb (None)", None, 600),
        (_spec(Reused(40, g), kind="reused", width=40),
         "Reused(40): layers inp, mid, out run inp, mid, inp, out; bucket_cap_mb=0.005",
         0.005, 40),
    ]
    return [(model, torch.randn(2, width, generator=g), cap, what)
            for model, what, cap, width in cases]


@ahead("distributed")
def _buckets_ahead(seed: int) -> None:
    for spec, sample, cap, _ in _public(seed) + _hidden(seed):
        oracle(_record, 2, spec, sample, cap)


@check(EXERCISE)
def small_mlp(predict_buckets, ctx):
    """DDP's buckets in iterations 1 and 2 of an MLP and of layers run out of order"""
    for spec, sample, cap, what in _public(ctx.seed):
        _compare(predict_buckets, spec, sample, cap, what)


@check(EXERCISE, hidden=True)
def seeded_models(predict_buckets, ctx):
    """DDP's buckets: seeded MLPs and caps, a frozen layer, an exact cap, a layer run twice"""
    for spec, sample, cap, what in _hidden(ctx.seed):
        _compare(predict_buckets, spec, sample, cap, what)
