"""Checks of ``allocator.round-size``: ``allocation_plan(size, divisions=0)`` against the rules of
``round_size``, ``get_pool`` and ``get_allocation_size`` (the reference model, itself compared
with the real allocator on a GPU): the public checks on the sizes of section 2's tables (the
model's recorded plans), the hidden ones at every boundary and on seeded random sizes."""

from __future__ import annotations

import random

from grader.checks import CheckFailure, check, exact, paired
from labs.allocator import probes, traces
from labs.allocator.checks import _harness
from labs.allocator.checks._harness import MODEL, refuse_oracle, size
from labs.allocator.snapshots import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    GiB,
    MiB,
)

EXERCISE = "allocator.round-size"


def _verify(allocation_plan, cases: list[tuple[int, int]], plan) -> None:
    """Compare ``allocation_plan`` on ``cases`` with ``plan(size, divisions)`` (the model's)."""
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
        want = tuple(plan(request, divisions))
        if got == want:
            continue
        names = ("block size", "pool", "segment size")
        i = next(k for k in range(3) if got[k] != want[k])
        shown = (lambda v: repr(v)) if i == 1 else size
        setting = f" with roundup_power2_divisions={divisions}" if divisions else ""
        raise CheckFailure(
            f"for a request of {size(request)}{setting}, your {names[i]} is {shown(got[i])}; "
            f"{MODEL} says {shown(want[i])}.")


def boundaries() -> list[int]:
    """Every size where a rule changes, with its neighbours."""
    edges = [K_MIN_BLOCK_SIZE, 2 * K_MIN_BLOCK_SIZE, K_SMALL_SIZE, K_SMALL_BUFFER,
             K_MIN_LARGE_ALLOC, K_LARGE_BUFFER, K_MIN_LARGE_ALLOC + K_ROUND_LARGE, 64 * MiB, GiB]
    return sorted({e + d for e in edges for d in (-513, -512, -1, 0, 1, 511, 512) if e + d > 0})


@check(EXERCISE)
def examples(allocation_plan, ctx):
    """matches the reference model on the sizes of section 2's table"""
    _verify(allocation_plan, [c for c in traces.PLANS if c[1] == 0], traces.recorded_plan)


@check(EXERCISE)
def divisions(allocation_plan, ctx):
    """matches it with roundup_power2_divisions set"""
    _verify(allocation_plan, [c for c in traces.PLANS if c[1]], traces.recorded_plan)


@check(EXERCISE, hidden=True)
def every_boundary(allocation_plan, ctx):
    """matches it at every boundary of the rules"""
    cases = [(n, 0) for n in boundaries()]
    _verify(allocation_plan, cases, _harness.reference_model().allocation_plan)


@check(EXERCISE, hidden=True)
def random_sizes(allocation_plan, ctx):
    """matches it on seeded random sizes, with and without divisions"""
    rng = random.Random(ctx.seed)
    cases = [(traces.interesting_size(rng), 0) for _ in range(300)]
    cases += [(rng.randint(1, 2 * GiB), rng.choice([0, 1, 2, 4, 8, 16])) for _ in range(300)]
    cases += [(1 << rng.randint(9, 34), rng.choice([2, 4, 8])) for _ in range(20)]
    _verify(allocation_plan, cases, _harness.reference_model().allocation_plan)
