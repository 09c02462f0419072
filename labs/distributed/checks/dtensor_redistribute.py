"""Checks of ``distributed.dtensor-redistribute``: ``redistribute(local, mesh, src, dst)``, called
on every rank with that rank's local tensor of a DTensor placed as ``src`` (a tuple of
``Shard(d)``, ``Replicate()``, ``Partial()``, one per mesh dimension) on ``mesh`` (a
``DeviceMesh``), must return the local tensor of the same DTensor placed as ``dst`` (no
``Partial`` in ``dst``), issuing the same collectives as DTensor's own ``redistribute``. The
oracle is DTensor: ``DTensor.from_local(local, mesh, src).redistribute(mesh, dst).to_local()``
on the same rank, and its ``CommDebugMode`` counts (collectives compared by kind: all_gather,
all_reduce, reduce_scatter, all_to_all, broadcast, whatever API issued them). Four gloo ranks,
meshes (4,) and (2, 2), 2-D tensors whose sharded sizes divide evenly. The answer runs on ranks
the kernel starts (the probe :func:`labs.distributed.probes.redistribute`, which reports what
each rank's call returned and issued); the judge runs DTensor on ranks of its own, from the same
inputs (:func:`labs.distributed.probes.dtensor_source`). An answer that runs DTensor's own
redistribution (its planner, its placements' transforms: ``models`` in the lab table) fails,
whatever it returns.
(torch/distributed/tensor/_redistribute.py: redistribute_local_tensor, _gen_transform_infos;
torch/distributed/tensor/placement_types.py: Shard._to_replicate_tensor, Partial._reduce_value,
Partial._reduce_shard_value.)"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

from grader.checks import CheckFailure, ahead, check
from labs.distributed import probes
from labs.distributed.checks._oracles import oracle
from labs.distributed.probes import (
    comm_counts,
    describe,
    dtensor_case,
    dtensor_source,
    placement,
)

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


def _code(p) -> str:
    """A placement's plain code (:func:`labs.distributed.probes.placement`)."""
    return "R" if p.is_replicate() else "P" if p.is_partial() else f"S{p.dim}"


def _plain(cases: dict) -> list:
    return [[list(mesh_shape), [[[_code(p) for p in src], [_code(p) for p in dst]]
                                for src, dst in pairs]] for mesh_shape, pairs in cases.items()]


def _oracle(seed: int, cases: list, shape: list) -> list[dict]:
    """On every rank of the judge's own world: DTensor's local tensor and collectives for each
    case."""
    full = torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed))
    found = []
    for mesh_shape, pairs in cases:
        mesh = init_device_mesh("cpu", tuple(mesh_shape))
        for src, dst in pairs:
            src_p, dst_p = tuple(map(placement, src)), tuple(map(placement, dst))
            local = dtensor_source(full, mesh, src_p, seed)
            source = DTensor.from_local(local, mesh, src_p, run_check=False)
            with CommDebugMode() as mode:
                want = source.redistribute(mesh, dst_p).to_local()
            found.append({"want": want.contiguous(), "counts": comm_counts(mode)})
    return found


def _judge(redistribute, seed: int, cases: dict, shape: list) -> None:
    plain = _plain(cases)
    real_run = oracle(_oracle, 4, seed, plain, shape)
    seen = redistribute.probe(probes.redistribute, seed, plain, shape)
    ranks = probes.ranks_of(seen)
    wanted = real_run.result()
    flat = [(mesh_shape, src, dst) for mesh_shape, pairs in plain for src, dst in pairs]
    for i, (mesh_shape, src, dst) in enumerate(flat):
        for rank in range(4):
            what = dtensor_case(src, dst, mesh_shape, shape, rank)
            _check_case(ranks[rank][i], wanted[rank][i], what, mesh_shape, rank)


def mesh_groups(mesh_shape: list, rank: int) -> list[list[int]]:
    """The global ranks of each mesh dimension's group that ``rank`` belongs to, on a mesh of
    ``mesh_shape`` laid out row-major over ranks 0..n-1 (what ``init_device_mesh`` builds:
    torch/distributed/device_mesh.py: DeviceMesh._init_process_groups)."""
    grid = torch.arange(int(torch.tensor(mesh_shape).prod())).reshape(mesh_shape)
    coord = [int(c) for c in (grid == rank).nonzero()[0]]
    groups = []
    for dim in range(len(mesh_shape)):
        index = list(coord)
        index[dim] = slice(None)
        groups.append(grid[tuple(index)].tolist())
    return groups


def _check_groups(mine: dict, mesh_shape: list, rank: int, what: str) -> None:
    """CheckFailure naming the first collective the answer ran on a group that is none of the
    mesh dimensions' groups of ``rank``."""
    groups = mesh_groups(mesh_shape, rank)
    for kind, ranks in mine["groups"]:
        if sorted(ranks) not in groups:
            named = "; ".join(f"dimension {d}: {g}" for d, g in enumerate(groups))
            whole = " (the whole world)" if len(ranks) == 4 else ""
            raise CheckFailure(
                f"for {what}, your {kind} ran on the process group of ranks {sorted(ranks)}"
                f"{whole}; each step of a redistribution runs on one mesh dimension's group, "
                f"and this rank's are {named} (mesh.get_group(dim)).")


def _check_case(mine: dict, oracle: dict, what: str, mesh_shape: list, rank: int) -> None:
    _check_groups(mine, mesh_shape, rank, what)
    got, want = mine["got"], oracle["want"]
    if got is None:
        why = ("a subclass of Tensor; return a plain Tensor" if mine["tensor"]
               else "not a Tensor or Parameter")
        raise CheckFailure(f"for {what}, the value redistribute returned has type "
                           f"{mine['type']}, {why}.")
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
    if mine["counts"] != oracle["counts"]:
        raise CheckFailure(
            f"for {what}, you issued {describe(mine['counts'])}; DTensor's redistribute issues "
            f"{describe(oracle['counts'])}.")


def _hidden_shape(seed: int) -> list[int]:
    """The hidden check's seeded tensor shape."""
    g = torch.Generator().manual_seed(seed)
    return [4 * int(k) for k in torch.randint(1, 5, (2,), generator=g)]


@ahead("distributed")
def _redistributed_ahead(seed: int) -> None:
    for cases, shape in ((PUBLIC, [8, 12]), (HIDDEN, _hidden_shape(seed))):
        oracle(_oracle, 4, seed, _plain(cases), shape)


@check(EXERCISE)
def public_pairs(redistribute, ctx):
    """local shards and collectives as DTensor's on meshes (4,) and (2, 2)"""
    _judge(redistribute, ctx.seed, PUBLIC, [8, 12])


@check(EXERCISE, hidden=True)
def more_pairs(redistribute, ctx):
    """local shards and collectives as DTensor's on more pairs, nested shards, seeded shapes"""
    _judge(redistribute, ctx.seed, HIDDEN, _hidden_shape(ctx.seed))
