"""What the judges of exercises 2-4 share: the learner's allocator class replays a trace in the
kernel (the probe :func:`labs.allocator.probes.replay`, which reports every step as plain data),
and :func:`compare` holds it against a :class:`~labs.allocator.traces.Run` of the reference
model on the same trace (itself checked against the real allocator), stopping at the first step
where they differ and saying what differs in the learner's terms (which block best fit was owed,
which split or merge is missing).

The public checks compare with the runs the model recorded (``traces.recorded``); the hidden
checks run the model here, in the grader's process (:func:`reference_run`). The learners' copy
has no model, and :func:`reference_model` is the one place a check imports it.
"""

from __future__ import annotations

from collections import Counter

from grader.checks import AnswerRaised, CheckFailure, exact
from labs.allocator import probes, traces
from labs.allocator.gpu import DeviceOutOfMemory
from labs.allocator.snapshots import (
    ALLOCATED,
    INACTIVE,
    K_LARGE_BUFFER,
    K_SMALL_SIZE,
    PENDING_FREE,
    SIZE_MAX,
    GiB,
    format_bytes,
)

_STATES = (ALLOCATED, PENDING_FREE, INACTIVE)
#: how this lab names the model a learner is compared with, on every machine: on a GPU, the
#: real allocator is compared with it too (allocator.vs-real)
MODEL = "the reference model (torch 2.13.0's rules)"


def reference_model():
    """The reference model (module ``labs.allocator.model``), imported when a hidden check
    first needs it: it is the instructor's, and the learners' copy of the course has neither
    it nor the hidden checks."""
    from labs.allocator import model

    return model


def reference_run(trace: list[tuple], *, capacity: int = 2 * GiB,
                  max_split_size: int | None = None, coalesce: bool = True) -> traces.Run:
    """The reference model's run of ``trace`` (see ``labs.allocator.model.run``), made now."""
    return traces.Run.from_json(reference_model().run(trace, capacity=capacity,
                                                max_split_size=max_split_size,
                                                coalesce=coalesce))


def size(n: int) -> str:
    """Bytes for a message, with the byte count when the unit does not divide it."""
    return format_bytes(n, exact=True)


def story(trace: list[tuple], upto: int, last: int = 6) -> str:
    """The ops leading to step ``upto`` (counted from 1), the last few of them."""
    first = max(0, upto - last)
    lines = [f"{i + 1}. {traces.describe(op, exact=True)}"
             for i, op in enumerate(trace[first:upto], first)]
    return ("... " if first else "") + "; ".join(lines)


def refuse_oracle(called: list) -> None:
    """Fail when the learner's code called into the lab's reference model or its checks (a
    probe's ``oracle`` observation: they are the oracle, and an answer that delegates to them
    proves nothing)."""
    if called:
        raise CheckFailure(
            f"your answer calls the lab's own model or checks ({called[0]}). Build the "
            "mechanism yourself: they are the oracle the checks compare you with.")


def replayed(cls, trace: list[tuple], capacity: int, max_split_size: int | None) -> dict:
    """What :func:`labs.allocator.probes.replay` saw of the learner's allocator class on
    ``trace`` (the oracle observation refused first)."""
    seen = cls.probe(probes.replay, [list(op) for op in trace], capacity, max_split_size)
    exact(seen, dict, "what the replay of your allocator gave")
    refuse_oracle(seen["oracle"])
    return seen


