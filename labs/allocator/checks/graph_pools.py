"""Checks of ``allocator.graph-pools``: the learner's ``GraphPoolAllocator`` (a
``StreamAllocator`` with CUDA graph private pools: ``begin_allocate_to_pool``,
``end_allocate_to_pool``, ``release_pool``) against the reference model along traces with
captures, step by step, the segments' pool ids compared too. Models
``c10/cuda/CUDACachingAllocator.cpp``: ``DeviceCachingAllocator::beginAllocateToPool``,
``endAllocateToPool``, ``releasePool``, ``get_pool``, and ``malloc``'s capture rules (no
``process_events``, no ``release_cached_blocks`` while a capture is underway). The public
checks compare with the model's recorded runs, the hidden ones with the model itself on seeded
traces (:func:`labs.allocator.traces.graph_trace`) on small GPUs and with ``max_split_size``."""

from __future__ import annotations

import random

from grader.checks import check
from labs.allocator import traces
from labs.allocator.checks import _harness
from labs.allocator.checks._harness import compare
from labs.allocator.snapshots import MiB

EXERCISE = "allocator.graph-pools"


@check(EXERCISE)
def worked_example(GraphPoolAllocator, ctx):
    """matches the reference model on section 7's capture"""
    compare(GraphPoolAllocator, traces.recorded("graph_pool"), label="section 7's capture")


@check(EXERCISE)
def public_random(GraphPoolAllocator, ctx):
    """matches it on a random trace with captures on a 192 MiB GPU"""
    compare(GraphPoolAllocator, traces.recorded("graph_random"),
            label="the public random trace with captures")


@check(EXERCISE, hidden=True)
def capture_rules(GraphPoolAllocator, ctx):
    """matches it where each rule of a capture decides: a pending block, out of memory, a
    shared pool"""
    for label, (trace, capacity) in traces.GRAPH_EDGES.items():
        compare(GraphPoolAllocator, _harness.reference_run(trace, capacity=capacity * MiB),
                label=label)


@check(EXERCISE, hidden=True)
def random_captures(GraphPoolAllocator, ctx):
    """matches it on seeded traces with captures, shared pools, destroyed graphs, small GPUs
    and max_split_size"""
    rng = random.Random(ctx.seed + 7000)
    for k in range(5):
        trace = traces.graph_trace(rng, 120, live_max=rng.choice([6, 10]))
        run = _harness.reference_run(trace, capacity=(2048, 128, 192, 160, 2048)[k] * MiB,
                                     max_split_size=(None, None, 40 * MiB, None, 20 * MiB)[k])
        compare(GraphPoolAllocator, run, label=f"hidden trace {k + 1}")
