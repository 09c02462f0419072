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


# ------------------------------------------------------------------ allocator.autocast
def amp_program(spec: list):
    """The function of an ``allocator.autocast`` case: ``spec`` is a list of steps over a hidden
    value ``h`` (starting as ``x``), with parameters ``W[i]`` (``d x d``) and ``b[i]`` (``d``):
    ``["linear", i, bias]``, ``["matmul", i]`` (``h @ W[i].t()``), ``["mm", i]``,
    ``["addmm", i]`` (``addmm(b[i], h, W[i].t())``), ``["relu"]``, ``["tanh"]``, ``["add_y"]``;
    then outputs: ``["mse_loss"]`` (against ``t``), ``["prod"]``, ``["cdist"]``, ``["cat"]``
    (``h``, the bfloat16 ``y16`` and the float64 ``z64``), ``["log_softmax"]``, ``["h"]``.
    Returns ``fn(x, W, b, t, y16, z64) -> tuple of outputs``."""
    import torch
    import torch.nn.functional as F

    def fn(x, W, b, t, y16, z64):
        h, outs = x, []
        for step in spec:
            kind = step[0]
            if kind == "linear":
                h = F.linear(h, W[step[1]], b[step[1]] if step[2] else None)
            elif kind == "matmul":
                h = h @ W[step[1]].t()
            elif kind == "mm":
                h = torch.mm(h, W[step[1]])
            elif kind == "addmm":
                h = torch.addmm(b[step[1]], h, W[step[1]].t())
            elif kind in ("relu", "tanh"):
                h = getattr(h, kind)()
            elif kind == "add_y":
                h = h + t
            elif kind == "mse_loss":
                outs.append(F.mse_loss(h, t))
            elif kind == "prod":
                outs.append(torch.prod(h.tanh() * 0.1 + 1, 1))
            elif kind == "cdist":
                outs.append(torch.cdist(h, h))
            elif kind == "cat":
                outs.append(torch.cat([h, y16, z64], 0))
            elif kind == "log_softmax":
                outs.append(h.log_softmax(-1))
            else:
                outs.append(h)
        return tuple(outs)

    return fn


def amp_run(enter, spec: list, tensors: dict, regions: str) -> dict:
    """Run the case's program under the context manager ``enter()`` (a ``MiniAutocast()``, or
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` in the judge), counting the casts
    (``aten._to_copy`` calls, seen by a ``TorchDispatchMode`` below it) after each call:
    ``regions`` ``"one"``: one call in one region; ``"two"``: one call in each of two regions;
    ``"nested"``: a call in a region nested in another, then one in the outer region. Returns
    ``{"outputs": [each call's outputs], "casts": [casts counted after each call],
    "real_autocast": whether an op reached the dispatcher with torch's AutocastCPU key on (not
    in the thread's excluded set: torch's own autocast at work), "grads":
    [the gradients of the sum of every output (as float32) for each W, then each b]}``, the
    parameters being float32 leaves that require grad."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    key = torch._C.DispatchKey.AutocastCPU

    class Casts(TorchDispatchMode):
        count, real = 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                Casts.count += 1
            # (an op on no list passes the AutocastCPU key through: torch's own autocast on)
            Casts.real |= not torch._C._dispatch_tls_is_dispatch_key_excluded(key)
            return func(*args, **(kwargs or {}))

    W = [w.detach().clone().requires_grad_() for w in tensors["W"]]
    b = [v.detach().clone().requires_grad_() for v in tensors["b"]]
    fn, args = amp_program(spec), (tensors["x"], W, b, tensors["t"], tensors["y16"],
                                   tensors["z64"])
    outputs, casts = [], []

    def call():
        outputs.append(list(fn(*args)))
        casts.append(Casts.count)

    with Casts():
        if regions == "nested":
            with enter():
                with enter():
                    call()
                call()
        else:
            for _ in range(2 if regions == "two" else 1):
                with enter():
                    call()
    total = sum(o.float().sum() for outs in outputs for o in outs)
    grads = (torch.autograd.grad(total, W + b, allow_unused=True) if total.requires_grad
             else [None] * len(W + b))  # (a program that uses no parameter)
    return {"outputs": outputs, "casts": casts, "real_autocast": Casts.real,
            "grads": [g if g is None else g.detach() for g in grads]}


@probe
def autocast_runs(MiniAutocast, cases: list) -> list:
    """:func:`amp_run` of ``MiniAutocast()`` for each ``[spec, tensors, regions]``; an entry
    ``{"raised": record}`` ends the list where the answer raised."""
    from grader.checks import raised

    out = []
    for spec, tensors, regions in cases:
        try:
            out.append(amp_run(MiniAutocast, spec, tensors, regions))
        except Exception as exc:  # noqa: BLE001  (the judge reports it)
            out.append({"raised": raised(exc)})
            break
    return out