def plain_snapshot(value, what: str = "snapshot()", pools: bool = False) -> list[dict]:
    """The learner's segments, checked to be plain lists/dicts/ints/strs (a subclass could lie
    when compared), reduced to what is compared (with ``pools``, each segment's
    ``segment_pool_id`` too, as a tuple)."""
    exact(value, list, f"the value {what} returned")
    out = []
    for i, seg in enumerate(value):
        exact(seg, dict, f"segment {i} of {what}")
        for key in ("address", "total_size", "stream", "segment_type", "blocks"):
            if key not in seg:
                raise CheckFailure(f"segment {i} of {what} has no {key!r} key.")
        for key in ("address", "total_size", "stream"):
            exact(seg[key], int, f"segment {i}'s {key!r}")
        exact(seg["segment_type"], str, f"segment {i}'s 'segment_type'")
        exact(seg["blocks"], list, f"segment {i}'s 'blocks'")
        blocks = []
        for j, b in enumerate(seg["blocks"]):
            exact(b, dict, f"block {j} of segment {i}")
            for key in ("address", "size", "requested_size", "state"):
                if key not in b:
                    raise CheckFailure(f"block {j} of segment {i} has no {key!r} key.")
            for key in ("address", "size", "requested_size"):
                exact(b[key], int, f"block {j} of segment {i}: {key!r}")
            exact(b["state"], str, f"block {j} of segment {i}: 'state'")
            if b["state"] not in _STATES:
                raise CheckFailure(f"block {j} of segment {i} has state {b['state']!r}; a "
                                   f"block's state is one of {', '.join(_STATES)}.")
            blocks.append({"address": b["address"], "size": b["size"], "state": b["state"],
                           "requested_size": 0 if b["state"] == INACTIVE
                           else b["requested_size"]})
        out.append({"address": seg["address"], "total_size": seg["total_size"],
                    "stream": seg["stream"], "segment_type": seg["segment_type"],
                    "blocks": blocks})
        if pools:
            pool = seg.get("segment_pool_id")
            if type(pool) not in (tuple, list) or len(pool) != 2 or any(
                    type(k) is not int for k in pool):
                raise CheckFailure(
                    f"segment {i} of {what} has segment_pool_id {pool!r}: a pair of ints, "
                    "(0, 0) for the default pools, the graph's pool id for a private pool's "
                    "segment.")
            out[-1]["segment_pool_id"] = tuple(pool)
    return out


def invariants(segs: list[dict], segments: dict[int, int], live: dict[int, int], where: str
               ) -> None:
    """What must hold of any caching allocator's state, whatever its policy (``segments``: the
    GPU's live cudaMalloc'ed ranges, address -> bytes)."""
    if [s["address"] for s in segs] != sorted(s["address"] for s in segs):
        raise CheckFailure(f"{where}: snapshot() must list segments in address order.")
    have = {s["address"]: s["total_size"] for s in segs}
    if have != segments:
        extra = sorted(set(have.items()) - set(segments.items()))
        missing = sorted(set(segments.items()) - set(have.items()))
        raise CheckFailure(
            f"{where}: your snapshot's segments are not the memory you cudaMalloc'ed: "
            + (f"segment(s) at {', '.join(hex(a) for a, _ in extra)} were not cudaMalloc'ed "
               "with that address and size" if extra else
               f"cudaMalloc'ed range(s) at {', '.join(hex(a) for a, _ in missing)} are missing "
               "or have another size")
            + ". Every segment is one cudaMalloc, listed whole until it is cudaFree'd.")
    for s in segs:
        pos = s["address"]
        for b in s["blocks"]:
            if b["address"] != pos or b["size"] <= 0:
                raise CheckFailure(
                    f"{where}: the blocks of the segment at {s['address']:#x} do not tile it: a "
                    f"block starts at {b['address']:#x} where {pos:#x} was expected. A segment's "
                    "blocks cover it exactly, in address order, without gaps or overlaps.")
            pos += b["size"]
        if pos != s["address"] + s["total_size"]:
            raise CheckFailure(
                f"{where}: the blocks of the segment at {s['address']:#x} add up to "
                f"{size(pos - s['address'])}, not its {size(s['total_size'])}.")
    allocated = {b["address"] for s in segs for b in s["blocks"] if b["state"] == ALLOCATED}
    if allocated != set(live.values()):
        wrong = sorted(allocated ^ set(live.values()))
        raise CheckFailure(
            f"{where}: the blocks marked {ALLOCATED!r} are not the live allocations "
            f"(they differ at {', '.join(hex(a) for a in wrong[:3])}).")


def _locate(segs: list[dict], ptr: int) -> str:
    for i, s in enumerate(segs):
        if s["address"] <= ptr < s["address"] + s["total_size"]:
            return f"offset {ptr - s['address']} of segment {i} ({size(s['total_size'])})"
    return f"{ptr:#x}, outside every segment"


