"""The compile lab's probes: what runs in the learner's kernel when an exercise is judged (see
``grader.probe``). Each builds what the answer needs from plain parameters (a function of
``labs/compile/programs.py`` or of this module by name, or the source text of one the judge drew
from the run's seed; input tensors; call sequences), calls the answer under a clean compiler
(:func:`fresh_compiler`), and returns what it observed as plain data: the graphs a backend kept
(their call targets as names, the shapes of their example inputs), graph-break counts, frames
compiled, whether torch.export ran, outputs, the kernels Inductor's code launches, what an
exported program returned or refused, what the answer raised. The judges in
``labs/compile/checks`` build the same functions and inputs with the builders defined here,
compute torch's answer in the grader's process (eager outputs, ``torch._dynamo.explain``, a
``CompileCounter``, Dynamo's guards, the library's partitioners) and decide. Nothing here knows
a right answer.
"""

from __future__ import annotations

import contextlib
import io
import sys

import torch
import torch._dynamo
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from torch import fx
from torch._dynamo.testing import CompileCounter

from grader.checks import (compiler_caches_as_started, config_changes, plain, probe, raised,
                           set_by_hand)
from labs.compile import programs, viz

#: how much of an exception's message a probe returns
_TEXT = 2000


# ------------------------------------------------------------------ a clean compiler
@probe
def changed_config(answer) -> list[str]:
    """The config entries the notebook set by hand (:func:`grader.checks.set_by_hand`), which
    the checks set back to their defaults while they run (:func:`fresh_compiler`):
    ``["torch._dynamo.config.capture_scalar_outputs", ...]``; what a library installed there
    (AOTInductor's metadata) is set back too, unnamed."""
    return [f"{label}.{name}" for label, module in (("torch._dynamo.config", torch._dynamo.config),
                                                    ("torch._inductor.config", inductor_config))
            for name in set_by_hand(module)]


class FrameCount:
    """Counts the frames Dynamo compiles while active (``with FrameCount() as seen:``): each
    call of ``torch._dynamo.convert_frame._compile`` (the function that turns one frame into a
    graph and its guards), wrapped for the duration. Unlike ``counters["frames"]``, neither
    ``torch._dynamo.reset`` nor ``counters.clear()`` touches it. ``frames``: the count;
    ``replaced``: whether the body put something else in ``_compile``'s place (the count then
    misses what that compiled)."""

    def __init__(self):
        self.frames, self.replaced = 0, False

    def __enter__(self) -> FrameCount:
        from torch._dynamo import convert_frame

        self._module, self._original = convert_frame, convert_frame._compile

        def counted(*args, **kwargs):
            self.frames += 1
            return self._original(*args, **kwargs)

        self._counted = convert_frame._compile = counted
        return self

    def __exit__(self, *exc) -> None:
        self.replaced = self._module._compile is not self._counted
        self._module._compile = self._original

    def seen(self) -> dict:
        """``{"frames": int, "replaced": bool}``, plain data for a judge."""
        return {"frames": self.frames, "replaced": self.replaced}


@contextlib.contextmanager
def fresh_compiler(functorch: bool = False):
    """Run the body with Dynamo's caches empty, the config modules (Dynamo's, Inductor's, and
    with ``functorch`` AOTAutograd's, which steers min-cut) at their defaults, the compiler
    caches where the kernel was started with them
    (:func:`grader.checks.compiler_caches_as_started`), and without warnings or log records
    below ERROR; the caches are emptied again on the way out (what the
    body compiled is not left to the notebook), and the notebook's config is given back.
    (torch/utils/_config_module.py: ConfigModule.patch.)"""
    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        stack.enter_context(viz.dynamo_quiet())
        stack.enter_context(compiler_caches_as_started())
        modules = [torch._dynamo.config, inductor_config] + [functorch_config] * functorch
        for module in modules:
            if diff := config_changes(module):
                stack.enter_context(module.patch(diff))
        try:
            yield
        finally:
            torch._dynamo.reset()


def _quiet():
    """What the programs print (``programs.logged``) kept out of the learner's output."""
    return contextlib.redirect_stdout(io.StringIO())


def returned(value) -> dict:
    """What an answer returned: ``{"value": it when it is plain data, else None, "type": its
    type's name, "unplain": "" when it is plain data, else what is not}``."""
    why = plain(value, "what your answer returned")
    return {"value": None if why else value, "type": type(value).__name__, "unplain": why}


