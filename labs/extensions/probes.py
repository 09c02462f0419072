"""The extensions lab's probes: what runs in the learner's kernel when an exercise is judged (see
``grader.kernel.probe``). A C++ answer is a function that returns a source string: its probe
builds it (:func:`labs.extensions.build.build`, into the kernel's own extensions folder), calls
the operators it registered on the inputs the judge chose, and returns what they gave as plain
data (tensors, opcheck's and gradcheck's words, logs, node targets); the judges in
``labs/extensions/checks`` compute torch's answer in the grader's process and decide. Nothing
here knows a right answer."""
from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

from grader.checks import probe
from labs.extensions import build as _build

#: how much of an error message a probe returns
_TEXT = 3000
#: the lab's own C++ operators (pad_rows, scale_boxed, scale_unboxed)
LABOPS = Path(__file__).with_name("labops.cpp")


def _error(exc: BaseException) -> dict:
    """``{"ename", "text"}`` of an exception (a build's, torch's or the answer's)."""
    return {"ename": type(exc).__name__, "text": str(exc).strip()[:_TEXT]}


@contextlib.contextmanager
def _quiet():
    """torch's warnings and prints kept out of the learner's output."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def labops():
    """The lab's own operators, built once (``torch.ops.labops_<key>``)."""
    return _build.build(LABOPS.read_text(), "labops")


def _built(source, cuda: bool = False):
    """Build what ``source()`` returns: ``(namespace, None)`` when it builds, ``(None,
    {"build": error})`` when not (what the answer raises, its stub's NotImplementedError
    included, propagates)."""
    text = source()
    if type(text) is not str:
        return None, {"build": {"ename": "TypeError", "text": f"the answer returned a "
                                f"{type(text).__name__}, not a string of C++ source"}}
    try:
        return _build.build(text, cuda=cuda), None
    except _build.BuildError as exc:
        return None, {"build": _error(exc)}


def _operator(source, name: str, cuda: bool = False):
    """Build ``source()`` and find its operator ``name``: ``(op, schema, None)``, or ``(None,
    None, reply)`` with the reply that says why not (``{"build"}`` or ``{"schema": None}``)."""
    ns, failed = _built(source, cuda)
    if failed:
        return None, None, failed
    op, schema = _find(ns, name)
    return op, schema, (None if op is not None else {"schema": None})


def _find(ns, name: str):
    """The default overload of ``ns.<name>`` and its schema, or (None, None)."""
    packet = getattr(ns, name, None) if ns is not None else None
    try:
        op = packet.default
    except (AttributeError, RuntimeError):
        return None, None
    return op, str(op._schema)


def _opcheck(op, args) -> dict:
    """torch.library.opcheck's result per test, as words ("SUCCESS" or the error's first
    lines) (torch/library.py: opcheck; torch/testing/_internal/optests)."""
    import torch

    with _quiet():
        try:
            found = torch.library.opcheck(op, args, raise_exception=False)
        except Exception as exc:  # noqa: BLE001  (opcheck itself could not run)
            return {"opcheck": f"{type(exc).__name__}: {str(exc)[:_TEXT]}"}
    return {test: result if result == "SUCCESS" else
            f"{type(result).__name__}: {str(result).strip()[:_TEXT]}"
            for test, result in found.items()}


def _call(op, *args) -> dict:
    """``{"out": op(*args)}`` (a tensor, or the type of what came back), or ``{"error"}``."""
    import torch

    try:
        with _quiet():
            out = op(*args)
    except Exception as exc:  # noqa: BLE001  (the judge says what was wrong)
        return {"error": _error(exc)}
    return {"out": out.detach() if type(out) is torch.Tensor else {"type": type(out).__name__}}


# ------------------------------------------------------------------------ extensions.cpp-op
@probe
def cpp_op(source, cases: list) -> dict:
    """Build ``source()``; for each case ``[kind, x, y]`` run its ``mul_tanh``: ``"call"`` on the
    tensors, ``"meta"`` on meta tensors shaped and strided like them, ``"opcheck"``
    through opcheck. Returns ``{"schema", "results": one dict per case}`` or ``{"build"}``."""
    import torch

    op, schema, failed = _operator(source, "mul_tanh")
    if failed:
        return failed
    results = []
    for kind, x, y in cases:
        if kind == "call":
            results.append(_call(op, x, y))
        elif kind == "meta":
            seen = _call(op, x.to("meta"), y.to("meta"))
            out = seen.pop("out", None)
            if isinstance(out, torch.Tensor):
                seen["meta"] = {"device": out.device.type, "shape": list(out.shape),
                                "dtype": str(out.dtype), "stride": list(out.stride())}
            results.append(seen)
        else:
            results.append(_opcheck(op, (x, y)))
    return {"schema": schema, "results": results}


