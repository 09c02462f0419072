"""The export lab's probes: what runs in the learner's kernel when an exercise is judged (see
``grader.kernel.probe``). Each builds what the answer needs from plain parameters (a model of
``labs/export/models.py`` by name and sizes, its weights as a state dict, input tensors), calls
the answer, and returns what it observed as plain data: what the answer returned (when plain),
what export made of it (node targets as strings, range constraints, whether export raised and
what it said), the outputs of the program it made, the bytes of a saved program. The judges in
``labs/export/checks`` build the same models with the same builders (defined here, public),
compute torch's answer in the grader's process and decide. Nothing here knows a right answer.
"""
from __future__ import annotations

import contextlib
import copy
import io
import warnings

from grader.checks import probe
from grader.checks import compiler_caches_as_started, config_changes, plain, raised

#: how much of an exception's message a probe returns
_TEXT = 8000


def _error(exc: BaseException) -> dict:
    """What an exception torch (or the answer through torch) raised says: ``{"ename": its type's
    name, "text": its message}``."""
    return {"ename": type(exc).__name__, "text": str(exc)[:_TEXT]}


def _quiet(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with torch's own warnings (deprecations while it exports or copies
    a program) and what it prints (graphs) kept out of the learner's output."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _tensor_or_type(value):
    """A plain tensor as itself, anything else as ``{"type": its type's name}``."""
    import torch

    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return value
    return {"type": type(value).__name__}


def _returned(value) -> dict:
    """What an answer returned: ``{"value": it when it is plain data, else None, "type": its
    type's name, "dict": whether it is a dict, "keys": its keys as str (a dict), "unplain":
    "" when it is plain data, else what is not}``."""
    why = plain(value, "what your answer returned")
    return {"value": None if why else value, "type": type(value).__name__,
            "dict": isinstance(value, dict),
            "keys": sorted(map(str, value)) if isinstance(value, dict) else None,
            "unplain": why}


def _load(model, state: dict | None):
    """``model`` with ``state`` loaded (non-strict: non-persistent buffers are built by the
    constructor), in train mode as built."""
    if state:
        model.load_state_dict(state, strict=False)
    return model


# ------------------------------------------------------------------------ export.signature
def signature_case(spec: list):
    """``(model, args)`` of an export.signature case, built from plain ``spec``:
    ``["counter", width, batch, seed]``, ``["stack", width, counted, batch, seed]``,
    ``["batchnorm", width, hidden, batch, seed]``, ``["tied", width, batch, seed]`` or
    ``["writes", width, writes, n_out, batch, seed]``. Tensors are drawn from a generator seeded
    with ``seed`` (a Linear's own initialisation from torch's RNG: the signature does not depend
    on values)."""
    import torch
    from torch import nn

    from labs.export import models

    kind, width, *rest = spec
    g = torch.Generator().manual_seed(rest[-1])
    batch = rest[-2]
    if kind == "counter":
        return models.Counter(width), (torch.randn(batch, width, generator=g),
                                       torch.randn(batch, width, generator=g))
    x = torch.randn(batch, width, generator=g)
    if kind == "stack":
        return models.Stack(width, list(rest[0]), g), (x,)
    if kind == "batchnorm":
        hidden = rest[0]
        return nn.Sequential(nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                             nn.Linear(hidden, 2)).train(), (x,)
    if kind == "tied":
        return models.Tied(width), (x,)
    if kind == "writes":
        args = (x, torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g))
        return models.Writes(width, list(rest[0]), rest[1]), args
    raise ValueError(f"no signature case {kind!r}")


@probe
def signatures(predict_signature, specs: list) -> list:
    """``predict_signature(model, args)`` for the case of each spec (:func:`signature_case`): one
    entry per case, :func:`_returned` of what it returned, or ``{"raised": record}`` for the
    case where it raised (the last)."""
    out = []
    for spec in specs:
        model, args = signature_case(spec)
        try:
            got = predict_signature(model, args)
        except Exception as exc:  # noqa: BLE001  (the judge reports it, after earlier cases)
            out.append({"raised": raised(exc)})
            break
        out.append(_returned(got))
    return out


