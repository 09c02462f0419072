"""Checks of ``distributed.fsdp-memory``: ``fsdp_memory(model, world_size,
reshard_after_forward)`` must return, for a :class:`~labs.distributed.models.Stack` sharded with
FSDP2 on ``world_size`` ranks (``fully_shard(layer, reshard_after_forward=...)`` for each of
``model.layers``, then ``fully_shard(model, ...)``; ``None`` means the argument is not passed),
the bytes each rank holds, as ``{key: [bytes of rank 0, rank 1, ...]}`` with the keys:

- ``params``: its parameter shards (the local tensors of the DTensor parameters);
- ``grads``: its gradient shards after one backward;
- ``optim``: ``torch.optim.Adam``'s state after one step (every tensor in ``optimizer.state``);
- ``peak_forward``: the most parameter bytes it holds during forward: its shards plus the
  parameters all-gathered (unsharded) at that moment, sampled before and after every module's
  forward;
- ``after_forward``: the same when forward has returned, before backward.

The oracle is a real run: ``world_size`` gloo ranks, started by the judge in its own process,
shard a copy of the model with ``fully_shard``, run forward, backward and an Adam step, and
measure each quantity on each rank. The answer runs in the kernel (the probe
:func:`labs.distributed.probes.fsdp_memory`, which builds the same model from a plain spec).
(torch/distributed/fsdp/_fully_shard/_fully_shard.py: fully_shard;
_fsdp_param.py: FSDPParam (chunked on dim 0, torch.chunk); _fsdp_param_group.py: FSDPParamGroup
.unshard, .reshard, post_forward_mesh_info; _fsdp_state.py: FSDPState._lazy_init (the root).)
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from grader.checks import CheckFailure, ahead, check
from labs.distributed import probes
from labs.distributed.checks._oracles import oracle
from labs.distributed.models import Stack, build

EXERCISE = "distributed.fsdp-memory"
KEYS = ("params", "grads", "optim", "peak_forward", "after_forward")


def _bytes(t: torch.Tensor) -> int:
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def measure(model: Stack, reshard_after_forward: bool | None) -> dict[str, int]:
    """On every rank: shard ``model`` with FSDP2, run forward, backward and an Adam step; the
    bytes this rank holds (the keys of the module docstring)."""
    kwargs = {} if reshard_after_forward is None else {
        "reshard_after_forward": reshard_after_forward}
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    shards = sum(_bytes(p) for p in model.parameters())

    def held() -> int:  # (an unsharded parameter is registered as a plain tensor, not a DTensor)
        return shards + sum(p.numel() * p.element_size() for m in model.modules()
                            for p in m._parameters.values()
                            if p is not None and not isinstance(p, DTensor))

    samples: list[int] = []
    hooks = [h for m in model.modules() for h in (
        m.register_forward_pre_hook(lambda *_: samples.append(held())),
        m.register_forward_hook(lambda *_: samples.append(held())))]
    out = model(torch.ones(2, model.layers[0].in_features))
    after = held()
    for h in hooks:
        h.remove()
    out.sum().backward()
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.step()
    return {"params": shards,
            "grads": sum(_bytes(p.grad) for p in model.parameters() if p.grad is not None),
            "optim": sum(_bytes(v) for state in optimizer.state.values()
                         for v in state.values() if isinstance(v, torch.Tensor)),
            "peak_forward": max(samples), "after_forward": after}


def _measure_each(spec: dict) -> dict:
    """On every rank: :func:`measure` a fresh model built from ``spec`` for each setting of
    reshard_after_forward (one process serves the three: DTensor's caches stay warm)."""
    return {reshard: measure(build(spec), reshard) for reshard in (None, True, False)}


def _compare(fsdp_memory, spec: dict, world_size: int, what: str) -> None:
    real_run = oracle(_measure_each, world_size, spec)
    answers = {reshard: fsdp_memory.probe(probes.fsdp_memory, spec, world_size, reshard)
               for reshard in (None, True, False)}
    measured = real_run.result()
    for reshard, got in answers.items():
        real = [m[reshard] for m in measured]
        call = f"fsdp_memory(model, {world_size}, reshard_after_forward={reshard})"
        if not isinstance(got, dict) or set(got) != set(KEYS):
            raise CheckFailure(f"for {what}, {call} returned "
                               f"{sorted(got) if isinstance(got, dict) else type(got).__name__}"
                               f"; return a dict with the keys {', '.join(KEYS)}.")
        for key in KEYS:
            want = [r[key] for r in real]
            mine = got[key]
            if not (isinstance(mine, list) and len(mine) == world_size):
                raise CheckFailure(f"for {what}, {call}[{key!r}] must be a list of "
                                   f"{world_size} ints, the bytes of rank 0, 1, ...")
            if mine != want:
                raise CheckFailure(
                    f"for {what}, {call}[{key!r}] is {mine}; measured on {world_size} real "
                    f"ranks it is {want} (bytes of rank 0, 1, ...).")


def _public(seed: int) -> list[tuple[dict, int, str]]:
    """(spec, world size, what) of the public check's case."""
    return [({"kind": "stack", "widths": [16, 40, 24, 30], "out": 3, "seed": seed}, 4,
             "Stack([16, 40, 24, 30], out=3)")]


def _hidden(seed: int) -> list[tuple[dict, int, str]]:
    """(spec, world size, what) of the hidden check's cases."""
    g = torch.Generator().manual_seed(seed)
    widths = [int(w) for w in torch.randint(5, 50, (5,), generator=g)]
    out = int(torch.randint(1, 4, (1,), generator=g))
    spec = {"kind": "stack", "widths": widths, "out": out, "seed": seed}
    few = {"kind": "stack", "widths": [12, 5, 20], "out": 1, "seed": seed}
    return [(spec, 3, f"Stack({widths}, out={out})"),
            (spec | {"frozen": [1]}, 2, f"Stack({widths}, out={out}) with layers[1] frozen"),
            # torch.chunk gives 5 rows to 4 ranks as 2, 2, 1, 0 and 1 row as 1, 0, 0, 0
            (few, 4, "Stack([12, 5, 20], out=1) (fewer rows than ranks in places)")]


@ahead("distributed")
def _measured_ahead(seed: int) -> None:
    for spec, world_size, _ in _public(seed) + _hidden(seed):
        oracle(_measure_each, world_size, spec)


@check(EXERCISE)
def four_ranks(fsdp_memory, ctx):
    """bytes per rank on 4 ranks: Stack([16, 40, 24, 30], 3), each reshard_after_forward"""
    for spec, world_size, what in _public(ctx.seed):
        _compare(fsdp_memory, spec, world_size, what)


@check(EXERCISE, hidden=True)
def seeded_stacks(fsdp_memory, ctx):
    """bytes per rank on 2, 3 and 4 ranks: seeded widths, a frozen layer, fewer rows than ranks"""
    for spec, world_size, what in _hidden(ctx.seed):
        _compare(fsdp_memory, spec, world_size, what)
