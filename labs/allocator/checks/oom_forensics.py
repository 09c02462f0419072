"""Checks of ``allocator.oom-forensics``: ``oom_forensics(snapshot)`` on memory snapshots (the
format of ``torch.cuda.memory._snapshot()``) taken when a request ran out of memory, produced by
the reference model from seeded traces on small simulated GPUs. The expected answer is read from
the model as it replays the trace (see :func:`snapshot_at_oom`); ``tests/`` checks that it agrees
with the exercise's definitions applied to the snapshot."""

from __future__ import annotations

import copy
import random

from grader.checks import CheckFailure, check, exact
from labs.allocator import model
from labs.allocator import probes
from labs.allocator.checks._harness import refuse_oracle, size
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.traces import FRAGMENTED

EXERCISE = "allocator.oom-forensics"
MiB = model.MiB
KEYS = ("oom_request", "peak_requested", "peak_at", "reserved_unallocated",
        "largest_free_block", "culprit")

def snapshot_at_oom(trace: list[tuple], capacity: int) -> tuple[dict, dict] | None:
    """The reference model's ``memory_snapshot()`` at the first out-of-memory of ``trace`` (the
    trace stops there) and the answer, or None when it never runs out. The answer is read from
    the model itself as it replays the trace (its stats, its blocks, and what freeing each block
    would leave), not from the snapshot the learner's function reads."""
    gpu = SimulatedGPU(capacity)
    allocator = model.CachingAllocatorModel(gpu)
    peak = {"bytes": 0, "at": 0}

    class Stop(Exception):
        pass

    def step(i, op, result):
        if isinstance(result, DeviceOutOfMemory):
            raise Stop(op)
        live = allocator.memory_stats()["requested_bytes.all.current"]
        if live > peak["bytes"]:  # (the alloc event is the last one the malloc recorded)
            peak.update(bytes=live, at=len(allocator.trace) - 1)

    try:
        model.replay(allocator, gpu, trace, step)
    except Stop as stop:
        return allocator.memory_snapshot(), _answer(allocator, stop.args[0], peak)
    return None


def _answer(allocator: model.CachingAllocatorModel, op: tuple, peak: dict) -> dict:
    request, stream = model.round_size(op[2]), op[3]
    stats = allocator.memory_stats()
    return {
        "oom_request": request,
        "peak_requested": peak["bytes"],
        "peak_at": peak["at"],
        "reserved_unallocated": stats["reserved_bytes.all.current"]
        - stats["allocated_bytes.all.current"],
        "largest_free_block": max((b.size for b in allocator.blocks if not b.allocated),
                                  default=0),
        "culprit": _culprit(allocator, request, stream),
    }


def _culprit(allocator: model.CachingAllocatorModel, request: int, stream: int) -> int | None:
    """The smallest allocated block (lowest address on ties) of the request's pool and stream
    that, freed in a copy of the model (which merges it with free neighbours), leaves a free
    block of at least ``request`` bytes."""
    small = request <= model.K_SMALL_SIZE
    for block in sorted(allocator.allocated.values(), key=lambda b: (b.size, b.ptr)):
        if block.pool.small != small or block.stream != stream:
            continue
        trial = copy.deepcopy(allocator)
        trial.free(block.ptr)
        freed = next(b for b in trial.blocks if b.ptr <= block.ptr < b.ptr + b.size)
        if freed.size >= request:
            return block.ptr
    return None


_WHAT = {
    "oom_request": "the size of the request that failed (the trace's 'oom' entry)",
    "peak_requested": "the most bytes live at once (alloc to free_requested, as the trace "
                      "reports sizes)",
    "peak_at": "the index in device_traces[0] of the alloc where that peak is first reached",
    "reserved_unallocated": "reserved bytes not in allocated blocks, at the OOM",
    "largest_free_block": "the largest inactive block, at the OOM",
    "culprit": "the address of the smallest allocated block (lowest address on ties) whose "
               "freeing would leave a free block big enough for the failed request (None if "
               "none would)",
}


def _verify(oom_forensics, case: tuple[dict, dict], label: str) -> None:
    snapshot, want = case
    seen = oom_forensics.probe(probes.forensics, snapshot)
    refuse_oracle(seen["oracle"])
    got = seen["result"]
    exact(got, dict, "the value oom_forensics returned")
    missing = [k for k in KEYS if k not in got]
    if missing:
        raise CheckFailure(f"the dict oom_forensics returned has no {missing[0]!r} key (keys: "
                           f"{', '.join(KEYS)}).")
    for key in KEYS:
        value = got[key]
        if key == "culprit" and value is None:
            pass
        else:
            exact(value, int, f"{key!r} in the dict oom_forensics returned")
        if value != want[key]:
            fmt = ((lambda v: "None" if v is None else f"{v:#x}") if key == "culprit" else
                   (lambda v: str(v)) if key == "peak_at" else size)
            raise CheckFailure(
                f"on {label}, {key!r} is {fmt(value)}; it should be {fmt(want[key])}: "
                f"{_WHAT[key]}.")
    if seen["modified"]:
        raise CheckFailure("oom_forensics modified the snapshot it was given; read it only.")


def random_snapshots(seed: int, count: int) -> list[tuple[dict, dict]]:
    """Seeded snapshots at an OOM, of traces on small GPUs, each with its answer."""
    rng = random.Random(seed)
    found = []
    while len(found) < count:
        trace = model.random_trace(rng, 150, live_max=rng.choice([6, 10, 14]))
        case = snapshot_at_oom(trace, rng.choice([64, 96, 128]) * MiB)
        if case is not None:
            found.append(case)
    return found


@check(EXERCISE)
def worked_example(oom_forensics, ctx):
    """finds what the notebook's example shows"""
    _verify(oom_forensics, snapshot_at_oom(FRAGMENTED, 100 * MiB), "the notebook's example")


@check(EXERCISE)
def random_oom(oom_forensics, ctx):
    """is right on a seeded random OOM"""
    (case,) = random_snapshots(ctx.seed, 1)
    _verify(oom_forensics, case, f"a random OOM (seed {ctx.seed})")


#: edge cases: the peak is reached twice (the first counts); a small-pool block would leave room
#: for the failed request, but the request is for the large pool (24 MiB GPU)
REPEATED_PEAK = [("malloc", 1, 4 * MiB, 0), ("free", 1), ("malloc", 2, 4 * MiB, 0),
                 ("malloc", 3, 100 * MiB, 0)]
OTHER_POOL = [("malloc", 1, 100_000, 0), ("malloc", 2, 9 * MiB, 0), ("malloc", 3, 10 * MiB, 0),
              ("malloc", 4, 1536 * 1024, 0)]


@check(EXERCISE, hidden=True)
def edge_cases(oom_forensics, ctx):
    """is right when the peak repeats and when another pool has room"""
    _verify(oom_forensics, snapshot_at_oom(REPEATED_PEAK, 64 * MiB), "a repeated peak")
    _verify(oom_forensics, snapshot_at_oom(OTHER_POOL, 24 * MiB), "a full large pool")


@check(EXERCISE, hidden=True)
def many_ooms(oom_forensics, ctx):
    """is right on more seeded OOMs"""
    for k, case in enumerate(random_snapshots(ctx.seed + 6000, 8)):
        _verify(oom_forensics, case, f"hidden OOM {k + 1}")