# ------------------------------------------------------------------------ export.dynamic-shapes
WINDOW_ARGS = ("tokens", "mask", "prev")


def _dims(ep) -> dict:
    """``[lower, upper]`` that ``ep.range_constraints`` gives the first user input's first two
    dimensions (``batch`` and ``seq``), each bound an int, or its str when it is not one
    (``int_oo``); None for a dimension export made static."""
    import torch

    first = ep.graph_signature.user_inputs[0]
    node = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == first)
    out = {}
    for name, size in zip(("batch", "seq"), node.meta["val"].shape[:2]):
        vr = (ep.range_constraints.get(size.node.expr) if isinstance(size, torch.SymInt)
              else None)
        out[name] = None if vr is None else [_bound(vr.lower), _bound(vr.upper)]
    return out


def _bound(value):
    try:
        if value.is_integer and value.is_finite:
            return int(value)
    except AttributeError:
        pass
    return str(value)


@probe
def window_program(window_shapes, max_batch: int, max_seq: int, state: dict, example: list,
                   accept: list, reject: list) -> dict:
    """``spec = window_shapes(max_batch, max_seq)``; then ``export(Window with state, example,
    dynamic_shapes=spec, strict=False)`` and its program run on each input list of ``accept``
    and of ``reject``. Returns ``{"spec": _returned-like {"type", "dict", "keys"}, "export":
    _error of what export raised or None, "accepted": [the program's output (a tensor or
    {"type"}) or {"error": _error}], "ranges": _dims(ep), "refused": [whether the program
    raised, per reject input list]}`` (as far as it got)."""
    from torch.export import export

    from labs.export import models

    spec = window_shapes(max_batch, max_seq)
    shown = {"type": type(spec).__name__, "dict": isinstance(spec, dict),
             "keys": sorted(map(str, spec)) if isinstance(spec, dict) else None}
    out = {"spec": shown, "export": None, "accepted": [], "ranges": None, "refused": []}
    if not isinstance(spec, dict) or set(spec) != set(WINDOW_ARGS):
        return out
    model = _load(models.Window(), state)
    try:
        ep = _quiet(export, model, tuple(example), dynamic_shapes=spec, strict=False)
        program = ep.module()
    except Exception as exc:  # noqa: BLE001  (torch's reason is the learner's lesson)
        out["export"] = _error(exc)
        return out
    for inputs in accept:
        try:
            out["accepted"].append(_tensor_or_type(program(*inputs)))
        except Exception as exc:  # noqa: BLE001  (a guard refused the sizes)
            out["accepted"].append({"error": _error(exc)})
    out["ranges"] = _dims(ep)
    for inputs in reject:
        try:
            program(*inputs)
        except Exception:  # noqa: BLE001
            out["refused"].append(True)
        else:
            out["refused"].append(False)
    return out


# ------------------------------------------------------------------------ export.cond
def call_targets(graph) -> list:
    """``[name, is_cond]`` of each call_function node of ``graph``: the target's ``__name__``
    (else its str) and whether it is ``torch.ops.higher_order.cond``."""
    import torch

    return [[getattr(n.target, "__name__", str(n.target)),
             n.target is torch.ops.higher_order.cond]
            for n in graph.nodes if n.op == "call_function"]