def compare(cls, run: traces.Run, *, label: str = "a trace", seen: dict | None = None) -> None:
    """Replay ``run``'s trace through ``cls(gpu, max_split_size=...)`` in the kernel (or take
    ``seen``, :func:`replayed`'s report of it) and raise CheckFailure at the first step where
    the address returned, the cudaMalloc / cudaFree calls, or the segments and blocks differ
    from the reference model's ``run``."""
    trace, capacity, max_split_size = run.trace, run.capacity, run.max_split_size
    pools = any(op[0] == "begin_pool" for op in trace)  # (segment pool ids compared too)
    seen = seen or replayed(cls, trace, capacity, max_split_size)
    setting = "" if max_split_size is None else f", max_split_size={size(max_split_size)}"
    if not run.coalesce:
        setting += "; compared with the rules without merging (exercise 2)"
    mine_live: dict[int, int] = {}
    before_ref: list[dict] = []
    capture = None  # (pool id, stream) of the capture underway
    for step, (op, ref) in enumerate(zip(trace, run.steps), 1):
        if op[0] == "begin_pool":
            capture = (tuple(op[1]), op[2])
        elif op[0] == "end_pool":
            capture = None
        during = ("" if capture is None else
                  f" (during the capture into pool {capture[0]} on stream {capture[1]})")
        where = f"on {label} (capacity {size(capacity)}{setting}), after step {step}{during}"
        if step > len(seen["steps"]):
            if seen["raised"]:
                raise AnswerRaised(seen["raised"])
            raise CheckFailure(f"{where}: the replay of your allocator stopped early.")
        mine = seen["steps"][step - 1]
        ref_result, mine_result = ref.result, mine["result"]
        if op[0] == "malloc" and mine_result != "oom":
            mine_live[op[1]] = mine_result
        elif op[0] == "free":
            mine_live.pop(op[1], None)
        context = f" Steps so far: {story(trace, step)}."
        if isinstance(ref_result, DeviceOutOfMemory) != (mine_result == "oom"):
            if isinstance(ref_result, DeviceOutOfMemory):
                raise CheckFailure(
                    f"{where}: {MODEL} runs out of memory here ({ref_result}), but your malloc "
                    "returned an address." + context)
            raise CheckFailure(
                f"{where}: your malloc raised DeviceOutOfMemory, but {MODEL} finds memory for "
                f"it ({_locate(ref.segments, ref_result)})." + context)
        segs_mine = plain_snapshot(mine["snapshot"], pools=pools)
        if op[0] == "malloc" and not isinstance(ref_result, DeviceOutOfMemory):
            exact(mine_result, int, f"the address malloc returned at step {step}")
            owner = next((s for s in segs_mine
                          if s["address"] <= mine_result < s["address"] + s["total_size"]), None)
            if owner is not None and owner["stream"] != op[3]:
                raise CheckFailure(
                    f"{where}: your malloc for stream {op[3]} returned a block of a segment of "
                    f"stream {owner['stream']}. Cached blocks are reused only by requests on the "
                    "stream they were allocated on (pools are ordered by stream first)." + context)
        calls_ref = Counter(c for c in ref.calls if c[0] in ("cudaMalloc", "cudaFree"))
        calls_mine = Counter(tuple(c) for c in mine["calls"])
        segs_ref = [_reduce(s, pools) for s in ref.segments]
        if calls_ref != calls_mine:
            why = _SEGMENTS
            if op[0] == "malloc" and any(c[0] == "cudaMalloc" and c[2] is None
                                         for c in calls_ref):
                why = _oom_path(max_split_size)
            elif op[0] == "malloc":
                why += " " + _why_malloc(before_ref, segs_ref, op, ref.rounded, max_split_size)
            raise CheckFailure(f"{where}: {_calls(calls_mine, calls_ref)} {why}"
                               + _graph_rule(op, capture, pools) + context)
        invariants(segs_mine, mine["segments"], mine_live, where)
        if op[0] == "malloc" and mine_result != ref_result and isinstance(ref_result, int):
            why = _why_malloc(before_ref, segs_ref, op, ref.rounded, max_split_size)
            raise CheckFailure(
                f"{where}: your malloc returned {_locate(segs_mine, mine_result)}; {MODEL} "
                f"returns {_locate(segs_ref, ref_result)}. {why} The allocation is the front of "
                "the chosen block (its address); a split-off rest follows it."
                + _graph_rule(op, capture, pools) + context)
        if segs_mine != segs_ref:
            raise CheckFailure(
                f"{where}: {_diff(segs_mine, segs_ref, run.coalesce, before_ref)}" + context)
        before_ref = segs_ref