# ------------------------------------------------------------------ extensions.cpp-autograd
@probe
def cpp_autograd(source, cases: list) -> dict:
    """Build ``source()``; for each case ``[x, y, grad]`` (float64) run ``mul_tanh`` on leaves
    that require grad and backpropagate ``grad``: the output, both gradients, the name of the
    output's grad_fn, and gradcheck's verdict. Also whether the operator has a kernel of its
    own for the Autograd key and whether a call under no_grad records a graph."""
    import torch

    op, schema, failed = _operator(source, "mul_tanh")
    if failed:
        return failed
    facts = {"schema": schema, "autograd_kernel": torch._C._dispatch_has_kernel_for_dispatch_key(
        op._schema.name, "Autograd"), "results": []}
    for x, y, grad in cases:
        seen = {}
        try:
            leaves = [x.clone().requires_grad_(), y.clone().requires_grad_()]
            with _quiet():
                out = op(*leaves)
                seen["grad_fn"] = None if out.grad_fn is None else out.grad_fn.name()
                seen["out"] = out.detach()
                if out.grad_fn is not None:
                    seen["grads"] = [g.detach() if g is not None else None for g in
                                     torch.autograd.grad(out, leaves, grad, allow_unused=True)]
        except Exception as exc:  # noqa: BLE001
            seen["error"] = _error(exc)
        try:
            with _quiet():
                seen["gradcheck"] = bool(torch.autograd.gradcheck(
                    op, [x.clone().requires_grad_(), y.clone().requires_grad_()]))
        except Exception as exc:  # noqa: BLE001  (gradcheck raises with its reason)
            seen["gradcheck"] = _error(exc)
        with torch.no_grad(), _quiet():
            seen["no_grad_fn"] = op(x.clone().requires_grad_(), y).grad_fn is not None
        facts["results"].append(seen)
    return facts


