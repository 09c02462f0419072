"""Lab 3's traces and what the reference model did on them.

A *trace* is a list of ops, each a tuple (see :func:`replay`). This module holds the worked
examples that the notebook walks through and the exercises' first checks replay (so the two
cannot drift apart), the functions that run a trace through any allocator and draw random ones,
and :func:`recorded`: what the lab's reference model (``labs/allocator/model.py``, which stays
with the instructor: it answers the exercises) did on each trace the notebook shows and the
public checks replay, step by step, read from ``recorded.json`` (written by ``python -m
labs.allocator.model``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from pathlib import Path

from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.snapshots import (
    ALLOCATED,
    INACTIVE,
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    PENDING_FREE,
    KiB,
    MiB,
    format_bytes,
    stats_from_segments,
)

#: what :func:`recorded` reads
RECORDED = Path(__file__).with_name("recorded.json")


#: section 3: small requests share a 2 MiB segment; a 5 MiB request splits a 20 MiB one whose
#: remainder a 12 MiB request then splits; freed blocks are reused by best fit; a 2 MiB request
#: takes a whole 3 MiB block (1 MiB would remain: no split); 16 MiB gets a segment of its own
BEST_FIT = [
    ("malloc", 1, 1000, 0),
    ("malloc", 2, 3000, 0),
    ("malloc", 3, 5 * MiB, 0),
    ("malloc", 4, 12 * MiB, 0),
    ("free", 1),
    ("malloc", 5, 700, 0),
    ("malloc", 6, 9 * MiB, 0),
    ("free", 3),
    ("malloc", 7, 2 * MiB, 0),
    ("malloc", 8, 16 * MiB, 0),
]

#: section 4: four small blocks freed out of order merge back into one segment; empty_cache frees
#: it only once it is whole
COALESCE = [("malloc", h, 300_000, 0) for h in (1, 2, 3, 4)] + [
    ("free", 2),
    ("free", 4),
    ("empty_cache",),
    ("free", 3),
    ("free", 1),
    ("empty_cache",),
]

#: section 4: on a 100 MiB GPU, a cached 30 MiB segment is freed to make room for 50 MiB; 80 MiB
#: then fails even after the retry
OUT_OF_MEMORY = [
    ("malloc", 1, 30 * MiB, 0),
    ("malloc", 2, 30 * MiB, 0),
    ("free", 1),
    ("malloc", 3, 50 * MiB, 0),
    ("malloc", 4, 80 * MiB, 0),
]

#: section 5: streams do not share cached blocks; a block used on stream 1 is pending free until
#: stream 1's work is done
STREAMS = [
    ("malloc", 1, 4 * MiB, 0),
    ("free", 1),
    ("malloc", 2, 4 * MiB, 1),
    ("malloc", 3, 4 * MiB, 0),
    ("use", 3, 1),
    ("free", 3),
    ("malloc", 4, 4 * MiB, 0),
    ("sync", 1),
    ("malloc", 5, 4 * MiB, 0),
]

#: section 6: 18 MiB are cached but split around a live 2 MiB block, so a 12 MiB request finds
#: no block, and no room, on a 100 MiB GPU
FRAGMENTED = [
    ("malloc", 1, 8 * MiB, 0),
    ("malloc", 2, 2 * MiB, 0),
    ("malloc", 3, 8 * MiB, 0),
    ("malloc", 4, 100_000, 0),
    ("free", 1),
    ("free", 3),
    ("malloc", 5, 78 * MiB, 0),
    ("malloc", 6, 12 * MiB, 0),
]


#: equal-size cached blocks in two segments of each pool: best fit takes the lower address
TIES = [("malloc", 1, 12 * MiB, 0), ("malloc", 2, 12 * MiB, 0), ("malloc", 3, 600_000, 0),
        ("malloc", 4, 600_000, 0), ("malloc", 5, 600_000, 0), ("malloc", 6, 600_000, 0),
        ("free", 2), ("free", 1), ("free", 5), ("free", 3), ("malloc", 7, 11 * MiB, 0),
        ("malloc", 8, 500_000, 0)]

#: section 1: a training loop's shapes, allocated and freed ten times: 50 mallocs, few cudaMallocs
LOOP = [op for step in range(10) for op in
        [("malloc", 5 * step + k + 1, n, 0)
         for k, n in enumerate((4 * MiB, 300 * KiB, 4 * MiB, 12 * MiB, 3000))]
        + [("free", 5 * step + k + 1) for k in range(5)]]

#: section 3: ``max_split_size``: a cached 64 MiB block is split for 3 MiB without a limit, and
#: not with one (32 MiB): oversize blocks serve only requests close to their size
MAX_SPLIT = [("malloc", 1, 64 * MiB, 0), ("free", 1), ("malloc", 2, 3 * MiB, 0),
             ("malloc", 3, 50 * MiB, 0), ("malloc", 4, 40 * MiB, 0), ("free", 3),
             ("malloc", 5, 36 * MiB, 0)]

#: section 7: a CUDA graph's capture on stream 1 allocates from the private pool (1, 0); its
#: segment survives ``empty_cache`` until the graph is destroyed (``release_pool``)
GRAPH_POOL = [("begin_pool", (1, 0), 1), ("malloc", 1, 3 * MiB, 1), ("end_pool", (1, 0)),
              ("free", 1), ("malloc", 2, 3 * MiB, 1), ("free", 2), ("empty_cache",),
              ("release_pool", (1, 0)), ("empty_cache",)]

#: allocator.graph-pools' fixed hidden cases, each a rule of a capture: (trace, capacity in MiB)
GRAPH_EDGES = {
    # a block freed before the capture, its event complete: no process_events during the
    # capture (a new segment for #2), the next malloc after it frees and reuses the block
    "a pending block during a capture": ([
        ("malloc", 1, 3 * MiB, 0), ("use", 1, 1), ("free", 1), ("sync", 1),
        ("begin_pool", (1, 0), 2), ("malloc", 2, 3 * MiB, 0), ("end_pool", (1, 0)),
        ("malloc", 3, 3 * MiB, 0)], 2048),
    # out of memory in a capture: no release_cached_blocks, so the cached 40 MiB stays
    "out of memory during a capture": ([
        ("malloc", 1, 40 * MiB, 0), ("free", 1), ("begin_pool", (1, 0), 1),
        ("malloc", 2, 30 * MiB, 1), ("end_pool", (1, 0)), ("malloc", 3, 30 * MiB, 1)], 64),
    # two graphs share a pool: a block freed in the first capture serves the second; the
    # capturing stream's requests after a capture go to the default pool; the pool's segment
    # survives empty_cache until both graphs are destroyed
    "a pool two graphs share": ([
        ("begin_pool", (1, 0), 1), ("malloc", 1, 3 * MiB, 1), ("free", 1), ("end_pool", (1, 0)),
        ("begin_pool", (1, 0), 1), ("malloc", 2, 3 * MiB, 1), ("end_pool", (1, 0)),
        ("malloc", 3, 3 * MiB, 1), ("free", 2), ("free", 3), ("release_pool", (1, 0)),
        ("empty_cache",), ("release_pool", (1, 0)), ("empty_cache",)], 2048),
}

#: section 2's tables: (request in bytes, roundup_power2_divisions) whose plans are recorded
PLANS = [(n, 0) for n in (1, 512, 513, 1000, MiB, MiB + 1, 5 * MiB, 10 * MiB - 1, 10 * MiB + 1,
                         25 * MiB, 1200, 5 * MiB + 7, 300 * MiB)]
PLANS += [(1200, 2), (1200, 4), (5 * MiB + 7, 4), (5 * MiB + 7, 8), (300 * MiB, 4),
          (300 * MiB, 8)]


# ------------------------------------------------------------------ running a trace
def apply_op(allocator, gpu: SimulatedGPU, op: tuple, live: dict):
    """Run one op of a trace (see :func:`replay`) through ``allocator`` on ``gpu``; ``live``
    maps handles to addresses and is updated. Returns what malloc returned, or the
    DeviceOutOfMemory it raised, else None."""
    kind = op[0]
    if kind == "malloc":
        try:
            live[op[1]] = allocator.malloc(op[2], op[3])
        except DeviceOutOfMemory as exc:
            return exc
        return live[op[1]]
    if kind == "free" and op[1] in live:
        allocator.free(live.pop(op[1]))
    elif kind == "use" and op[1] in live:
        gpu.launch(op[2])
        allocator.record_stream(live[op[1]], op[2])
    elif kind == "sync":
        gpu.synchronize(op[1])
    elif kind == "empty_cache":
        allocator.empty_cache()
    elif kind == "begin_pool":
        allocator.begin_allocate_to_pool(tuple(op[1]), op[2])
    elif kind == "end_pool":
        allocator.end_allocate_to_pool(tuple(op[1]))
    elif kind == "release_pool":
        allocator.release_pool(tuple(op[1]))
    return None


def replay(allocator, gpu: SimulatedGPU, trace: list[tuple], after_step=None) -> dict:
    """Run ``trace`` on ``allocator`` (an object with ``malloc``/``free``, and
    ``record_stream``/``empty_cache`` when the trace uses them) over ``gpu``.

    A trace is a list of tuples: ``("malloc", handle, size, stream)``, ``("free", handle)``,
    ``("use", handle, stream)`` (a kernel on ``stream`` uses the block: ``gpu.launch`` then
    ``record_stream``), ``("sync", stream)`` (the stream's work finishes) and
    ``("empty_cache",)``; the reference model also takes a CUDA graph's
    ``("begin_pool", pool_id, stream)``, ``("end_pool", pool_id)`` and
    ``("release_pool", pool_id)`` (``beginAllocateToPool``, ``endAllocateToPool``,
    ``releasePool``). Handles name allocations; an op on the handle of a failed malloc is
    skipped. ``after_step(i, op, result)`` is called after each op (``result`` is the address
    a malloc returned, the DeviceOutOfMemory it raised, or None). Returns handle -> address of
    the live allocations.
    """
    live: dict[int, int] = {}
    for i, op in enumerate(trace):
        result = apply_op(allocator, gpu, op, live)
        if after_step is not None:
            after_step(i, op, result)
    return live


def describe(op: tuple, exact: bool = False) -> str:
    """One op of a trace in words: ``#3 = malloc(5 MiB, stream 0)``, ``free(#3)``, ..."""
    kind = op[0]
    if kind == "malloc":
        return f"#{op[1]} = malloc({format_bytes(op[2], exact)}, stream {op[3]})"
    if kind == "free":
        return f"free(#{op[1]})"
    if kind == "use":
        return f"#{op[1]} used on stream {op[2]} (record_stream)"
    if kind == "sync":
        return f"stream {op[1]} finishes its work"
    if kind == "begin_pool":
        return f"capture on stream {op[2]} begins: private pool {tuple(op[1])}"
    if kind == "end_pool":
        return f"capture into pool {tuple(op[1])} ends"
    if kind == "release_pool":
        return f"the graph of pool {tuple(op[1])} is destroyed (release_pool)"
    return "empty_cache()"


def interesting_size(rng: random.Random, large: bool = True) -> int:
    """A request size (bytes) near the allocator's boundaries or drawn across its ranges."""
    edges = [K_MIN_BLOCK_SIZE, K_SMALL_SIZE, K_SMALL_BUFFER, K_MIN_LARGE_ALLOC, K_LARGE_BUFFER]
    if large:
        edges += [K_SMALL_SIZE + K_SMALL_SIZE // 2, 12 * MiB, 18 * MiB, 19 * MiB, 64 * MiB]
    pick = rng.random()
    if pick < 0.3:
        return max(1, rng.choice(edges) + rng.choice([-1, 0, 1, -512, 512]))
    if pick < 0.65 or not large:
        return rng.randint(1, K_SMALL_SIZE)
    if pick < 0.85:
        return rng.randint(K_SMALL_SIZE + 1, K_MIN_LARGE_ALLOC)
    return rng.randint(K_MIN_LARGE_ALLOC, 80 * MiB)


def random_trace(rng: random.Random, n: int, *, streams: int = 1, large: bool = True,
                 empty_cache: bool = False, live_max: int = 12) -> list[tuple]:
    """A seeded trace of ``n`` ops: mallocs of :func:`interesting_size` sizes, frees in random
    order (keeping at most ``live_max`` live), and, with ``streams`` > 1, requests on several
    streams, cross-stream uses and stream syncs; ``empty_cache`` adds some ``empty_cache`` calls."""
    trace: list[tuple] = []
    live: list[int] = []
    handle = 0
    while len(trace) < n:
        pick = rng.random()
        if live and (len(live) >= live_max or pick < 0.4):
            trace.append(("free", live.pop(rng.randrange(len(live)))))
        elif streams > 1 and live and pick < 0.55:
            trace.append(("use", rng.choice(live), rng.randrange(streams)))
        elif streams > 1 and pick < 0.62:
            trace.append(("sync", rng.randrange(streams)))
        elif empty_cache and pick < 0.66:
            trace.append(("empty_cache",))
        else:
            handle += 1
            trace.append(("malloc", handle, interesting_size(rng, large), rng.randrange(streams)))
            live.append(handle)
    return trace


def graph_trace(rng: random.Random, n: int, *, live_max: int = 10) -> list[tuple]:
    """A seeded trace of ``n`` ops with CUDA graph captures. Outside a capture: mallocs, frees,
    uses and syncs on streams 0 to 2 (as :func:`random_trace` makes them), ``empty_cache``, and
    now and then a graph destroyed (``release_pool`` of a pool a graph holds) or a capture
    begun on stream 1 or 2, into a new private pool or (sharing it, ``pool=g.pool()``) one a
    graph holds. During a capture (2 to 8 ops): mallocs on the capturing stream and on others,
    and frees of blocks no other stream used; none of what would break a real capture (a
    stream sync, ``empty_cache``) or what the exercise leaves out (a free deferred until the
    capture ends). Pool ids are ``(k, 0)``, a new ``k`` for each new pool."""
    trace: list[tuple] = []
    live: list[int] = []
    used: set[int] = set()  # handles used on another stream (record_stream)
    held: dict[tuple, int] = {}  # pool id -> graphs that hold it
    handle, pools, capture, left = 0, 0, None, 0

    def malloc(stream: int) -> None:
        nonlocal handle
        handle += 1
        trace.append(("malloc", handle, interesting_size(rng), stream))
        live.append(handle)

    while len(trace) < n:
        pick = rng.random()
        if capture is not None:
            plain = [h for h in live if h not in used]
            if left == 0:
                trace.append(("end_pool", capture[0]))
                capture = None
            elif plain and (len(live) >= live_max or pick < 0.35):
                gone = plain[rng.randrange(len(plain))]
                live.remove(gone)
                trace.append(("free", gone))
            else:
                malloc(capture[1] if pick < 0.8 else rng.randrange(3))
            left -= 1
        elif pick < 0.08:
            shared = [pool for pool, count in held.items() if count > 0]
            if shared and rng.random() < 0.3:
                pool = rng.choice(shared)
            else:
                pools += 1
                pool = (pools, 0)
            held[pool] = held.get(pool, 0) + 1
            capture, left = (pool, rng.choice([1, 2])), rng.randint(2, 8)
            trace.append(("begin_pool", pool, capture[1]))
        elif pick < 0.13 and any(held.values()):
            pool = rng.choice([pool for pool, count in held.items() if count > 0])
            held[pool] -= 1
            trace.append(("release_pool", pool))
        elif pick < 0.17:
            trace.append(("empty_cache",))
        elif live and (len(live) >= live_max or pick < 0.5):
            gone = live.pop(rng.randrange(len(live)))
            used.discard(gone)
            trace.append(("free", gone))
        elif live and pick < 0.6:
            chosen = rng.choice(live)
            used.add(chosen)
            trace.append(("use", chosen, rng.randrange(3)))
        elif pick < 0.66:
            trace.append(("sync", rng.randrange(3)))
        else:
            malloc(rng.randrange(3))
    if capture is not None:
        trace.append(("end_pool", capture[0]))
    return trace


# ------------------------------------------------------------------ what the model did
@dataclasses.dataclass(frozen=True)
class Step:
    """The state of an allocator after one op of a trace.

    ``index``: the op's number, counted from 1; ``op``: the trace's tuple; ``text``: the op in
    words; ``result``: the address a malloc returned, the DeviceOutOfMemory it raised, or None
    for other ops; ``segments``: the ``snapshot()`` after the op; ``stats``: the
    ``"<stat>.<pool>.current"`` values of ``memory_stats()`` computed from those segments
    (bytes and counts); ``calls``: the ``SimulatedGPU.log`` entries the op made
    (``("cudaMalloc", nbytes, ptr or None)``, ``("cudaFree", ptr, nbytes)``, event calls);
    ``rounded``: the block size (bytes) a malloc's request was rounded to, where known (the
    reference model's recorded runs), else None."""

    index: int
    op: tuple
    text: str
    result: object
    segments: list
    stats: dict
    calls: tuple
    rounded: int | None = None


@dataclasses.dataclass(frozen=True)
class Run:
    """What the reference model did on ``trace`` over a ``SimulatedGPU(capacity)`` (bytes),
    built with ``max_split_size`` (bytes or None) and ``coalesce``: one :class:`Step` per op;
    for the runs recorded with their end state (else None), its ``memory_stats()`` (the
    current values, peaks and event counters) and ``memory_snapshot()`` (the format of
    ``torch.cuda.memory._snapshot()``, with ``device_traces``) after the last op."""

    trace: list
    capacity: int
    max_split_size: int | None
    coalesce: bool
    steps: list
    memory_stats: dict | None
    memory_snapshot: dict | None

    @classmethod
    def from_json(cls, data: dict) -> Run:
        """A run from the plain data ``recorded.json`` holds (what the reference model's ``run``
        returns, on the instructor's side)."""
        trace = [_op(op) for op in data["trace"]]
        steps = []
        for i, (op, step) in enumerate(zip(trace, data["steps"], strict=True)):
            result = step.get("result")
            if result == "oom":
                result = DeviceOutOfMemory(step["error"])
            segments = unpack(step["segments"])
            steps.append(Step(i + 1, op, describe(op), result, segments,
                              stats_from_segments(segments),
                              tuple(tuple(c) for c in step["calls"]), step.get("rounded")))
        return cls(trace, data["capacity"], data["max_split_size"], data["coalesce"], steps,
                   data["memory_stats"], data["memory_snapshot"])


#: block states, as :func:`pack` writes them
_STATE_CODES = {ALLOCATED: "A", PENDING_FREE: "P", INACTIVE: "I"}


def pack(segments: list[dict]) -> list[list]:
    """A snapshot's segments as compact lists (what ``recorded.json`` stores): per segment
    ``[address, total_size, stream, segment_type, segment_pool_id, blocks]``, per block
    ``[size, requested_size, state code]`` (blocks tile their segment in address order)."""
    return [[s["address"], s["total_size"], s["stream"], s["segment_type"],
             list(s.get("segment_pool_id", (0, 0))),
             [[b["size"], b["requested_size"], _STATE_CODES[b["state"]]] for b in s["blocks"]]]
            for s in segments]


def unpack(packed: list[list]) -> list[dict]:
    """:func:`pack`'s segments as a snapshot's dicts again (the keys of
    ``torch.cuda.memory._snapshot()["segments"]`` that the lab reads)."""
    states = {code: state for state, code in _STATE_CODES.items()}
    segments = []
    for address, total, stream, kind, pool, packed_blocks in packed:
        blocks, at = [], address
        for size, requested, code in packed_blocks:
            blocks.append({"address": at, "size": size, "requested_size": requested,
                           "state": states[code]})
            at += size
        segments.append({"address": address, "total_size": total, "stream": stream,
                         "segment_type": kind, "segment_pool_id": tuple(pool),
                         "blocks": blocks})
    return segments


def _op(op: list) -> tuple:
    """An op read from JSON: a tuple again, a pool id too."""
    return tuple(tuple(x) if isinstance(x, list) else x for x in op)


@functools.cache
def _recorded_text() -> str:
    if not RECORDED.is_file():
        raise FileNotFoundError(f"{RECORDED} is missing: the instructor writes it with "
                                "`python -m labs.allocator.model`")
    return RECORDED.read_text(encoding="utf-8")


def _recorded(part: str, name) -> dict:
    table = json.loads(_recorded_text())[part]
    if name not in table:
        raise KeyError(f"{name!r}: the reference model's recordings ({part}) are of "
                       f"{', '.join(map(repr, table))}; another trace, run it through your own "
                       "allocator (viz.record)")
    return table[name]


def recorded(name: str) -> Run:
    """What the reference model did on the trace called ``name`` (a key of ``recorded.json``'s
    ``runs``: ``"best_fit"``, ``"coalesce"``, ...), as a :class:`Run`. Raises KeyError naming
    the recorded runs for any other name."""
    return Run.from_json(_recorded("runs", name))


def recorded_plan(size: int, divisions: int = 0) -> tuple[int, str, int]:
    """The reference model's ``(block size, pool, segment size)`` for a request of ``size``
    bytes with ``roundup_power2_divisions`` ``divisions``, for the cases of :data:`PLANS`
    (KeyError otherwise)."""
    block, pool, segment = _recorded("plans", f"{size},{divisions}")
    return block, pool, segment


def recorded_oom(name: str) -> tuple[dict, dict]:
    """``(memory snapshot at the out-of-memory error, the expected answer of
    allocator.oom-forensics)`` the reference model recorded for ``name`` (``"fragmented"``,
    ...)."""
    case = _recorded("oom_cases", name)
    return case["snapshot"], case["answer"]
