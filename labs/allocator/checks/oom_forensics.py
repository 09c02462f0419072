"""Checks of ``allocator.oom-forensics``: ``oom_forensics(snapshot)`` on memory snapshots (the
format of ``torch.cuda.memory._snapshot()``) taken when a request ran out of memory, produced by
the reference model from traces on small simulated GPUs. The expected answer is read from the
model as it replays the trace (``labs.allocator.model.oom_case``); ``tests/`` checks that it
agrees with the exercise's definitions applied to the snapshot. The public checks use the
model's recorded cases, the hidden ones the model itself on seeded traces."""

from __future__ import annotations

from grader.checks import CheckFailure, check, exact
from labs.allocator import probes, traces
from labs.allocator.checks import _harness
from labs.allocator.checks._harness import refuse_oracle, size
from labs.allocator.snapshots import MiB

EXERCISE = "allocator.oom-forensics"
KEYS = ("oom_request", "peak_requested", "peak_at", "reserved_unallocated",
        "largest_free_block", "culprit")

_WHAT = {
    "oom_request": "the size of the request that failed: the trace's last 'oom' entry (the "
                   "snapshot is taken at that failure; an earlier 'oom' entry is a failure the "
                   "program survived)",
    "peak_requested": "the most bytes live at once, as the trace reports sizes: an allocation is "
                      "live from its 'alloc' event to its 'free_requested' event, not to its "
                      "'free_completed' (which comes later for a block used on another stream)",
    "peak_at": "the index in device_traces[0] of the alloc where that peak is first reached",
    "reserved_unallocated": "reserved bytes not in allocated blocks, at the OOM",
    "largest_free_block": "the largest inactive block, at the OOM",
    "culprit": "the address of the smallest allocated block (lowest address on ties) whose "
               "freeing would leave a free block big enough for the failed request (None if "
               "none would)",
}


def _verify(oom_forensics, case: tuple[dict, dict], label: str) -> None:
    snapshot, want = case
    seen = oom_forensics.probe(probes.forensics, snapshot)
    refuse_oracle(seen["oracle"])
    got = seen["result"]
    exact(got, dict, "the value oom_forensics returned")
    missing = [k for k in KEYS if k not in got]
    if missing:
        raise CheckFailure(f"the dict oom_forensics returned has no {missing[0]!r} key (keys: "
                           f"{', '.join(KEYS)}).")
    for key in KEYS:
        value = got[key]
        if key == "culprit" and value is None:
            pass
        else:
            exact(value, int, f"{key!r} in the dict oom_forensics returned")
        if value != want[key]:
            fmt = ((lambda v: "None" if v is None else f"{v:#x}") if key == "culprit" else
                   (lambda v: str(v)) if key == "peak_at" else size)
            raise CheckFailure(
                f"on {label}, {key!r} is {fmt(value)}; it should be {fmt(want[key])}: "
                f"{_WHAT[key]}.")
    if seen["modified"]:
        raise CheckFailure("oom_forensics modified the snapshot it was given; read it only.")


@check(EXERCISE)
def worked_example(oom_forensics, ctx):
    """finds what the notebook's example shows"""
    _verify(oom_forensics, traces.recorded_oom("fragmented"), "the notebook's example")


@check(EXERCISE)
def random_oom(oom_forensics, ctx):
    """is right on a random OOM"""
    _verify(oom_forensics, traces.recorded_oom("random"), "the public random OOM")


#: edge cases: the peak is reached twice (the first counts); a small-pool block would leave room
#: for the failed request, but the request is for the large pool (24 MiB GPU)
REPEATED_PEAK = [("malloc", 1, 4 * MiB, 0), ("free", 1), ("malloc", 2, 4 * MiB, 0),
                 ("malloc", 3, 100 * MiB, 0)]
OTHER_POOL = [("malloc", 1, 100_000, 0), ("malloc", 2, 9 * MiB, 0), ("malloc", 3, 10 * MiB, 0),
              ("malloc", 4, 1536 * 1024, 0)]
#: #1, used on stream 1, is freed (free_requested) but pending until its event completes
#: (free_completed, in the OOM's release_cached_blocks): #2 is allocated in between. Live until
#: free_requested, the peak is 30 MiB at #1's alloc; counted until free_completed, 50 MiB at #2's
#: (64 MiB GPU)
PENDING_PEAK = [("malloc", 1, 30 * MiB, 0), ("use", 1, 1), ("free", 1),
                ("malloc", 2, 20 * MiB, 0), ("malloc", 3, 100 * MiB, 0)]
#: two OOMs: 100 MiB fails and the program goes on; the snapshot is taken at the second, a
#: 12 MiB request that freeing #3 would serve (64 MiB GPU)
TWO_OOMS = [("malloc", 1, 40 * MiB, 0), ("malloc", 2, 100 * MiB, 0), ("malloc", 3, 20 * MiB, 0),
            ("malloc", 4, 12 * MiB, 0)]


@check(EXERCISE, hidden=True)
def edge_cases(oom_forensics, ctx):
    """is right at a repeated peak, another pool's room, a pending block and a second OOM"""
    model = _harness.reference_model()
    _verify(oom_forensics, model.oom_case(REPEATED_PEAK, 64 * MiB), "a repeated peak")
    _verify(oom_forensics, model.oom_case(OTHER_POOL, 24 * MiB), "a full large pool")
    _verify(oom_forensics, model.oom_case(PENDING_PEAK, 64 * MiB),
            "a block freed while another stream still used it")
    _verify(oom_forensics, model.oom_case(TWO_OOMS, 64 * MiB, ooms=2),
            "a snapshot taken at a second out-of-memory error")


@check(EXERCISE, hidden=True)
def many_ooms(oom_forensics, ctx):
    """is right on more seeded OOMs"""
    for k, case in enumerate(_harness.reference_model().random_oom_cases(ctx.seed + 6000, 8)):
        _verify(oom_forensics, case, f"hidden OOM {k + 1}")
