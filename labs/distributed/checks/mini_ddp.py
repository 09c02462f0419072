"""Checks of ``distributed.mini-ddp``: ``MiniDDP(module, bucket_cap_mb)`` wraps a module for data
parallel training. On every rank of a gloo group, after ``loss.backward()`` returns, each
parameter's ``.grad`` must hold the mean of that gradient over the ranks, so that N steps of SGD
on each rank's slice of a batch leave the parameters where N steps on the whole batch in one
process leave them (the oracle: torch, trained here on the full batch). And it must get there as
DDP does (torch/csrc/distributed/c10d/reducer.cpp: Reducer::autograd_hook, mark_bucket_ready,
finalize_backward): ``self.buckets`` holds the parameters that require grad, in reverse order
of ``module.parameters()``, closed when a bucket reaches ``bucket_cap_mb`` MiB; each backward
issues exactly one all-reduce per bucket (seen by
:class:`~labs.distributed.probes.CommLog`), and the first is issued while backward is
still running (before the last gradient is accumulated), so communication overlaps compute.
The ranks train in the kernel (the probe :func:`labs.distributed.probes.mini_ddp`, which reports
each rank's buckets, collectives, timings, gradients and final parameters); the judge trains the
one-process oracle itself."""

from __future__ import annotations

import copy

import torch
from torch import nn

from grader.checks import CheckFailure, check
from labs.distributed import probes
from labs.distributed.models import Crossed, mlp
from labs.distributed.probes import describe

EXERCISE = "distributed.mini-ddp"
STEPS, LR = 3, 0.1
#: seconds the last rank starts its first backward late: a hook that waits for its all-reduce
#: (a blocking call, or wait() in the hook) holds backward up that long on rank 0
LATE = 0.5
MIB = 1024 * 1024


