"""The lab's reference model of the CUDA caching allocator of torch 2.13.0, rule for rule for
what it models (below), under the default allocator settings.

Every constant and rule is the one in ``c10/cuda/CUDACachingAllocator.cpp`` (class
``DeviceCachingAllocator`` and the helpers named below) and the allocator-config headers
(``c10/core/AllocatorConfig.h``, ``c10/cuda/CUDAAllocatorConfig.h``). It runs on a
:class:`labs.allocator.gpu.SimulatedGPU` instead of the CUDA runtime, so it teaches, and checks
the learner's model, on a machine without a GPU; on a GPU the lab replays the same traces through
the real allocator beside it.

Modelled: size rounding (``round_size``, ``roundup_power2_divisions``), the small and large pools
and their segment sizes (``get_pool``, ``get_allocation_size``), best fit (``get_free_block``,
``BlockComparatorSize``), ``max_split_size`` and ``max_non_split_rounding_size``, splitting
(``should_split``, ``alloc_found_block``), coalescing (``free_block``, ``try_merge_blocks``),
per-stream reuse with ``recordStream`` and events (``insert_events``, ``process_events``), the
OOM path (``alloc_block``, ``release_available_cached_blocks``, ``release_cached_blocks``),
``emptyCache``, CUDA-graph private pools (``beginAllocateToPool``, ``endAllocateToPool``,
``releasePool``), the statistics of ``memory_stats()`` and the ``_snapshot()`` format.

Not modelled (the notebook's section 7 lists the same): the garbage-collection threshold
(``garbage_collection_threshold``, ``garbage_collect_cached_blocks``) and memory fractions
(``setMemoryFraction``, ``allowed_memory_maximum``); expandable segments;
``large_segment_size_mb`` (``AcceleratorAllocatorConfig::large_segment_size()``: the model's
segment for a request between 1 and 10 MiB is always its 20 MiB default, ``K_LARGE_BUFFER``, as
is the default of ``max_non_split_rounding``); ``roundup_power2_divisions`` per size interval
(one value for all sizes here); the free-memory callbacks and the second ``get_free_block``
after them (``trigger_free_memory_callbacks``, ``FreeCudaMemoryCallbacksRegistry``), so only
``cudaMalloc`` is retried; ``MemPool`` (``use_mem_pool``, ``use_on_oom``, ``no_split``, a pool's
own allocator), pluggable allocators and ``cudaMallocAsync``; a side stream joining a capture
(only the stream given to ``begin_allocate_to_pool`` is routed to the private pool: the real
filter, ``CUDAGraph::create_allocate_filter``, accepts every stream whose capture id is the
graph's) and frees deferred until a capture ends; IPC; host (pinned) memory. So "matches the real
allocator step by step" holds for traces and settings that use none of these.

**Instructor-only.** The model answers exercises 1-6, so the learners' copy of the course leaves
this module out (``instructor_only`` in ``lab.toml``), and grading kernels do not see it. What
learners see of it is recorded: :func:`run` replays a trace and returns every step as plain
data, and ``python -m labs.allocator.model`` writes the runs the notebook shows and the public
checks compare with, the plans of section 2's tables and the public out-of-memory cases to
``labs/allocator/recorded.json`` (:func:`labs.allocator.traces.recorded` reads them; ``tests/``
checks the file is current). The hidden checks run the model itself, in the grader's process.
"""

from __future__ import annotations

import bisect
import collections
import copy
import dataclasses
import json
import random
import sys

from labs.allocator import traces
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.snapshots import (
    ALLOCATED,
    INACTIVE,
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    PENDING_FREE,
    SIZE_MAX,
    GiB,
    KiB,
    MiB,
    stats_from_segments,
)


