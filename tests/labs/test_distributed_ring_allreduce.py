"""distributed.ring-allreduce: plausible wrong ring all-reduces fail, called directly through
run_checks. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import re

import pytest
import torch
import torch.distributed as dist

from tests.conftest import assert_rejected

EX = "distributed.ring-allreduce"


def _exchange(send, incoming, dst, src):
    ops = [dist.P2POp(dist.isend, send.contiguous(), dst), dist.P2POp(dist.irecv, incoming, src)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def _ring(tensor, chunks):
    """The reference's reduce-scatter then all-gather, over the views ``chunks`` of ``tensor``."""
    rank, p = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % p, (rank - 1) % p
    for s in range(p - 1):
        send, recv = chunks[(rank - s) % p], chunks[(rank - s - 1) % p]
        incoming = torch.empty_like(recv)
        _exchange(send, incoming, nxt, prev)
        recv.add_(incoming)
    for s in range(p - 1):
        send, recv = chunks[(rank + 1 - s) % p], chunks[(rank - s) % p]
        incoming = torch.empty_like(recv)
        _exchange(send, incoming, nxt, prev)
        recv.copy_(incoming)


def with_the_collective(tensor):
    dist.all_reduce(tensor)


def floor_sized_chunks(tensor):
    """Chunks of n // p elements: the remainder is never reduced."""
    flat, p = tensor.view(-1), dist.get_world_size()
    k = flat.numel() // p
    _ring(tensor, [flat[i * k:(i + 1) * k] for i in range(p)])


def whole_tensor_around_the_ring(tensor):
    """Passes the whole tensor on p - 1 times, adding what arrives: the right sum, p times the
    bytes."""
    rank, p = dist.get_rank(), dist.get_world_size()
    total, passing = tensor.clone(), tensor.clone()
    for _ in range(p - 1):
        incoming = torch.empty_like(passing)
        _exchange(passing, incoming, (rank + 1) % p, (rank - 1) % p)
        passing = incoming
        total += passing
    tensor.copy_(total)


def through_rank_zero(tensor):
    """Every rank sends its tensor to rank 0, which sums and sends the sum back. Rank 0 sends to
    rank 2, rank 1 sends to rank 0 and rank 2 receives from rank 0: none are ring neighbours,
    and which rank reports first varies from run to run."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for src in range(1, p):
            incoming = torch.empty_like(tensor)
            dist.recv(incoming, src)
            tensor += incoming
        for dst in range(1, p):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)


def returns_the_sum(tensor):
    """Sums around the ring into a copy and returns it: the caller's tensor is left as it was."""
    out = tensor.clone()
    _ring(out, out.view(-1).tensor_split(dist.get_world_size()))
    return out


@pytest.mark.parametrize("answer, phrase", [
    (with_the_collective, "your ring issued collectives (1 all_reduce)"),
    (floor_sized_chunks, "the tensor differs from what dist.all_reduce gives"),
    (whole_tensor_around_the_ring, "Send chunks, not the whole tensor"),
    (through_rank_zero, ": in a ring each rank "),
    (returns_the_sum, "the tensor was left unchanged. You returned a tensor"),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    if answer is through_rank_zero:
        assert re.search(r"rank (0 sent to rank 2: in a ring each rank sends only to the next"
                         r"|1 sent to rank 0: in a ring each rank sends only to the next"
                         r"|2 received from rank 0: in a ring each rank receives only from the "
                         r"previous)", v.message), v.message


def torch_chunk(tensor):
    """torch.chunk instead of tensor_split: fewer than p chunks when n < p (and for some other
    n: 6 elements for 4 ranks make 3 chunks of 2)."""
    _ring(tensor, tensor.view(-1).chunk(dist.get_world_size()))


def test_fewer_chunks_than_ranks_fails_on_a_hidden_case():
    v = assert_rejected(EX, torch_chunk, "raised IndexError: tuple index out of range")
    assert v.status == "error" and v.message.startswith("hidden check 2/2"), v.message
    assert re.search(r"\(seed 0\): rank [01] raised IndexError", v.message), v.message