def _graph_rule(op: tuple, capture, pools: bool) -> str:
    """The CUDA graph rule that decides ``op`` on a trace with captures, in words
    (``DeviceCachingAllocator::malloc`` while ``captures_underway`` is not empty;
    ``release_cached_blocks`` and ``releasePool``)."""
    if capture is not None and op[0] == "malloc":
        return (" During a capture, malloc neither frees the pending blocks whose events "
                "completed (no process_events) nor, out of memory, cudaFrees every cached "
                "segment (no release_cached_blocks): only release_available_cached_blocks of "
                "the request's own pool runs, then one retry.")
    if pools and op[0] == "empty_cache":
        return (" empty_cache cudaFrees a private pool's whole cached segments only once no "
                "graph holds the pool: every graph that captured into it (or shared it) was "
                "destroyed (release_pool).")
    return ""


def _reduce(seg: dict, pools: bool = False) -> dict:
    out = {"address": seg["address"], "total_size": seg["total_size"], "stream": seg["stream"],
           "segment_type": seg["segment_type"],
           "blocks": [{"address": b["address"], "size": b["size"], "state": b["state"],
                       "requested_size": b["requested_size"]} for b in seg["blocks"]]}
    if pools:
        out["segment_pool_id"] = tuple(seg["segment_pool_id"])
    return out


def _calls(mine: Counter, ref: Counter) -> str:
    def fmt(calls: Counter) -> str:
        if not calls:
            return "no cudaMalloc or cudaFree"
        parts = []
        for call in sorted(calls, key=str):
            what = (f"cudaFree of the {size(call[2])} segment at {call[1]:#x}"
                    if call[0] == "cudaFree" else
                    f"cudaMalloc({size(call[1])})" + (" (failed)" if call[2] is None else ""))
            parts.append(what + (f" x{calls[call]}" if calls[call] > 1 else ""))
        return ", ".join(parts)

    return f"your allocator made {fmt(mine)}; {MODEL} makes {fmt(ref)}."


_SEGMENTS = ("A segment is cudaMalloc'ed only when no cached block fits, with the segment size of "
             "the request's pool; cudaFree returns whole cached segments only.")


def _pending(segs: list[dict]) -> int:
    return sum(b["state"] == PENDING_FREE for s in segs for b in s["blocks"])


def _oom_path(max_split: int | None) -> str:
    """What malloc does when cudaMalloc fails, in words (``c10/cuda/CUDACachingAllocator.cpp:
    DeviceCachingAllocator::malloc``, after ``alloc_block`` returned false)."""
    first = ("" if max_split is None else
             "first the smallest cached block of the request's pool and stream of at least "
             f"max(request, max_split_size={size(max_split)}) (release_available_cached_blocks; "
             "lowest address on ties), else the largest ones of at least max_split_size until "
             "they add up to that, and a retry; then ")
    return ("cudaMalloc failed here, so malloc frees cached segments and retries cudaMalloc only: "
            f"{first}every cached whole segment (release_cached_blocks) and a last try.")


def _why_malloc(before: list[dict], after: list[dict], op: tuple, rounded: int,
                max_split: int | None) -> str:
    """Why the reference served a malloc as it did: pending blocks freed first
    (``process_events``), or the block best fit and the ``max_split_size`` rules chose."""
    if _pending(after) < _pending(before):
        return ("Before searching, malloc frees the blocks whose events have all completed "
                "(process_events), and they merge with free neighbours: "
                f"{_pending(before) - _pending(after)} pending block(s) were freed here first.")
    return _why_block(before, op, rounded, max_split)


def _why_block(before: list[dict], op: tuple, rounded: int, max_split: int | None) -> str:
    """Why the reference picked its block, from the free blocks before the malloc
    (``c10/cuda/CUDACachingAllocator.cpp: DeviceCachingAllocator::get_free_block``)."""
    pool = "small" if rounded <= K_SMALL_SIZE else "large"
    free = [(b["size"], b["address"]) for s in before
            if s["segment_type"] == pool and s["stream"] == op[3]
            for b in s["blocks"] if b["state"] == INACTIVE and b["size"] >= rounded]
    text = (f"The request rounds to {size(rounded)} ({pool} pool). ")
    if not free:
        return (text + "No cached block of that pool and stream was big enough, so a new segment "
                "is due.")
    best = min(free)
    limit = SIZE_MAX if max_split is None else max_split
    if rounded < limit <= best[0]:
        return (text + f"The best-fit cached block ({size(best[0])}) is oversize (at least "
                f"max_split_size, {size(limit)}) and the request is not: get_free_block never "
                "hands an oversize block to a smaller request, so a new segment is due.")
    if rounded >= limit and best[0] >= rounded + K_LARGE_BUFFER:
        return (text + f"The request is at least max_split_size ({size(limit)}) and the best-fit "
                f"cached block ({size(best[0])}) is {size(best[0] - rounded)} bigger: "
                "get_free_block refuses an oversize block that is max_non_split_rounding "
                f"({size(K_LARGE_BUFFER)}) or more bigger than the request, so a new segment is "
                "due.")
    text += (f"Best fit is the smallest cached block of that pool and stream with at least "
             f"that many bytes ({size(best[0])} at {best[1]:#x}), the lowest address on ties")
    if rounded >= limit:
        return (text + f"; an oversize block less than max_non_split_rounding "
                f"({size(K_LARGE_BUFFER)}) bigger than a request of at least max_split_size is "
                "handed out whole.")
    return text + "."