# ------------------------------------------------------------------ sizes
def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``DeviceCachingAllocator::roundup_power2_next_division``: ``size`` (bytes) rounded up to the
    next of ``divisions`` equal steps between the powers of two around it."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, divisions: int = 0) -> int:
    """``DeviceCachingAllocator::round_size``: the block size (bytes) a request of ``size`` bytes
    gets. ``divisions`` is ``roundup_power2_divisions`` for the request's size interval (0 or 1:
    off, the default; ``AcceleratorAllocatorConfig::roundup_power2_divisions(size)``)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return K_MIN_BLOCK_SIZE * -(-size // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``DeviceCachingAllocator::get_allocation_size``: the bytes ``cudaMalloc`` is asked for when
    no cached block fits a (rounded) request of ``size`` bytes: the segment size."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)


def allocation_plan(size: int, divisions: int = 0) -> tuple[int, str, int]:
    """``(block size, "small" | "large", segment size)`` for a request of ``size`` bytes: what
    ``malloc`` computes before searching (``round_size``, ``get_pool``, ``get_allocation_size``)."""
    rounded = round_size(size, divisions)
    return rounded, "small" if rounded <= K_SMALL_SIZE else "large", allocation_size(rounded)


# ------------------------------------------------------------------ blocks and pools
@dataclasses.dataclass(eq=False)
class Block:
    """``struct Block``: ``size`` bytes at ``ptr`` of one segment, on ``stream``, owned by ``pool``;
    ``prev``/``next`` are its neighbours in the segment (``None`` at the ends: both ``None`` means
    the block is a whole, unsplit segment)."""

    ptr: int
    size: int
    stream: int
    pool: BlockPool = dataclasses.field(repr=False)
    requested: int = 0
    allocated: bool = False
    prev: Block | None = dataclasses.field(default=None, repr=False)
    next: Block | None = dataclasses.field(default=None, repr=False)
    event_count: int = 0
    stream_uses: set = dataclasses.field(default_factory=set)

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


def _order(block: Block) -> tuple[int, int, int]:
    """``BlockComparatorSize``: by stream, then size, then address."""
    return block.stream, block.size, block.ptr


class BlockPool:
    """``struct BlockPool``: the free (cached) blocks of one pool, kept in ``BlockComparatorSize``
    order, so the first block at or after ``(stream, size)`` is the best fit. ``private`` is the
    CUDA-graph :class:`PrivatePool` owning it (``None`` for the two default pools)."""

    def __init__(self, small: bool, private: PrivatePool | None = None):
        self.small = small
        self.private = private
        self.blocks: list[Block] = []

    def insert(self, block: Block) -> None:
        bisect.insort(self.blocks, block, key=_order)

    def remove(self, block: Block) -> None:
        i = bisect.bisect_left(self.blocks, _order(block), key=_order)
        assert self.blocks[i] is block
        del self.blocks[i]


@dataclasses.dataclass(eq=False)
class PrivatePool:
    """``struct PrivatePool``: the pools a CUDA graph's capture allocates from."""

    id: tuple[int, int]
    use_count: int = 1
    cuda_malloc_count: int = 0

    def __post_init__(self):
        self.small, self.large = BlockPool(True, self), BlockPool(False, self)