def expected_buckets(module: nn.Module, bucket_cap_mb: float) -> list[list[str]]:
    """The buckets the exercise asks for, by parameter name."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    buckets, bucket, size = [], [], 0
    for name, p in reversed(named):
        bucket.append(name)
        size += p.numel() * p.element_size()
        if size >= bucket_cap_mb * MIB:
            buckets.append(bucket)
            bucket, size = [], 0
    return buckets + ([bucket] if bucket else [])


def _blocked(rank: dict) -> bool:
    """Whether rank 0's first backward stopped at its first all-reduce until the late rank had
    issued it: no gradient became ready within LATE / 2 s after it."""
    step = rank["steps"][0]
    if not step["issued_at"]:
        return False
    first = step["issued_at"][0]
    return min((t for t in step["ready_at"] if t > first), default=first) - first > LATE / 2


def _mlp_spec(model: nn.Sequential) -> dict:
    """The plain spec (``labs.distributed.models.build``) of an :func:`mlp`, frozen layers too."""
    widths = [model[0].in_features] + [model[2 * i].out_features
                                       for i in range(len(model) // 2 + 1)]
    return {"kind": "mlp", "widths": widths, "state": dict(model.state_dict()),
            "frozen": [i for i in range(len(widths) - 1)
                       if not all(q.requires_grad for q in model[2 * i].parameters())]}


def out_of_order(buckets: list[list[str]], ready_order: list[str], at_issue: list[int]
                 ) -> tuple[int, list[str]] | None:
    """The first all-reduce (index, and its bucket's parameters not yet ready) issued before its
    bucket was complete, taking the k-th all-reduce of a backward to be bucket k: DDP launches
    buckets in bucket order (``Reducer::mark_bucket_ready``). ``at_issue[k]`` gradients (and
    possibly the one whose hook issued it) were ready then, in ``ready_order``; None when every
    bucket was complete when its turn came."""
    for k, (bucket, ready) in enumerate(zip(buckets, at_issue)):
        missing = [name for name in bucket if name not in ready_order[:ready + 1]]
        if missing:
            return k, missing
    return None


def _compare(MiniDDP, model: nn.Module, spec: dict, cap: float, p: int, g: torch.Generator,
             what: str, late: bool = False):
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    x = torch.randn(12, linears[0].in_features, generator=g)
    y = torch.randn(12, linears[-1].out_features, generator=g)
    seen = MiniDDP.probe(probes.mini_ddp, spec, cap, p, x, y, STEPS, LR, LATE if late else 0.0)
    results = probes.ranks_of(seen)
    if any(r["buckets"] is None for r in results):
        raise CheckFailure("MiniDDP(module, bucket_cap_mb).buckets must be a list of buckets, "
                           "each a list of the module's parameters.")
    if any(s.get("missing_grad") for r in results for s in r["steps"]):
        raise CheckFailure("after loss.backward() a parameter that requires grad has no "
                           ".grad: write the averaged gradient back into every .grad.")
    want_buckets = expected_buckets(model, cap)
    mine = results[0]
    if mine["buckets"] != want_buckets:
        raise CheckFailure(
            f"for {what}: MiniDDP.buckets is {mine['buckets']}; with parameters in reverse "
            f"order, a bucket closing once it holds {cap} MiB, it is {want_buckets}.")
    for i, step in enumerate(mine["steps"]):
        n = step["counts"].get("all_reduce", 0)
        if n != len(want_buckets) or set(step["counts"]) - {"all_reduce"}:
            first = mine["steps"][0]["counts"] == {"all_reduce": len(want_buckets)}
            why = (" Backward 1 issued them right: reset what your hooks count when a backward "
                   "ends." if i and first else " Flatten each bucket's gradients into one tensor "
                   "and all-reduce it once.")
            raise CheckFailure(
                f"for {what}, backward {i + 1} issued {describe(step['counts'])}; DDP issues "
                f"one all_reduce per bucket: {len(want_buckets)} here.{why}")
        if late and i == 0 and _blocked(mine):
            raise CheckFailure(
                f"for {what}, backward {i + 1} stopped at the first all-reduce until every rank "
                "had issued it (one rank started backward late): the hook waited for it, so "
                "nothing overlapped. Launch it with async_op=True and wait for the works only "
                "when backward ends.")
        differ = [r for r, other in enumerate(results)
                  if not torch.allclose(other["steps"][i]["grads"], step["grads"])]
        if differ:
            raise CheckFailure(
                f"for {what}, after backward {i + 1} rank {differ[0]} holds other gradients "
                f"than rank 0{' (backward 1 was right)' if i else ''}: every rank must end "
                "each backward with the same averaged .grad. Does your end-of-backward work "
                "run at every backward?")
        if early := out_of_order(want_buckets, step["ready_order"], step["at_issue"]):
            k, missing = early
            raise CheckFailure(
                f"for {what}, backward {i + 1} issued its all-reduce number {k + 1} while "
                f"bucket {k} ({', '.join(want_buckets[k])}) still waited for "
                f"{', '.join(missing)}: DDP launches buckets in bucket order "
                "(Reducer::mark_bucket_ready), so a bucket that is complete before an earlier "
                "one waits for it, and both go when the earlier one is complete. Gradients here "
                f"were ready in the order {', '.join(step['ready_order'])}.")
        if step["at_issue"] and step["at_issue"][0] >= mine["trainable"]:
            raise CheckFailure(
                f"for {what}, backward {i + 1} issued its first all-reduce after all "
                f"{mine['trainable']} gradients were ready: nothing overlapped. Launch a "
                "bucket's all-reduce (async_op=True) as soon as its last gradient is ready, "
                "from a hook, and wait for the works only at the end of backward.")
    single = copy.deepcopy(model)
    opt = torch.optim.SGD(single.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(single(x), y).backward()
        opt.step()
    for name, want in single.named_parameters():
        torch.testing.assert_close(mine["params"][name], want.detach(), msg=lambda m, name=name: (
            f"for {what}, after {STEPS} SGD steps on {p} ranks, parameter {name!r} differs "
            f"from {STEPS} steps on the whole batch in one process (are the gradients "
            f"averaged over the ranks, not summed, and written back into .grad?): {m}"))


@check(EXERCISE)
def two_ranks(MiniDDP, ctx):
    """2 ranks, an MLP in 2 buckets: buckets, one all-reduce each, overlap, SGD as one process"""
    g = torch.Generator().manual_seed(ctx.seed)
    model = mlp([16, 32, 32, 4], g)
    _compare(MiniDDP, model, _mlp_spec(model), 0.004, 2, g,
             "Sequential(16 -> 32 -> 32 -> 4) on 2 ranks, bucket_cap_mb=0.004", late=True)


@check(EXERCISE, hidden=True)
def three_ranks_and_a_frozen_layer(MiniDDP, ctx):
    """3 ranks, seeded widths and caps, a frozen layer, layers run out of their defined order"""
    g = torch.Generator().manual_seed(ctx.seed)
    widths = [int(w) for w in torch.randint(12, 40, (5,), generator=g)]
    model = mlp(widths, g)
    cap = float(torch.empty(()).uniform_(0.002, 0.006, generator=g))
    _compare(MiniDDP, model, _mlp_spec(model), cap, 3, g, f"a seeded MLP {widths} on 3 ranks, "
             f"bucket_cap_mb={cap:.4f}")
    exact = (widths[-2] + 1) * widths[-1] * 4 / MIB  # (a power of 2 apart: exact in a float)
    _compare(MiniDDP, model, _mlp_spec(model), exact, 2, g, f"the MLP {widths} on 2 ranks, "
             f"bucket_cap_mb={exact} (the last layer's size exactly)")
    model[2].requires_grad_(False)
    _compare(MiniDDP, model, _mlp_spec(model), cap, 2, g, f"the MLP {widths} with layer 1 "
             f"frozen on 2 ranks, bucket_cap_mb={cap:.4f}")
    crossed = Crossed(24, g)  # buckets [out, early], [late], [inp]: late's fills before the first
    _compare(MiniDDP, crossed, {"kind": "crossed", "width": 24,
                                "state": dict(crossed.state_dict())}, 0.002, 2, g,
             "Crossed(24) on 2 ranks (layers defined inp, late, early, out and run inp, early, "
             "late, out), bucket_cap_mb=0.002")