def _failure(exc: BaseException) -> dict:
    """What an exception says, on one line (its first), with where in the learner's code it was
    raised: :func:`grader.checks.raised`'s record with ``first``."""
    record = raised(exc)
    record["first"] = (str(exc).strip().splitlines() or [""])[0][:300]
    return record


def _mark(args: list, marks: list) -> None:
    """``torch._dynamo.mark_dynamic(args[i], dims)`` for each ``[i, dims]`` of ``marks``."""
    for i, dims in marks:
        torch._dynamo.mark_dynamic(args[i], list(dims))


def _kind(value) -> dict:
    """What kind of thing a class's answer is: ``{"class": whether it is a class, "type": its
    type's name}``."""
    return {"class": isinstance(value, type), "type": type(value).__name__}


# ------------------------------------------------------------------ compile.graph-capture
def no_break(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A function without graph breaks: one graph."""
    return torch.relu(x @ w).sum(1) + 1


def from_source(source: str, name: str = "fn", filename: str = "<a function of the checks>"):
    """The function ``name`` that ``source`` defines (with ``torch`` in its globals)."""
    namespace = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    return namespace[name]


def capture_function(spec: list):
    """A function of exercise 1's cases: ``["program", name]`` (``programs.BREAKING``),
    ``["no_break"]`` or ``["source", text]`` (a function ``fn``)."""
    if spec[0] == "program":
        return programs.BREAKING[spec[1]]
    if spec[0] == "no_break":
        return no_break
    return from_source(spec[1])


def call_names(gm) -> list[str]:
    """A graph's call_function / call_method targets, in order, as names."""
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
            if n.op in ("call_function", "call_method")]


def _list_state(owner, name: str) -> dict:
    """``{"present": owner has the attribute, "list": it is exactly a list, "type": its type's
    name, "len": its length (a list)}``."""
    if not hasattr(owner, name):
        return {"present": False, "list": False, "type": None, "len": None}
    value = getattr(owner, name)
    is_list = type(value) is list
    return {"present": True, "list": is_list, "type": type(value).__name__,
            "len": len(value) if is_list else None}


def _example(values) -> list | dict:
    """A graph's example inputs: each tensor's shape (a list), anything else its type's name; or
    ``{"type": name}`` when they are not a list or tuple."""
    if not isinstance(values, (list, tuple)):
        return {"type": type(values).__name__}
    return [list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__ for v in values]


@probe
def recorded(GraphRecorder, cases: list) -> dict:
    """For each ``[spec, args]`` (:func:`capture_function`): two new recorders (one never used),
    the function compiled with ``torch.compile(fn, backend=recorder)`` and called once on
    ``args``. Returns ``{**_kind(GraphRecorder), "cases": [...]}``, one entry per case:
    ``{"fresh": {attr: _list_state} of a new recorder, "output": returned(what the compiled
    function returned), "other": [len of the unused recorder's lists, or None], "graphs": [{
    "type", "module": an fx.GraphModule, "calls": call_names}] or None (not a list), "inputs":
    [_example of each entry] or None}``; or ``{"not_callable": what Dynamo said}`` when the
    backend's return was refused, ``{"call_failed": _failure}`` when calling the compiled
    function raised, ``{"raised": record}`` when the answer raised (the last entry)."""
    out = {**_kind(GraphRecorder), "cases": []}
    if not out["class"]:
        return out
    for spec, args in cases:
        fn = capture_function(spec)
        with fresh_compiler(), _quiet():
            try:
                other, recorder = GraphRecorder(), GraphRecorder()
                fresh = {name: _list_state(recorder, name)
                         for name in ("graphs", "example_inputs")}
                try:
                    got = torch.compile(fn, backend=recorder)(*args)
                except torch._dynamo.exc.BackendCompilerFailed as exc:
                    inner = exc.inner_exception
                    if isinstance(inner, AssertionError) and "callable" in str(inner):
                        out["cases"].append({"not_callable": str(inner)[:_TEXT]})
                        continue
                    raise inner from None
                except NotImplementedError:
                    raise
                except Exception as exc:  # noqa: BLE001  (reported with the learner's line)
                    out["cases"].append({"call_failed": _failure(exc)})
                    continue
            except Exception as exc:  # noqa: BLE001  (the judge reports it)
                out["cases"].append({"raised": raised(exc)})
                break
        graphs, inputs = recorder.graphs, recorder.example_inputs
        out["cases"].append({
            "fresh": fresh,
            "output": returned(got),
            "other": [len(v) if type(v) is list else None
                      for v in (getattr(other, "graphs", None),
                                getattr(other, "example_inputs", None))],
            "graphs": None if type(graphs) is not list else [
                {"type": type(gm).__name__, "module": isinstance(gm, fx.GraphModule),
                 "calls": call_names(gm) if isinstance(gm, fx.GraphModule) else None}
                for gm in graphs],
            "inputs": None if type(inputs) is not list else [_example(ex) for ex in inputs],
        })
    return out