# ------------------------------------------------------------------ the allocator
class CachingAllocatorModel:
    """``DeviceCachingAllocator`` over a :class:`SimulatedGPU`.

    ``max_split_size`` (bytes; ``max_split_size_mb`` in ``PYTORCH_ALLOC_CONF``, default no limit),
    ``roundup_power2_divisions`` (one value for every size interval; default 0: off),
    ``max_non_split_rounding`` (bytes; default 20 MiB, the large segment size).
    ``coalesce=False`` leaves freed blocks unmerged (exercise 2's allocator; the real one always
    merges).

    ``malloc(size, stream)`` returns the block's address (int) or raises
    :class:`DeviceOutOfMemory`; ``free(ptr)``; ``record_stream(ptr, stream)``; ``empty_cache()``;
    ``snapshot()`` the segments as ``torch.cuda.memory._snapshot()["segments"]`` lists them;
    ``memory_stats()`` as ``torch.cuda.memory_stats()`` names them; ``memory_snapshot()`` a dict
    ``torch.cuda._memory_viz`` can draw. ``trace`` lists what happened as
    ``_snapshot()["device_traces"]`` does.
    """

    def __init__(self, gpu: SimulatedGPU, *, max_split_size: int | None = None,
                 roundup_power2_divisions: int = 0, max_non_split_rounding: int = K_LARGE_BUFFER,
                 coalesce: bool = True):
        self.gpu = gpu
        self.max_split_size = SIZE_MAX if max_split_size is None else int(max_split_size)
        self.divisions = roundup_power2_divisions
        self.max_non_split_rounding = max_non_split_rounding
        self.coalesce = coalesce
        self.large, self.small = BlockPool(False), BlockPool(True)
        self.blocks: set[Block] = set()  # every block of every segment
        self.allocated: dict[int, Block] = {}  # ptr -> allocated block
        self.events: dict[int, collections.deque] = {}  # stream -> deque of (Event, Block)
        self.private_pools: dict[tuple[int, int], PrivatePool] = {}
        self.freeable: dict[tuple[int, int], PrivatePool] = {}
        self.captures: dict[tuple[int, int], int] = {}  # pool id -> capturing stream
        self.deferred: list[Block] = []  # freed during a capture, events not yet recorded
        self.trace: list[dict] = []
        self.counters = collections.Counter()
        self.peaks: dict[str, int] = {}

    # -------------------------------------------------------------- public API
    def malloc(self, size: int, stream: int = 0) -> int:
        """``DeviceCachingAllocator::malloc``: the address of a block of at least ``size`` bytes
        usable on ``stream``. Raises DeviceOutOfMemory (after the free-and-retry steps)."""
        if not self.captures:
            self._process_events()
        rounded = round_size(size, self.divisions)
        pool = self._get_pool(rounded, stream)
        alloc = allocation_size(rounded)
        block = self._get_free_block(pool, rounded, stream)
        if block is None:
            block = self._alloc_block(pool, alloc, stream)
        if block is None and self._release_available_cached_blocks(pool, rounded, stream):
            block = self._alloc_block(pool, alloc, stream)
        if block is None and not self.captures:
            self._release_cached_blocks()
            block = self._alloc_block(pool, alloc, stream, retry=True)
        if block is None:
            self.counters["num_ooms"] += 1
            self._record("oom", self.gpu.capacity - self.gpu.used, rounded, stream)
            self._update_peaks()
            stats = self.memory_stats()
            unused = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
            raise DeviceOutOfMemory(
                f"out of memory. Tried to allocate {_fmt(alloc)}. The device has a total "
                f"capacity of {_fmt(self.gpu.capacity)} of which "
                f"{_fmt(self.gpu.capacity - self.gpu.used)} is free. "
                f"{_fmt(stats['allocated_bytes.all.current'])} is allocated and {_fmt(unused)} is "
                "reserved but unallocated."
            )
        ptr = self._alloc_found_block(block, rounded, size, pool, self._should_split(block, rounded))
        self._update_peaks()
        return ptr

    def free(self, ptr: int) -> None:
        """``DeviceCachingAllocator::free``: a block used on other streams waits for events
        recorded on them (``insert_events``); any other goes back to its pool at once."""
        block = self.allocated.pop(ptr, None)
        if block is None:
            raise ValueError(f"invalid device pointer: {ptr:#x}")
        block.allocated = False
        self._record("free_requested", block.ptr, block.requested, block.stream)
        if block.stream_uses:
            if self.captures:
                self.deferred.append(block)
            else:
                self._insert_events(block)
        else:
            self._free_block(block)
        self._update_peaks()

    def record_stream(self, ptr: int, stream: int) -> None:
        """``DeviceCachingAllocator::recordStream``: the block at ``ptr`` is also used on
        ``stream`` (ignored for its own stream)."""
        block = self.allocated[ptr]
        if stream != block.stream:
            block.stream_uses.add(stream)

    def empty_cache(self) -> None:
        """``DeviceCachingAllocator::emptyCache`` -> ``release_cached_blocks``."""
        self._release_cached_blocks()
        self._update_peaks()

    def begin_allocate_to_pool(self, pool_id: tuple[int, int], stream: int) -> None:
        """``beginAllocateToPool`` (``CUDAGraph::capture_begin``): requests on ``stream`` go to
        the private pool ``pool_id`` (made on first use, shared if it exists) until
        :meth:`end_allocate_to_pool`."""
        if pool_id in self.private_pools:
            self.private_pools[pool_id].use_count += 1
        else:
            self.private_pools[pool_id] = PrivatePool(pool_id)
        self.captures[pool_id] = stream

    def end_allocate_to_pool(self, pool_id: tuple[int, int]) -> None:
        """``endAllocateToPool`` (``CUDAGraph::capture_end``)."""
        del self.captures[pool_id]

    def release_pool(self, pool_id: tuple[int, int]) -> None:
        """``releasePool`` (``CUDAGraph::reset``): when no graph uses the pool, its cached blocks
        may be cudaFree'd by the next ``release_cached_blocks``."""
        pool = self.private_pools[pool_id]
        pool.use_count -= 1
        if pool.use_count == 0:
            self.freeable[pool_id] = pool

    def snapshot(self) -> list[dict]:
        """The segments, sorted by address, as ``torch.cuda.memory._snapshot()["segments"]``:
        ``address``, ``total_size``, ``allocated_size``, ``active_size``, ``requested_size``,
        ``stream``, ``segment_type`` (``"small"``/``"large"``), ``segment_pool_id``, and
        ``blocks`` (``address``, ``size``, ``requested_size``, ``state``), in address order."""
        segments = []
        for head in sorted((b for b in self.blocks if b.prev is None), key=lambda b: b.ptr):
            blocks, b = [], head
            while b is not None:
                state = (ALLOCATED if b.allocated else
                         PENDING_FREE if b.event_count or b.stream_uses else INACTIVE)
                blocks.append({"address": b.ptr, "size": b.size,
                               "requested_size": b.requested if state != INACTIVE else 0,
                               "state": state})
                b = b.next
            segments.append({
                "address": head.ptr,
                "total_size": sum(x["size"] for x in blocks),
                "allocated_size": sum(x["size"] for x in blocks if x["state"] == ALLOCATED),
                "active_size": sum(x["size"] for x in blocks if x["state"] != INACTIVE),
                "requested_size": sum(x["requested_size"] for x in blocks),
                "stream": head.stream,
                "segment_type": "small" if head.pool.small else "large",
                "segment_pool_id": head.pool.private.id if head.pool.private else (0, 0),
                "is_expandable": False,
                "device": 0,
                "blocks": blocks,
            })
        return segments

    def memory_stats(self) -> dict[str, int]:
        """``torch.cuda.memory_stats()``'s keys this model keeps: the current value of every
        byte and count statistic (from the blocks, :func:`stats_from_segments`), their peaks
        (after each call), and the event counters (``num_alloc_retries``, ``num_ooms``,
        ``num_device_alloc``, ``num_device_free``, ``num_sync_all_streams``)."""
        stats = stats_from_segments(self.snapshot())
        for key, value in list(stats.items()):
            stats[key.replace(".current", ".peak")] = max(self.peaks.get(key, 0), value)
        for name in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                     "num_sync_all_streams"):
            stats[name] = self.counters[name]
        stats["max_split_size"] = -1 if self.max_split_size == SIZE_MAX else self.max_split_size
        return stats

    def memory_snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()``'s shape: ``{"segments": ..., "device_traces":
        [trace]}``, which ``torch.cuda._memory_viz`` (``segment_plot``, ``trace_plot``,
        ``segsum``) reads."""
        return {"segments": self.snapshot(), "device_traces": [list(self.trace)]}

    # -------------------------------------------------------------- the rules
    def _get_pool(self, size: int, stream: int) -> BlockPool:
        """``get_pool``: a capture's private pool for its stream, else small (<= 1 MiB) or large."""
        for pool_id, capturing in self.captures.items():
            if capturing == stream:
                private = self.private_pools[pool_id]
                return private.small if size <= K_SMALL_SIZE else private.large
        return self.small if size <= K_SMALL_SIZE else self.large

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """``get_free_block``: the smallest cached block of ``stream`` with at least ``size``
        bytes (lowest address on ties), unless the ``max_split_size`` rules refuse it."""
        i = bisect.bisect_left(pool.blocks, (stream, size, 0), key=_order)
        if i == len(pool.blocks) or pool.blocks[i].stream != stream:
            return None
        block = pool.blocks[i]
        if size < self.max_split_size <= block.size:
            return None  # do not return an oversized block for a smaller request
        if size >= self.max_split_size and block.size >= size + self.max_non_split_rounding:
            return None  # an oversized block may be rounded up, but only so far
        del pool.blocks[i]
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        """``should_split``: small pool, if at least 512 bytes remain; large pool, if the request
        is under ``max_split_size`` and more than 1 MiB remains."""
        remaining = block.size - size
        if block.pool.small:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.max_split_size and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, block: Block, size: int, requested: int, pool: BlockPool,
                           split: bool) -> int:
        """``alloc_found_block``: the front ``size`` bytes become the allocation; the rest, if
        split off, goes back to the pool as a free block."""
        if split:
            rest = block
            block = Block(rest.ptr, size, rest.stream, pool, prev=rest.prev, next=rest)
            if block.prev is not None:
                block.prev.next = block
            rest.prev = block
            rest.ptr += size
            rest.size -= size
            pool.insert(rest)
            self.blocks.add(block)
        block.allocated, block.requested = True, requested
        self.allocated[block.ptr] = block
        self._record("alloc", block.ptr, requested, block.stream)
        return block.ptr

    def _alloc_block(self, pool: BlockPool, size: int, stream: int, retry: bool = False):
        """``alloc_block``: a fresh segment of ``size`` bytes from cudaMalloc, or None."""
        if retry:
            self.counters["num_alloc_retries"] += 1
        ptr = self.gpu.cuda_malloc(size)
        if ptr is None:
            return None
        if pool.private is not None:
            pool.private.cuda_malloc_count += 1
        block = Block(ptr, size, stream, pool)
        self.blocks.add(block)
        self.counters["num_device_alloc"] += 1
        self._record("segment_alloc", ptr, size, stream)
        return block

    def _free_block(self, block: Block) -> None:
        """``free_block``: merge with free neighbours, then cache the block in its pool."""
        self._record("free_completed", block.ptr, block.requested, block.stream)
        if self.coalesce:
            for neighbour in (block.prev, block.next):
                self._try_merge_blocks(block, neighbour, block.pool)
        block.pool.insert(block)

    def _try_merge_blocks(self, dst: Block, src: Block | None, pool: BlockPool) -> int:
        """``try_merge_blocks``: absorb ``src`` into ``dst`` if it is free (not allocated, no
        pending events, no recorded streams); return the bytes absorbed."""
        if src is None or src.allocated or src.event_count > 0 or src.stream_uses:
            return 0
        if dst.prev is src:  # [src dst]
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        pool.remove(src)
        self.blocks.discard(src)
        return src.size

    def _release_block(self, block: Block) -> None:
        """``release_block``: cudaFree a whole cached segment."""
        self._record("segment_free", block.ptr, block.size, block.stream)
        self.gpu.cuda_free(block.ptr)
        if block.pool.private is not None:
            block.pool.private.cuda_malloc_count -= 1
        self.counters["num_device_free"] += 1
        block.pool.remove(block)
        self.blocks.discard(block)

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        """``release_available_cached_blocks``: with a ``max_split_size`` set, cudaFree the
        smallest oversize cached block of ``stream`` that covers the request, else the largest
        ones until they add up to it. False if that is not possible (or no limit is set)."""
        if self.max_split_size == SIZE_MAX:
            return False
        key = max(size, self.max_split_size)
        mine = [b for b in pool.blocks if b.stream == stream]
        fits = [b for b in mine if b.size >= key]
        if fits:
            self._release_block(fits[0])
            return True
        released = 0
        for block in reversed(mine):
            if released >= key or block.size < self.max_split_size:
                break
            released += block.size
            self._release_block(block)
        return released >= key

    def _release_cached_blocks(self) -> bool:
        """``release_cached_blocks``: wait for every pending event, then cudaFree every cached
        block that is a whole segment (and the blocks of private pools no graph uses)."""
        self._synchronize_and_free_events()
        for pool in (self.large, self.small):
            self._release_blocks(pool)
        for pool_id, private in list(self.freeable.items()):
            self._release_blocks(private.small)
            self._release_blocks(private.large)
            if private.cuda_malloc_count == 0:
                del self.private_pools[pool_id], self.freeable[pool_id]
        return True

    def _release_blocks(self, pool: BlockPool) -> None:
        for block in list(pool.blocks):
            if not block.is_split():
                self._release_block(block)

    def _insert_events(self, block: Block) -> None:
        """``insert_events``: one event per stream the block was used on."""
        for stream in sorted(block.stream_uses):
            self.events.setdefault(stream, collections.deque()).append(
                (self.gpu.record_event(stream), block))
            block.event_count += 1
        block.stream_uses.clear()

    def _process_events(self) -> None:
        """``process_events``: free the blocks whose events have all completed."""
        self._insert_deferred()
        for stream in list(self.events):
            queue = self.events[stream]
            while queue and queue[0][0].query():
                _, block = queue.popleft()
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
            if not queue:
                del self.events[stream]

    def _synchronize_and_free_events(self) -> None:
        """``synchronize_and_free_events``: wait for every event and free their blocks."""
        self.counters["num_sync_all_streams"] += 1
        self._insert_deferred()
        for queue in self.events.values():
            for event, block in queue:
                event.synchronize()
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
        self.events.clear()

    def _insert_deferred(self) -> None:
        """``insert_events_deferred_until_no_capture``."""
        for block in self.deferred:
            self._insert_events(block)
        self.deferred.clear()

    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": stream,
                           "frames": [], "time_us": len(self.trace)})

    def _update_peaks(self) -> None:
        for key, value in stats_from_segments(self.snapshot()).items():
            self.peaks[key] = max(self.peaks.get(key, 0), value)


