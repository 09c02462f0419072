"""Replay seeded traces through the real CUDA caching allocator and through the lab's reference
model (``labs/allocator/model.py``), step by step, and record what the real one did.

On a CUDA machine::

    python -m tests.labs.record_allocator tests/labs/data/allocator_gpu/<gpu>.json

writes, for every trace of :func:`traces`, ``torch.cuda.memory_stats()`` and the segments of
``torch.cuda.memory._snapshot()`` after each step, with the torch version and the GPU they came
from; it exits non-zero if the model disagrees anywhere. The traces include the hidden cases at
``max_split_size``'s boundaries (the allocator set as they set it) and CUDA graph captures into
private pools (``torch.cuda.CUDAGraph``, pool ids compared up to renaming: :class:`RealGraphs`).
The graph and ``max_split_size`` replays were written without a GPU at hand (2026-12): their
first GPU run is their first test. ``tests/labs/test_allocator_vs_real.py``
checks the model against every recording on any machine, and runs the live comparison on a GPU.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from labs.allocator import model
from labs.allocator.checks.round_size import boundaries
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.snapshots import STAT_NAMES, MiB
from labs.allocator.checks.best_fit_split import ROUNDING_LIMIT
from labs.allocator.checks.coalesce import OVERSIZE_SMALLEST
from labs.allocator.traces import (GRAPH_EDGES, GRAPH_POOL, MAX_SPLIT, graph_trace, random_trace,
                                   replay)

#: the statistics compared (``current`` values), and the event counters
STATS = [f"{name}.{scope}.current" for name in STAT_NAMES
         for scope in ("all", "small_pool", "large_pool")] + ["num_alloc_retries", "num_ooms"]
#: GPU cycles a "use" keeps its stream busy (about 0.2 s at 2 GHz): longer than the host needs
#: to reach the trace's next "sync", so events complete when the model says they do
SLEEP_CYCLES = 400_000_000


def traces() -> list[dict]:
    """The recorded traces: name, trace, capacity in bytes (None: the whole GPU)."""
    rng = random.Random(2026)
    edge = [("malloc", i + 1, n, 0) for i, n in enumerate(boundaries()[:40])]
    edge += [("free", h) for h in range(1, 41, 2)] + [("empty_cache",)]
    out = [{"name": "boundary sizes", "trace": edge, "capacity": None}]
    for k in range(3):
        out.append({"name": f"one stream {k}", "capacity": None,
                    "trace": random_trace(rng, 120, empty_cache=True)})
    for k in range(3):
        out.append({"name": f"streams {k}", "capacity": None,
                    "trace": random_trace(rng, 100, streams=k + 2, empty_cache=True)})
    for k, mib in enumerate((96, 128, 160)):
        out.append({"name": f"out of memory {k}", "capacity": mib * MiB,
                    "trace": random_trace(rng, 100, streams=1 + k % 2, live_max=8)})
    # the hidden cases at the max_split_size boundaries, with the allocator set as they are
    out += [{"name": "oversize rounding limit", "capacity": None, "trace": ROUNDING_LIMIT,
             "max_split_size": 40 * MiB},
            {"name": "oversize release, smallest first", "capacity": 160 * MiB,
             "trace": OVERSIZE_SMALLEST, "max_split_size": 40 * MiB},
            {"name": "max_split_size", "capacity": None, "trace": MAX_SPLIT,
             "max_split_size": 32 * MiB}]
    # CUDA graph captures into private pools (torch.cuda.CUDAGraph)
    out.append({"name": "graph pool", "capacity": None, "trace": GRAPH_POOL})
    out += [{"name": f"graphs: {name}", "capacity": mib * MiB, "trace": trace}
            for name, (trace, mib) in GRAPH_EDGES.items()]
    for k, mib in enumerate((None, 192)):
        out.append({"name": f"graphs {k}", "capacity": mib and mib * MiB,
                    "trace": graph_trace(rng, 80)})
    return out


def normal(segments: list[dict], streams: dict[int, int], pools: dict | None = None) -> list:
    """Segments without addresses, in a stable order: (pool, size, stream, blocks, pool id).
    ``streams`` and ``pools`` rename the real allocator's stream handles and private pool ids
    to the trace's."""
    pools = pools or {}
    return sorted(
        [s["segment_type"], s["total_size"], streams.get(s["stream"], s["stream"]),
         [[b["size"], b["state"]] for b in s["blocks"]],
         list(pools.get(tuple(s.get("segment_pool_id", (0, 0))),
                        s.get("segment_pool_id", (0, 0))))]
        for s in segments
    )


