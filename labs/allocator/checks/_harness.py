"""What the checks of exercises 2-4 share: run the learner's allocator class and the reference
model (``labs.allocator.model``, itself checked against the real allocator) side by side over one
trace, on two :class:`SimulatedGPU`s, and stop at the first step where they differ, saying what
differs in the learner's terms (which block best fit was owed, which split or merge is missing).
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path

from grader.checks import CheckFailure, exact
from labs.allocator import model
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU

#: what a learner's code may not call: the reference model and the checks (the oracles)
_ORACLES = (model.__file__, str(Path(__file__).parent))
_STATES = (model.ALLOCATED, model.PENDING_FREE, model.INACTIVE)


def size(n: int) -> str:
    """Bytes for a message, with the byte count when the unit does not divide it."""
    return model.format_bytes(n, exact=True)


def story(trace: list[tuple], upto: int, last: int = 6) -> str:
    """The ops leading to step ``upto`` (counted from 1), the last few of them."""
    first = max(0, upto - last)
    lines = [f"{i + 1}. {model.describe(op, exact=True)}"
             for i, op in enumerate(trace[first:upto], first)]
    return ("... " if first else "") + "; ".join(lines)


@contextlib.contextmanager
def no_reference():
    """Fail the check if the learner's code calls into the lab's reference model or its checks
    (they are the oracle: an answer that delegates to them proves nothing)."""
    called = []

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(_ORACLES) and name != __file__:
            called.append(f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}")

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)
        if called:
            raise CheckFailure(
                f"your answer calls the lab's own model or checks ({called[0]}). Build the "
                "mechanism yourself: they are the oracle the checks compare you with.")


def plain_snapshot(value, what: str = "snapshot()") -> list[dict]:
    """The learner's segments, checked to be plain lists/dicts/ints/strs (a subclass could lie
    when compared), reduced to what is compared."""
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
                           "requested_size": 0 if b["state"] == model.INACTIVE
                           else b["requested_size"]})
        out.append({"address": seg["address"], "total_size": seg["total_size"],
                    "stream": seg["stream"], "segment_type": seg["segment_type"],
                    "blocks": blocks})
    return out


def invariants(segs: list[dict], gpu: SimulatedGPU, live: dict[int, int], where: str) -> None:
    """What must hold of any caching allocator's state, whatever its policy."""
    if [s["address"] for s in segs] != sorted(s["address"] for s in segs):
        raise CheckFailure(f"{where}: snapshot() must list segments in address order.")
    have = {s["address"]: s["total_size"] for s in segs}
    if have != gpu.segments():
        extra = sorted(set(have.items()) - set(gpu.segments().items()))
        missing = sorted(set(gpu.segments().items()) - set(have.items()))
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
    allocated = {b["address"] for s in segs for b in s["blocks"] if b["state"] == model.ALLOCATED}
    if allocated != set(live.values()):
        wrong = sorted(allocated ^ set(live.values()))
        raise CheckFailure(
            f"{where}: the blocks marked {model.ALLOCATED!r} are not the live allocations "
            f"(they differ at {', '.join(hex(a) for a in wrong[:3])}).")


def _locate(segs: list[dict], ptr: int) -> str:
    for i, s in enumerate(segs):
        if s["address"] <= ptr < s["address"] + s["total_size"]:
            return f"offset {ptr - s['address']} of segment {i} ({size(s['total_size'])})"
    return f"{ptr:#x}, outside every segment"


