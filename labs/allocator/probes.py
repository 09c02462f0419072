"""The allocator lab's probes: what runs in the learner's kernel when an exercise is judged (see
``grader.kernel.probe``). Each calls the answer on a simulated GPU and returns what it observed as
plain data; the judges in ``labs/allocator/checks`` hold it against the reference model's run of
the same trace (recorded, or made in the grader's own process) and decide. This module does not
import the reference model."""
from __future__ import annotations

import contextlib
import copy
import sys
from pathlib import Path

from grader.checks import probe
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.traces import apply_op

#: what a learner's code may not call: the reference model and the checks (the oracles)
_ORACLES = (str(Path(__file__).with_name("model.py")), str(Path(__file__).with_name("checks")))


@contextlib.contextmanager
def _watching(called: list[str]):
    """Record into ``called`` each function of the lab's model or checks that runs in the body
    (an observation in the kernel: an answer that delegates to the oracle proves nothing)."""

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(_ORACLES):
            called.append(f"{Path(name).stem}.{frame.f_code.co_name}")

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)


@probe
def plans(allocation_plan, cases: list) -> dict:
    """``allocation_plan(size[, divisions])`` for each ``[size, divisions]`` (divisions 0: the
    call without it): ``{"plans": [what each returned], "oracle": [oracle functions called]}``."""
    called: list[str] = []
    with _watching(called):
        got = [allocation_plan(n, d) if d else allocation_plan(n) for n, d in cases]
    return {"plans": got, "oracle": called[:3]}


@probe
def forensics(oom_forensics, snapshot: dict) -> dict:
    """``oom_forensics`` on a copy of ``snapshot``: ``{"result": what it returned, "modified":
    whether it changed the copy, "oracle": [oracle functions called]}``."""
    given, called = copy.deepcopy(snapshot), []
    with _watching(called):
        result = oom_forensics(given)
    return {"result": result, "modified": given != snapshot, "oracle": called[:3]}


@probe
def replay(cls, trace: list, capacity: int, max_split_size) -> dict:
    """Replay ``trace`` (ops as ``labs.allocator.traces.replay`` takes them) through
    ``cls(gpu, max_split_size=...)`` on a fresh ``SimulatedGPU(capacity)``, as far as it gets.

    Returns ``{"steps": [...], "raised": record or None, "oracle": [...]}``; each step is
    ``{"result": the address malloc returned, "oom" when it raised DeviceOutOfMemory, None for
    other ops; "calls": the step's cudaMalloc/cudaFree calls, "snapshot": what snapshot() returned
    after it, "segments": the GPU's live cudaMalloc'ed ranges}``. ``raised`` is what the answer
    raised at the step after the last one recorded (the judge reports it there)."""
    from grader.checks import raised

    gpu, called, steps, live = SimulatedGPU(capacity), [], [], {}
    failure = None
    with _watching(called):
        allocator = cls(gpu, max_split_size=max_split_size)
        try:
            for op in trace:
                before = len(gpu.log)
                result = apply_op(allocator, gpu, op, live)
                oom = isinstance(result, DeviceOutOfMemory)
                steps.append({"result": "oom" if oom else result,
                              "snapshot": allocator.snapshot(),
                              "calls": [list(c) for c in gpu.log[before:]
                                        if c[0] in ("cudaMalloc", "cudaFree")],
                              "segments": gpu.segments()})
        except Exception as exc:
            failure = raised(exc)
    return {"steps": copy.deepcopy(steps), "raised": failure, "oracle": called[:3]}


@probe
def on_cuda(replay_on_cuda, trace: list) -> dict:
    """``replay_on_cuda(trace)`` on the real allocator, from an emptied cache, with its memory
    history recorded: ``{"reserved": bytes still reserved before it ran, "result": what it
    returned, "allocations": the allocations the real allocator recorded, "oracle": [...]}``
    (``result`` and ``allocations`` are None when memory was still reserved)."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if reserved := torch.cuda.memory_reserved():
        return {"reserved": reserved, "result": None, "allocations": None, "oracle": []}
    called: list[str] = []
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    try:
        with _watching(called):
            result = replay_on_cuda(list(trace))
        events = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return {"reserved": 0, "result": result, "oracle": called[:3],
            "allocations": sum(e["action"] == "alloc" for e in events)}