def replay_model(trace: list[tuple], capacity: int, max_split_size: int | None = None
                 ) -> list[dict]:
    """The model's stats and normalized segments after each step."""
    gpu = SimulatedGPU(capacity)
    alloc = model.CachingAllocatorModel(gpu, max_split_size=max_split_size)
    steps: list[dict] = []

    def after(i, op, result):
        stats = alloc.memory_stats()
        steps.append({"oom": isinstance(result, DeviceOutOfMemory),
                      "stats": {k: stats[k] for k in STATS},
                      "segments": normal(alloc.snapshot(), {})})

    replay(alloc, gpu, trace, after)
    return steps


class RealGraphs:
    """The trace's CUDA graph ops on the real allocator: ``begin_pool`` starts a capture
    (``torch.cuda.CUDAGraph.capture_begin``, relaxed, so other streams may still allocate) on
    its stream into a new pool (``graph_pool_handle``) or, for a pool id seen before, the pool
    the trace's graphs share; ``end_pool`` ends it (the graph then holds the pool);
    ``release_pool`` destroys one graph holding it (``reset``: ``releasePool``). ``ids`` maps
    the real pool ids to the trace's. A graph captured and kept alive before the replay
    (:meth:`warm_up`) makes the CUDA generator's graph state (two int64 tensors of the default
    pool, made when a first graph registers) exist before the baseline is taken."""

    def __init__(self, torch, streams: dict):
        self.torch, self.streams = torch, streams
        self.handles: dict[tuple, object] = {}  # trace pool id -> real handle
        self.held: dict[tuple, list] = {}  # trace pool id -> graphs holding it
        self.capturing = None  # (graph, trace pool id, stream) between begin and end
        self.warm = None

    @property
    def ids(self) -> dict[tuple, list]:
        return {tuple(h): list(k) for k, h in self.handles.items()}

    def warm_up(self, scratch) -> None:
        torch, side = self.torch, self.torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        self.warm = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            self.warm.capture_begin()
            scratch.add_(1)
            self.warm.capture_end()
        torch.cuda.synchronize()

    def apply(self, op: tuple) -> None:
        torch, kind = self.torch, op[0]
        if kind == "begin_pool":
            pool, stream = tuple(op[1]), self.streams[op[2]]
            handle = self.handles.setdefault(pool, torch.cuda.graph_pool_handle())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=handle, capture_error_mode="relaxed")
            self.capturing = (graph, pool, stream)
        elif kind == "end_pool":
            graph, pool, stream = self.capturing
            with torch.cuda.stream(stream):
                graph.capture_end()
            self.held.setdefault(pool, []).append(graph)
            self.capturing = None
        elif kind == "release_pool":
            self.held[tuple(op[1])].pop().reset()

    def close(self) -> None:
        for graphs in self.held.values():
            for graph in graphs:
                graph.reset()
        if self.warm is not None:
            self.warm.reset()