def compare(cls, trace: list[tuple], *, capacity: int = 2 * model.GiB,
            max_split_size: int | None = None, coalesce: bool = True,
            label: str = "a trace") -> None:
    """Replay ``trace`` through ``cls(gpu, max_split_size=...)`` and the reference model side by
    side; raise CheckFailure at the first step where the address returned, the cudaMalloc /
    cudaFree calls, or the segments and blocks differ."""
    mine_gpu, ref_gpu = SimulatedGPU(capacity), SimulatedGPU(capacity)
    with no_reference():
        mine = cls(mine_gpu, max_split_size=max_split_size)
    ref = model.CachingAllocatorModel(ref_gpu, max_split_size=max_split_size, coalesce=coalesce)
    setting = "" if max_split_size is None else f", max_split_size={size(max_split_size)}"
    if not coalesce:
        setting += "; compared with the real rules without merging (exercise 2)"
    mine_live: dict[int, int] = {}
    ref_live: dict[int, int] = {}
    for step, op in enumerate(trace, 1):
        where = f"on {label} (capacity {size(capacity)}{setting}), after step {step}"
        before_ref = ref.snapshot()
        n_ref, n_mine = len(ref_gpu.log), len(mine_gpu.log)
        ref_result = apply_op(ref, ref_gpu, op, ref_live)
        mine_result = apply_op(mine, mine_gpu, op, mine_live, learner=True)
        context = f" Steps so far: {story(trace, step)}."
        if isinstance(ref_result, DeviceOutOfMemory) != isinstance(mine_result, DeviceOutOfMemory):
            if isinstance(ref_result, DeviceOutOfMemory):
                raise CheckFailure(
                    f"{where}: the real allocator runs out of memory here ({ref_result}), but "
                    "your malloc returned an address." + context)
            raise CheckFailure(
                f"{where}: your malloc raised DeviceOutOfMemory, but the real allocator finds "
                f"memory for it ({_locate(ref.snapshot(), ref_result)})." + context)
        segs_mine = plain_snapshot(call(mine, "snapshot"))
        if op[0] == "malloc" and not isinstance(ref_result, DeviceOutOfMemory):
            exact(mine_result, int, f"the address malloc returned at step {step}")
            owner = next((s for s in segs_mine
                          if s["address"] <= mine_result < s["address"] + s["total_size"]), None)
            if owner is not None and owner["stream"] != op[3]:
                raise CheckFailure(
                    f"{where}: your malloc for stream {op[3]} returned a block of a segment of "
                    f"stream {owner['stream']}. Cached blocks are reused only by requests on the "
                    "stream they were allocated on (pools are ordered by stream first)." + context)
        calls_ref = Counter(c for c in ref_gpu.log[n_ref:] if c[0] in ("cudaMalloc", "cudaFree"))
        calls_mine = Counter(c for c in mine_gpu.log[n_mine:]
                             if c[0] in ("cudaMalloc", "cudaFree"))
        if calls_ref != calls_mine:
            raise CheckFailure(f"{where}: {_calls(calls_mine, calls_ref)}" + context)
        invariants(segs_mine, mine_gpu, mine_live, where)
        segs_ref = [_reduce(s) for s in ref.snapshot()]
        if op[0] == "malloc" and mine_result != ref_result and isinstance(ref_result, int):
            why = _why_block(before_ref, op, model.round_size(op[2]), max_split_size)
            if _pending(segs_ref) < _pending(before_ref):
                why = ("Before searching, malloc frees the blocks whose events have all completed "
                       "(process_events), and they merge with free neighbours: "
                       f"{_pending(before_ref) - _pending(segs_ref)} pending block(s) were freed "
                       "here first.")
            raise CheckFailure(
                f"{where}: your malloc returned {_locate(segs_mine, mine_result)}; the real "
                f"allocator returns {_locate(segs_ref, ref_result)}. {why} The allocation is the "
                "front of the chosen block (its address); a split-off rest follows it." + context)
        if segs_mine != segs_ref:
            raise CheckFailure(f"{where}: {_diff(segs_mine, segs_ref, coalesce)}" + context)


def call(obj, name: str, *args):
    """``obj.<name>(*args)`` for a learner's object; refused if it calls the lab's oracles."""
    with no_reference():
        return getattr(obj, name)(*args)


def apply_op(allocator, gpu, op, live, learner: bool = False):
    """One op of the trace (as ``model.replay`` runs it); returns what malloc returned/raised."""
    kind = op[0]
    run = call if learner else (lambda obj, name, *args: getattr(obj, name)(*args))
    if kind == "malloc":
        try:
            result = run(allocator, "malloc", op[2], op[3])
        except DeviceOutOfMemory as exc:
            return exc
        live[op[1]] = result
        return result
    if kind == "free" and op[1] in live:
        run(allocator, "free", live.pop(op[1]))
    elif kind == "use" and op[1] in live:
        gpu.launch(op[2])
        run(allocator, "record_stream", live[op[1]], op[2])
    elif kind == "sync":
        gpu.synchronize(op[1])
    elif kind == "empty_cache":
        run(allocator, "empty_cache")
    return None


