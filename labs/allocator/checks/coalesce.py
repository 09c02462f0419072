"""Checks of ``allocator.coalesce``: the learner's ``CoalescingAllocator`` against the reference
model along traces with frees in random order, ``empty_cache`` and out-of-memory retries on a
small simulated GPU; fragmentation (``inactive_split_bytes``, the largest free block) is reported
in the learner's terms when it differs. The public checks compare with the model's recorded
runs, the hidden ones with the model itself on seeded traces."""

from __future__ import annotations

import random

from grader.checks import CheckFailure, check
from labs.allocator import traces
from labs.allocator.checks import _harness
from labs.allocator.checks._harness import (
    MODEL,
    compare,
    plain_snapshot,
    replayed,
    size,
    story,
)
from labs.allocator.gpu import DeviceOutOfMemory
from labs.allocator.snapshots import INACTIVE, MiB, stats_from_segments

EXERCISE = "allocator.coalesce"

def fragmentation(segments: list[dict]) -> tuple[int, int]:
    """(inactive_split_bytes, largest free block) of a snapshot's segments, in bytes."""
    stats = stats_from_segments(segments)
    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == INACTIVE]
    return stats["inactive_split_bytes.all.current"], max(free, default=0)


def unmerged(segments: list[dict]) -> bool:
    """Whether some segment holds two free blocks side by side (a missed merge)."""
    return any(a["state"] == b["state"] == INACTIVE
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


def _figures(cls, run: traces.Run, label: str) -> None:
    """Find a missed merge first (a message in terms of fragmentation), then compare everything
    step by step with compare."""
    seen = replayed(cls, run.trace, run.capacity, run.max_split_size)
    steps_mine = _steps([s["snapshot"] for s in seen["steps"]],
                        [s["result"] == "oom" for s in seen["steps"]])
    steps_ref = _steps([s.segments for s in run.steps],
                       [isinstance(s.result, DeviceOutOfMemory) for s in run.steps])
    for step, ((oom_a, missed, a), (oom_b, _, b)) in enumerate(zip(steps_mine, steps_ref), 1):
        if oom_a != oom_b or (a != b and not missed):
            break  # not a merging mistake: compare says what differs
        if a != b:
            raise CheckFailure(
                f"on {label}, after step {step}: a segment of yours holds two free blocks side by "
                f"side. inactive_split_bytes is {size(a[0])} and the largest free block "
                f"{size(a[1])} in your allocator; {MODEL} has {size(b[0])} and "
                f"{size(b[1])}. A freed block merges with each free neighbour in its segment. "
                f"Steps so far: {story(run.trace, step)}.")
    compare(cls, run, label=label, seen=seen)


@check(EXERCISE)
def worked_example(CoalescingAllocator, ctx):
    """matches the reference model on the notebook's example"""
    _figures(CoalescingAllocator, traces.recorded("coalesce"), "the notebook's example")


@check(EXERCISE)
def random_trace(CoalescingAllocator, ctx):
    """matches it on a random trace with empty_cache calls"""
    _figures(CoalescingAllocator, traces.recorded("coalesce_random"), "the public random trace")


@check(EXERCISE)
def out_of_memory(CoalescingAllocator, ctx):
    """frees its cached segments and retries before running out of memory"""
    _figures(CoalescingAllocator, traces.recorded("out_of_memory"), "the notebook's 100 MiB GPU")


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


#: two cached oversize segments cover a 30 MiB request (max_split_size 40 MiB: both cover
#: max(30, 40) MiB) on a 160 MiB GPU: the smaller, 60 MiB, is freed, the 90 MiB one stays (as on
#: an H200)
OVERSIZE_SMALLEST = [("malloc", 1, 60 * MiB, 0), ("malloc", 2, 90 * MiB, 0), ("free", 1),
                     ("free", 2), ("malloc", 3, 30 * MiB, 0)]


@check(EXERCISE, hidden=True)
def oversize_release(CoalescingAllocator, ctx):
    """frees oversize cached blocks first when max_split_size is set"""
    _figures(CoalescingAllocator, _harness.reference_run(OVERSIZE_SMALLEST, capacity=160 * MiB,
                                                max_split_size=40 * MiB), "a 160 MiB GPU")
    _figures(CoalescingAllocator, _harness.reference_run(OVERSIZE, capacity=100 * MiB,
                                                max_split_size=20 * MiB), "a 100 MiB GPU")
    _figures(CoalescingAllocator, _harness.reference_run(OVERSIZE_TIES, capacity=150 * MiB,
                                                max_split_size=32 * MiB), "a 150 MiB GPU")


@check(EXERCISE, hidden=True)
def small_gpus(CoalescingAllocator, ctx):
    """matches it on seeded traces that run out of memory, with and without max_split_size"""
    rng = random.Random(ctx.seed + 3000)
    for k in range(6):
        trace = traces.random_trace(rng, 100, empty_cache=k % 2 == 1, live_max=8)
        capacity = rng.choice([96, 128, 160]) * MiB
        limit = (None, 20 * MiB, None, 24 * MiB, 40 * MiB, None)[k]
        run = _harness.reference_run(trace, capacity=capacity, max_split_size=limit)
        _figures(CoalescingAllocator, run, f"hidden trace {k + 1}")


@check(EXERCISE, hidden=True)
def long_traces(CoalescingAllocator, ctx):
    """matches it on long seeded traces"""
    rng = random.Random(ctx.seed + 4000)
    for k in range(3):
        trace = traces.random_trace(rng, 200, empty_cache=True, live_max=20)
        _figures(CoalescingAllocator, _harness.reference_run(trace), f"hidden long trace {k + 1}")
