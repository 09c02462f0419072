"""Checks of ``distributed.ring-allreduce``: ``ring_all_reduce(tensor)``, called on every rank of
a gloo process group, must leave in ``tensor`` (in place) what ``dist.all_reduce(tensor)``
(SUM) leaves there: the sum of the ranks' tensors, which the judge builds again from the same
seed (:func:`labs.distributed.probes.ring_input`); and it must get there around a ring, as a
reduce-scatter then an all-gather: only point-to-point ops (``send``/``recv`` and their
``i``/batched forms, seen by :class:`~labs.distributed.probes.CommLog`), sends only to rank
``(r + 1) % p`` and receives only from ``(r - 1) % p``, at most ``2 (p - 1)`` sends per rank,
carrying at most ``2 (p - 1) ceil(n / p)`` elements. World sizes 3 (public), then 2, 3 and 4
with seeded hidden tensors: lengths below, at and not divisible by the world size, 2-D,
float64 and int64. The ranks run in the kernel (the probe
:func:`labs.distributed.probes.ring_all_reduce`), which reports each rank's tensor afterwards
and the point-to-point ops it issued. (NCCL's ring: nccl/src/device/all_reduce.h: runRing.)"""

from __future__ import annotations

import math

import torch

from grader.checks import CheckFailure, check
from labs.distributed import probes
from labs.distributed.probes import KINDS, Comm, describe, ring_case, ring_input

EXERCISE = "distributed.ring-allreduce"


def _judge(ring_all_reduce, seed: int, p: int, cases: list[tuple]) -> None:
    seen = ring_all_reduce.probe(probes.ring_all_reduce, seed, p, cases)
    ranks = probes.ranks_of(seen)
    if not (isinstance(ranks, list) and len(ranks) == p):
        raise CheckFailure(f"the ranks' results came back as {type(ranks).__name__}.")
    for i, (shape, dtype) in enumerate(cases):
        inputs = [ring_input(seed, i, r, shape, dtype) for r in range(p)]
        want = torch.stack(inputs).sum(0, dtype=dtype)
        what = ring_case(shape, dtype, p)
        for rank, mine in enumerate(inputs):
            _check_rank(ranks[rank][i], rank, p, what, mine, want)


def _check_rank(seen: dict, rank: int, p: int, what: str, mine: torch.Tensor,
                want: torch.Tensor) -> None:
    log = [Comm(kind, peer, nbytes) for kind, peer, nbytes in seen["comms"]]
    got = seen["tensor"]
    counts: dict[str, int] = {}
    for c in log:
        if c.kind in set(KINDS.values()) and c.kind not in ("send", "recv"):
            counts[c.kind] = counts.get(c.kind, 0) + 1
    if counts:
        raise CheckFailure(
            f"for {what} your ring issued collectives ({describe(counts)}): build the "
            "all-reduce from point-to-point send and recv only.")
    if torch.equal(got, mine) and not torch.equal(want, mine):
        hint = (" You returned a tensor: all-reduce works in place, like dist.all_reduce: "
                "write the sum into the tensor you were given (copy_ into it).")
        raise CheckFailure(f"for {what}, the tensor was left unchanged."
                           + (hint if seen["returned_tensor"] else ""))
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, msg=lambda m, what=what: (
            f"for {what}, the tensor differs from what dist.all_reduce gives: {m}"))
    elif not torch.equal(got, want):
        bad = int((got != want).nonzero()[0][-1]) if got.dim() else 0
        raise CheckFailure(f"for {what}, the sum differs from dist.all_reduce's (first at "
                           f"index {bad} of the last dimension); are the chunks covering "
                           "every element when the length is not divisible by the world size?")
    _ring_traffic(log, rank, p, what, mine)


def _ring_traffic(log: list[Comm], rank: int, p: int, what: str, tensor: torch.Tensor) -> None:
    sends = [c for c in log if c.kind == "send"]
    recvs = [c for c in log if c.kind == "recv"]
    nxt, prev = (rank + 1) % p, (rank - 1) % p
    stray = sorted({c.peer for c in sends if c.peer != nxt})
    if stray:
        raise CheckFailure(f"for {what}, rank {rank} sent to rank {stray[0]}: in a ring each rank "
                           f"sends only to the next one, (rank + 1) % world_size = {nxt}.")
    stray = sorted({c.peer for c in recvs if c.peer != prev})
    if stray:
        raise CheckFailure(f"for {what}, rank {rank} received from rank {stray[0]}: in a ring "
                           "each rank receives only from the previous one, (rank - 1) % "
                           f"world_size = {prev}.")
    n, size = tensor.numel(), tensor.element_size()
    most = 2 * (p - 1) * math.ceil(n / p) * size
    sent = sum(c.bytes for c in sends)
    if len(sends) > 2 * (p - 1) or sent > most:
        raise CheckFailure(
            f"for {what}, rank {rank} made {len(sends)} sends of {sent} bytes in all. A ring "
            f"all-reduce sends a chunk of about 1/{p} of the tensor at each of its 2 (p - 1) = "
            f"{2 * (p - 1)} steps: at most {most} bytes here. Send chunks, not the whole tensor.")


@check(EXERCISE)
def world_of_three(ring_all_reduce, ctx):
    """equals dist.all_reduce on 3 ranks, lengths 10 and 12, around the ring"""
    cases = [((10,), torch.float32), ((12,), torch.float32)]
    _judge(ring_all_reduce, ctx.seed, 3, cases)


@check(EXERCISE, hidden=True)
def worlds_two_to_four(ring_all_reduce, ctx):
    """equals dist.all_reduce on 2, 3 and 4 ranks on odd lengths, 2-D, float64 and int64"""
    g = torch.Generator().manual_seed(ctx.seed)
    for p in (2, 3, 4):
        odd = int(torch.randint(2, 6, (1,), generator=g)) * p + int(
            torch.randint(1, p, (1,), generator=g))
        below = (p - 1,) if p > 2 else (p,)  # (fewer elements than ranks: empty chunks)
        cases = [((1,), torch.float32), (below, torch.float32), ((odd,), torch.float32),
                 ((3, odd), torch.float64), ((odd + p,), torch.int64)]
        _judge(ring_all_reduce, ctx.seed, p, cases)
