"""Checks of ``allocator.coalesce``: the learner's ``CoalescingAllocator`` against the reference
model along traces with frees in random order, ``empty_cache`` and out-of-memory retries on a
small simulated GPU; fragmentation (``inactive_split_bytes``, the largest free block) is reported
in the learner's terms when it differs."""

from __future__ import annotations

import random

from grader.checks import CheckFailure, check
from labs.allocator import model, probes
from labs.allocator.checks._harness import (
    compare,
    plain_snapshot,
    replayed,
    size,
    story,
)
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.traces import COALESCE, OUT_OF_MEMORY

EXERCISE = "allocator.coalesce"
MiB = model.MiB

def fragmentation(segments: list[dict]) -> tuple[int, int]:
    """(inactive_split_bytes, largest free block) of a snapshot's segments, in bytes."""
    stats = model.stats_from_segments(segments)
    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == model.INACTIVE]
    return stats["inactive_split_bytes.all.current"], max(free, default=0)


def unmerged(segments: list[dict]) -> bool:
    """Whether some segment holds two free blocks side by side (a missed merge)."""
    return any(a["state"] == b["state"] == model.INACTIVE
               for s in segments for a, b in zip(s["blocks"], s["blocks"][1:]))


def _steps(snapshots: list, ooms: list[bool]) -> list[tuple[bool, bool, tuple[int, int]]]:
    """(out of memory?, a missed merge?, fragmentation) after each step, from the snapshots
    after each step, as far as they are well-formed."""
    steps = []
    for snap, oom in zip(snapshots, ooms):
        try:
            segments = plain_snapshot(snap)
        except CheckFailure:
            break  # reported by compare, at its step
        steps.append((oom, unmerged(segments), fragmentation(segments)))
    return steps


def _figures(cls, trace, capacity, max_split_size, label):
    """Find a missed merge first (a message in terms of fragmentation), then compare everything
    step by step with compare."""
    seen = replayed(cls, trace, capacity, max_split_size)
    steps_mine = _steps([s["snapshot"] for s in seen["steps"]],
                        [s["result"] == "oom" for s in seen["steps"]])
    ref_gpu = SimulatedGPU(capacity)
    ref = model.CachingAllocatorModel(ref_gpu, max_split_size=max_split_size)
    snaps, ooms, live = [], [], {}
    for op in trace:
        ooms.append(isinstance(probes.apply_op(ref, ref_gpu, op, live), DeviceOutOfMemory))
        snaps.append(ref.snapshot())
    steps_ref = _steps(snaps, ooms)
    for step, ((oom_a, missed, a), (oom_b, _, b)) in enumerate(zip(steps_mine, steps_ref), 1):
        if oom_a != oom_b or (a != b and not missed):
            break  # not a merging mistake: compare says what differs
        if a != b:
            raise CheckFailure(
                f"on {label}, after step {step}: a segment of yours holds two free blocks side by "
                f"side. inactive_split_bytes is {size(a[0])} and the largest free block "
                f"{size(a[1])} in your allocator; the real allocator has {size(b[0])} and "
                f"{size(b[1])}. A freed block merges with each free neighbour in its segment. "
                f"Steps so far: {story(trace, step)}.")
    compare(cls, trace, capacity=capacity, max_split_size=max_split_size, label=label,
            seen=seen)


@check(EXERCISE)
def worked_example(CoalescingAllocator, ctx):
    """matches the real allocator on the notebook's example"""
    _figures(CoalescingAllocator, COALESCE, 2 * model.GiB, None, "the notebook's example")


@check(EXERCISE)
def random_trace(CoalescingAllocator, ctx):
    """matches it on a seeded trace with empty_cache calls"""
    trace = model.random_trace(random.Random(ctx.seed), 80, empty_cache=True)
    _figures(CoalescingAllocator, trace, 2 * model.GiB, None, f"a random trace (seed {ctx.seed})")


@check(EXERCISE)
def out_of_memory(CoalescingAllocator, ctx):
    """frees its cached segments and retries before running out of memory"""
    _figures(CoalescingAllocator, OUT_OF_MEMORY, 100 * MiB, None, "the notebook's 100 MiB GPU")


@check(EXERCISE, hidden=True)
def small_gpus(CoalescingAllocator, ctx):
    """matches it on seeded traces that run out of memory, with and without max_split_size"""
    rng = random.Random(ctx.seed + 3000)
    for k in range(6):
        trace = model.random_trace(rng, 100, empty_cache=k % 2 == 1, live_max=8)
        capacity = rng.choice([96, 128, 160]) * MiB
        limit = (None, 20 * MiB, None, 24 * MiB, 40 * MiB, None)[k]
        _figures(CoalescingAllocator, trace, capacity, limit, f"hidden trace {k + 1}")


#: release_available_cached_blocks on a 100 MiB GPU with max_split_size 20 MiB: step 5 frees only
#: the cached 60 MiB block that covers the request, step 9 only the two largest oversize blocks
#: that add up to it; the 12 MiB and small segments stay cached both times
OVERSIZE = [("malloc", 1, 60 * MiB, 0), ("malloc", 2, 100_000, 0), ("malloc", 3, 12 * MiB, 0),
            ("free", 1), ("free", 2), ("free", 3), ("malloc", 4, 30 * MiB, 0),
            ("malloc", 5, 24 * MiB, 0), ("free", 4), ("free", 5), ("malloc", 6, 50 * MiB, 0)]


#: three equal oversize cached blocks, two of which must go for a 70 MiB request: the highest
#: addresses first (the pool is walked from its end)
OVERSIZE_TIES = [("malloc", h, 40 * MiB, 0) for h in (1, 2, 3)] + [
    ("free", 2), ("free", 1), ("free", 3), ("malloc", 4, 70 * MiB, 0)]


@check(EXERCISE, hidden=True)
def oversize_release(CoalescingAllocator, ctx):
    """frees oversize cached blocks first when max_split_size is set"""
    _figures(CoalescingAllocator, OVERSIZE, 100 * MiB, 20 * MiB, "a 100 MiB GPU")
    _figures(CoalescingAllocator, OVERSIZE_TIES, 150 * MiB, 32 * MiB, "a 150 MiB GPU")


@check(EXERCISE, hidden=True)
def long_traces(CoalescingAllocator, ctx):
    """matches it on long seeded traces"""
    rng = random.Random(ctx.seed + 4000)
    for k in range(3):
        trace = model.random_trace(rng, 200, empty_cache=True, live_max=20)
        _figures(CoalescingAllocator, trace, 2 * model.GiB, None, f"hidden long trace {k + 1}")
