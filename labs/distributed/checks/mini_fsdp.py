"""Checks of ``distributed.mini-fsdp``: ``MiniFSDP(module)`` shards a module over the ranks of the
default process group as FSDP1's flat parameter does (torch/distributed/fsdp/_flat_param.py:
FlatParamHandle.flatten_tensors, .shard, .unshard, .reshard; _runtime_utils.py: _reduce_grad).
Every parameter of the module, frozen ones too, is flattened into one flat float32 parameter
(``module.parameters()`` order, each ``reshape(-1)``), padded with zeros at the end to
``p * s`` elements (``s = ceil(numel / p)``), and rank ``r`` keeps only elements
``[r * s, (r + 1) * s)`` as ``self.shard``, an ``nn.Parameter``: the module's own parameters
are freed. Forward all-gathers the flat parameter (one all-gather) and runs the module on views
of it; backward reduce-scatters the flat gradient (one reduce-scatter), averaged over the ranks,
into ``self.shard.grad``, and frees the gathered parameter and gradient.

The oracles are real runs on the judge's own ranks (:func:`flat_oracle`): FSDP1
(``FullyShardedDataParallel``, on CPU with gloo) for each rank's shard (its ``FlatParameter``'s
local data) and the bytes flat-parameter sharding holds (that shard, then its gradient shard
after backward); FSDP2 (``fully_shard(model)``) for every parameter's gradient after each of two
SGD steps (its DTensor gradients' ``full_tensor()``), which the ranks' gradient shards,
reassembled, must equal (zeros for a frozen parameter: FSDP gives it no gradient). The answer
runs in the kernel (the probe :func:`labs.distributed.probes.mini_fsdp`): it reports each rank's
shard, the collectives issued in forward and in backward (``probes.CommLog``), the gradient
shards, and the tensors each rank holds, found by the garbage collector (what it held before the
model was built left out).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from grader.checks import CheckFailure, ahead, check
from labs.distributed import probes
from labs.distributed.checks._oracles import oracle
from labs.distributed.models import build
from labs.distributed.probes import describe

EXERCISE = "distributed.mini-fsdp"
#: SGD steps each run takes (the second shows that forward gathers the updated shards)
STEPS, LR = 2, 0.5
#: rows of the batch each rank trains on
ROWS = 2


def flat_oracle(spec: dict, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> dict:
    """On every rank, for the model ``spec`` builds, trained on this rank's slice of (x, y)
    with MSE loss: ``{"shard": FSDP1's local FlatParameter data, "shard_bytes", "grad_bytes":
    the bytes of its storage and of its gradient's after one backward, "grads": on rank 0, for
    each of ``steps`` SGD steps (``lr``) under FSDP2, {name: the full gradient, None where
    frozen}}``. FSDP1 with ``use_orig_params=False`` flattens a module's parameters into one
    FlatParameter only if all or none require grad; requires_grad does not change its layout, so
    its copy of the model trains every parameter."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    warnings.simplefilter("ignore")  # (FSDP1's deprecation, and its notes on CPU)
    rank, p = dist.get_rank(), dist.get_world_size()
    xs, ys = x.chunk(p)[rank], y.chunk(p)[rank]
    fsdp1 = FullyShardedDataParallel(build(spec).requires_grad_(True),
                                     device_id=torch.device("cpu"))
    (flat,) = fsdp1.parameters()
    shard = flat.detach().clone()
    nn.functional.mse_loss(fsdp1(xs), ys).backward()
    found = {"shard": shard, "shard_bytes": flat.untyped_storage().nbytes(),
             "grad_bytes": flat.grad.untyped_storage().nbytes()}
    model = build(spec)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    grads = []
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(xs), ys).backward()
        grads.append({n: None if q.grad is None else q.grad.full_tensor()
                      for n, q in model.named_parameters()})
        optimizer.step()
    return found | {"grads": grads if rank == 0 else None}


