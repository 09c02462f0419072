"""The vocabulary of lab 3, shared by the learner's allocators, the pictures and the checks: the
caching allocator's size constants, the block states and statistics of its memory snapshots,
and bytes in words. None of it decides where a block goes: that is the exercises' work (and the
reference model's, which stays with the instructor).

Sources: ``c10/core/AllocatorConfig.h`` (the constants, and the large segment size:
``AcceleratorAllocatorConfig::large_segment_size()``), ``c10/cuda/CUDACachingAllocator.cpp``
(``DeviceCachingAllocator::snapshot``, ``getStats``) and ``c10/core/Allocator.h`` (``Stat``).
"""

from __future__ import annotations

KiB, MiB, GiB = 1024, 1024**2, 1024**3
#: ``c10/core/AllocatorConfig.h``: all sizes are rounded to at least 512 bytes
K_MIN_BLOCK_SIZE = 512
#: ``c10/core/AllocatorConfig.h``: largest "small" allocation is 1 MiB
K_SMALL_SIZE = MiB
#: ``c10/core/AllocatorConfig.h``: "small" allocations are packed in 2 MiB blocks
K_SMALL_BUFFER = 2 * MiB
#: ``c10/core/AllocatorConfig.h``: allocations between 1 and 10 MiB may use kLargeBuffer
K_MIN_LARGE_ALLOC = 10 * MiB
#: ``c10/core/AllocatorConfig.h``: round up large allocations to 2 MiB
K_ROUND_LARGE = 2 * MiB
#: the large segment size, 20 MiB by default: not a constant in torch 2.13.0 but a setting,
#: ``c10/core/AllocatorConfig.h: AcceleratorAllocatorConfig::large_segment_size()`` (member
#: ``large_segment_size_``; ``large_segment_size_mb`` changes it), which ``get_allocation_size``
#: returns for requests between 1 and 10 MiB; the lab keeps the default
K_LARGE_BUFFER = 20 * MiB
#: ``AcceleratorAllocatorConfig::max_split_size_`` default: ``SIZE_MAX`` (no limit)
SIZE_MAX = 2**64 - 1

#: the block states of ``torch.cuda.memory._snapshot()`` (``BlockInfo`` -> ``_snapshot``)
ALLOCATED, PENDING_FREE, INACTIVE = "active_allocated", "active_pending_free", "inactive"

#: the byte and count statistics of ``torch.cuda.memory_stats()`` that snapshots determine
STAT_NAMES = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
              "requested_bytes", "allocation", "segment", "active", "inactive_split")


def stats_from_segments(segments: list[dict]) -> dict[str, int]:
    """The ``current`` value of each statistic of ``torch.cuda.memory_stats()`` (``STAT_NAMES``,
    for ``all``, ``small_pool`` and ``large_pool``) computed from a snapshot's segments, as
    ``DeviceCachingAllocator`` keeps them (``c10/core/Allocator.h: Stat::increase``): allocated =
    allocated blocks; reserved = segments; active = allocated or waiting on events; inactive
    split = free blocks of segments that are split (a block without ``requested_size`` counts 0
    requested bytes). Keys: ``"<stat>.<pool>.current"``; values in bytes or counts."""
    stats = {f"{name}.{scope}.current": 0 for name in STAT_NAMES
             for scope in ("all", "small_pool", "large_pool")}
    for seg in segments:
        scopes = ("all", "small_pool" if seg["segment_type"] == "small" else "large_pool")
        split = len(seg["blocks"]) > 1
        for scope in scopes:
            stats[f"reserved_bytes.{scope}.current"] += seg["total_size"]
            stats[f"segment.{scope}.current"] += 1
            for b in seg["blocks"]:
                if b["state"] == ALLOCATED:
                    stats[f"allocated_bytes.{scope}.current"] += b["size"]
                    stats[f"allocation.{scope}.current"] += 1
                if b["state"] != INACTIVE:
                    stats[f"active_bytes.{scope}.current"] += b["size"]
                    stats[f"active.{scope}.current"] += 1
                    stats[f"requested_bytes.{scope}.current"] += b.get("requested_size", 0)
                elif split:
                    stats[f"inactive_split_bytes.{scope}.current"] += b["size"]
                    stats[f"inactive_split.{scope}.current"] += 1
    return stats


def format_bytes(n: int, exact: bool = False) -> str:
    """Bytes in words: ``n B`` below 1 KiB, else KiB/MiB/GiB with at most two decimals; with
    ``exact``, the byte count first when the unit does not divide ``n`` (``10485759 B (about
    10 MiB)``)."""
    if n < KiB:
        return f"{n} B"
    unit, scale = next((u, s) for u, s in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)) if n >= s)
    text = f"{n / scale:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} B (about {text})" if exact and n % scale else text
