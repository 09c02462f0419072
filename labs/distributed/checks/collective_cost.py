"""Checks of ``distributed.collective-cost``: ``collective_cost(op, algorithm, nbytes,
world_size, alpha, beta)`` must return ``(bytes each rank sends, seconds)`` for six collective
algorithms, as measured on real runs: the checks run each algorithm below with real sends and
receives on ``world_size`` gloo ranks, count the bytes every rank's sends carry
(:class:`~labs.distributed.checks._comms.CommLog`) and time the messages with the alpha-beta
model (:func:`alpha_beta_time`). Each result is also compared with torch's own collective.

The algorithms (rank 0 is the root; a message of ``b`` bytes costs ``alpha + b * beta``):

- ring ``all_reduce``: reduce-scatter then all-gather, ``2 (p - 1)`` steps of one ``n / p``
  chunk to the next rank; ring ``reduce_scatter`` and ``all_gather``: ``p - 1`` such steps
  (``nbytes`` is the full tensor: all-gather's output, reduce-scatter's input);
- ring ``broadcast``: the whole message passed along the chain 0 -> 1 -> ... -> p-1;
- tree ``broadcast``: a binomial tree, in round ``k`` every rank ``r < 2**k`` sends the whole
  message to ``r + 2**k`` (when it exists); tree ``all_reduce``: the same tree backwards (round
  ``k`` from last to first, rank ``r + 2**k`` sends its partial sum to ``r``), then a tree
  broadcast. (NCCL: nccl/src/graph/tuning.cc: the ring and tree cost models; Thakur et al.,
  "Optimization of collective communication operations in MPICH", 2005.)

Message sizes are multiples of ``4 * world_size`` bytes (float32 elements, equal chunks).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from grader.checks import AnswerRaised, CheckFailure, ahead, check
from labs.distributed.checks._comms import CommLog
from labs.distributed.checks._oracles import oracle

EXERCISE = "distributed.collective-cost"
#: the (op, algorithm) pairs the exercise asks about
CASES = [("all_reduce", "ring"), ("all_gather", "ring"), ("reduce_scatter", "ring"),
         ("broadcast", "ring"), ("broadcast", "tree"), ("all_reduce", "tree")]


class _Batches:
    """Point-to-point ops issued together and waited for together, in program order."""

    def __init__(self):
        self.batches: list[list[tuple[str, int, int]]] = []

    def exchange(self, send=None, recv=None) -> None:
        """Post a send ``(tensor, dst)`` and/or a recv ``(buffer, src)``, then wait for both."""
        ops, batch = [], []
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send[0].contiguous(), send[1]))
            batch.append(("send", send[1], send[0].numel() * send[0].element_size()))
        if recv is not None:
            ops.append(dist.P2POp(dist.irecv, recv[0], recv[1]))
            batch.append(("recv", recv[1], recv[0].numel() * recv[0].element_size()))
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        self.batches.append(batch)


def _ring(chunks: list[torch.Tensor], net: _Batches, steps: range, offset: int, add: bool):
    rank, p = dist.get_rank(), dist.get_world_size()
    for s in steps:
        send, recv = chunks[(rank + offset - s) % p], chunks[(rank + offset - s - 1) % p]
        incoming = torch.empty_like(recv)
        net.exchange(send=(send, (rank + 1) % p), recv=(incoming, (rank - 1) % p))
        recv.add_(incoming) if add else recv.copy_(incoming)


def _tree_broadcast(x: torch.Tensor, net: _Batches) -> None:
    rank, p = dist.get_rank(), dist.get_world_size()
    for k in range(math.ceil(math.log2(p))):
        span = 2**k
        if rank < span and rank + span < p:
            net.exchange(send=(x, rank + span))
        elif span <= rank < 2 * span:
            net.exchange(recv=(x, rank - span))


def _tree_reduce(x: torch.Tensor, net: _Batches) -> None:
    rank, p = dist.get_rank(), dist.get_world_size()
    for k in reversed(range(math.ceil(math.log2(p)))):
        span = 2**k
        if span <= rank < 2 * span:
            net.exchange(send=(x, rank - span))
        elif rank < span and rank + span < p:
            incoming = torch.empty_like(x)
            net.exchange(recv=(incoming, rank + span))
            x.add_(incoming)


def _run_case(op: str, algorithm: str, n: int, net: _Batches) -> None:
    """Run one algorithm on ``n`` float32 elements and compare it with torch's collective."""
    rank, p = dist.get_rank(), dist.get_world_size()
    x = torch.arange(n, dtype=torch.float32) + 1000 * rank
    if op == "all_reduce":
        want = x.clone()
        dist.all_reduce(want)
        if algorithm == "ring":
            _ring(list(x.chunk(p)), net, range(p - 1), 0, add=True)
            _ring(list(x.chunk(p)), net, range(p - 1), 1, add=False)
        else:
            _tree_reduce(x, net)
            _tree_broadcast(x, net)
        got = x
    elif op == "reduce_scatter":
        want = torch.empty(n // p)
        dist.reduce_scatter_tensor(want, x.clone())
        chunks = list(x.chunk(p))
        _ring(chunks, net, range(p - 1), -1, add=True)  # (rank r ends with chunk r)
        got = chunks[rank]
    elif op == "all_gather":
        mine = x[: n // p].clone()
        want = torch.empty(n)
        dist.all_gather_into_tensor(want, mine)
        out = torch.empty(n)
        chunks = list(out.chunk(p))
        chunks[rank].copy_(mine)
        _ring(chunks, net, range(p - 1), 0, add=False)
        got = out
    else:
        want = x.clone()
        dist.broadcast(want, 0)
        if algorithm == "tree":
            _tree_broadcast(x, net)
        else:
            if rank > 0:
                net.exchange(recv=(x, rank - 1))
            if rank < p - 1:
                net.exchange(send=(x, rank + 1))
        got = x
    assert torch.equal(got, want), f"the course's {algorithm} {op} is wrong: please report it"


def _measure(sizes: dict[tuple[str, str], int]) -> dict:
    """On every rank: run each case; (bytes sent, batches) by case."""
    out = {}
    for (op, algorithm), nbytes in sizes.items():
        net = _Batches()
        dist.barrier()
        with CommLog() as log:
            _run_case(op, algorithm, nbytes // 4, net)
        sent = sum(c.bytes for c in log.comms if c.kind == "send")
        out[op, algorithm] = (sent, net.batches)
    return out


def alpha_beta_time(batches: list[list[list[tuple[str, int, int]]]], alpha: float,
                    beta: float) -> float:
    """Seconds until the last rank is done, under the alpha-beta model, for the point-to-point
    batches each rank issued (``batches[rank]``: in program order, each a list of
    ``(kind, peer, bytes)`` posted together and waited for together). A rank posts a batch when
    its previous one completes. A message of ``b`` bytes moves once both its send and its
    receive are posted (the k-th send from ``a`` to ``b`` matches the k-th receive of ``b`` from
    ``a``) and takes ``alpha + b * beta`` seconds; a batch completes with its last message. So a
    rank sends one message and receives one at a time per batch, as in the model behind the
    textbook formulas. Raises ValueError when a send has no receive or the batches deadlock."""
    queues: dict[tuple[int, int], tuple[list, list]] = {}
    for r, ranks_batches in enumerate(batches):
        for i, batch in enumerate(ranks_batches):
            for kind, peer, nbytes in batch:
                key = (r, peer) if kind == "send" else (peer, r)
                queues.setdefault(key, ([], []))[kind != "send"].append((r, i, nbytes))
    partners: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for sends, recvs in queues.values():
        if len(sends) != len(recvs):
            raise ValueError("a send has no matching receive, or a receive no send")
        for (sr, si, nbytes), (rr, ri, _) in zip(sends, recvs):
            partners.setdefault((sr, si), []).append((rr, ri, nbytes))
            partners.setdefault((rr, ri), []).append((sr, si, nbytes))
    done: dict[tuple[int, int], float] = {}

    def posted(r: int, i: int) -> float:
        return 0.0 if i == 0 else finished(r, i - 1)

    def finished(r: int, i: int) -> float:
        if (r, i) not in done:
            done[r, i] = math.nan  # (being computed: met again only in a deadlock)
            start = posted(r, i)
            done[r, i] = max([start] + [max(start, posted(pr, pi)) + alpha + nbytes * beta
                                        for pr, pi, nbytes in partners.get((r, i), [])])
        if math.isnan(done[r, i]):
            raise ValueError("the batches deadlock: two ranks each wait for the other")
        return done[r, i]

    return max([finished(r, len(b) - 1) for r, b in enumerate(batches) if b] or [0.0])


def _answer(collective_cost, op, algorithm, nbytes, p, alpha, beta):
    got = collective_cost(op, algorithm, nbytes, p, alpha, beta)
    what = f"collective_cost({op!r}, {algorithm!r}, {nbytes}, {p}, {alpha:g}, {beta:g})"
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailure(f"{what} returned {type(got).__name__}; return a tuple "
                           "(bytes each rank sends: a list of world_size ints, seconds: float).")
    sent, seconds = got
    if (not isinstance(sent, list) or len(sent) != p
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in sent)):
        raise CheckFailure(f"{what}[0] is {sent!r}; it must be a list of {p} ints, the bytes "
                           "rank 0, 1, ... sends.")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise CheckFailure(f"{what}[1] is {seconds!r}; it must be a number of seconds.")
    return what, sent, float(seconds)


def _compare(collective_cost, p: int, sizes: dict, alpha: float, beta: float) -> None:
    real_run = oracle(_measure, p, sizes)
    answers = [_answer(collective_cost, op, algorithm, nbytes, p, alpha, beta)
               for (op, algorithm), nbytes in sizes.items()]
    measured = real_run.result()
    for ((op, algorithm), nbytes), (what, sent, seconds) in zip(sizes.items(), answers):
        real = [m[op, algorithm][0] for m in measured]
        if sent != real:
            raise CheckFailure(
                f"{what}: you said the ranks send {sent} bytes; on {p} real ranks they sent "
                f"{real} ({algorithm} {op}, as the exercise defines it).")
        batches = [m[op, algorithm][1] for m in measured]
        want = alpha_beta_time(batches, alpha, beta)
        if not math.isclose(seconds, want, rel_tol=1e-6):
            raise CheckFailure(
                f"{what}: you said {seconds:.6g} s; the real run's messages take {want:.6g} s "
                "under the alpha-beta model. "
                + _terms(collective_cost, (op, algorithm, nbytes, p), alpha, beta, batches))


def _terms(collective_cost, case: tuple, alpha: float, beta: float, batches: list) -> str:
    """Which term of the time differs, from the answer asked again with beta = 0 (its alpha
    term: latencies on the critical path) and with alpha = 0 (its beta term: bytes moved along
    the critical path), against the real run's under the same model."""
    try:
        latencies = _answer(collective_cost, *case, alpha, 0.0)[2] / alpha
        moved = _answer(collective_cost, *case, 0.0, beta)[2] / beta
    except (AnswerRaised, CheckFailure):
        latencies = moved = math.nan  # (the answer cannot be asked so: name no term)
    want_latencies = alpha_beta_time(batches, alpha, 0.0) / alpha
    want_moved = alpha_beta_time(batches, 0.0, beta) / beta
    said = []
    if not math.isclose(latencies, want_latencies, rel_tol=1e-6):
        said.append(
            f"The alpha term differs: your time holds {latencies:.4g} latencies (alpha) on the "
            f"critical path, the real run {want_latencies:g}; which messages wait for which "
            "decides it: count the steps, not the messages.")
    if not math.isclose(moved, want_moved, rel_tol=1e-6):
        said.append(
            f"The beta term differs: your time moves {moved:.6g} bytes (times beta) along the "
            f"critical path, the real run {want_moved:g}: the bytes of each step on it, "
            "added up.")
    if math.isnan(latencies) or not said:
        return ("Count the steps on the critical path (alpha each) and the bytes each step "
                "moves (beta per byte).")
    return " ".join(said)


def _public(seed: int) -> list[tuple[int, dict, float, float]]:
    """(world size, message sizes by case, alpha, beta) of the public check."""
    return [(4, {case: 4096 for case in CASES}, 1e-5, 1e-9)]


def _hidden(seed: int) -> list[tuple[int, dict, float, float]]:
    """(world size, message sizes by case, alpha, beta) of the hidden check's worlds."""
    g = torch.Generator().manual_seed(seed)
    worlds = []
    for p in (2, 3, 5):
        sizes = {case: 4 * p * int(torch.randint(1, 300, (1,), generator=g)) for case in CASES}
        alpha = float(torch.empty(()).uniform_(1e-6, 5e-5, generator=g))
        beta = float(torch.empty(()).uniform_(1e-10, 1e-8, generator=g))
        worlds.append((p, sizes, alpha, beta))
    return worlds


@ahead("distributed")
def _measured_ahead(seed: int) -> None:
    for p, sizes, _, _ in _public(seed) + _hidden(seed):
        oracle(_measure, p, sizes)


@check(EXERCISE)
def four_ranks(collective_cost, ctx):
    """bytes and seconds of six algorithms on 4 real ranks, 4 KiB messages"""
    for world in _public(ctx.seed):
        _compare(collective_cost, *world)


@check(EXERCISE, hidden=True)
def other_worlds(collective_cost, ctx):
    """bytes and seconds on 2, 3 and 5 real ranks, seeded sizes, alpha and beta"""
    for world in _hidden(ctx.seed):
        _compare(collective_cost, *world)