# ------------------------------------------------------------------ compile.graph-breaks
@probe
def entries(fixed) -> dict:
    """What ``fixed`` is: ``{"dict": exactly a dict, "type": its type's name, "keys": its keys
    (str as they are, others by repr), "callable": {key: whether its value is callable},
    "types": {key: the value's type's name}}``."""
    if type(fixed) is not dict:
        return {"dict": False, "type": type(fixed).__name__}
    key = lambda k: k if type(k) is str else repr(k)
    return {"dict": True, "type": "dict", "keys": [key(k) for k in fixed],
            "callable": {key(k): callable(v) for k, v in fixed.items()},
            "types": {key(k): type(v).__name__ for k, v in fixed.items()}}


@probe
def rewrites(fixed, cases: list) -> list:
    """For each ``[name, x, explain]``: when ``explain``, ``torch._dynamo.explain(fixed[name])(x)``
    (``"breaks"``: its graph-break count, ``"reason"``: the first break's reason, first line);
    then ``torch.compile(fixed[name], backend="eager", fullgraph=True)(x)`` (``"output"``:
    returned(...), or ``"failed"``: _failure). One entry per case; ``{"raised": record}`` for
    the case where the answer raised otherwise (the last)."""
    out = []
    for name, x, explain in cases:
        f, entry = fixed[name], {}
        try:
            if explain:
                with fresh_compiler(), _quiet():
                    found = torch._dynamo.explain(f)(x.clone())
                entry["breaks"] = found.graph_break_count
                entry["reason"] = (str(found.break_reasons[0].reason).strip().splitlines()[0][:300]
                                   if found.break_reasons else "")
            with fresh_compiler(), _quiet():
                try:
                    entry["output"] = returned(torch.compile(f, backend="eager",
                                                             fullgraph=True)(x.clone()))
                except NotImplementedError:
                    raise
                except Exception as exc:  # noqa: BLE001  (any failure to compile is the answer's)
                    entry["failed"] = _failure(exc)
        except Exception as exc:  # noqa: BLE001  (the judge reports it)
            out.append({"raised": raised(exc)})
            break
        out.append(entry)
    return out


# ------------------------------------------------------------------ compile.recompiles
def regroup(x: torch.Tensor, k: int) -> torch.Tensor:
    """x (k * m, d) -> the sums of k groups of rows, shape (k,)."""
    return x.reshape(k, -1).sum(1)


