"""Checks of ``allocator.best-fit-split``: the learner's ``BestFitAllocator`` against the reference
model without coalescing (``CachingAllocatorModel(coalesce=False)``), step by step along traces
on one stream: same address for every malloc (best fit, lowest address on ties, the front of a
split block), same cudaMalloc calls, and the same segments and blocks (``snapshot()``)."""

from __future__ import annotations

import random

from grader.checks import check
from labs.allocator import model
from labs.allocator.checks._harness import compare
from labs.allocator.traces import BEST_FIT

EXERCISE = "allocator.best-fit-split"
MiB = model.MiB

def _traces(seed: int, count: int, n: int) -> list[list[tuple]]:
    rng = random.Random(seed)
    return [model.random_trace(rng, n, empty_cache=False) for _ in range(count)]


@check(EXERCISE)
def worked_example(BestFitAllocator, ctx):
    """matches the real allocator on the notebook's example"""
    compare(BestFitAllocator, BEST_FIT, coalesce=False, label="the notebook's example")


#: equal-size cached blocks in two segments of each pool: best fit takes the lower address
TIES = [("malloc", 1, 12 * MiB, 0), ("malloc", 2, 12 * MiB, 0), ("malloc", 3, 600_000, 0),
        ("malloc", 4, 600_000, 0), ("malloc", 5, 600_000, 0), ("malloc", 6, 600_000, 0),
        ("free", 2), ("free", 1), ("free", 5), ("free", 3), ("malloc", 7, 11 * MiB, 0),
        ("malloc", 8, 500_000, 0)]


@check(EXERCISE)
def ties(BestFitAllocator, ctx):
    """takes the lowest address among equal best fits"""
    compare(BestFitAllocator, TIES, coalesce=False, label="a trace with ties")


@check(EXERCISE)
def random_trace(BestFitAllocator, ctx):
    """matches it on a seeded random trace"""
    (trace,) = _traces(ctx.seed, 1, 60)
    compare(BestFitAllocator, trace, coalesce=False, label=f"a random trace (seed {ctx.seed})")


@check(EXERCISE, hidden=True)
def many_traces(BestFitAllocator, ctx):
    """matches it on more seeded traces"""
    for k, trace in enumerate(_traces(ctx.seed + 1000, 6, 80)):
        compare(BestFitAllocator, trace, coalesce=False, label=f"hidden trace {k + 1}")


@check(EXERCISE, hidden=True)
def max_split_size(BestFitAllocator, ctx):
    """matches it with max_split_size set"""
    for k, trace in enumerate(_traces(ctx.seed + 2000, 4, 80)):
        limit = (20 * MiB, 32 * MiB, 64 * MiB, 20 * MiB)[k]
        compare(BestFitAllocator, trace, coalesce=False, max_split_size=limit,
                label=f"hidden trace {k + 1}")
