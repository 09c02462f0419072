"""Checks of ``allocator.streams``: the learner's ``StreamAllocator`` against the reference model
along traces on two or three streams, with cross-stream uses (``record_stream``), stream syncs
(events completing), ``empty_cache`` and out-of-memory retries."""

from __future__ import annotations

import random

from grader.checks import check
from labs.allocator import model
from labs.allocator.checks._harness import compare
from labs.allocator.traces import STREAMS

EXERCISE = "allocator.streams"
MiB = model.MiB

@check(EXERCISE)
def worked_example(StreamAllocator, ctx):
    """matches the real allocator on the notebook's example"""
    compare(StreamAllocator, STREAMS, label="the notebook's example")


@check(EXERCISE)
def two_streams(StreamAllocator, ctx):
    """matches it on a seeded trace on two streams"""
    trace = model.random_trace(random.Random(ctx.seed), 80, streams=2)
    compare(StreamAllocator, trace, label=f"a random trace on 2 streams (seed {ctx.seed})")


@check(EXERCISE, hidden=True)
def three_streams(StreamAllocator, ctx):
    """matches it on seeded traces on three streams, with empty_cache and small GPUs"""
    rng = random.Random(ctx.seed + 5000)
    for k in range(6):
        trace = model.random_trace(rng, 100, streams=rng.choice([2, 3]), empty_cache=True,
                                   live_max=10)
        capacity = (2048, 160, 2048, 128, 2048, 192)[k] * MiB
        compare(StreamAllocator, trace, capacity=capacity,
                max_split_size=(None, None, 20 * MiB, None, None, 40 * MiB)[k],
                label=f"hidden trace {k + 1}")