def replay_real(trace: list[tuple], capacity: int | None, max_split_size: int | None = None
                ) -> tuple[list[dict], int]:
    """The real allocator's stats and normalized segments after each step, and the capacity the
    model must be given (``set_per_process_memory_fraction`` caps the real one). What was
    allocated before the replay (none but, for a trace with captures, the CUDA generator's graph
    state) is left out: its segments are not compared and its statistics are subtracted.
    ``max_split_size`` (bytes) is set with ``torch.cuda.memory._set_allocator_settings`` for the
    replay."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0, "CUDA memory is still reserved before the replay"
    streams = {0: torch.cuda.current_stream()}
    for op in trace:
        for s in _streams_of(op):
            streams.setdefault(s, torch.cuda.Stream())
    graphs = RealGraphs(torch, streams)
    scratch = None
    if any(op[0] == "begin_pool" for op in trace):
        scratch = torch.zeros(1, device="cuda")
        graphs.warm_up(scratch)
    before = torch.cuda.memory_stats()
    base = {k: before.get(k, 0) for k in STATS}
    kept = {s["address"] for s in torch.cuda.memory._snapshot()["segments"]}
    total = torch.cuda.get_device_properties(0).total_memory
    reserved = torch.cuda.memory_reserved()
    fraction = 1.0 if capacity is None else (capacity + reserved) / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    if max_split_size is not None:
        torch.cuda.memory._set_allocator_settings(f"max_split_size_mb:{max_split_size // MiB}")
    live, steps = {}, []
    try:
        for op in trace:
            kind, oom = op[0], False
            if kind == "malloc":
                try:
                    with torch.cuda.stream(streams[op[3]]):
                        live[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
                except torch.cuda.OutOfMemoryError:
                    oom = True
            elif kind == "free":
                live.pop(op[1], None)
            elif kind == "use" and op[1] in live:
                with torch.cuda.stream(streams[op[2]]):
                    torch.cuda._sleep(SLEEP_CYCLES)
                    live[op[1]][:1].add_(1)
                live[op[1]].record_stream(streams[op[2]])
            elif kind == "sync":
                streams[op[1]].synchronize()
            elif kind == "empty_cache":
                torch.cuda.empty_cache()
            else:
                graphs.apply(op)
            stats = torch.cuda.memory_stats()
            handles = {st.cuda_stream: i for i, st in streams.items()}
            segments = [s for s in torch.cuda.memory._snapshot()["segments"]
                        if s["address"] not in kept]
            steps.append({"oom": oom,
                          "stats": {k: stats.get(k, 0) - base[k] for k in STATS},
                          "segments": normal(segments, handles, graphs.ids)})
    finally:
        live.clear()
        torch.cuda.synchronize()
        graphs.close()
        del scratch
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)
        if max_split_size is not None:  # (back to no limit: 1 TiB, more than any GPU holds)
            torch.cuda.memory._set_allocator_settings(f"max_split_size_mb:{1 << 20}")
    return steps, int(fraction * total) - reserved


def _streams_of(op: tuple) -> tuple:
    """The streams an op of a trace names."""
    return {"malloc": (op[-1],), "use": (op[-1],), "sync": (op[-1],),
            "begin_pool": (op[-1],)}.get(op[0], ())


def differences(real: list[dict], predicted: list[dict], trace: list[tuple]) -> list[str]:
    """Where the model's steps differ from the real ones (empty when they agree)."""
    found = []
    for i, (a, b) in enumerate(zip(real, predicted)):
        for key in ("oom", "stats", "segments"):
            if a[key] != b[key]:
                diff = ({k: (a[key][k], b[key][k]) for k in a[key] if a[key][k] != b[key][k]}
                        if key == "stats" else (a[key], b[key]))
                found.append(f"step {i + 1} {trace[i]}: {key} real vs model: {diff}")
    return found


def main(out: str) -> int:
    import torch

    if not torch.cuda.is_available():
        print(f"record_allocator needs a CUDA GPU; torch {torch.__version__} sees none",
              file=sys.stderr)
        return 2
    recorded, failures = [], []
    for t in traces():
        trace = [tuple(op) for op in t["trace"]]
        split = t.get("max_split_size")
        real, capacity = replay_real(trace, t["capacity"], split)
        model_capacity = capacity if t["capacity"] is not None else 1 << 50
        failures += [f"{t['name']}: {d}" for d in differences(
            real, replay_model(trace, model_capacity, split), trace)]
        recorded.append({"name": t["name"], "capacity": model_capacity, "trace": trace,
                         "max_split_size": split, "steps": real})
        print(f"{t['name']}: {len(trace)} steps recorded", flush=True)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0), "traces": recorded}))
    print(f"wrote {out}; {len(failures)} difference(s) from the model")
    for line in failures[:20]:
        print("  ", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "allocator_gpu.json"))