def _fmt(n: int) -> str:
    """``format_size``: bytes as torch's OOM message writes them."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


# ------------------------------------------------------------------ recorded runs
def run(trace: list[tuple], *, capacity: int = 2 * GiB, max_split_size: int | None = None,
        coalesce: bool = True, end_state: bool = False) -> dict:
    """Replay ``trace`` (``labs.allocator.traces.replay``'s format) on a fresh
    ``SimulatedGPU(capacity)`` (bytes) through ``CachingAllocatorModel(max_split_size=...,
    coalesce=...)``, and return it as plain data (JSON-able) that
    ``labs.allocator.traces.Run.from_json`` reads: the trace and settings; per step the address
    a malloc returned (``"oom"`` and the error's text when it raised; None for other ops), the
    block size it rounded to, the runtime calls the step made, and ``snapshot()`` after it; at
    the end ``memory_stats()`` and ``memory_snapshot()``."""
    gpu = SimulatedGPU(capacity)
    allocator = CachingAllocatorModel(gpu, max_split_size=max_split_size, coalesce=coalesce)
    steps: list[dict] = []
    logged = [0]

    def after_step(i, op, result):
        step = {"result": result, "calls": [list(c) for c in gpu.log[logged[0]:]],
                "segments": traces.pack(allocator.snapshot())}
        logged[0] = len(gpu.log)
        if op[0] == "malloc":
            step["rounded"] = round_size(op[2], allocator.divisions)
        if isinstance(result, DeviceOutOfMemory):
            step.update(result="oom", error=str(result))
        steps.append(step)

    traces.replay(allocator, gpu, trace, after_step)
    return {"trace": [list(op) for op in trace], "capacity": capacity,
            "max_split_size": max_split_size, "coalesce": coalesce, "steps": steps,
            "memory_stats": allocator.memory_stats() if end_state else None,
            "memory_snapshot": allocator.memory_snapshot() if end_state else None}


def oom_case(trace: list[tuple], capacity: int, ooms: int = 1) -> tuple[dict, dict] | None:
    """The model's ``memory_snapshot()`` at the ``ooms``-th out-of-memory error of ``trace`` (the
    trace stops there; the earlier ones are survived, as by a program that catches
    ``torch.OutOfMemoryError``) on a ``SimulatedGPU(capacity)``, and the answer of
    ``allocator.oom-forensics`` for it; None when the trace never gets there. The answer is read
    from the model itself as it replays the trace (its live allocations, its blocks, and what
    freeing each block would leave), not from the snapshot the learner's function reads."""
    gpu = SimulatedGPU(capacity)
    allocator = CachingAllocatorModel(gpu)
    peak = {"bytes": 0, "at": 0}
    seen = [0]

    class Stop(Exception):
        pass

    def step(i, op, result):
        if isinstance(result, DeviceOutOfMemory):
            seen[0] += 1
            if seen[0] == ooms:
                raise Stop(op)
        # live from alloc to free_requested (DeviceCachingAllocator::free), the exercise's
        # definition; requested_bytes counts a block pending on another stream's events until
        # free_block (free_completed)
        live = sum(b.requested for b in allocator.allocated.values())
        if live > peak["bytes"]:  # (the alloc event is the last one the malloc recorded)
            peak.update(bytes=live, at=len(allocator.trace) - 1)

    try:
        traces.replay(allocator, gpu, trace, step)
    except Stop as stop:
        return allocator.memory_snapshot(), _oom_answer(allocator, stop.args[0], peak)
    return None


def _oom_answer(allocator: CachingAllocatorModel, op: tuple, peak: dict) -> dict:
    request, stream = round_size(op[2]), op[3]
    stats = allocator.memory_stats()
    return {
        "oom_request": request,
        "peak_requested": peak["bytes"],
        "peak_at": peak["at"],
        "reserved_unallocated": stats["reserved_bytes.all.current"]
        - stats["allocated_bytes.all.current"],
        "largest_free_block": max((b.size for b in allocator.blocks if not b.allocated),
                                  default=0),
        "culprit": _culprit(allocator, request, stream),
    }


def _culprit(allocator: CachingAllocatorModel, request: int, stream: int) -> int | None:
    """The smallest allocated block (lowest address on ties) of the request's pool and stream
    that, freed in a copy of the model (as if its uses on other streams were over: it merges with
    its free neighbours at once), leaves a free block of at least ``request`` bytes."""
    small = request <= K_SMALL_SIZE
    for block in sorted(allocator.allocated.values(), key=lambda b: (b.size, b.ptr)):
        if block.pool.small != small or block.stream != stream:
            continue
        trial = copy.deepcopy(allocator)
        trial.allocated[block.ptr].stream_uses.clear()  # freed once its other streams are done
        trial.free(block.ptr)
        freed = next(b for b in trial.blocks if b.ptr <= block.ptr < b.ptr + b.size)
        if freed.size >= request:
            return block.ptr
    return None


def random_oom_cases(seed: int, count: int) -> list[tuple[dict, dict]]:
    """``count`` :func:`oom_case` of seeded random traces on small GPUs (64-128 MiB), on one
    stream or two, at the trace's first out-of-memory error or its second."""
    rng = random.Random(seed)
    found = []
    while len(found) < count:
        trace = traces.random_trace(rng, 150, streams=rng.choice([1, 2]),
                                    live_max=rng.choice([6, 10, 14]))
        case = oom_case(trace, rng.choice([64, 96, 128]) * MiB, ooms=rng.choice([1, 2]))
        if case is not None:
            found.append(case)
    return found


#: the seed of the public checks' random traces (fixed: what learners see is recorded)
PUBLIC_SEED = 1


def recordings() -> dict:
    """Everything ``recorded.json`` holds, computed by the model: the runs of the notebook's
    traces and of the public checks' traces, the plans of :data:`labs.allocator.traces.PLANS`,
    and the public out-of-memory cases."""
    rng = random.Random(PUBLIC_SEED)
    runs = {
        "loop": run(traces.LOOP),
        "best_fit": run(traces.BEST_FIT, coalesce=False),
        "best_fit_merging": run(traces.BEST_FIT, end_state=True),
        "ties": run(traces.TIES, coalesce=False),
        "best_fit_random": run(traces.random_trace(rng, 60), coalesce=False),
        "max_split_none": run(traces.MAX_SPLIT),
        "max_split_32": run(traces.MAX_SPLIT, max_split_size=32 * MiB),
        "coalesce": run(traces.COALESCE),
        "out_of_memory": run(traces.OUT_OF_MEMORY, capacity=100 * MiB, end_state=True),
        "coalesce_random": run(traces.random_trace(rng, 80, empty_cache=True)),
        "streams": run(traces.STREAMS),
        "streams_random": run(traces.random_trace(rng, 80, streams=2)),
        "vs_real_random": run(traces.random_trace(rng, 60), capacity=64 * GiB),
        "fragmented": run(traces.FRAGMENTED, capacity=100 * MiB, end_state=True),
        "graph_pool": run(traces.GRAPH_POOL, end_state=True),
        "graph_random": run(traces.graph_trace(rng, 80), capacity=192 * MiB),
    }
    plans = {f"{n},{d}": allocation_plan(n, d) for n, d in traces.PLANS}
    oom_cases = {"fragmented": oom_case(traces.FRAGMENTED, 100 * MiB),
                 "random": random_oom_cases(PUBLIC_SEED, 1)[0]}
    return {"written_by": "python -m labs.allocator.model", "runs": runs, "plans": plans,
            "oom_cases": {name: {"snapshot": snap, "answer": answer}
                          for name, (snap, answer) in oom_cases.items()}}


def recorded_text() -> str:
    """``recorded.json`` as :func:`recordings` makes it (one run or table per line)."""
    data = json.loads(json.dumps(recordings()))  # tuples as lists, as the file holds them
    parts = []
    for key, value in data.items():
        if isinstance(value, dict):
            inner = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
                               for k, v in value.items())
            parts.append(f" {json.dumps(key)}: {{\n{inner}\n }}")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


if __name__ == "__main__":
    traces.RECORDED.write_text(recorded_text(), encoding="utf-8")
    print(f"wrote {traces.RECORDED} ({traces.RECORDED.stat().st_size:,} bytes)", file=sys.stderr)