def _reduce(seg: dict) -> dict:
    return {"address": seg["address"], "total_size": seg["total_size"], "stream": seg["stream"],
            "segment_type": seg["segment_type"],
            "blocks": [{"address": b["address"], "size": b["size"], "state": b["state"],
                        "requested_size": b["requested_size"]} for b in seg["blocks"]]}


def _calls(mine: Counter, ref: Counter) -> str:
    def fmt(calls: Counter) -> str:
        if not calls:
            return "no cudaMalloc or cudaFree"
        parts = []
        for call in sorted(calls, key=str):
            what = (f"cudaMalloc({size(call[1])})" if call[0] == "cudaMalloc"
                    else f"cudaFree of the {size(call[2])} segment at {call[1]:#x}")
            parts.append(what + (f" x{calls[call]}" if calls[call] > 1 else ""))
        return ", ".join(parts)

    return (f"your allocator made {fmt(mine)}; the real allocator makes {fmt(ref)}. A segment "
            "is cudaMalloc'ed only when no cached block fits, with the segment size of the "
            "request's pool; cudaFree returns whole cached segments only.")


def _pending(segs: list[dict]) -> int:
    return sum(b["state"] == model.PENDING_FREE for s in segs for b in s["blocks"])


def _why_block(before: list[dict], op: tuple, rounded: int, max_split: int | None) -> str:
    """Why the reference picked its block, from the free blocks before the malloc."""
    pool = "small" if rounded <= model.K_SMALL_SIZE else "large"
    free = [(b["size"], b["address"]) for s in before
            if s["segment_type"] == pool and s["stream"] == op[3]
            for b in s["blocks"] if b["state"] == model.INACTIVE and b["size"] >= rounded]
    text = (f"The request rounds to {size(rounded)} ({pool} pool). ")
    if not free:
        return text + "No cached block of that pool and stream was big enough, so a new segment is due."
    best = min(free)
    limit = model.SIZE_MAX if max_split is None else max_split
    if rounded < limit <= best[0] or (rounded >= limit and best[0] >= rounded + model.K_LARGE_BUFFER):
        return (text + f"The best-fit cached block ({size(best[0])}) is refused by the "
                "max_split_size rules, so a new segment is due.")
    return (text + f"Best fit is the smallest cached block of that pool and stream with at least "
            f"that many bytes ({size(best[0])} at {best[1]:#x}), the lowest address on ties.")


def _diff(mine: list[dict], ref: list[dict], coalesce: bool) -> str:
    """The first difference between two snapshots, in words."""
    for i, (a, b) in enumerate(zip(mine, ref)):
        if a == b:
            continue
        for key in ("address", "total_size", "stream", "segment_type"):
            if a[key] != b[key]:
                return (f"segment {i} has {key} {a[key]!r} in your snapshot, {b[key]!r} in the "
                        "real allocator's.")
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
            hint = (" A pending block is freed once its events complete: at the start of each "
                    "malloc (process_events), and in empty_cache, which waits for them.")
        elif len(sizes_a) > len(sizes_b):
            hint = (" Your segment has more blocks: "
                    + ("a freed block merges with each free neighbour, and " if coalesce else "")
                    + split_rule + ".")
        elif len(sizes_a) < len(sizes_b):
            hint = (" Yours has fewer blocks: " + split_rule
                    + ("; only free neighbours merge (not pending or allocated ones)"
                       if coalesce else "; nothing merges yet") + ".")
        return (f"segment {i} ({size(a['total_size'])}) holds blocks {_blocks(sizes_a)} in your "
                f"snapshot, {_blocks(sizes_b)} in the real allocator's.{hint}")
    return (f"your snapshot lists {len(mine)} segment(s), the real allocator's {len(ref)}.")


def _blocks(blocks: list[tuple[int, str]]) -> str:
    short = {model.ALLOCATED: "allocated", model.PENDING_FREE: "pending free",
             model.INACTIVE: "free"}
    return "[" + ", ".join(f"{size(n)} {short[s]}" for n, s in blocks) + "]"
