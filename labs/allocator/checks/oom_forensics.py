"""Checks of ``allocator.oom-forensics``: ``oom_forensics(snapshot)`` on memory snapshots (the
format of ``torch.cuda.memory._snapshot()``) taken when a request ran out of memory, produced by
the reference model from seeded traces on small simulated GPUs. The expected answer is computed
here from the snapshot's trace and segments, by the definitions the exercise states."""

from __future__ import annotations

import copy
import random

from grader.checks import CheckFailure, check, exact
from labs.allocator import model
from labs.allocator.checks._harness import no_reference, size
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.traces import FRAGMENTED

EXERCISE = "allocator.oom-forensics"
MiB = model.MiB
KEYS = ("oom_request", "peak_requested", "peak_at", "reserved_unallocated",
        "largest_free_block", "culprit")

def snapshot_at_oom(trace: list[tuple], capacity: int) -> dict | None:
    """The reference model's ``memory_snapshot()`` at the first out-of-memory of ``trace`` (the
    trace stops there), or None when it never runs out."""
    gpu = SimulatedGPU(capacity)
    allocator = model.CachingAllocatorModel(gpu)

    class Stop(Exception):
        pass

    def stop(i, op, result):
        if isinstance(result, DeviceOutOfMemory):
            raise Stop

    try:
        model.replay(allocator, gpu, trace, stop)
    except Stop:
        return allocator.memory_snapshot()
    return None


def expected(snapshot: dict) -> dict:
    """The answer, by the exercise's definitions."""
    events = snapshot["device_traces"][0]
    live, total, peak, peak_at = {}, 0, 0, 0
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
            if total > peak:
                peak, peak_at = total, i
        elif e["action"] == "free_requested":
            total -= live.pop(e["addr"])
    oom = next(e for e in reversed(events) if e["action"] == "oom")
    segs = snapshot["segments"]
    pool = "small" if oom["size"] <= model.K_SMALL_SIZE else "large"
    culprit, best = None, None
    for s in segs:
        blocks = s["blocks"]
        if s["segment_type"] != pool or s["stream"] != oom["stream"]:
            continue
        for j, b in enumerate(blocks):
            if b["state"] != model.ALLOCATED:
                continue
            room = b["size"]
            for k in (j - 1, j + 1):
                if 0 <= k < len(blocks) and blocks[k]["state"] == model.INACTIVE:
                    room += blocks[k]["size"]
            if room >= oom["size"] and (best is None or (b["size"], b["address"]) < best):
                best, culprit = (b["size"], b["address"]), b["address"]
    free = [b["size"] for s in segs for b in s["blocks"] if b["state"] == model.INACTIVE]
    return {
        "oom_request": oom["size"],
        "peak_requested": peak,
        "peak_at": peak_at,
        "reserved_unallocated": sum(s["total_size"] for s in segs)
        - sum(b["size"] for s in segs for b in s["blocks"] if b["state"] == model.ALLOCATED),
        "largest_free_block": max(free, default=0),
        "culprit": culprit,
    }


_WHAT = {
    "oom_request": "the size of the request that failed (the trace's 'oom' entry)",
    "peak_requested": "the most bytes live at once (alloc to free_requested, as the trace "
                      "reports sizes)",
    "peak_at": "the index in device_traces[0] of the alloc where that peak is first reached",
    "reserved_unallocated": "reserved bytes not in allocated blocks, at the OOM",
    "largest_free_block": "the largest inactive block, at the OOM",
    "culprit": "the address of the smallest allocated block (lowest address on ties) whose "
               "freeing would leave a free block big enough for the failed request (None if "
               "none would)",
}


def _verify(oom_forensics, snapshot: dict, label: str) -> None:
    given = copy.deepcopy(snapshot)
    with no_reference():
        got = oom_forensics(given)
    exact(got, dict, "the value oom_forensics returned")
    missing = [k for k in KEYS if k not in got]
    if missing:
        raise CheckFailure(f"the dict oom_forensics returned has no {missing[0]!r} key (keys: "
                           f"{', '.join(KEYS)}).")
    want = expected(snapshot)
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
    if given != snapshot:
        raise CheckFailure("oom_forensics modified the snapshot it was given; read it only.")


def random_snapshots(seed: int, count: int) -> list[dict]:
    """Seeded snapshots at an OOM, of traces on small GPUs."""
    rng = random.Random(seed)
    found = []
    while len(found) < count:
        trace = model.random_trace(rng, 150, live_max=rng.choice([6, 10, 14]))
        snap = snapshot_at_oom(trace, rng.choice([64, 96, 128]) * MiB)
        if snap is not None:
            found.append(snap)
    return found


@check(EXERCISE)
def worked_example(oom_forensics, ctx):
    """finds what the notebook's example shows"""
    _verify(oom_forensics, snapshot_at_oom(FRAGMENTED, 100 * MiB), "the notebook's example")


@check(EXERCISE)
def random_oom(oom_forensics, ctx):
    """is right on a seeded random OOM"""
    (snap,) = random_snapshots(ctx.seed, 1)
    _verify(oom_forensics, snap, f"a random OOM (seed {ctx.seed})")


#: edge cases: the peak is reached twice (the first counts); a small-pool block would leave room
#: for the failed request, but the request is for the large pool (24 MiB GPU)
REPEATED_PEAK = [("malloc", 1, 4 * MiB, 0), ("free", 1), ("malloc", 2, 4 * MiB, 0),
                 ("malloc", 3, 100 * MiB, 0)]
OTHER_POOL = [("malloc", 1, 100_000, 0), ("malloc", 2, 9 * MiB, 0), ("malloc", 3, 10 * MiB, 0),
              ("malloc", 4, 1536 * 1024, 0)]


@check(EXERCISE, hidden=True)
def edge_cases(oom_forensics, ctx):
    """is right when the peak repeats and when another pool has room"""
    _verify(oom_forensics, snapshot_at_oom(REPEATED_PEAK, 64 * MiB), "a repeated peak")
    _verify(oom_forensics, snapshot_at_oom(OTHER_POOL, 24 * MiB), "a full large pool")


@check(EXERCISE, hidden=True)
def many_ooms(oom_forensics, ctx):
    """is right on more seeded OOMs"""
    for k, snap in enumerate(random_snapshots(ctx.seed + 6000, 8)):
        _verify(oom_forensics, snap, f"hidden OOM {k + 1}")