# ----------------------------------------------------------------- extensions.boxed-fallback
def run_program(steps: list, seed: int) -> None:
    """Run a program: ``steps`` (names of :func:`program_steps`) applied in order to seeded
    tensors (a state ``x`` of shape (4, 6), a weight ``w`` of shape (6, 6))."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(4, 6, generator=g), torch.randn(6, 6, generator=g)
    every = program_steps()
    for step in steps:
        x = every[step](x, w)


def program_steps() -> dict:
    """The steps of a program, by name: ``(x, w) -> the next x``, of shape (4, 6). Each calls
    ATen operators that have kernels of their own (none is CompositeImplicitAutograd, which a
    mode below autograd sees only once decomposed)."""
    import torch

    return {
        "mm": lambda x, w: torch.mm(x, w),
        "add": lambda x, w: x + 1.5,
        "mul": lambda x, w: x * x,
        "relu": lambda x, w: torch.relu(x),
        "exp": lambda x, w: torch.exp(x * 0.1),
        "sum": lambda x, w: x + x.sum(0),
        "cat": lambda x, w: torch.cat([x[:2], x[2:]]),
        "view": lambda x, w: x.view(24).view(4, 6),
        "clone": lambda x, w: x.clone(),
        "neg": lambda x, w: torch.neg(x),
        "transpose": lambda x, w: x.t().t(),
        "index": lambda x, w: x.index_select(1, torch.arange(5, -1, -1)),
    }


@probe
def boxed_fallback(source, programs: list) -> dict:
    """Build ``source()``; run each program ``[steps, seed]`` between its ``start()`` and
    ``stop()``: ``{"results": one per program: the log stop() returned, less the entries of
    the source's own operators, or {"error"}}``, or ``{"build"}``, or ``{"missing": the names
    not found of start and stop}``."""
    ns, failed = _built(source)
    if failed:
        return failed
    start, _ = _find(ns, "start")
    stop, _ = _find(ns, "stop")
    if start is None or stop is None:
        return {"missing": [n for n, op in (("start", start), ("stop", stop)) if op is None]}
    own = f"{ns.name}::"
    results = []
    for steps, seed in programs:
        try:
            start()
            try:
                run_program(steps, seed)
            finally:
                log = stop()
        except Exception as exc:  # noqa: BLE001
            results.append({"error": _error(exc)})
            continue
        if type(log) is not list or not all(type(e) is str for e in log):
            results.append({"error": {"ename": "TypeError", "text": f"stop() returned "
                                      f"{type(log).__name__}, not a list of strings"}})
            continue
        results.append({"log": [e for e in log if not e.startswith(own)]})
    return {"results": results}


# ----------------------------------------------------------------- extensions.compile-ready
@probe
def compile_ready(pad_rows_fake, cases: list) -> dict:
    """Register ``pad_rows_fake`` as the fake kernel of the lab's ``pad_rows`` (for the time of
    this probe: the registration is removed after), then for each case ``[kind, x, multiple]``:
    ``"fake"``: the fake kernel's output on a FakeTensor like ``x`` (shape, stride, dtype);
    ``"opcheck"``: opcheck's words; ``"compile"``: torch._dynamo.explain of ``pad_rows(x * 2,
    multiple).sum(1)`` (graph and break counts, the reasons), and torch.compile(fullgraph=True)'s
    output; ``"export"``: the call targets of torch.export with dim 0 dynamic, and what the
    exported program returns for ``x``."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = labops()
    op = ops.pad_rows.default
    qualname = op._schema.name
    lib = torch.library.Library(ops.name, "FRAGMENT")
    results = []
    try:
        torch.library.register_fake(qualname, pad_rows_fake, lib=lib)
        with FakeTensorMode() as mode, _quiet():  # (what it raises is the answer's: its stub's)
            pad_rows_fake(mode.from_tensor(cases[0][1]), cases[0][2])
        for kind, x, multiple in cases:
            try:
                results.append(_compile_case(op, kind, x, multiple, FakeTensorMode))
            except Exception as exc:  # noqa: BLE001
                results.append({"error": _error(exc)})
    finally:
        lib._destroy()
        torch._dynamo.reset()
    return {"results": results}


def _compile_case(op, kind: str, x, multiple: int, fake_mode) -> dict:
    """One case of :func:`compile_ready`."""
    import torch

    if kind == "fake":
        with fake_mode() as mode, _quiet():
            out = op(mode.from_tensor(x), multiple)
        return {"shape": list(out.shape), "stride": list(out.stride()), "dtype": str(out.dtype),
                "type": type(out).__name__}
    if kind == "opcheck":
        return _opcheck(op, (x, multiple))

    def program(t):
        return op(t * 2, multiple).sum(1)

    if kind == "compile":
        torch._dynamo.reset()
        with _quiet():
            explained = torch._dynamo.explain(program)(x)
            torch._dynamo.reset()
            out = torch.compile(program, fullgraph=True, backend="eager")(x)
        return {"graphs": explained.graph_count, "breaks": explained.graph_break_count,
                "reasons": [str(r.reason)[:300] for r in explained.break_reasons],
                "out": out.detach()}

    class Program(torch.nn.Module):
        def forward(self, t):
            return program(t)

    rows = torch.export.Dim("rows", min=2, max=64)
    with _quiet():
        ep = torch.export.export(Program(), (x,), dynamic_shapes=({0: rows},))
        out = ep.module()(x)
    return {"targets": [str(n.target) for n in ep.graph.nodes if n.op == "call_function"],
            "out": out.detach()}


# ----------------------------------------------------------------------- extensions.cuda-op
@probe
def cuda_op(source, cases: list) -> dict:
    """Build ``source()`` as CUDA; for each case ``[x, y]`` (CPU tensors) run its ``mul_tanh``
    on copies on the GPU: ``{"results": [{"out": on the CPU, "device"} or {"error"}]}``."""
    import torch

    op, schema, failed = _operator(source, "mul_tanh", cuda=True)
    if failed:
        return failed
    results = []
    for x, y in cases:
        seen = _call(op, x.cuda(), y.cuda())
        if isinstance(seen.get("out"), torch.Tensor):
            seen["device"] = seen["out"].device.type
            seen["out"] = seen["out"].cpu()
        results.append(seen)
    return {"schema": schema, "results": results}
