"""Checks of ``distributed.ring-allreduce``: ``ring_all_reduce(tensor)``, called on every rank of
a gloo process group, must leave in ``tensor`` (in place) what ``dist.all_reduce(tensor)``
(SUM) leaves there, the oracle run on a copy on the same ranks; and it must get there around a
ring, as a reduce-scatter then an all-gather: only point-to-point ops (``send``/``recv`` and
their ``i``/batched forms, seen by :class:`~labs.distributed.checks._comms.CommLog`), sends only
to rank ``(r + 1) % p`` and receives only from ``(r - 1) % p``, at most ``2 (p - 1)`` sends per
rank, carrying at most ``2 (p - 1) ceil(n / p)`` elements. World sizes 3 (public), then 2, 3 and 4
with seeded hidden tensors: lengths below, at and not divisible by the world size, 2-D,
float64 and int64. (NCCL's ring: nccl/src/device/all_reduce.h: runRing.)"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from grader.checks import CheckFailure, check
from labs.distributed.checks._comms import CommLog, describe
from labs.distributed.launch import run

EXERCISE = "distributed.ring-allreduce"


def _case(seed: int, case: int, rank: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 7919 + case * 101 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def _on_rank(ring_all_reduce, seed: int, cases: list[tuple]) -> None:
    rank, p = dist.get_rank(), dist.get_world_size()
    for i, (shape, dtype) in enumerate(cases):
        mine = _case(seed, i, rank, shape, dtype)
        want = mine.clone()
        dist.all_reduce(want)
        got = mine.clone()
        what = f"a {dtype} tensor of shape {list(shape)} at world size {p}"
        with CommLog() as log:
            try:
                returned = ring_all_reduce(got)
            except Exception as exc:  # (the verdict says which case it raised on)
                exc.add_note(f"for {what}")
                raise
        collectives = {k: n for k, n in log.counts().items() if k not in ("send", "recv")}
        if collectives:
            raise CheckFailure(
                f"for {what} your ring issued collectives ({describe(collectives)}): build the "
                "all-reduce from point-to-point send and recv only.")
        if torch.equal(got, mine) and not torch.equal(want, mine):
            hint = (" You returned a tensor: all-reduce works in place, like dist.all_reduce: "
                    "write the sum into the tensor you were given (copy_ into it).")
            raise CheckFailure(f"for {what}, the tensor was left unchanged."
                               + (hint if isinstance(returned, torch.Tensor) else ""))
        if dtype.is_floating_point:
            torch.testing.assert_close(got, want, msg=lambda m, what=what: (
                f"for {what}, the tensor differs from what dist.all_reduce gives: {m}"))
        elif not torch.equal(got, want):
            bad = int((got != want).nonzero()[0][-1]) if got.dim() else 0
            raise CheckFailure(f"for {what}, the sum differs from dist.all_reduce's (first at "
                               f"index {bad} of the last dimension); are the chunks covering "
                               "every element when the length is not divisible by the world size?")
        _ring_traffic(log, rank, p, what, mine)


def _ring_traffic(log: CommLog, rank: int, p: int, what: str, tensor: torch.Tensor) -> None:
    sends = [c for c in log.comms if c.kind == "send"]
    recvs = [c for c in log.comms if c.kind == "recv"]
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
    run(_on_rank, 3, ring_all_reduce, ctx.seed, cases, echo=False)


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
        run(_on_rank, p, ring_all_reduce, ctx.seed, cases, echo=False)