@probe
def gate_runs(Gate, width: int, state: dict, eager: list, exports: list, cases: list) -> dict:
    """``Gate(width)`` loaded with ``state`` (GateEager's), run eagerly (under no_grad) on each x
    of ``eager``; then for each ``[strict, dynamic]`` of ``exports``, ``export(gate, (cases[0],),
    strict=strict, dynamic_shapes={"x": (Dim("batch"), Dim.STATIC)} if dynamic)`` and its program
    run on each x of ``cases``. Returns ``{"module": "" when Gate is an nn.Module class, else its
    type and repr, "load": the first line of what load_state_dict raised, or "", "eager":
    [outputs], "exports": [{"error": _error of what export raised, or None, "targets":
    call_targets of its graph, "outputs": [a tensor, {"type"} or {"error": _error}]}]}``."""
    import torch
    from torch import nn
    from torch.export import Dim, export

    out = {"module": "", "load": "", "eager": [], "exports": []}
    if not (isinstance(Gate, type) and issubclass(Gate, nn.Module)):
        out["module"] = f"{type(Gate).__name__} {Gate!r:.60}"
        return out
    gate = Gate(width)
    try:
        gate.load_state_dict(state)
    except RuntimeError as exc:
        out["load"] = str(exc).strip().splitlines()[0][:200]
        return out
    for x in eager:
        with torch.no_grad():
            out["eager"].append(_tensor_or_type(gate(x.clone())))
    for strict, dynamic in exports:
        ds = {"x": (Dim("batch"), Dim.STATIC)} if dynamic else None
        run = {"error": None, "targets": [], "outputs": []}
        out["exports"].append(run)
        try:
            ep = _quiet(export, gate, (cases[0],), strict=strict, dynamic_shapes=ds)
        except Exception as exc:  # noqa: BLE001  (torch's reason is the learner's lesson)
            run["error"] = _error(exc)
            break
        run["targets"] = call_targets(ep.graph)
        try:
            program = ep.module()
        except Exception as exc:  # noqa: BLE001
            run["outputs"].append({"error": _error(exc)})
            break
        for x in cases:
            try:
                run["outputs"].append(_tensor_or_type(program(x.clone())))
            except Exception as exc:  # noqa: BLE001
                run["outputs"].append({"error": _error(exc)})
                break
    return out


# ------------------------------------------------------------------------ export.graph-pass
def pass_model(spec: list):
    """The graph pass's model of ``spec``: ``["mlp", widths, relu_after]`` (``models.mlp``) or
    ``["mixed", width, out]`` (``models.Mixed``), weights from torch's RNG (load a state dict)."""
    import torch

    from labs.export import models

    if spec[0] == "mlp":
        return models.mlp(list(spec[1]), torch.Generator(), list(spec[2]))
    if spec[0] == "mixed":
        return models.Mixed(spec[1], spec[2])
    raise ValueError(f"no graph-pass model {spec[0]!r}")


def core_aten(model, args: tuple):
    """``export(model, args).run_decompositions()``, quietly."""
    import torch

    return _quiet(lambda: torch.export.export(model, args).run_decompositions())