def scaled_matmul(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """(x @ y) * alpha, then a row sum."""
    return ((x @ y) * alpha).sum(1)


#: the functions exercise 3's compile_once is judged on, by name
SEQUENCED = {f.__name__: f for f in (programs.scaled_sum, regroup, scaled_matmul)}


def _dict_shape(value, keys) -> dict:
    """``{"dict": exactly a dict, "type": its type's name, "keys": which of ``keys`` it has}``."""
    is_dict = type(value) is dict
    return {"dict": is_dict, "type": type(value).__name__,
            "keys": [k for k in keys if k in value] if is_dict else []}


def _part(recompiles, key: str, out: dict):
    """``recompiles[key]`` when the answer is a dict that has it and it is callable, else None;
    ``out`` gets the answer's ``"shape"`` (:func:`_dict_shape`) and, for a part that is there,
    ``"callable"`` and ``"type"``."""
    out["shape"] = _dict_shape(recompiles, ("predicted", "compile_once"))
    if key not in out["shape"]["keys"]:
        return None
    part = recompiles[key]
    out.update(callable=callable(part), type=type(part).__name__)
    return part if out["callable"] else None


def _marked(calls: list, marks: list) -> list[list]:
    """The argument lists of ``calls``, copied, with ``[call, arg, dims]`` of ``marks`` marked
    dynamic (``torch._dynamo.mark_dynamic``)."""
    calls = [list(args) for args in calls]
    for k, i, dims in marks:
        torch._dynamo.mark_dynamic(calls[k][i], list(dims))
    return calls


@probe
def predictions(recompiles, sequences: list) -> dict:
    """For each ``[calls, marks]`` (``scaled_sum``'s argument lists in order; ``[call, arg,
    dims]`` to mark dynamic): ``recompiles["predicted"](calls)``, with the calls as tuples, on
    an empty cache. Returns ``{"shape": _dict_shape(recompiles), "callable": whether predicted
    is callable, "type": its type's name, "answers": [{"answer": returned(the prediction),
    **FrameCount.seen() of the call}]}``."""
    out = {"answers": []}
    predicted = _part(recompiles, "predicted", out)
    if predicted is None:
        return out
    for calls, marks in sequences:
        calls = _marked(calls, marks)
        with fresh_compiler(), FrameCount() as count:
            got = predicted([tuple(args) for args in calls])
        out["answers"].append({"answer": returned(got), **count.seen()})
    return out


@probe
def compiled_once(recompiles, sequences: list) -> dict:
    """For each ``[name, calls, marks]`` (a function of :data:`SEQUENCED`, its argument lists in
    order, ``[call, arg, dims]`` to mark dynamic): ``compiled = compile_once(fn, counter)``
    (``counter`` a fresh ``CompileCounter``) on an empty cache, then called on each argument
    list. Returns ``{"shape": _dict_shape(recompiles), "callable": whether compile_once is
    callable, "type": its type's name, "runs": [{"returned": type's name of what compile_once
    returned, "callable": whether it is callable, "frames": frames counted, "graph_runs": how
    many calls ran a compiled graph (:class:`_RunCounter`), "outs": [returned(output)],
    "config": the names of the ``torch._dynamo.config`` entries compile_once or the calls
    changed (set back afterwards)}]}``."""
    out = {"runs": []}
    compile_once = _part(recompiles, "compile_once", out)
    if compile_once is None:
        return out
    for name, calls, marks in sequences:
        calls = _marked(calls, marks)
        with fresh_compiler():
            config = torch._dynamo.config.get_config_copy()
            counter, run = _RunCounter(), {"frames": 0, "graph_runs": 0, "outs": []}
            try:
                compiled = compile_once(SEQUENCED[name], counter)
                run.update(returned=type(compiled).__name__, callable=callable(compiled))
                if run["callable"]:
                    run["outs"] = [returned(compiled(*args)) for args in calls]
                    run["frames"], run["graph_runs"] = counter.frame_count, counter.runs
            finally:
                now = torch._dynamo.config.get_config_copy()
                run["config"] = [key for key in config if now[key] != config[key]]
                torch._dynamo.config.load_config(config)  # (the learner's is given back too)
        out["runs"].append(run)
    return out


class _RunCounter(CompileCounter):
    """A ``CompileCounter`` that also counts how often the graphs it compiled run (``runs``): a
    call Dynamo runs eagerly (e.g. past ``recompile_limit``) runs none."""

    def __init__(self):
        super().__init__()
        self.runs = 0

    def __call__(self, gm, example_inputs):
        forward = super().__call__(gm, example_inputs)

        def run(*args):
            self.runs += 1
            return forward(*args)

        return run


# ------------------------------------------------------------------ compile.guards
def reduce_last(x):
    return x.sum(-1) * 2


def scale_by(x, c):
    return x * c + 1


def stack_sum(xs):
    return torch.stack(xs).sum(0)


def with_bias(x, bias=None):
    return x.sin() if bias is None else x.sin() + bias


def pair(x, y):
    return (x * y).sum(0)


def ignores_y(x, y):
    return x.sin() * 2


#: the functions exercise 4's cases compile, by name
GUARDED = {f.__name__: f for f in (programs.scaled_sum, reduce_last, scale_by, stack_sum,
                                   with_bias, pair, ignores_y)}


@probe
def answers(would_recompile, cases: list) -> list:
    """For each ``[name, args, new_args, marks]`` (a function of :data:`GUARDED`; ``[i, dims]``
    of ``args`` to mark dynamic): ``would_recompile(fn, args, new_args)`` on an empty cache.
    One entry per case: ``{"answer": returned(what it said), **FrameCount.seen() of the
    call}``."""
    out = []
    for name, args, new_args, marks in cases:
        args = list(args)
        _mark(args, marks)
        with fresh_compiler(), FrameCount() as count:
            got = would_recompile(GUARDED[name], tuple(args), tuple(new_args))
        out.append({"answer": returned(got), **count.seen()})
    return out


# ------------------------------------------------------------------ compile.partitioner
_UNARY = {"sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "exp": torch.exp,
          "sigmoid": torch.sigmoid, "relu": torch.relu}
#: the ops a chain may apply after its matmul
CHAIN_OPS = (*_UNARY, "mul", "add", "square")


def chain(linear: bool, ops: list[str], reduce: bool):
    """A chain: matmul (or linear with a bias), then pointwise ops; ``mul``/``add`` use the last
    input ``y``. Takes ``x, w`` (then ``b`` if linear, then ``y`` if used)."""
    uses_y = any(op in ("mul", "add") for op in ops)

    def fn(x, w, *rest):
        b, y = (rest[0] if linear else None), (rest[-1] if uses_y else None)
        h = torch.nn.functional.linear(x, w, b) if linear else x @ w.t()
        for op in ops:
            if op == "mul":
                h = h * y
            elif op == "add":
                h = h + y
            elif op == "square":
                h = h * h
            else:
                h = _UNARY[op](torch.tanh(h) if op == "exp" else h)  # (exp stays finite)
        return h.sum(1) if reduce else h

    fn.__name__ = fn.__qualname__ = ("linear" if linear else "mm") + "+" + "+".join(ops)
    return fn, uses_y


def partitioned_function(spec: list):
    """A function of exercise 5's cases: ``["program", name]`` (``programs.PARTITIONED``) or
    ``["chain", linear, ops, reduce]`` (:func:`chain`)."""
    if spec[0] == "program":
        return programs.PARTITIONED[spec[1]][0]
    return chain(spec[1], list(spec[2]), spec[3])[0]


def saved_by(fn, inputs: list, partition, grad_out) -> tuple:
    """Compile ``fn`` with ``functorch.compile.aot_function`` and ``partition``, run forward and
    backward (with ``grad_out``) on copies of ``inputs``; return (output, grads, the tensors the
    forward returned after its first ``num_fwd_outputs``: what it saved for backward, the name of
    each op the backward graph calls, e.g. ``"aten.mm.default"``, in graph order)."""
    from functorch.compile import aot_function, make_boxed_func

    found = {}

    def watch_partition(joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
        found["n"] = num_fwd_outputs
        return partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def fw_compiler(fw_module, example_inputs):
        def run(*args):
            outs = fw_module(*args)
            found["saved"] = list(outs[found["n"]:])
            return outs

        return make_boxed_func(run)

    def bw_compiler(bw_module, example_inputs):
        found["ops"] = [str(node.target) for node in bw_module.graph.nodes
                        if node.op == "call_function"]
        return make_boxed_func(bw_module)

    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    compiled = aot_function(fn, fw_compiler, bw_compiler, partition_fn=watch_partition)
    out = compiled(*leaves)
    grads = torch.autograd.grad(out, leaves, grad_out)
    return out, list(grads), found["saved"], found["ops"]


def described(saved: list) -> list:
    """``[shape (a list), dtype]`` of each saved tensor; None for anything else."""
    return [[list(t.shape), t.dtype] if isinstance(t, torch.Tensor) else None for t in saved]


class _Watched:
    """Wraps a partition: runs it with a profile hook that notes any call of the library's
    partitioners (``used`` names them) and counts its calls."""

    def __init__(self, partition):
        from functorch.compile import default_partition, min_cut_rematerialization_partition

        self.partition, self.used, self.calls = partition, [], 0
        self.library = {default_partition.__code__: "default_partition",
                        min_cut_rematerialization_partition.__code__:
                        "min_cut_rematerialization_partition"}

    def _hook(self, frame, event, arg):
        if event == "call" and frame.f_code in self.library:
            self.used.append(self.library[frame.f_code])

    def __call__(self, joint_module, joint_inputs, **kwargs):
        self.calls += 1
        before = sys.getprofile()
        sys.setprofile(self._hook)
        try:
            return self.partition(joint_module, joint_inputs, **kwargs)
        finally:
            sys.setprofile(before)


def _saved_report(p, fn, inputs) -> dict:
    """``{"returned": returned(p.saved(fn, *inputs)) with each item's type}``."""
    got = p.saved(fn, *[x.detach().clone().requires_grad_() for x in inputs])
    report = returned(got)
    report["items"] = ([type(item).__name__ for item in got] if isinstance(got, list) else [])
    return report


@probe
def partitions(RecomputePartitioner, cases: list, run: bool = True, saved: bool = False,
               subclass: bool = False) -> dict:
    """For each ``[spec, inputs, grad_out]`` (:func:`partitioned_function`), on a clean compiler:
    with ``run``, the function compiled with a ``RecomputePartitioner()`` (watched:
    :class:`_Watched`), forward and backward run; with ``saved``, ``p.saved(fn, *inputs)``, where
    ``p`` is the instance, or with ``subclass`` an instance of a subclass whose ``__call__`` is
    ``default_partition``. Returns ``{**_kind, "callable": whether an instance is callable,
    "cases": [{"used": library partitioners called, "calls": partition calls, "output",
    "grads", "saved": described(what the forward saved), "backward_ops": the ops the
    backward graph calls (:func:`saved_by`), "failed": {"ename", "text"} when
    torch's graph extraction asserted, "saved_report": _saved_report}]}``; ``{"raised": record}``
    for the case where the answer raised (the last)."""
    from functorch.compile import default_partition

    out = {**_kind(RecomputePartitioner), "callable": False, "cases": []}
    if not out["class"]:
        return out
    p = RecomputePartitioner()
    out["callable"] = callable(p)
    if not out["callable"]:
        return out
    if subclass:
        class DefaultPartitioner(RecomputePartitioner):
            def __call__(self, joint_module, joint_inputs, **kwargs):
                return default_partition(joint_module, joint_inputs, **kwargs)

        p = DefaultPartitioner()
    for spec, inputs, grad_out in cases:
        fn, entry = partitioned_function(spec), {}
        try:
            with fresh_compiler(functorch=True):
                if run:
                    watched = _Watched(p)
                    try:
                        output, grads, kept, ops = saved_by(fn, inputs, watched, grad_out)
                        entry.update(output=output, grads=grads, saved=described(kept),
                                     backward_ops=ops)
                    except AssertionError as exc:  # (torch's graph extraction asserts)
                        entry["failed"] = {"ename": "AssertionError", "text": str(exc)[:_TEXT]}
                    except Exception:
                        if not watched.used:
                            raise
                    entry.update(used=watched.used[:3], calls=watched.calls)
                if saved:
                    entry["saved_report"] = _saved_report(p, fn, inputs)
        except Exception as exc:  # noqa: BLE001  (the judge reports it)
            out["cases"].append({"raised": raised(exc)})
            break
        out["cases"].append(entry)
    return out


# ------------------------------------------------------------------ compile.fusion(-gpu)
def kernels_in(codes: list[str]) -> tuple[list[str], list[str]]:
    """(generated kernels launched, ATen fallback / extern calls) in Inductor's output codes, in
    call order (read by :func:`labs.compile.viz.kernels`, the table the notebook shows)."""
    found = viz.kernels(codes)
    return ([name for name, kind in found if kind != "ATen fallback"],
            [name for name, kind in found if kind == "ATen fallback"])


def compiled_kernels(fn, x: torch.Tensor) -> dict:
    """Compile ``fn`` with Inductor (fullgraph) and run it on ``x``: ``{"output", "device": of
    the output, "codes": how many output codes Inductor wrote, "generated": [kernel names],
    "fallbacks": [ATen fallback / extern calls]}``, or ``{"unsupported": the first line of the
    graph break Dynamo reported}``."""
    # the FX graph cache off: the code is generated (and seen) every time, so nothing in
    # Inductor's caches (the kernel's copy of the grader's warm cache, what the notebook
    # compiled, or planted) stands in for it
    from torch._inductor.utils import run_and_get_code

    try:
        with inductor_config.patch(fx_graph_cache=False):
            got, codes = run_and_get_code(torch.compile(fn, fullgraph=True), x)
    except torch._dynamo.exc.Unsupported as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"unsupported": first[:_TEXT]}
    generated, fallbacks = kernels_in(codes)
    return {"output": returned(got), "device": _device_of(got), "codes": len(codes),
            "generated": generated, "fallbacks": fallbacks}


def _device_of(value) -> str | None:
    return str(value.device) if isinstance(value, torch.Tensor) else None


@probe
def fused_outputs(fused, xs: list, device: str) -> list:
    """``fused(x)`` for each ``x`` of ``xs`` moved to ``device``: ``{"output": returned(...),
    "device": the output's device}`` each."""
    out = []
    for x in xs:
        got = fused(x.to(device))
        out.append({"output": returned(got), "device": _device_of(got)})
    return out


@probe
def fused_kernels(fused, x, device: str) -> dict:
    """:func:`compiled_kernels` of ``fused`` on ``x`` moved to ``device``, on a clean
    compiler."""
    with fresh_compiler():
        return compiled_kernels(fused, x.to(device))


# ------------------------------------------------------------------ compile.mini-dynamo
def branchy(x):
    """An ``if`` on a tensor's value: COMPARE_OP and a jump, outside the subset."""
    if x.sum() > 0:
        return x * 2
    return x - 1


def traced_function(spec: list):
    """A function of exercise 7's cases: ``["program", name]`` (``programs.TRACED``),
    ``["branchy"]`` or ``["source", text, name]``."""
    if spec[0] == "program":
        return programs.TRACED[spec[1]][0]
    if spec[0] == "branchy":
        return branchy
    return from_source(spec[1], spec[2], f"<{spec[2]}>")


def _code_body(code) -> tuple:
    """What a code object runs, whatever object holds it: its bytecode, constants and names."""
    return code.co_code, code.co_consts, code.co_names, code.co_varnames


class _Watch:
    """While active: notes a call of ``code`` (fn's code ran) and Dynamo compiling a frame."""

    def __init__(self, code):
        self.code, self.ran, self.dynamo = code, False, False
        self._body = _code_body(code)

    @contextlib.contextmanager
    def __call__(self):
        """Watch the body; the profiler set before (the grader's observer of the exercise's
        ``models``) still sees every event."""
        outer, count = sys.getprofile(), FrameCount()

        def hook(frame, event, arg):
            # fn's code, or a copy of it (code.replace() makes a new object of the same body)
            if event == "call" and (frame.f_code is self.code
                                    or _code_body(frame.f_code) == self._body):
                self.ran = True
            if outer is not None:
                outer(frame, event, arg)

        sys.setprofile(hook)
        try:
            with count:
                yield
        finally:
            sys.setprofile(outer)
            self.dynamo |= bool(count.frames) or count.replaced

    def seen(self) -> dict:
        return {"ran": self.ran, "dynamo": self.dynamo}


def _graphs_state(md) -> dict:
    graphs = getattr(md, "graphs", None)
    return {"type": type(graphs).__name__, "list": type(graphs) is list,
            "len": len(graphs) if type(graphs) is list else None}


@probe
def traced(MiniDynamo, spec: list, steps: list, fresh: list) -> dict:
    """``md = MiniDynamo(fn)`` (:func:`traced_function`), then ``md(*args)`` for each argument
    list of ``steps`` in order, each watched (:class:`_Watch`); after the first, ``graphs[-1]``
    (its type, whether it is an ``fx.GraphModule``, its placeholder count, and its output on
    ``fresh``). Returns ``{**_kind, "built": _Watch.seen() of the constructor, "steps": [{
    "output": returned(...), "graphs": _graphs_state, **_Watch.seen()}], "last": {...}}``; a
    step where the answer raised is ``{"raised": record, **seen}`` (the last)."""
    out = {**_kind(MiniDynamo), "steps": [], "last": None}
    if not out["class"]:
        return out
    fn = traced_function(spec)
    watch = _Watch(fn.__code__)
    try:
        with watch():
            md = MiniDynamo(fn)
    except Exception as exc:  # noqa: BLE001  (the judge reports it, after what it saw)
        out["built"] = {"raised": raised(exc), **watch.seen()}
        return out
    out["built"] = watch.seen()
    for k, args in enumerate(steps):
        try:
            with watch():
                got = md(*args)
        except Exception as exc:  # noqa: BLE001
            out["steps"].append({"raised": raised(exc), **watch.seen()})
            break
        out["steps"].append({"output": returned(got), "graphs": _graphs_state(md),
                             **watch.seen()})
        if k == 0:
            gm = md.graphs[-1] if out["steps"][0]["graphs"]["len"] else None
            last = {"type": type(gm).__name__, "module": isinstance(gm, fx.GraphModule)}
            out["last"] = last
            if last["module"]:
                last["placeholders"] = len([n for n in gm.graph.nodes if n.op == "placeholder"])
                if last["placeholders"] == len(fresh):
                    try:
                        last["output"] = returned(gm(*fresh))
                    except Exception as exc:  # noqa: BLE001  (the judge reports it)
                        last["raised"] = raised(exc)
    return out


@probe
def unsupported(MiniDynamo, x) -> dict:
    """``MiniDynamo(branchy)(x)``, watched: ``{**_kind, "raised": record of what it raised or
    None, **_Watch.seen()}``."""
    out = {**_kind(MiniDynamo), "raised": None}
    if not out["class"]:
        return out
    watch = _Watch(branchy.__code__)
    try:
        with watch():
            MiniDynamo(branchy)(x)
    except Exception as exc:  # noqa: BLE001  (any exception will do: the judge reads it)
        out["raised"] = raised(exc)
    return {**out, **watch.seen()}


# ------------------------------------------------------------------ compile.dynamic-shapes
#: the keys of exercise 8's answer
DYNAMIC_KEYS = ("shape_guards", "checked")
#: where torch.export's tracing lives, and the functions of it every export (strict or not)
#: calls: a call of one means export ran (importing the module calls others)


def shaped_function(spec: list):
    """A function of exercise 8's guard cases: ``["program", name]`` (``programs.SHAPED``) or
    ``["source", text]`` (a function ``fn``)."""
    if spec[0] == "program":
        return programs.SHAPED[spec[1]]
    return from_source(spec[1], "fn", "<a function of the checks>")


@probe
def guard_predictions(dynamic_shapes, cases: list) -> dict:
    """For each ``[spec, example_args, dynamic_dims, new_args_list]`` (:func:`shaped_function`),
    on a clean compiler: ``accepts = dynamic_shapes["shape_guards"](fn, example_args,
    dynamic_dims)``, then ``accepts(*new_args)`` for each of ``new_args_list`` (Dynamo or
    export run meanwhile are the exercise's ``models``, seen by the probe's observer). Returns
    ``{"shape": _dict_shape, "callable", "type": of shape_guards, "cases": [{"callable",
    "type": of accepts, "answers": [returned(...)]}]}``."""
    out = {"shape": _dict_shape(dynamic_shapes, DYNAMIC_KEYS), "cases": []}
    if "shape_guards" not in out["shape"]["keys"]:
        return out
    shape_guards = dynamic_shapes["shape_guards"]
    out.update(callable=callable(shape_guards), type=type(shape_guards).__name__)
    if not out["callable"]:
        return out
    for spec, example, dims, news in cases:
        fn = shaped_function(spec)
        with fresh_compiler():
            accepts = shape_guards(fn, tuple(example), [list(d) for d in dims])
            entry = {"callable": callable(accepts), "type": type(accepts).__name__,
                     "answers": []}
            for new in news if entry["callable"] else ():
                entry["answers"].append(returned(accepts(*new)))
        out["cases"].append(entry)
    return out


class _Forward(torch.nn.Module):
    """A module whose forward is ``fn`` (what ``torch.export.export`` takes)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def export_rows_dynamic(fn, example: list):
    """``torch.export.export`` of ``fn`` (as a module's forward) on ``example``, non-strict, with
    the first input's dim 0 dynamic (``Dim.AUTO``) and every other size static: the
    ExportedProgram. What export prints when it fails (the graph so far) is not shown.
    (torch/export/_trace.py: _export; torch/export/dynamic_shapes.py: Dim.)"""
    from torch.export import Dim

    spec = ({0: Dim.AUTO},) + (None,) * (len(example) - 1)
    with contextlib.redirect_stderr(io.StringIO()):
        return torch.export.export(_Forward(fn), tuple(example), dynamic_shapes=(spec,),
                                   strict=False)


@probe
def exported_checks(dynamic_shapes, cases: list) -> dict:
    """For each ``[name, example, inputs]``: ``dynamic_shapes["checked"][name]`` exported on
    ``example`` (:func:`export_rows_dynamic`) on a clean compiler, then its ``module()`` run on
    each of ``inputs``. Returns ``{"shape": _dict_shape, "checked": {"dict", "type", "missing":
    names of the cases without a callable}, "cases": [{"export": _failure of what export raised
    or None, "runs": [{"output": returned(...)} or {"error": {"ename", "first"}}]}]}``."""
    out = {"shape": _dict_shape(dynamic_shapes, DYNAMIC_KEYS), "cases": []}
    if "checked" not in out["shape"]["keys"]:
        return out
    checked = dynamic_shapes["checked"]
    is_dict = type(checked) is dict
    out["checked"] = {"dict": is_dict, "type": type(checked).__name__, "missing": [
        name for name, _, _ in cases if not is_dict or not callable(checked.get(name))]}
    if out["checked"]["missing"]:
        return out
    for name, example, inputs in cases:
        entry = {"export": None, "runs": []}
        with fresh_compiler():
            try:
                program = export_rows_dynamic(checked[name], example).module()
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001  (the judge reports what export said)
                entry["export"] = _failure(exc)
            for args in inputs if entry["export"] is None else ():
                try:
                    entry["runs"].append({"output": returned(program(*args))})
                except Exception as exc:  # noqa: BLE001  (a refusal: the judge decides)
                    first = (str(exc).strip().splitlines() or [""])[0][:300]
                    entry["runs"].append({"error": {"ename": type(exc).__name__,
                                                    "first": first}})
        out["cases"].append(entry)
    return out