def _data(spec: dict, world_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch (x, y) of a case: ROWS rows per rank, seeded."""
    g = torch.Generator().manual_seed(seed * 31 + world_size)
    rows = ROWS * world_size
    return (torch.randn(rows, spec["widths"][0], generator=g),
            torch.randn(rows, spec["out"], generator=g))


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}"


def _ranks(reply, world_size: int, what: str) -> list[dict]:
    """What each rank returned in a reply of the probe's (``probes._ranks``), one dict per rank,
    or CheckFailure / AnswerError as the ranks' own run would raise."""
    ranks = probes.ranks_of(reply if type(reply) is dict else {"ranks": None})
    if type(ranks) is not list or len(ranks) != world_size or any(
            type(r) is not dict for r in ranks):
        raise CheckFailure(f"for {what}, what came back from your ranks does not cover the "
                           f"{world_size} ranks: the grader's probe did not run as shipped "
                           "(answers must not modify the grader).")
    return ranks


def _held(alive: list[list]) -> tuple[int, str]:
    """The bytes of the tensors a rank holds (rows of ``probes._alive``) and, in words, the
    largest three of them besides its shard and gradient shard."""
    others = sorted((row for row in alive if row[0] == "other"), key=lambda r: -r[3])
    said = ", ".join(f"{dtype} {shape} ({_plural(nbytes, 'byte')})"
                     for _, dtype, shape, nbytes in others[:3])
    more = f" and {len(others) - 3} more" if len(others) > 3 else ""
    return sum(row[3] for row in alive), (f" Also alive on that rank: {said}{more}."
                                          if others else "")


def _offset(flat: torch.Tensor, mine: torch.Tensor) -> int | None:
    """Where ``mine`` sits in ``flat`` (the first offset of an exact match), or None."""
    n = mine.numel()
    if n == 0 or n > flat.numel():
        return None
    hits = (flat.unfold(0, n, 1) == mine).all(dim=1).nonzero()
    return int(hits[0]) if len(hits) else None


def _check_built(built: list[dict], real: list[dict], numel: int, what: str) -> None:
    p = len(real)
    for rank, mine in enumerate(built):
        if mine["type"] != "Parameter" or type(mine["shard"]) is not torch.Tensor:
            raise CheckFailure(
                f"for {what}, MiniFSDP(model).shard on rank {rank} is a {mine['type']}; make "
                "it an nn.Parameter: this rank's 1-D float32 shard of the flat parameter, "
                "which the optimizer steps on.")
        if mine["shard"].dim() != 1 or mine["shard"].dtype != torch.float32:
            raise CheckFailure(
                f"for {what}, MiniFSDP(model).shard on rank {rank} has shape "
                f"{list(mine['shard'].shape)} and dtype {mine['shard'].dtype}; it must be 1-D "
                "float32: a contiguous slice of the flat parameter.")
    sizes = [m["shard"].numel() for m in built]
    want = [r["shard"].numel() for r in real]
    if sizes != want:
        why = (f" Together they hold the {numel:,} parameters without padding: pad the flat "
               f"parameter with zeros at its end to a multiple of the world size "
               f"({want[0] * p:,} here), so that every rank's shard has ceil(numel / p) "
               "elements; all_gather and reduce_scatter need equal sizes on every rank "
               "(FlatParamHandle._get_shard pads each chunk to the first one's size)."
               if sum(sizes) == numel else
               " Are frozen parameters (requires_grad=False) in it? Every parameter of "
               "module.parameters() goes into the flat parameter, frozen ones too."
               if sum(sizes) < numel else "")
        raise CheckFailure(
            f"for {what}, the ranks' shards hold {sizes} elements (rank 0, 1, ...); FSDP1's "
            f"FlatParameter, sharded on {p} ranks, holds {want}.{why}")
    padded = torch.cat([r["shard"] for r in real])
    for rank, (mine, theirs) in enumerate(zip(built, real)):
        if not torch.equal(mine["shard"], theirs["shard"]):
            s = want[rank]
            at = _offset(padded, mine["shard"])
            where = (f" It is elements [{at:,}, {at + s:,}) of the flat parameter; rank "
                     f"{rank}'s shard is elements [{rank * s:,}, {(rank + 1) * s:,}): rank r "
                     "keeps chunk r of the padded flat parameter (FlatParamHandle.shard)."
                     if at is not None else
                     f" Rank {rank}'s shard is elements [{rank * s:,}, {(rank + 1) * s:,}) of "
                     "the flat parameter: every parameter of module.parameters(), in that "
                     "order, each reshape(-1), concatenated, then zeros to the padded length.")
            raise CheckFailure(
                f"for {what}, MiniFSDP(model).shard on rank {rank} holds other values than "
                f"FSDP1's FlatParameter shard on that rank.{where}")
    for rank, (mine, theirs) in enumerate(zip(built, real)):
        held, also = _held(mine["alive"])
        shard_bytes = sum(row[3] for row in mine["alive"] if row[0] == "shard")
        if shard_bytes > theirs["shard_bytes"]:
            raise CheckFailure(
                f"for {what}, rank {rank}'s shard lives in a storage of "
                f"{_plural(shard_bytes, 'byte')}, for {_plural(want[rank], 'element')}: it is a "
                "view of a larger tensor (the whole flat parameter?), which it keeps alive. "
                "Keep a copy (.clone()) of the slice, so that the rest can be freed.")
        if held != theirs["shard_bytes"]:
            raise CheckFailure(
                f"for {what}, once MiniFSDP(model) has returned, rank {rank} holds "
                f"{_plural(held, 'byte')} of tensors (every tensor alive that it did not hold "
                f"before the model was built); flat-parameter sharding holds "
                f"{_plural(theirs['shard_bytes'], 'byte')} (FSDP1: its FlatParameter shard, "
                "measured). Free the module's own parameters: the shard is their only "
                f"storage between steps.{also}")


def _diagnose(mine: torch.Tensor, want: torch.Tensor, flat_mine: torch.Tensor,
              flat_want: torch.Tensor, s: int, p: int, first_right: bool) -> str:
    """Why a parameter's reassembled gradient ``mine`` is not FSDP2's ``want``, in words."""
    if torch.allclose(mine, want * p, rtol=1e-4, atol=1e-6):
        return (f" It is {p} times FSDP2's: a reduce-scatter sums over the ranks, and FSDP "
                "averages (it divides by the world size: _runtime_utils.py: _reduce_grad, "
                "_div_if_needed).")
    for rank in range(p):
        got = flat_mine[rank * s:(rank + 1) * s]
        if torch.allclose(got, flat_want[rank * s:(rank + 1) * s], rtol=1e-4, atol=1e-6):
            continue
        for at in range(flat_want.numel() - s + 1):
            if at != rank * s and torch.allclose(got, flat_want[at:at + s], rtol=1e-4,
                                                 atol=1e-6):
                return (f" Rank {rank}'s gradient shard is elements [{at:,}, {at + s:,}) of the "
                        f"flat gradient, not [{rank * s:,}, {(rank + 1) * s:,}): a rank's "
                        "gradient shard covers the elements its parameter shard does.")
        break
    if first_right:
        return (" Backward 1 was right: does forward gather the parameters from the shard as "
                "the optimizer left it (shard -= lr * shard.grad, in place, between the steps)?")
    return (" Lay the flat gradient out as the flat parameter (module.parameters() order, each "
            "flattened, then the padding), reduce-scatter it, and divide by the world size.")


def _check_trained(trained: list[dict], real: list[dict], model: nn.Module, what: str) -> None:
    p, s = len(real), real[0]["shard"].numel()
    named = list(model.named_parameters())
    for rank, mine in enumerate(trained):
        steps = mine.get("steps")
        if type(steps) is not list or not (len(steps) == STEPS or 0 < len(steps) < STEPS
                                           and steps[-1].get("grad", 0) is None):
            raise CheckFailure(f"for {what}, what came back from rank {rank} does not cover "
                               f"the {STEPS} steps: the grader's probe did not run as shipped.")
    for i in range(STEPS):
        steps = [mine["steps"][i] for mine in trained]
        for rank, step in enumerate(steps):
            if step["forward"] != {"all_gather": 1}:
                raise CheckFailure(
                    f"for {what}, forward {i + 1} issued {describe(step['forward'])} on rank "
                    f"{rank}; FSDP gathers the flat parameter with one all_gather before the "
                    "module runs (FlatParamHandle.unshard), and nothing else: every rank "
                    "sends its shard and receives the others'.")
            if step["backward"] != {"reduce_scatter": 1}:
                why = (" An all_reduce gives every rank the whole summed gradient, twice the "
                       "traffic of a reduce-scatter, and a full-size gradient to free; FSDP "
                       "reduce-scatters, so each rank receives only its shard."
                       if "all_reduce" in step["backward"] else
                       " Keep the gathered parameter from forward until backward has used it "
                       "(FSDP does not reshard its root unit after forward)."
                       if "all_gather" in step["backward"] else "")
                raise CheckFailure(
                    f"for {what}, backward {i + 1} issued {describe(step['backward'])} on rank "
                    f"{rank}; FSDP reduce-scatters the flat gradient once when backward has "
                    f"produced it (_runtime_utils.py: _reduce_grad), and nothing else.{why}")
            if step["grad"] is None:
                raise CheckFailure(
                    f"for {what}, after backward {i + 1} returned, rank {rank}'s shard.grad is "
                    "None: put this rank's shard of the averaged flat gradient there, from a "
                    "hook that runs in backward.")
            if type(step["grad"]) is not torch.Tensor or step["grad"].shape != (s,):
                shape = getattr(step["grad"], "shape", None)
                raise CheckFailure(
                    f"for {what}, after backward {i + 1}, rank {rank}'s shard.grad has shape "
                    f"{list(shape) if shape is not None else shape}; it must have the shard's, "
                    f"[{s}].")
        flat_mine = torch.cat([step["grad"] for step in steps])
        grads = real[0]["grads"][i]
        flat_want = torch.cat([torch.zeros(q.numel()) if grads[n] is None
                               else grads[n].reshape(-1) for n, q in named]
                              + [torch.zeros(p * s - sum(q.numel() for _, q in named))])
        offset = 0
        for name, q in named:
            mine = flat_mine[offset:offset + q.numel()].view(q.shape)
            offset += q.numel()
            want = grads[name]
            if want is None:
                continue
            if not torch.allclose(mine, want, rtol=1e-4, atol=1e-6):
                worst = float((mine - want).abs().max())
                raise CheckFailure(
                    f"for {what}, after backward {i + 1}, the gradient of {name}, reassembled "
                    "from the ranks' gradient shards (rank r's shard.grad as elements "
                    f"[r * {s}, (r + 1) * {s}) of the flat gradient), differs from FSDP2's "
                    f"(largest difference {worst:.3g})."
                    + _diagnose(mine, want, flat_mine, flat_want, s, p, i > 0))
        offset = 0
        for name, q in named:
            mine = flat_mine[offset:offset + q.numel()]
            offset += q.numel()
            if grads[name] is None and mine.any():
                raise CheckFailure(
                    f"for {what}, after backward {i + 1}, the gradient shards hold nonzero "
                    f"entries for {name}, which does not require grad (it is frozen): an "
                    "optimizer stepping on the shard would change it. FSDP gives a frozen "
                    "parameter no gradient: keep its view out of autograd (detach it), so that "
                    "its part of the flat gradient is zeros.")
        for rank, (step, theirs) in enumerate(zip(steps, real)):
            held, also = _held(step["alive"])
            want = theirs["shard_bytes"] + theirs["grad_bytes"]
            if held != want:
                raise CheckFailure(
                    f"for {what}, after backward {i + 1}, rank {rank} holds "
                    f"{_plural(held, 'byte')} of tensors (every tensor alive that it did not "
                    "hold before the model was built; the output and the loss freed); "
                    f"flat-parameter sharding holds {_plural(want, 'byte')} (FSDP1, measured: "
                    f"its shard, {theirs['shard_bytes']:,}, and its gradient shard, "
                    f"{theirs['grad_bytes']:,}). Free the gathered flat parameter and its "
                    "gradient once the gradient is reduce-scattered: resize its storage to 0 "
                    "(FlatParamHandle.reshard: _free_storage), or drop every reference to it "
                    f"(the module's views of it keep it alive too).{also}")


def _compare(MiniFSDP, spec: dict, world_size: int, what: str, seed: int) -> None:
    x, y = _data(spec, world_size, seed)
    real_run = oracle(flat_oracle, world_size, spec, x, y, STEPS, LR)
    seen = MiniFSDP.probe(probes.mini_fsdp, spec, world_size, x, y, STEPS, LR)
    if type(seen) is not dict:
        raise CheckFailure("what came back from your answer is not the probe's reply: the "
                           "grader's probe did not run as shipped.")
    model = build(spec)
    numel = sum(q.numel() for q in model.parameters())
    what = f"{what} on {world_size} ranks ({numel:,} parameters)"
    built = _ranks(seen.get("built"), world_size, what)
    real = real_run.result()
    _check_built(built, real, numel, what)
    _check_trained(_ranks(seen.get("trained"), world_size, what), real, model, what)


def _stack(widths: list[int], out: int) -> str:
    return f"Stack({widths}, out={out})"


def _public(seed: int) -> list[tuple[dict, int, str]]:
    """(spec, world size, what) of the public check's case."""
    return [({"kind": "stack", "widths": [16, 40, 24, 30], "out": 3, "seed": seed}, 4,
             _stack([16, 40, 24, 30], 3))]


def _hidden(seed: int) -> list[tuple[dict, int, str]]:
    """(spec, world size, what) of the hidden check's cases."""
    g = torch.Generator().manual_seed(seed)
    while True:  # (a seeded stack whose parameters do not divide among 3 ranks: padding)
        widths = [int(w) for w in torch.randint(5, 40, (4,), generator=g)]
        out = int(torch.randint(1, 5, (1,), generator=g))
        spec = {"kind": "stack", "widths": widths, "out": out, "seed": seed, "frozen": [1]}
        if sum(q.numel() for q in build(spec).parameters()) % 3:
            break
    # 5 parameters on 4 ranks: shards of 2, the last rank's all padding
    tiny = {"kind": "stack", "widths": [2, 1], "out": 1, "seed": seed}
    return [(spec, 3, f"{_stack(widths, out)} with layers[1] frozen"),
            (tiny, 4, f"{_stack([2, 1], 1)} (the last rank's shard is all padding)")]


@ahead("distributed")
def _flat_ahead(seed: int) -> None:
    for spec, world_size, _ in _public(seed) + _hidden(seed):
        oracle(flat_oracle, world_size, spec, *_data(spec, world_size, seed), STEPS, LR)


@check(EXERCISE)
def four_ranks(MiniFSDP, ctx):
    """4 ranks, Stack([16, 40, 24, 30], 3): shards, collectives, gradients, bytes held"""
    for spec, world_size, what in _public(ctx.seed):
        _compare(MiniFSDP, spec, world_size, what, ctx.seed)


@check(EXERCISE, hidden=True)
def frozen_and_padded(MiniFSDP, ctx):
    """3 and 4 ranks: a seeded stack with a frozen layer, a shard of padding only"""
    for spec, world_size, what in _hidden(ctx.seed):
        _compare(MiniFSDP, spec, world_size, what, ctx.seed)
