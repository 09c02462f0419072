"""Checks of ``allocator.streams``: the learner's ``StreamAllocator`` against the reference model
along traces on two or three streams, with cross-stream uses (``record_stream``), stream syncs
(events completing), ``empty_cache`` and out-of-memory retries. The public checks compare with
the model's recorded runs, the hidden ones with the model itself on seeded traces."""

from __future__ import annotations

import random

from grader.checks import check
from labs.allocator import traces
from labs.allocator.checks import _harness
from labs.allocator.checks._harness import compare
from labs.allocator.snapshots import MiB

EXERCISE = "allocator.streams"


@check(EXERCISE)
def worked_example(StreamAllocator, ctx):
    """matches the reference model on the notebook's example"""
    compare(StreamAllocator, traces.recorded("streams"), label="the notebook's example")


@check(EXERCISE)
def two_streams(StreamAllocator, ctx):
    """matches it on a random trace on two streams"""
    compare(StreamAllocator, traces.recorded("streams_random"),
            label="the public random trace on 2 streams")


@check(EXERCISE, hidden=True)
def three_streams(StreamAllocator, ctx):
    """matches it on seeded traces on three streams, with empty_cache and small GPUs"""
    rng = random.Random(ctx.seed + 5000)
    for k in range(6):
        trace = traces.random_trace(rng, 100, streams=rng.choice([2, 3]), empty_cache=True,
                                    live_max=10)
        run = _harness.reference_run(trace, capacity=(2048, 160, 2048, 128, 2048, 192)[k] * MiB,
                            max_split_size=(None, None, 20 * MiB, None, None, 40 * MiB)[k])
        compare(StreamAllocator, run, label=f"hidden trace {k + 1}")