def _arg(value):
    """A node's argument as plain data: a Node as ``{"node": its name}``, containers as lists
    and dicts, scalars as they are, anything else as ``{"other": its repr}``."""
    import torch

    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, (list, tuple)):
        return [_arg(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _arg(v) for k, v in value.items()}
    if type(value) in (type(None), bool, int, float, str, torch.dtype, torch.device):
        return value
    return {"other": repr(value)[:200]}


def graph_nodes(graph) -> list:
    """Each node of ``graph`` as ``{"name", "op", "target": str of its target, "args",
    "kwargs" (see _arg), "users": how many nodes use it}``."""
    return [{"name": n.name, "op": n.op, "target": str(n.target), "args": _arg(list(n.args)),
             "kwargs": _arg(dict(n.kwargs)), "users": len(n.users)} for n in graph.nodes]


def flat_inputs(ep, x) -> list:
    """The inputs ``ep.graph_module`` takes, in signature order: lifted parameters and buffers,
    then x."""
    out = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == spec.kind.USER_INPUT:
            out.append(x)
        elif spec.target in ep.state_dict:
            out.append(ep.state_dict[spec.target])
        else:
            out.append(ep.constants[spec.target])
    return out


def _first(program, args):
    """``program(*args)``'s first output (a tensor or {"type"}), or ``{"error": _error}``."""
    try:
        out = program(*args)
    except Exception as exc:  # noqa: BLE001
        return {"error": _error(exc)}
    return _tensor_or_type(out[0] if isinstance(out, (tuple, list)) else out)


@probe
def fused(fuse_linear_relu, spec: list, state: dict, xs: list, save: bool) -> dict:
    """``fuse_linear_relu(ep.graph_module)`` on ``core_aten(pass_model(spec) with state,
    (xs[0],))``; then what the graph became. Returns ``{"returned": {"value": it when an int,
    "type", "int": whether it is an int}, "lint": _error of what gm.graph.lint() raised, or
    None, "nodes": graph_nodes,
    "code": how many times gm.code calls course.linear_relu.default, "parameters":
    inputs_to_parameters, "outputs": [[ep.module()'s, gm's with the lifted inputs] per x] (see
    _first), "saved": the bytes of torch.export.save (when save), or {"error": _error}}``."""
    import torch

    ep = core_aten(_load(pass_model(spec), state), (xs[0],))
    gm = ep.graph_module
    got = fuse_linear_relu(gm)
    out = {"returned": {"value": got if type(got) is int else None, "type": type(got).__name__,
                        "int": isinstance(got, int)},
           "lint": None, "nodes": graph_nodes(gm.graph),
           "code": gm.code.count("course.linear_relu.default("),
           "parameters": dict(ep.graph_signature.inputs_to_parameters),
           "outputs": [], "saved": None}
    try:
        gm.graph.lint()
    except Exception as exc:  # noqa: BLE001  (lint's message says what is broken)
        out["lint"] = _error(exc)
        return out
    with torch.no_grad():
        try:
            program = ep.module()
        except Exception as exc:  # noqa: BLE001
            program = None
            failed = {"error": _error(exc)}
        for x in xs:
            out["outputs"].append([_first(program, (x,)) if program else failed,
                                   _first(gm, flat_inputs(ep, x))])
    if save:
        buf = io.BytesIO()
        try:
            _quiet(torch.export.save, ep, buf)
            out["saved"] = buf.getvalue()
        except Exception as exc:  # noqa: BLE001
            out["saved"] = {"error": _error(exc)}
    return out


# ------------------------------------------------------------------------ export.mini-interpreter
def interpreter_model(spec: list):
    """The mini-interpreter's model of ``spec``: ``["counter", width]``, ``["batchnorm", width,
    hidden]`` (Linear, BatchNorm1d, ReLU in train mode), ``["mixer", width, cut]`` or
    ``["kwargs"]``; weights from torch's RNG (load a state dict)."""
    from torch import nn

    from labs.export import models

    kind = spec[0]
    if kind == "counter":
        return models.Counter(spec[1])
    if kind == "batchnorm":
        width, hidden = spec[1], spec[2]
        return nn.Sequential(nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU()).train()
    if kind == "mixer":
        return models.Mixer(spec[1], spec[2])
    if kind == "kwargs":
        return models.Kwargs()
    raise ValueError(f"no mini-interpreter model {kind!r}")


def _state_of(ep, name: str):
    if name in ep.state_dict:
        return ep.state_dict[name]
    return ep.constants.get(name)


@probe
def interpreted(interpret, spec: list, state: dict, example: list, calls: list) -> dict:
    """``ep = core_aten(interpreter_model(spec) with state, example)``; ``interpret(mine,
    *args)`` on ``mine = copy.deepcopy(ep)`` for each argument list of ``calls``, in turn.
    Returns ``{"calls": [{"type": the result's type's name, "values": its items (a tensor or
    {"type"}) when it is a tuple, "args": the arguments after the call}, or {"raised": record,
    "key": a KeyError's str key} (the last)], "buffers": {each BUFFER input's target: its value
    in mine after the calls, or None}}``."""
    import torch

    ep = core_aten(_load(interpreter_model(spec), state), tuple(example))
    mine = _quiet(copy.deepcopy, ep)
    out = {"calls": [], "buffers": {}}
    for args in calls:
        ours = [a.clone() for a in args]
        try:
            got = interpret(mine, *ours)
        except Exception as exc:  # noqa: BLE001  (the judge reports it, after earlier calls)
            key = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 and type(
                exc.args[0]) is str else None
            out["calls"].append({"raised": raised(exc), "key": key})
            return out
        is_tuple = isinstance(got, tuple)
        out["calls"].append({"type": type(got).__name__,
                             "values": [_tensor_or_type(v) for v in got] if is_tuple else None,
                             "args": ours})
    for s in ep.graph_signature.input_specs:
        if s.kind.name == "BUFFER":
            value = _state_of(mine, s.target)
            out["buffers"][s.target] = value if isinstance(value, torch.Tensor) else None
    return out


# ------------------------------------------------------------------------ export.unflatten
def unflatten_model(spec: list):
    """The unflatten exercise's model of ``spec``:
    ``["tower", width, hidden, depth, classes]`` (``models.Tower``, one input ``x``) or
    ``["deep", width, depth, classes]`` (``models.Deep``, inputs ``x`` and ``context``); weights
    and buffers from torch's RNG (load a state dict)."""
    from labs.export import models

    if spec[0] == "tower":
        return models.Tower(*spec[1:5])
    if spec[0] == "deep":
        return models.Deep(*spec[1:4])
    raise ValueError(f"no unflatten model {spec[0]!r}")


def _leaves(value) -> list:
    """The pytree leaves of ``value`` (tuples, lists, dicts and torch.fx's immutable_list
    opened), each a tensor (detached, cloned) or ``{"type": its type's name}``."""
    import torch
    from torch.utils import _pytree as pytree

    return [leaf.detach().clone() if type(leaf) in (torch.Tensor, torch.nn.Parameter)
            else {"type": type(leaf).__name__} for leaf in pytree.tree_leaves(value)]


def module_calls(module, args: list) -> dict:
    """``module(*args)`` under no_grad with a forward hook on each of its submodules. Returns
    ``{"outputs": _leaves(what it returned), "submodules": [[name, _leaves(args and kwargs),
    _leaves(output)] per submodule call, in the order the calls returned]}``, or ``{"raised":
    record}``."""
    import torch

    seen: list = []

    def recorder(name):
        def hook(mod, hook_args, hook_kwargs, output):
            seen.append([name, _leaves((hook_args, hook_kwargs)), _leaves(output)])
        return hook

    handles = [sub.register_forward_hook(recorder(name), with_kwargs=True)
               for name, sub in module.named_modules() if name]
    try:
        with torch.no_grad():
            result = module(*[a.clone() for a in args])
    except Exception as exc:  # noqa: BLE001  (the judge reports it)
        return {"raised": raised(exc)}
    finally:
        for handle in handles:
            handle.remove()
    return {"outputs": _leaves(result), "submodules": seen}


@probe
def unflattened(unflatten, spec: list, state: dict, example: list, calls: list) -> dict:
    """``unflatten(ep)`` with ``ep = export(unflatten_model(spec) with state, example)``, then
    the module it returned run on each argument list of ``calls`` (:func:`module_calls`).
    Returns ``{"type": the returned value's type's name, "module": whether it is an nn.Module,
    "modules": the names of its named_modules(), "parameters": of its named_parameters(),
    "buffers": of its named_buffers(), "state": its state_dict() (each value a tensor or
    {"type"}), "calls": [module_calls per argument list, up to the first that raised]}``."""
    import torch

    ep = _quiet(torch.export.export, _load(unflatten_model(spec), state), tuple(example))
    got = unflatten(ep)
    out = {"type": type(got).__name__, "module": isinstance(got, torch.nn.Module),
           "modules": [], "parameters": [], "buffers": [], "state": {}, "calls": []}
    if not out["module"]:
        return out
    out["modules"] = [str(name) for name, _ in got.named_modules()]
    out["parameters"] = [str(name) for name, _ in got.named_parameters()]
    out["buffers"] = [str(name) for name, _ in got.named_buffers()]
    out["state"] = {str(k): _tensor_or_type(v) for k, v in got.state_dict().items()}
    for args in calls:
        out["calls"].append(module_calls(got, args))
        if "raised" in out["calls"][-1]:
            break
    return out


# ------------------------------------------------------------------------ export.onnx-parity
def onnx_model(spec: list):
    """The onnx-parity model of ``spec``: ``["mlp", widths]`` (``models.mlp``) or ``["head", d,
    hidden, k]`` (``models.Head``); load a state dict for its weights."""
    import torch

    from labs.export import models

    if spec[0] == "mlp":
        return models.mlp(list(spec[1]), torch.Generator())
    if spec[0] == "head":
        return models.Head(spec[1], spec[2], spec[3], torch.Generator())
    raise ValueError(f"no onnx-parity model {spec[0]!r}")


@contextlib.contextmanager
def quiet(*loggers: str):
    """Warnings, and records below ERROR of the named loggers (e.g. ``"torch._inductor"``), kept
    out of the output for the body; the loggers' levels are put back afterwards."""
    import logging

    found = [logging.getLogger(name) for name in loggers]
    levels = [lg.level for lg in found]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for lg in found:
                lg.setLevel(logging.ERROR)
            yield
    finally:
        for lg, level in zip(found, levels, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def _exporter_quiet():
    """The ONNX exporter's chatter kept out of the output: its ``[torch.onnx]`` progress lines
    (the rest of what is printed is passed on), warnings, and log records below ERROR."""
    import sys

    out = io.StringIO()
    try:
        with quiet("torch.onnx", "onnxscript", "torch.export"), contextlib.redirect_stdout(out):
            yield
    finally:
        kept = [line for line in out.getvalue().splitlines(keepends=True)
                if not line.startswith("[torch.onnx]")]
        if kept:
            sys.stdout.write("".join(kept))


@probe
def onnx_files(to_onnx, spec: list, state: dict, example) -> dict:
    """``to_onnx(onnx_model(spec) with state, example, path)``, with ``path`` a ``model.onnx`` in
    an empty temporary folder. Returns ``{"files": {each file name in the folder afterwards: its
    bytes}}`` (the answer's exceptions are the learner's: they propagate)."""
    import os
    import tempfile

    model = _load(onnx_model(spec), state)
    with tempfile.TemporaryDirectory(prefix="onnx_parity_") as folder:
        path = os.path.join(folder, "model.onnx")
        with _exporter_quiet():
            to_onnx(model, example.clone(), path)
        files = {}
        for name in sorted(os.listdir(folder)):
            full = os.path.join(folder, name)
            if os.path.isfile(full):
                with open(full, "rb") as f:
                    files[name] = f.read()
            else:
                files[name] = None
    return {"files": files}


# ------------------------------------------------------------------------ export.aoti
CHECK_INPUTS = "AOTI_RUNTIME_CHECK_INPUTS"
#: the loggers export and Inductor report through while a package is built
_COMPILERS = ("torch._inductor", "torch.export", "torch._export", "torch._dynamo")




@contextlib.contextmanager
def _checked_inputs():
    """``AOTI_RUNTIME_CHECK_INPUTS=1`` for the body (a package's generated code then checks its
    input's sizes, at its first run), and what C++ writes to fds 1 and 2 (the input check
    prints its error before raising it) sent to /dev/null."""
    import os
    import sys

    old = os.environ.get(CHECK_INPUTS)
    os.environ[CHECK_INPUTS] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
        if old is None:
            del os.environ[CHECK_INPUTS]
        else:
            os.environ[CHECK_INPUTS] = old


@contextlib.contextmanager
def _batch_ranges(found: list):
    """Record in ``found``, for each program exported in the body (every export reaches
    ``torch.export._trace._export``), the range its ``range_constraints`` give dim 0 of its
    first user input: ``[lower, upper]`` (ints; ``upper`` None when unbounded), the size twice
    when that dim is static."""
    import torch.export._trace as trace

    real = trace._export

    def recording(*args, **kwargs):
        ep = real(*args, **kwargs)
        user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        node = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name in user[:1])
        size = node.meta["val"].shape[0]
        if isinstance(size, int):
            found.append([size, size])
        else:
            bounds = ep.range_constraints[size.node.expr]
            upper = bounds.upper
            found.append([int(bounds.lower), int(upper) if upper.is_finite else None])
        return ep

    trace._export = recording
    try:
        yield
    finally:
        trace._export = real


@probe
def aoti_runs(package_aoti, widths: list, state: dict, example, xs: list) -> dict:
    """``package_aoti(models.mlp(widths) with state, example, path)`` (``path`` a ``model.pt2``
    in an empty temporary folder) under Inductor's default configuration, whatever the notebook
    set (:func:`grader.checks.config_changes`), with ``aot_inductor.check_lowerbound=False``;
    then the package
    at the path it returned loaded with ``torch._inductor.aoti_load_package`` and run, with
    ``AOTI_RUNTIME_CHECK_INPUTS`` set, on each x of ``xs``. Returns ``{"returned": {"type": the
    returned value's type's name, "path": it as a str when it is a str or PathLike, else None},
    "abs": whether that path is absolute, "file": whether it is a file, "folder": the names in
    the temporary folder, "zip": whether the file is a zip archive, "aoti": whether it holds
    anything under data/aotinductor/, "load": _error of what loading raised, or None,
    "outputs": [a tensor, {"type"} or {"error": _error}, per x], "ranges": the batch range of
    each program the answer exported (:func:`_batch_ranges`)}`` (as far as it got; the answer's
    own exceptions propagate)."""
    import os
    import tempfile
    import zipfile

    import torch
    import torch._inductor
    import torch._inductor.config as inductor_config

    from labs.export import models

    model = _load(models.mlp(list(widths), torch.Generator()), state)
    out = {"returned": None, "abs": False, "file": False, "folder": [], "zip": False,
           "aoti": False, "load": None, "outputs": [], "ranges": []}
    with tempfile.TemporaryDirectory(prefix="aoti_") as folder:
        path = os.path.join(folder, "model.pt2")
        # Inductor's own configuration, whatever the notebook set (a compiler of another
        # machine in cpp.cxx), with the exercise's one setting
        config = {**config_changes(inductor_config), "aot_inductor.check_lowerbound": False}
        with quiet(*_COMPILERS), inductor_config.patch(config), compiler_caches_as_started(), \
                _batch_ranges(out["ranges"]):
            got = package_aoti(model, example.clone(), path)
        is_path = isinstance(got, (str, os.PathLike))
        got_path = os.fspath(got) if is_path else None
        out["returned"] = {"type": type(got).__name__,
                           "path": got_path if type(got_path) is str else None}
        out["folder"] = sorted(os.listdir(folder))
        if type(got_path) is not str:
            return out
        out["abs"] = os.path.isabs(got_path)
        out["file"] = os.path.isfile(got_path)
        if not out["file"]:
            return out
        out["zip"] = zipfile.is_zipfile(got_path)
        if not out["zip"]:
            return out
        with zipfile.ZipFile(got_path) as z:
            out["aoti"] = any("/data/aotinductor/" in n for n in z.namelist())
        if not out["aoti"]:
            return out
        try:
            with quiet(*_COMPILERS):
                runner = torch._inductor.aoti_load_package(got_path)
        except Exception as exc:  # noqa: BLE001  (what the loader says is the learner's clue)
            out["load"] = _error(exc)
            return out
        for x in xs:
            try:
                with _checked_inputs():
                    out["outputs"].append(_tensor_or_type(runner(x.clone())))
            except Exception as exc:  # noqa: BLE001  (the input check refused the sizes)
                out["outputs"].append({"error": _error(exc)})
    return out
