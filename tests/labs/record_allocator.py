"""Replay seeded traces through the real CUDA caching allocator and through the lab's reference
model (``labs/allocator/model.py``), step by step, and record what the real one did.

On a CUDA machine::

    python -m tests.labs.record_allocator tests/labs/data/allocator_gpu/<gpu>.json

writes, for every trace of :func:`traces`, ``torch.cuda.memory_stats()`` and the segments of
``torch.cuda.memory._snapshot()`` after each step, with the torch version and the GPU they came
from; it exits non-zero if the model disagrees anywhere. ``tests/labs/test_allocator_vs_real.py``
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
from labs.allocator.traces import random_trace, replay

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
    return out


def normal(segments: list[dict], streams: dict[int, int]) -> list:
    """Segments without addresses, in a stable order: (pool, size, stream, blocks)."""
    return sorted(
        [s["segment_type"], s["total_size"], streams.get(s["stream"], s["stream"]),
         [[b["size"], b["state"]] for b in s["blocks"]]]
        for s in segments
    )


def replay_model(trace: list[tuple], capacity: int) -> list[dict]:
    """The model's stats and normalized segments after each step."""
    gpu = SimulatedGPU(capacity)
    alloc = model.CachingAllocatorModel(gpu)
    steps: list[dict] = []

    def after(i, op, result):
        stats = alloc.memory_stats()
        steps.append({"oom": isinstance(result, DeviceOutOfMemory),
                      "stats": {k: stats[k] for k in STATS},
                      "segments": normal(alloc.snapshot(), {})})

    replay(alloc, gpu, trace, after)
    return steps


def replay_real(trace: list[tuple], capacity: int | None) -> tuple[list[dict], int]:
    """The real allocator's stats and normalized segments after each step, and the capacity the
    model must be given (``set_per_process_memory_fraction`` caps the real one)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0, "CUDA memory is still reserved before the replay"
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = 1.0 if capacity is None else capacity / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    torch.cuda.reset_accumulated_memory_stats()
    streams = {0: torch.cuda.current_stream()}
    live, steps = {}, []
    try:
        for op in trace:
            kind, oom = op[0], False
            for s in (op[3],) if kind == "malloc" else (op[2],) if kind == "use" else ():
                if s not in streams:
                    streams[s] = torch.cuda.Stream()
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
            elif kind == "sync" and op[1] in streams:
                streams[op[1]].synchronize()
            elif kind == "empty_cache":
                torch.cuda.empty_cache()
            stats = torch.cuda.memory_stats()
            handles = {st.cuda_stream: i for i, st in streams.items()}
            steps.append({"oom": oom, "stats": {k: stats.get(k, 0) for k in STATS},
                          "segments": normal(torch.cuda.memory._snapshot()["segments"], handles)})
    finally:
        live.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)
    return steps, int(fraction * total)


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

    recorded, failures = [], []
    for t in traces():
        trace = [tuple(op) for op in t["trace"]]
        real, capacity = replay_real(trace, t["capacity"])
        model_capacity = capacity if t["capacity"] is not None else 1 << 50
        failures += [f"{t['name']}: {d}" for d in differences(
            real, replay_model(trace, model_capacity), trace)]
        recorded.append({"name": t["name"], "capacity": model_capacity, "trace": trace,
                         "steps": real})
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
