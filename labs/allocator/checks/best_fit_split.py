"""Checks of ``allocator.best-fit-split``: the learner's ``BestFitAllocator`` against the reference
model without coalescing (``CachingAllocatorModel(coalesce=False)``), step by step along traces
on one stream: same address for every malloc (best fit, lowest address on ties, the front of a
split block), same cudaMalloc calls, and the same segments and blocks (``snapshot()``). The
public checks compare with the model's recorded runs, the hidden ones with the model itself on
seeded traces."""

from __future__ import annotations

import random

from grader.checks import check
from labs.allocator import traces
from labs.allocator.checks import _harness
from labs.allocator.checks._harness import compare
from labs.allocator.snapshots import MiB

EXERCISE = "allocator.best-fit-split"


def _seeded_runs(seed: int, count: int, n: int, max_split_size: list | None = None) -> list:
    rng = random.Random(seed)
    limits = max_split_size or [None] * count
    return [_harness.reference_run(traces.random_trace(rng, n, empty_cache=False), coalesce=False,
                          max_split_size=limits[k]) for k in range(count)]


@check(EXERCISE)
def worked_example(BestFitAllocator, ctx):
    """matches the reference model on the notebook's example"""
    compare(BestFitAllocator, traces.recorded("best_fit"), label="the notebook's example")


@check(EXERCISE)
def ties(BestFitAllocator, ctx):
    """takes the lowest address among equal best fits"""
    compare(BestFitAllocator, traces.recorded("ties"), label="a trace with ties")


@check(EXERCISE)
def random_trace(BestFitAllocator, ctx):
    """matches it on a random trace"""
    compare(BestFitAllocator, traces.recorded("best_fit_random"), label="the public random trace")


@check(EXERCISE, hidden=True)
def many_traces(BestFitAllocator, ctx):
    """matches it on more seeded traces"""
    for k, run in enumerate(_seeded_runs(ctx.seed + 1000, 6, 80)):
        compare(BestFitAllocator, run, label=f"hidden trace {k + 1}")


#: get_free_block's max_non_split_rounding boundary, with max_split_size 40 MiB: a cached 60 MiB
#: block is exactly 20 MiB bigger than a 40 MiB request, so it is refused and a 40 MiB segment is
#: made (as on an H200); a 42 MiB request then takes it whole (18 MiB bigger)
ROUNDING_LIMIT = [("malloc", 1, 60 * MiB, 0), ("free", 1), ("malloc", 2, 40 * MiB, 0),
                  ("free", 2), ("malloc", 3, 42 * MiB, 0)]


@check(EXERCISE, hidden=True)
def oversize_rounding(BestFitAllocator, ctx):
    """hands out an oversize block only if it is less than 20 MiB bigger than the request"""
    run = _harness.reference_run(ROUNDING_LIMIT, coalesce=False, max_split_size=40 * MiB)
    compare(BestFitAllocator, run, label="the max_non_split_rounding boundary")


@check(EXERCISE, hidden=True)
def max_split_size(BestFitAllocator, ctx):
    """matches it with max_split_size set"""
    limits = [20 * MiB, 32 * MiB, 64 * MiB, 20 * MiB]
    for k, run in enumerate(_seeded_runs(ctx.seed + 2000, 4, 80, limits)):
        compare(BestFitAllocator, run, label=f"hidden trace {k + 1}")
