"""Checks of ``allocator.round-size``: ``allocation_plan(size, divisions=0)`` against the rules of
``round_size``, ``get_pool`` and ``get_allocation_size`` (the reference model, itself compared
with the real allocator on a GPU), at every boundary and on seeded random sizes."""

from __future__ import annotations

import random

from grader.checks import CheckFailure, check, exact, paired
from labs.allocator import model
from labs.allocator import probes
from labs.allocator.checks._harness import refuse_oracle, size

EXERCISE = "allocator.round-size"
MiB = model.MiB


def _verify(allocation_plan, cases: list[tuple[int, int]]) -> None:
    seen = allocation_plan.probe(probes.plans, [list(c) for c in cases])
    refuse_oracle(seen["oracle"])
    for (request, divisions), got in paired(cases, seen["plans"], "sizes"):
        what = f"allocation_plan({request}{f', {divisions}' if divisions else ''})"
        exact(got, tuple, f"the value {what} returned")
        if len(got) != 3:
            raise CheckFailure(f"{what} returned {len(got)} values; return (block size, pool, "
                               "segment size).")
        exact(got[0], int, f"the block size {what} returned")
        exact(got[1], str, f"the pool {what} returned")
        exact(got[2], int, f"the segment size {what} returned")
        want = model.allocation_plan(request, divisions)
        if got == want:
            continue
        names = ("block size", "pool", "segment size")
        i = next(k for k in range(3) if got[k] != want[k])
        shown = (lambda v: repr(v)) if i == 1 else size
        setting = f" with roundup_power2_divisions={divisions}" if divisions else ""
        raise CheckFailure(
            f"for a request of {size(request)}{setting}, your {names[i]} is {shown(got[i])}; the "
            f"real allocator's is {shown(want[i])}.")


def boundaries() -> list[int]:
    """Every size where a rule changes, with its neighbours."""
    edges = [model.K_MIN_BLOCK_SIZE, 2 * model.K_MIN_BLOCK_SIZE, model.K_SMALL_SIZE,
             model.K_SMALL_BUFFER, model.K_MIN_LARGE_ALLOC, model.K_LARGE_BUFFER,
             model.K_MIN_LARGE_ALLOC + model.K_ROUND_LARGE, 64 * MiB, model.GiB]
    return sorted({e + d for e in edges for d in (-513, -512, -1, 0, 1, 511, 512) if e + d > 0})


@check(EXERCISE)
def examples(allocation_plan, ctx):
    """matches the real allocator on the sizes of section 2's table"""
    sizes = (1, 512, 513, 1000, MiB, MiB + 1, 5 * MiB, 10 * MiB - 1, 10 * MiB + 1, 25 * MiB)
    _verify(allocation_plan, [(n, 0) for n in sizes])


@check(EXERCISE)
def divisions(allocation_plan, ctx):
    """matches it with roundup_power2_divisions set"""
    _verify(allocation_plan, [(1200, 4), (1200, 2), (5 * MiB + 7, 4), (300 * MiB, 8)])


@check(EXERCISE, hidden=True)
def every_boundary(allocation_plan, ctx):
    """matches it at every boundary of the rules"""
    _verify(allocation_plan, [(n, 0) for n in boundaries()])


@check(EXERCISE, hidden=True)
def random_sizes(allocation_plan, ctx):
    """matches it on seeded random sizes, with and without divisions"""
    rng = random.Random(ctx.seed)
    cases = [(model.interesting_size(rng), 0) for _ in range(300)]
    cases += [(rng.randint(1, 2 * model.GiB), rng.choice([0, 1, 2, 4, 8, 16])) for _ in range(300)]
    cases += [(1 << rng.randint(9, 34), rng.choice([2, 4, 8])) for _ in range(20)]
    _verify(allocation_plan, cases)
