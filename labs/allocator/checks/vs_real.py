"""Checks of ``allocator.vs-real`` (needs a CUDA GPU): ``replay_on_cuda(trace)`` runs a trace on the
real caching allocator and returns ``torch.cuda.memory_stats()`` after each step; the statistics
must be those the reference model predicts (so the model, and the learner's, which exercises 2-4
compared with it, predict the real allocator): the public check along a trace the model's run of
which is recorded, the hidden ones along seeded traces the model runs here."""

from __future__ import annotations

import random

from grader.checks import CheckFailure, check, exact
from labs.allocator import probes, traces
from labs.allocator.checks import _harness
from labs.allocator.checks._harness import refuse_oracle, size, story
from labs.allocator.snapshots import STAT_NAMES, GiB

EXERCISE = "allocator.vs-real"
COMPARED = [f"{name}.{scope}.current" for name in STAT_NAMES
            for scope in ("all", "small_pool", "large_pool")]


def _verify(replay_on_cuda, run: traces.Run, label: str) -> None:
    """``replay_on_cuda(run.trace)`` against the statistics of the model's ``run`` of it."""
    trace = run.trace
    seen = replay_on_cuda.probe(probes.on_cuda, [list(op) for op in trace])
    if seen["reserved"]:
        raise CheckFailure(
            f"{size(seen['reserved'])} of CUDA memory is still reserved after "
            "empty_cache(): some CUDA tensor of the notebook is alive. Delete it (del t) before "
            "this check, so the replay starts from an empty allocator.")
    refuse_oracle(seen["oracle"])
    got, allocations = seen["result"], seen["allocations"]
    mallocs = sum(op[0] == "malloc" for op in trace)
    if allocations < mallocs:
        raise CheckFailure(
            f"replay_on_cuda made {allocations} allocation(s) on the GPU for a trace of {mallocs} "
            "mallocs: run every malloc of the trace as a CUDA tensor on the real allocator.")
    exact(got, list, "the value replay_on_cuda returned")
    if len(got) != len(trace):
        raise CheckFailure(f"replay_on_cuda returned {len(got)} dicts for a trace of "
                           f"{len(trace)} steps; return memory_stats() after every step.")
    for step, (stats, ref) in enumerate(zip(got, run.steps), 1):
        exact(stats, dict, f"the stats of step {step}")
        want = ref.stats
        for key in COMPARED:
            if stats.get(key, 0) != want[key]:
                raise CheckFailure(
                    f"on {label}, after step {step}, {key} is {stats.get(key)} on the GPU (the "
                    f"real allocator) and {want[key]} in the reference model. Steps so far: "
                    f"{story(trace, step)}.")


@check(EXERCISE)
def one_stream(replay_on_cuda, ctx):
    """the real allocator's stats are the model's, along a random trace on one stream"""
    _verify(replay_on_cuda, traces.recorded("vs_real_random"), "the public random trace")


@check(EXERCISE, hidden=True)
def two_streams(replay_on_cuda, ctx):
    """and along seeded traces on two streams with empty_cache"""
    rng = random.Random(ctx.seed + 7000)
    for k in range(3):
        trace = traces.random_trace(rng, 80, streams=2, empty_cache=True)
        run = _harness.reference_run(trace, capacity=64 * GiB)
        _verify(replay_on_cuda, run, f"hidden trace {k + 1}")
