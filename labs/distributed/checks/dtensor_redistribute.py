"""Checks of ``distributed.dtensor-redistribute``: ``redistribute(local, mesh, src, dst)``, called
on every rank with that rank's local tensor of a DTensor placed as ``src`` (a tuple of
``Shard(d)``, ``Replicate()``, ``Partial()``, one per mesh dimension) on ``mesh`` (a
``DeviceMesh``), must return the local tensor of the same DTensor placed as ``dst`` (no
``Partial`` in ``dst``), issuing the same collectives as DTensor's own ``redistribute``. The
oracle is DTensor: ``DTensor.from_local(local, mesh, src).redistribute(mesh, dst).to_local()``
on the same rank, and its ``CommDebugMode`` counts (collectives compared by kind: all_gather,
all_reduce, reduce_scatter, all_to_all, broadcast, whatever API issued them). Four gloo ranks,
meshes (4,) and (2, 2), 2-D tensors whose sharded sizes divide evenly.
(torch/distributed/tensor/_redistribute.py: redistribute_local_tensor, _gen_transform_infos;
torch/distributed/tensor/placement_types.py: Shard._to_replicate_tensor, Partial._reduce_value,
Partial._reduce_shard_value.)"""

from __future__ import annotations

import os
import traceback

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks import CheckFailure, check, plain_tensor
from labs.distributed.checks._comms import KINDS, describe
from labs.distributed.launch import run

EXERCISE = "distributed.dtensor-redistribute"
S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
PUBLIC = {(4,): [((S0,), (R,)), ((P,), (R,)), ((R,), (S1,)), ((P,), (S0,))],
          (2, 2): [((S0, S1), (R, R)), ((R, R), (S0, S1))]}
HIDDEN = {
    (4,): [((S1,), (R,)), ((S0,), (S1,)), ((P,), (S1,))],
    (2, 2): [((S0, R), (R, R)), ((P, R), (R, R)), ((P, P), (R, R)), ((P, S0), (R, R)),
             ((S0, S1), (S1, S0)), ((P, P), (S0, S1)), ((R, S0), (S0, R)), ((P, R), (S0, R)),
             # two mesh dimensions splitting one tensor dimension (nested shards)
             ((S0, S0), (R, R)), ((R, R), (S1, S1)), ((S0, S0), (S0, R)), ((S0, S0), (R, S0)),
             ((S1, S1), (R, S1)), ((S0, S1), (S1, S1)), ((R, S0), (S0, S0))],
}


def name(placements) -> str:
    """``(Shard(0), Replicate())`` as ``"(S(0), R)"``, the way DTensor prints placements."""
    return "(" + ", ".join(str(p) for p in placements) + ")"


def _counts(mode: CommDebugMode) -> dict[str, int]:
    found: dict[str, int] = {}
    for op, n in mode.get_comm_counts().items():
        kind = KINDS.get(str(op).rsplit(".", 1)[-1], str(op))
        found[kind] = found.get(kind, 0) + n
    return found


class _DTensorIssued(TorchDispatchMode):
    """Notes the first c10d op issued from DTensor's own code (``torch/distributed/tensor/``,
    its debug tools aside): an answer that lets DTensor redistribute for it."""

    def __init__(self):
        super().__init__()
        self.where = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional") and not self.where:
            for frame in traceback.extract_stack():
                path = frame.filename.replace(os.sep, "/")
                if "torch/distributed/tensor/" in path and "/debug/" not in path:
                    self.where = f"torch/{path.split('/torch/', 1)[-1]}: {frame.name}"
                    break
        return func(*args, **(kwargs or {}))


def _source(full: torch.Tensor, mesh, src: tuple[Placement, ...], seed: int) -> torch.Tensor:
    """This rank's local tensor of a DTensor placed as ``src``: ``full`` sharded and
    replicated, then along each Partial mesh dimension split into seeded random parts."""
    local = distribute_tensor(full, mesh, [R if p.is_partial() else p for p in src]).to_local()
    coord = mesh.get_coordinate()
    for i, p in enumerate(src):
        if p.is_partial():  # parts summing to local: local/k + noise, and at coordinate 0
            g = torch.Generator().manual_seed(seed * 31 + i)  # local/k - (k - 1) noise
            noise = torch.randn(local.shape, generator=g)
            local = local / mesh.size(i) + noise * (1 if coord[i] else 1 - mesh.size(i))
    return local


def _on_rank(redistribute, seed: int, cases: dict, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(shape, generator=g)
    for mesh_shape, pairs in cases.items():
        mesh = init_device_mesh("cpu", mesh_shape)
        for src, dst in pairs:
            local = _source(full, mesh, src, seed)
            source = DTensor.from_local(local, mesh, src, run_check=False)
            with CommDebugMode() as oracle:
                want = source.redistribute(mesh, dst).to_local()
            what = (f"{name(src)} -> {name(dst)} on a mesh of shape {mesh_shape} (a tensor of "
                    f"shape {list(shape)}, rank {dist.get_rank()} at mesh coordinate "
                    f"{tuple(mesh.get_coordinate())})")
            with CommDebugMode() as mode, _DTensorIssued() as issued:
                try:
                    got = redistribute(local.clone(), mesh, src, dst)
                except Exception as exc:  # (the verdict says which case it raised on)
                    exc.add_note(f"for {what}")
                    raise
            if issued.where:
                raise CheckFailure(
                    f"for {what}, DTensor's own code issued a collective ({issued.where}): "
                    "redistribute the local tensor yourself, with collectives on the groups of "
                    "the mesh's dimensions.")
            plain_tensor(got, f"for {what}, the value redistribute returned")
            if got.shape != want.shape:
                raise CheckFailure(f"for {what}, your local tensor has shape {list(got.shape)}; "
                                   f"DTensor's has shape {list(want.shape)} (a collective on "
                                   "the whole world instead of the mesh dimension's group "
                                   "mesh.get_group(i), or a chunk too many or too few?).")
            torch.testing.assert_close(got, want, msg=lambda m, what=what: (
                f"for {what}, your local tensor differs from DTensor's (is each mesh "
                "dimension's shard the chunk at this rank's coordinate on that dimension, and "
                "when two mesh dimensions split one tensor dimension, is the order of the "
                f"gathers and chunks right?): {m}"))
            mine, theirs = _counts(mode), _counts(oracle)
            if mine != theirs:
                raise CheckFailure(
                    f"for {what}, you issued {describe(mine)}; DTensor's redistribute issues "
                    f"{describe(theirs)}.")


@check(EXERCISE)
def public_pairs(redistribute, ctx):
    """local shards and collectives as DTensor's on meshes (4,) and (2, 2)"""
    run(_on_rank, 4, redistribute, ctx.seed, PUBLIC, (8, 12), echo=False)


@check(EXERCISE, hidden=True)
def more_pairs(redistribute, ctx):
    """local shards and collectives as DTensor's on more pairs, nested shards, seeded shapes"""
    g = torch.Generator().manual_seed(ctx.seed)
    shape = tuple(4 * int(k) for k in torch.randint(1, 5, (2,), generator=g))
    run(_on_rank, 4, redistribute, ctx.seed, HIDDEN, shape, echo=False)
