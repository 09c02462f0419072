"""Checks of ``allocator.streams``: the learner's ``StreamAllocator`` against the reference model
along traces on two or three streams, with cross-stream uses (``record_stream``), stream syncs
(events completing), ``empty_cache`` and out-of-memory retries."""

from __future__ import annotations

import random

from grader.checks import check
from labs.allocator import model
from labs.allocator.checks._harness import compare

EXERCISE = "allocator.streams"
MiB = model.MiB

#: the notebook's example: a block freed on stream 0 is not reused by stream 1; a block used on
#: stream 1 is pending free until stream 1's work is done
EXAMPLE = [("malloc", 1, 4 * MiB, 0), ("free", 1), ("malloc", 2, 4 * MiB, 1),
           ("malloc", 3, 4 * MiB, 0), ("use", 3, 1), ("free", 3), ("malloc", 4, 4 * MiB, 0),
           ("sync", 1), ("malloc", 5, 4 * MiB, 0), ("malloc", 6, 100_000, 0), ("use", 6, 1),
           ("free", 6), ("empty_cache",)]


@check(EXERCISE)
def worked_example(StreamAllocator, ctx):
    """matches the real allocator on the notebook's example"""
    compare(StreamAllocator, EXAMPLE, label="the notebook's example")


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