def _diff(mine: list[dict], ref: list[dict], coalesce: bool, before: list[dict]) -> str:
    """The first difference between two snapshots, in words (``before``: the reference's
    snapshot one step earlier)."""
    for i, (a, b) in enumerate(zip(mine, ref)):
        if a == b:
            continue
        for key in ("address", "total_size", "stream", "segment_type", "segment_pool_id"):
            if a.get(key) != b.get(key):
                why = (" During a capture, requests on the capturing stream are served from the "
                       "capture's private pool, and only from it (get_pool); its segments keep "
                       "that pool id for good." if key == "segment_pool_id" else "")
                return (f"segment {i} has {key} {a.get(key)!r} in your snapshot, {b.get(key)!r} "
                        f"in {MODEL}'s.{why}")
        sizes_a = [(x["size"], x["state"]) for x in a["blocks"]]
        sizes_b = [(x["size"], x["state"]) for x in b["blocks"]]
        if sizes_a == sizes_b:
            x, y = next((x, y) for x, y in zip(a["blocks"], b["blocks"]) if x != y)
            return (f"the {size(x['size'])} block at offset {x['address'] - a['address']} of "
                    f"segment {i} has requested_size {x['requested_size']} in your snapshot; it "
                    f"should be {y['requested_size']}: the bytes malloc was asked for, before "
                    "rounding (0 for a free block).")
        split_rule = ("a block is split only when the rest is big enough (small pool: at least "
                      "512 bytes; large pool: more than 1 MiB, for requests under "
                      "max_split_size)")
        hint = ""
        if _pending([b]) > _pending([a]):
            hint = (" A block used on another stream (record_stream) stays pending free, neither "
                    "reused nor merged, until the events recorded when it was freed complete.")
        elif _pending([a]) > _pending([b]):
            was = {x["address"] for s in before for x in s["blocks"]
                   if x["state"] == PENDING_FREE}
            pending = [x for x in a["blocks"] if x["state"] == PENDING_FREE]
            never = [x for x in pending if x["address"] not in was]
            block = (never or pending)[0]
            hint = (f" Your block at offset {block['address'] - a['address']} is pending free, "
                    + (f"but {MODEL} never made it pending: free waits for events only for the "
                       "streams other than the block's own that it was used on (record_stream) "
                       "since it was allocated; record_stream on its own stream is ignored, and "
                       "the streams are forgotten once the block is freed." if never else
                       f"but {MODEL} frees it here. A pending block waits for one event per "
                       "stream other than its own that it was used on (record_stream on its own "
                       "stream is ignored), and is freed once they complete: at the start of "
                       "each malloc (process_events), and in empty_cache, which waits for "
                       "them."))
        elif len(sizes_a) > len(sizes_b):
            hint = (" Your segment has more blocks: "
                    + ("a freed block merges with each free neighbour, and " if coalesce else "")
                    + split_rule + ".")
        elif len(sizes_a) < len(sizes_b):
            hint = (" Yours has fewer blocks: " + split_rule
                    + ("; only free neighbours merge (not pending or allocated ones)"
                       if coalesce else "; nothing merges yet") + ".")
        return (f"segment {i} ({size(a['total_size'])}) holds blocks {_blocks(sizes_a)} in your "
                f"snapshot, {_blocks(sizes_b)} in {MODEL}'s.{hint}")
    return (f"your snapshot lists {len(mine)} segment(s), {MODEL}'s {len(ref)}.")


def _blocks(blocks: list[tuple[int, str]]) -> str:
    short = {ALLOCATED: "allocated", PENDING_FREE: "pending free", INACTIVE: "free"}
    return "[" + ", ".join(f"{size(n)} {short[s]}" for n, s in blocks) + "]"
