"""The dispatcher lab's probes: what runs in the learner's kernel when an exercise is judged
(see ``grader.kernel.probe``). Each calls the answer and returns what it observed as plain data;
the judges in ``labs/dispatcher/checks`` decide."""
from __future__ import annotations

import contextlib
import itertools
import warnings

from grader.checks import probe


def _spy_mode():
    """A dispatch mode that records the aten ops run while it is active
    (torch/utils/_python_dispatch.py: TorchDispatchMode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    return Spy()


@probe
def geometry(view_geometry, shape: list, ops: list) -> dict:
    """``view_geometry(shape, ops)`` under a dispatch mode: ``{"got": what it returned, "ops":
    the aten ops it ran}`` (an observation in the kernel: the judge's message for the common
    slip of asking torch; the int64-overflowing shapes are what no such answer can pass)."""
    with _spy_mode() as spy:
        got = view_geometry(tuple(shape), [tuple(op) for op in ops])
    return {"got": got, "ops": spy.ops}


# ------------------------------------------------------------------------ dispatcher.op-trace
def recording_mode():
    """A minimal TorchDispatchMode that records, per call, the OpOverload and the name of the
    autograd Node running it (torch._C._current_autograd_node): the dispatcher's own account of
    which overloads run (torch/utils/_python_dispatch.py: TorchDispatchMode). The judge's
    reference, and in a probe the plain mode an answer is nested with."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recording(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.nodes = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            node = torch._C._current_autograd_node()
            self.ops.append(func)
            self.nodes.append(None if node is None else node.name())
            return func(*args, **(kwargs or {}))

    return Recording()


# A program is ``build(g) -> body``: ``build`` makes the inputs (outside any mode) from a seeded
# generator; ``body()`` runs forward and backward and returns the tensors to compare.
def _mlp(g):
    import torch
    import torch.nn.functional as F

    x = torch.randn(5, 3, generator=g)
    w1 = (torch.randn(4, 3, generator=g) * 0.5).requires_grad_()
    b1 = torch.randn(4, generator=g).requires_grad_()
    w2 = (torch.randn(2, 4, generator=g) * 0.5).requires_grad_()

    def body():
        hidden = torch.tanh(F.linear(x, w1, b1))
        loss = (hidden @ w2.T).pow(2).mean()
        return [loss, *torch.autograd.grad(loss, [w1, b1, w2])]
    return body


def _views_inplace(g):
    import torch

    a = torch.randn(4, 3, generator=g).requires_grad_()

    def body():
        b = a.clone()
        b[1:3].mul_(2)                      # an in-place op on a view: CopySlices in backward
        c = b.t().exp()
        return [c, *torch.autograd.grad(c.sum(), a)]
    return body


def _accumulate_and_kwargs(g):
    """.backward() into leaves (AccumulateGrad), factories and ops whose kwargs matter."""
    import torch

    x = torch.randn(3, 4, generator=g).requires_grad_()
    w = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()

    def body():
        z = torch.zeros(3, 4, dtype=torch.float64)
        y = torch.add(z, x.to(torch.float64), alpha=3)      # kwargs: dtype, alpha
        s = (y * w).sum(dim=1, dtype=torch.float64)
        out = torch.softmax(s, dim=0)[0] + torch.ones((), dtype=torch.float64)
        out.backward()
        return [out, x.grad, w.grad]
    return body


def _random_program(g, rng, n_ops: int):
    """A seeded random program over (n, m) tensors: pointwise ops, matmul, views, reductions,
    in-place ops on clones, dtype round trips; then gradients of a sum."""
    import torch

    n, m = rng.randint(1, 4), rng.randint(1, 4)
    leaves = [torch.randn(n, m, generator=g).requires_grad_() for _ in range(rng.randint(1, 3))]
    square = torch.randn(m, m, generator=g).requires_grad_()
    const = torch.randn(n, m, generator=g)
    plan = [rng.randrange(16) for _ in range(n_ops)]
    picks = [(rng.random(), rng.random()) for _ in range(n_ops)]
    use_backward = rng.random() < 0.5

    def body():
        pool = list(leaves) + [const]

        def pick(u):
            return pool[int(u * len(pool))]

        for kind, (u, v) in zip(plan, picks):
            a, b = pick(u), pick(v)
            if kind == 0:
                r = a + b
            elif kind == 1:
                r = torch.mul(a, b)
            elif kind == 2:
                r = torch.sin(a) * torch.sigmoid(b)
            elif kind == 3:
                r = a @ square
            elif kind == 4:
                r = a.t().contiguous().t() * 2           # a view, a copy and a view back
            elif kind == 5:
                r = a.sum(dim=1, keepdim=True).expand(n, m) - b
            elif kind == 6:
                r = torch.softmax(a, dim=-1)
            elif kind == 7:
                c = a.clone()
                c.mul_(b)                                # in-place on a fresh clone
                r = c
            elif kind == 8:
                r = torch.cat([a, b], dim=0)[::2][:n]    # cat, slicing with a step
                if r.shape[0] < n:
                    r = torch.cat([r, b[: n - r.shape[0]]], dim=0)
            elif kind == 9:
                r = torch.where(a > 0, a, b * 0.5)
            elif kind == 10:
                r = a.to(torch.float64).exp().to(torch.float32)
            elif kind == 11:
                r = torch.relu(a) + torch.clamp(b, min=-0.5)
            elif kind == 12:
                r = a.unsqueeze(0).mean(dim=0)
            elif kind == 13:
                r = torch.tanh(a).pow(2)
            elif kind == 14:
                r = a.reshape(-1).flip(0).reshape(n, m)
            else:
                r = torch.add(a, b, alpha=-0.5)
            pool.append(r)
        out = pool[-1].sum()
        for t in pool[-3:-1]:
            out = out + t.sum()
        if not out.requires_grad:
            out = out + leaves[0].sum()
        if use_backward:
            out.backward()
            return [out] + [t.grad for t in leaves + [square]]
        return [out, *torch.autograd.grad(out, leaves + [square], allow_unused=True)]
    return body


def _no_ops(g):
    """Only Python-level reads: no operator reaches the dispatcher."""
    import torch

    x = torch.randn(2, 3, generator=g)

    def body():
        _ = x.shape, x.dtype, x.dim(), x.requires_grad, x.is_contiguous()
        return []
    return body


def _no_grad_and_ints(g):
    """Ops under no_grad (no backward), integer tensors, a factory with a generator."""
    import torch

    x = torch.randn(3, generator=g).requires_grad_()

    def body():
        with torch.no_grad():
            y = x * 2
        idx = torch.arange(3).flip(0)
        r = torch.randn(3, generator=torch.Generator().manual_seed(7))
        return [y, idx, r, y[idx] + r]
    return body


_PROGRAMS = {"mlp": _mlp, "views_inplace": _views_inplace,
             "accumulate_and_kwargs": _accumulate_and_kwargs, "no_ops": _no_ops,
             "no_grad_and_ints": _no_grad_and_ints}


def program(spec: list, seed: int):
    """The body of the op-trace program ``spec`` (``[name]``, or ``["random", plan_seed, n_ops]``),
    its inputs built from a generator seeded with ``seed``: ``body()`` runs it, forward and
    backward, and returns its results (tensors or None)."""
    import random

    import torch

    g = torch.Generator().manual_seed(seed)
    if spec[0] == "random":
        return _random_program(g, random.Random(spec[1]), spec[2])
    return _PROGRAMS[spec[0]](g)


def op_entry(op) -> list:
    """One recorded op as plain data: ``["overload", "aten.mm.default"]`` for an OpOverload,
    ``["packet", "aten.mm"]`` for an OpOverloadPacket, ``["other", type name, repr]`` else
    (torch/_ops.py: OpOverload, OpOverloadPacket)."""
    import torch

    if isinstance(op, torch._ops.OpOverload):
        return ["overload", str(op)]
    if isinstance(op, torch._ops.OpOverloadPacket):
        return ["packet", str(op)]
    return ["other", type(op).__name__, repr(op)[:200]]


def _node_entry(node):
    """A recorded node name as plain data: the str or None itself, else ``{"type": its type's
    name, "str": whether it is a str (a subclass)}``."""
    if type(node) in (str, type(None)):
        return node
    return {"type": type(node).__name__, "str": isinstance(node, str)}


def _listing(value, entry) -> dict:
    """An attribute the contract asks to be a list, as plain data: ``{"type": its type's name,
    "list": isinstance(value, list), "items": [entry(x)...] when it is exactly a list, else
    None}`` (a list subclass could lie about its items, so its items are not read)."""
    items = [entry(x) for x in value] if type(value) is list else None
    return {"type": type(value).__name__, "list": isinstance(value, list), "items": items}


def tensor_entry(value):
    """A program's result as plain data: None, a plain tensor, or ``{"type": its type's name,
    "tensor": whether it is a tensor (a subclass)}``."""
    import torch

    if value is None or type(value) in (torch.Tensor, torch.nn.Parameter):
        return value
    return {"type": type(value).__name__, "tensor": isinstance(value, torch.Tensor)}


def _recorded(mode) -> dict:
    """What a mode shows after a run: ``{"ops": _listing of mode.ops, "nodes": _listing of
    mode.nodes}``."""
    return {"ops": _listing(getattr(mode, "ops", None), op_entry),
            "nodes": _listing(getattr(mode, "nodes", None), _node_entry)}


def _mode_class(OpTrace) -> str:
    """"" when ``OpTrace`` is a TorchDispatchMode class, else its repr."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if isinstance(OpTrace, type) and issubclass(OpTrace, TorchDispatchMode):
        return ""
    return repr(OpTrace)[:200]


def _leave_no_mode() -> bool:
    """Whether a mode is left on the dispatch-mode stack; pops what is left."""
    import torch

    left = torch._C._len_torch_dispatch_stack() > 0
    while torch._C._len_torch_dispatch_stack():
        torch._C._pop_torch_dispatch_stack()
    return left


@probe
def traces(OpTrace, programs: list) -> dict:
    """Each ``[spec, seed]`` of ``programs`` (see :func:`program`) run under ``with OpTrace():``,
    a new instance each: ``{"not_a_mode": repr of OpTrace when it is not a TorchDispatchMode
    class, else "", "runs": [...]}``, one run per program as far as it gets, each ``{"values":
    the program's results (see tensor_entry), "left_on_stack": whether a mode was left on the
    dispatch-mode stack, "ops" and "nodes": see _listing}``, or ``{"raised": record}`` for the
    program where the answer raised (the last)."""
    from grader.checks import raised

    if why := _mode_class(OpTrace):
        return {"not_a_mode": why, "runs": []}
    runs = []
    for spec, seed in programs:
        try:
            mode = OpTrace()
            body = program(spec, seed)
            with mode:
                values = body()
        except Exception as exc:
            _leave_no_mode()
            runs.append({"raised": raised(exc)})
            break
        run = {"values": [tensor_entry(v) for v in values], "left_on_stack": _leave_no_mode()}
        runs.append({**run, **_recorded(mode)})
    return {"not_a_mode": "", "runs": runs}


#: how the nested-modes probe stacks the answer's mode and a plain recording mode (outer, inner)
NESTINGS = {"yours inside a plain recording mode": ("plain", "yours"),
            "a plain recording mode inside yours": ("yours", "plain"),
            "yours inside another of yours": ("yours", "yours")}


@probe
def nested_traces(OpTrace, spec: list, seed: int) -> dict:
    """Program ``spec`` (see :func:`program`) run under two nested modes, for each nesting of
    :data:`NESTINGS` in order: ``{"not_a_mode": as in traces, "runs": [{"values": ...,
    "outer": {"ops", "nodes"}, "inner": {"ops", "nodes"}} or {"raised": record}]}``."""
    from grader.checks import raised

    if why := _mode_class(OpTrace):
        return {"not_a_mode": why, "runs": []}
    runs = []
    for outer_kind, inner_kind in NESTINGS.values():
        try:
            outer = recording_mode() if outer_kind == "plain" else OpTrace()
            inner = recording_mode() if inner_kind == "plain" else OpTrace()
            body = program(spec, seed)
            with outer:
                with inner:
                    values = body()
        except Exception as exc:
            _leave_no_mode()
            runs.append({"raised": raised(exc)})
            break
        _leave_no_mode()
        runs.append({"values": [tensor_entry(v) for v in values],
                     "outer": _recorded(outer), "inner": _recorded(inner)})
    return {"not_a_mode": "", "runs": runs}


# ------------------------------------------------------------------------ dispatcher.custom-op
#: the namespace the custom-op probe registers the answer's operator in, under a fresh name
CUSTOM_OP_NAMESPACE = "course_checks"
_custom_ops = itertools.count()


@contextlib.contextmanager
def quiet():
    """Silence what torch prints about failures a judge reports itself: anomaly-mode warnings and
    FakeTensor's error log."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        logger.setLevel(level)


def _text(exc: BaseException) -> str:
    """What an exception says (its message, else its type's name), for a judge to quote."""
    return str(exc).strip()[:4000] or type(exc).__name__


def metadata(value) -> dict:
    """What a value is, without its contents: ``{"type": its type's name, "tensor", "plain" (a
    torch.Tensor, exactly), "fake" (a FakeTensor, exactly), "fake_sub" (a FakeTensor or a
    subclass), and for a tensor its "shape" (ints), "dtype" and "device"}``
    (torch/_subclasses/fake_tensor.py: FakeTensor)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    is_tensor = isinstance(value, torch.Tensor)
    return {"type": type(value).__name__, "tensor": is_tensor,
            "plain": type(value) in (torch.Tensor, torch.nn.Parameter),
            "fake": type(value) is FakeTensor, "fake_sub": isinstance(value, FakeTensor),
            "shape": [int(s) for s in value.shape] if is_tensor else None,
            "dtype": value.dtype if is_tensor else None,
            "device": value.device if is_tensor else None}


def _registered_op(returned, name: str) -> tuple:
    """(the OpOverload ``course_checks::<name>.default`` or None, the plain facts a judge reads
    about it and about what register_op returned: "found", "callable", "returned" (its type's
    name), "schema", "args" and "returns" (the schema's types), "mutable")
    (torch/_library/custom_ops.py: custom_op; torch/_ops.py: OpOverloadPacket)."""
    import torch

    packet = getattr(getattr(torch.ops, CUSTOM_OP_NAMESPACE), name, None)
    found = packet is not None and "default" in packet.overloads()
    facts = {"found": found, "callable": callable(returned),
             "returned": type(returned).__name__}
    if not found:
        return None, facts
    schema = packet.default._schema
    facts.update(schema=str(schema), args=[str(a.type) for a in schema.arguments],
                 returns=[str(r.type) for r in schema.returns], mutable=schema.is_mutable)
    return packet.default, facts


def _outputs(op, x, t, requires_grad: bool) -> dict:
    """``{"out": tensor_entry of op(x, t), "grad": tensor_entry of the gradient its backward
    gives x for a gradient of ones}``, each None where it could not be had (the call raised, the
    output is no tensor or has no grad_fn): what opcheck and gradcheck will compare."""
    import torch

    seen = {"out": None, "grad": None}
    try:
        leaf = x.detach().clone().requires_grad_(requires_grad)
        out = op(leaf, t)
    except Exception:
        return seen
    if not isinstance(out, torch.Tensor):
        return seen
    seen["out"] = tensor_entry(out)
    if out.grad_fn is None:
        return seen
    try:
        (gx,) = torch.autograd.grad(out, leaf, torch.ones_like(out), allow_unused=True)
    except Exception:
        return seen
    seen["grad"] = tensor_entry(gx)
    return seen


def _fake_run(op, make_x, t) -> dict:
    """op on the FakeTensor ``make_x(mode)`` makes under a fresh FakeTensorMode: ``{"error": what
    it raised or None, "x_device": the fake x's device, "out": metadata of the output}``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        try:
            fx = make_x(mode)
            out = op(fx, t)
        except Exception as exc:
            return {"error": _text(exc), "x_device": None, "out": None}
    return {"error": None, "x_device": fx.device, "out": metadata(out)}


def _compiled(op, x, w, t) -> dict:
    """``(op(x * w, t).sin() + 1).sum()`` under ``torch.compile(fullgraph=True)`` with a backend
    that counts the graphs and runs aot_eager, then backward: ``{"error": what it raised or
    None, "graphs": how many graphs, "out", "x_grad", "w_grad": tensor_entry of each, "op_nodes":
    the captured graph's calls of op, "traced": metadata of the example_value of op's node}``
    (torch/_dynamo/backends/debugging.py: aot_eager)."""
    import torch
    from torch._dynamo.backends.debugging import aot_eager

    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    def program(x, w):
        return (op(x * w, t).sin() + 1).sum()

    x, w = x.requires_grad_(), w.requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(program, backend=counting_backend, fullgraph=True)
    try:
        with quiet():
            out = compiled(x, w)
            out.backward()
    except Exception as exc:  # dynamo wraps the cause
        return {"error": _text(exc)}
    nodes = [n for n in graphs[0].graph.nodes if n.op == "call_function" and n.target is op]
    traced = nodes[0].meta.get("example_value") if len(nodes) == 1 else None
    return {"error": None, "graphs": len(graphs), "out": tensor_entry(out),
            "x_grad": tensor_entry(x.grad), "w_grad": tensor_entry(w.grad),
            "op_nodes": len(nodes), "traced": None if traced is None else metadata(traced)}


def _custom_op_task(op, returned, task: list):
    """One task of :func:`custom_op` (see there)."""
    import torch

    kind, *args = task
    if kind == "call":
        x, t = args
        before = x.clone()
        out = op(x, t)
        return {"out": tensor_entry(out), "modified": not torch.equal(x, before)}
    if kind == "returned":
        x, t = args
        return {"mine": tensor_entry(returned(x, t)), "theirs": tensor_entry(op(x, t))}
    if kind == "vjp":
        x, t, v = args
        leaf = x.detach().clone().requires_grad_()
        out = op(leaf, t)
        if not isinstance(out, torch.Tensor) or out.grad_fn is None:
            return {"out": tensor_entry(out), "grad_fn": False, "grad": None}
        (gx,) = torch.autograd.grad(out, leaf, v, allow_unused=True)
        return {"out": tensor_entry(out), "grad_fn": True, "grad": tensor_entry(gx)}
    if kind == "opcheck":
        x, t, requires_grad = args
        seen = _outputs(op, x, t, requires_grad)
        with quiet():
            result = torch.library.opcheck(op, (x.requires_grad_(requires_grad), t),
                                           raise_exception=False)
        seen["opcheck"] = [[test, outcome == "SUCCESS", str(outcome)[:4000]]
                           for test, outcome in result.items()]
        return seen
    if kind == "gradcheck":
        from torch.autograd.gradcheck import GradcheckError

        x, t = args
        seen = _outputs(op, x, t, True)
        try:
            torch.autograd.gradcheck(lambda v: op(v, t), (x.requires_grad_(),), eps=1e-6,
                                     atol=1e-5)
            seen["gradcheck"] = None
        except GradcheckError as exc:
            seen["gradcheck"] = _text(exc)
        return seen
    if kind == "compile":
        return _compiled(op, *args)
    if kind == "real":
        return metadata(op(*args))
    if kind == "fake":
        x, t = args
        return _fake_run(op, lambda mode: mode.from_tensor(x), t)
    if kind == "meta":
        x, t = args
        return metadata(op(x.to("meta"), t))
    if kind == "fake_on":
        shape, dtype, device, t = args
        return _fake_run(op, lambda mode: torch.empty(shape, dtype=dtype, device=device), t)
    raise ValueError(f"no task {kind!r}")


@probe
def custom_op(register_op, tasks: list) -> dict:
    """``register_op(qualname)`` for a fresh ``course_checks::smooth_max_<n>``, then each task on
    the operator it registered, as far as they get; the registration is removed afterwards.

    Returns ``{"raised": record}`` when register_op raised, else ``{"qualname", "name", "facts"
    (see _registered_op), "results": one per task, or ``{"raised": record}`` for the task where
    the answer raised (the last)}``; no task runs unless the operator was found and what
    register_op returned is callable. Tasks (x, v, w tensors; t a float): ``["call", x, t]``:
    ``{"out", "modified": whether op changed x}``; ``["returned", x, t]``: ``{"mine": what the
    returned object gives, "theirs": what the registered operator gives}``; ``["vjp", x, t, v]``:
    ``{"out", "grad_fn", "grad": d<op(x, t), v>/dx}``; ``["opcheck", x, t, requires_grad]``:
    _outputs plus ``"opcheck": [[test, passed, what it said]]``
    (torch/testing/_internal/optests: opcheck); ``["gradcheck", x, t]``: _outputs plus
    ``"gradcheck": GradcheckError's message or None``; ``["compile", x, w, t]``: see _compiled;
    ``["real", x, t]`` and ``["meta", x, t]``: metadata of op's output on x, on x.to("meta");
    ``["fake", x, t]``: see _fake_run, x made fake by the mode; ``["fake_on", shape, dtype,
    device, t]``: see _fake_run, x a fake torch.empty on ``device``."""
    import torch

    from grader.checks import raised

    name = f"smooth_max_{next(_custom_ops)}"
    qualname = f"{CUSTOM_OP_NAMESPACE}::{name}"
    results = []
    try:
        try:
            returned = register_op(qualname)
        except Exception as exc:
            return {"raised": raised(exc)}
        op, facts = _registered_op(returned, name)
        if op is not None and facts["callable"]:
            for task in tasks:
                try:
                    results.append(_custom_op_task(op, returned, task))
                except Exception as exc:
                    results.append({"raised": raised(exc)})
                    break
    finally:
        torch._dynamo.reset()
        lib = torch._library.custom_ops.OPDEF_TO_LIB.pop(qualname, None)
        if lib is not None:
            lib._destroy()
    return {"qualname": qualname, "name": name, "facts": facts, "results": results}


# ------------------------------------------------------------------------ dispatcher.subclass
# The inputs of the subclass checks are drawn from a generator seeded by the judge, the same way
# here and in the judge (which runs the programs on the dense tensors inner * scale): what is
# drawn never depends on the answer.
def _ri(g, lo: int, hi: int) -> int:
    """A seeded integer in [lo, hi]."""
    import torch

    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _pick(g, options):
    """A seeded choice from a list."""
    return options[_ri(g, 0, len(options) - 1)]


def _scale(g) -> float:
    """A seeded nonzero scale in +-[0.25, 2.5], rounded so that messages can quote it."""
    import torch

    s = round(float(torch.empty(()).uniform_(0.25, 2.5, generator=g)), 3)
    return -s if _ri(g, 0, 2) == 0 else s


def _pointwise(g):
    import torch
    import torch.nn.functional as F

    n, m = _ri(g, 1, 4), _ri(g, 1, 5)
    other = _pick(g, [(n, m), (m,), (n, 1), (1, m), ()])
    binary = [
        ("a + b", lambda a, b: a + b),
        ("a - b", lambda a, b: a - b),
        ("a * b", lambda a, b: a * b),
        ("a / (b.abs() + 0.5)", lambda a, b: a / (b.abs() + 0.5)),
        ("torch.maximum(a, b)", torch.maximum),
        ("torch.where(a > b, a, b)", lambda a, b: torch.where(a > b, a, b)),
        ("torch.lerp(a, b, 0.3)", lambda a, b: torch.lerp(a, b, 0.3)),
        ("a * 2.5 - b / 4", lambda a, b: a * 2.5 - b / 4),
    ]
    unary = [
        ("a.exp().tanh()", lambda a: a.exp().tanh()),
        ("torch.sigmoid(a)", torch.sigmoid),
        ("F.relu(a)", F.relu),
        ("-a", lambda a: -a),
        ("a.abs().sqrt()", lambda a: a.abs().sqrt()),
        ("a.pow(2)", lambda a: a.pow(2)),
        ("1 / (a.abs() + 1)", lambda a: 1 / (a.abs() + 1)),
        ("a.clamp(-0.5, 0.7)", lambda a: a.clamp(-0.5, 0.7)),
        ("F.gelu(a)", F.gelu),
        ("torch.sin(a) + 3", lambda a: torch.sin(a) + 3),
    ]
    if _ri(g, 0, 1):
        label, fn = _pick(g, binary)
        return label, [(n, m), other], fn
    label, fn = _pick(g, unary)
    return label, [_pick(g, [(n, m), (), (n,)])], fn


def _reductions(g):
    import torch
    import torch.nn.functional as F

    n, m = _ri(g, 1, 4), _ri(g, 2, 5)
    options = [
        ("a.sum()", lambda a: a.sum()),
        ("a.sum(dim=1)", lambda a: a.sum(dim=1)),
        ("a.mean(0, keepdim=True)", lambda a: a.mean(0, keepdim=True)),
        ("a.amax(dim=-1)", lambda a: a.amax(dim=-1)),
        ("a.max(dim=1)", lambda a: a.max(dim=1)),
        ("a.norm()", lambda a: a.norm()),
        ("a.var(dim=1)", lambda a: a.var(dim=1)),
        ("F.softmax(a, dim=-1)", lambda a: F.softmax(a, dim=-1)),
        ("F.log_softmax(a, dim=0)", lambda a: F.log_softmax(a, dim=0)),
        ("a.cumsum(1)", lambda a: a.cumsum(1)),
        ("torch.sort(a, dim=1)", lambda a: torch.sort(a, dim=1)),
        ("a.topk(2, dim=1)", lambda a: a.topk(2, dim=1)),
        ("a.logsumexp(1)", lambda a: a.logsumexp(1)),
        ("a.argmax(dim=1)", lambda a: a.argmax(dim=1)),
        ("a.sum().item()", lambda a: a.sum().item()),
        ("(a > 0).sum()", lambda a: (a > 0).sum()),
    ]
    label, fn = _pick(g, options)
    return label, [(n, m)], fn


def _matmuls(g):
    import torch
    import torch.nn.functional as F

    n, k, m, b = _ri(g, 1, 4), _ri(g, 1, 5), _ri(g, 1, 4), _ri(g, 1, 3)
    options = [
        ("a @ b", [(n, k), (k, m)], lambda a, c: a @ c),
        ("torch.mm(a, b)", [(n, k), (k, m)], torch.mm),
        ("torch.bmm(a, b)", [(b, n, k), (b, k, m)], torch.bmm),
        ("a @ b (batched @ matrix)", [(b, n, k), (k, m)], lambda a, c: a @ c),
        ("torch.mv(a, b)", [(n, k), (k,)], torch.mv),
        ("F.linear(a, w)", [(n, k), (m, k)], lambda a, w: F.linear(a, w)),
        ("torch.outer(a, b)", [(n,), (m,)], torch.outer),
        (
            "torch.einsum('ij,kj->ik', a, b)",
            [(n, k), (m, k)],
            lambda a, c: torch.einsum("ij,kj->ik", a, c),
        ),
    ]
    return _pick(g, options)


def _views(g):
    n, m = _ri(g, 2, 4), _ri(g, 2, 5)
    options = [
        ("a.t()", lambda a: a.t()),
        ("a.transpose(0, 1) * 2", lambda a: a.transpose(0, 1) * 2),
        ("a.reshape(-1)", lambda a: a.reshape(-1)),
        ("a.view(m, n)", lambda a: a.view(m, n)),
        ("a.unsqueeze(1)", lambda a: a.unsqueeze(1)),
        ("a[1:, ::2]", lambda a: a[1:, ::2]),
        ("a[0]", lambda a: a[0]),
        ("a.narrow(1, 1, 1)", lambda a: a.narrow(1, 1, 1)),
        ("a.split(1, dim=0)", lambda a: a.split(1, dim=0)),
        ("a.unbind(1)", lambda a: a.unbind(1)),
        ("a.expand(3, n, m).sum(0)", lambda a: a.unsqueeze(0).expand(3, n, m).sum(0)),
        ("a.diagonal()", lambda a: a.diagonal()),
        ("a.flatten()", lambda a: a.flatten()),
        ("a.t().contiguous()", lambda a: a.t().contiguous()),
        ("a.mT.flip(0)", lambda a: a.mT.flip(0)),
    ]
    label, fn = _pick(g, options)
    return label, [(n, m)], fn


def _indexing(g):
    import torch

    n, m = _ri(g, 2, 5), _ri(g, 2, 4)
    idx = torch.randint(0, n, (_ri(g, 1, 4),), generator=g)
    cols = torch.randint(0, m, (n, 2), generator=g)
    mask = torch.rand(n, m, generator=g) > 0.5
    options = [
        ("a[idx]", lambda a: a[idx]),
        ("a[mask]", lambda a: a[mask]),
        ("a.index_select(0, idx)", lambda a: a.index_select(0, idx)),
        ("a.gather(1, cols)", lambda a: a.gather(1, cols)),
        ("a.masked_fill(mask, 0.5)", lambda a: a.masked_fill(mask, 0.5)),
        ("a[idx, 0]", lambda a: a[idx, 0]),
    ]
    label, fn = _pick(g, options)
    return label, [(n, m)], fn


def _inplace(g):
    import torch

    n, m = _ri(g, 2, 4), _ri(g, 2, 5)
    idx = torch.randint(0, n, (1,), generator=g)
    mask = torch.rand(n, m, generator=g) > 0.5

    def setitem_row(a, b):
        a[idx] = b[0]
        return a

    def setitem_col(a, b):
        a[:, 0] = 3.0
        return a

    def view_then_inplace(a, b):
        a[1:].mul_(2.0)
        return a.sum()

    def transposed_add_(a, b):
        a.t().add_(b.t())
        return a

    options = [
        ("a.add_(b)", [(n, m), (n, m)], lambda a, b: a.add_(b)),
        ("a.mul_(1.5)", [(n, m)], lambda a: a.mul_(1.5)),
        ("a.zero_()", [(n, m)], lambda a: a.zero_()),
        ("a.fill_(0.75)", [(n, m)], lambda a: a.fill_(0.75)),
        ("a.copy_(b)", [(n, m), (n, m)], lambda a, b: a.copy_(b)),
        ("a.clamp_(min=0)", [(n, m)], lambda a: a.clamp_(min=0)),
        ("a[i] = b[0]", [(n, m), (n, m)], setitem_row),
        ("a[:, 0] = 3.0", [(n, m), (n, m)], setitem_col),
        ("a[1:].mul_(2.0); a.sum()", [(n, m), (n, m)], view_then_inplace),
        ("a.t().add_(b.t())", [(n, m), (n, m)], transposed_add_),
        (
            "a.addcmul_(b, b, value=0.5)",
            [(n, m), (n, m)],
            lambda a, b: a.addcmul_(b, b, value=0.5),
        ),
        ("a.masked_fill_(mask, 0.0)", [(n, m)], lambda a: a.masked_fill_(mask, 0.0)),
    ]
    return _pick(g, options)


def _structure(g):
    import torch

    n, m = _ri(g, 1, 4), _ri(g, 1, 4)
    options = [
        ("torch.cat([a, b])", [(n, m), (n, m)], lambda a, b: torch.cat([a, b])),
        ("torch.stack([a, b], dim=1)", [(n, m), (n, m)], lambda a, b: torch.stack([a, b], dim=1)),
        ("a.clone()", [(n, m)], lambda a: a.clone()),
        ("a.to(torch.float32)", [(n, m)], lambda a: a.to(torch.float32)),
        ("a.double()", [(n, m)], lambda a: a.double()),
        ("a.long()", [(n, m)], lambda a: a.long()),
        ("a > b", [(n, m), (n, m)], lambda a, b: a > b),
        ("a.eq(a)", [(n, m)], lambda a: a.eq(a)),
        ("torch.zeros_like(a)", [(n, m)], torch.zeros_like),
        ("torch.ones_like(a) * a", [(n, m)], lambda a: torch.ones_like(a) * a),
        ("torch.allclose(a, b)", [(n, m), (n, m)], lambda a, b: torch.allclose(a, b)),
        ("a.new_zeros(3)", [(n, m)], lambda a: a.new_zeros(3)),
    ]
    return _pick(g, options)


#: the autograd_flows programs: (label, leaf shapes, leaf kinds, program)
AUTOGRAD_PROGRAMS = [
    (
        "((a @ w).tanh() * a.sum(-1, keepdim=True)).sum()",
        [(3, 4), (4, 2)],
        "sd",
        lambda a, w: ((a @ w).tanh() * a.sum(-1, keepdim=True)).sum(),
    ),
    (
        "(a * b).sum(0).pow(2).mean()",
        [(3, 4), (3, 4)],
        "ss",
        lambda a, b: (a * b).sum(0).pow(2).mean(),
    ),
    ("(a.t() @ a).sum()", [(3, 2)], "s", lambda a: (a.t() @ a).sum()),
    ("softmax(a, -1)[:, 1:].sum()", [(2, 5)], "s", lambda a: a.softmax(-1)[:, 1:].sum()),
    (
        "(0.1 * torch.bmm(a, b)).exp().mean()",
        [(2, 3, 2), (2, 2, 3)],
        "ss",
        lambda a, b: a.bmm(b).mul(0.1).exp().mean(),
    ),
]


def _steps() -> list:
    """The steps of random_autograd's programs: (name, step(h, w))."""
    import torch

    return [
        ("tanh", lambda h, w: h.tanh()),
        ("* 0.7", lambda h, w: h * 0.7),
        ("sin", lambda h, w: h.sin()),
        ("@ w", lambda h, w: h @ w),
        ("+ h.t() @ h[:, :1]", lambda h, w: h + (h.t() @ h[:, :1]).t()[:, :1]),
        ("softmax", lambda h, w: h.softmax(-1)),
        ("[1:] padded", lambda h, w: torch.cat([h[1:], h[:1] * 2])),
        ("pow 2", lambda h, w: h.pow(2)),
        ("exp(-h^2)", lambda h, w: torch.exp(-h * h)),
    ]


def inplace_on_nonleaf(a, b):
    """random_autograd's last program: in-place ops on a non-leaf and on views of it."""
    h = a * 1.0
    h[0] = b[1]
    h.mul_(2.0)
    h.t()[1:].add_(b.t()[1:])
    return (h * a).sum()


def _run(g, label, shapes, fn, *, dtype=None, scaled=None) -> dict:
    """A case that runs ``fn`` on inputs of ``shapes``: ``{"kind": "run", "label", "fn",
    "inputs": [(inner, scale, whether it is a ScaledTensor)]}``."""
    import torch

    dtype = dtype or torch.float64
    scaled = scaled if scaled is not None else [True] + [_ri(g, 0, 1) == 1 for _ in shapes[1:]]
    inputs = []
    for shape, is_scaled in zip(shapes, scaled):
        inner = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        inputs.append((inner, _scale(g), is_scaled))
    return {"kind": "run", "label": label, "fn": fn, "inputs": inputs}


def _autograd(g, label, shapes, kinds, program) -> dict:
    """A case that differentiates ``program`` (it returns a 0-d tensor) at leaves of ``shapes``
    (kind 's': ScaledTensor, 'd': plain tensor): ``{"kind": "autograd", "label", "program",
    "leaves": [(inner, scale, kind)], "v": the incoming gradient}``."""
    import torch

    leaves = []
    for shape, kind in zip(shapes, kinds):
        inner = torch.randn(shape, generator=g, dtype=torch.float64)
        leaves.append((inner, _scale(g) if kind == "s" else 1.0, kind))
    v = torch.randn((), generator=g, dtype=torch.float64)
    return {"kind": "autograd", "label": label, "program": program, "leaves": leaves, "v": v}


def subclass_cases(check: str, seed: int) -> list[dict]:
    """The cases of the subclass check named ``check``, drawn from a generator seeded with
    ``seed``: dicts whose "kind" says how the probe runs them (see :func:`scaled_tensor`)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    if check == "construction":
        # a contiguous inner, then a view: a nonzero storage offset and transposed strides
        base = torch.randn(5, 6, generator=g)
        return [
            {"kind": "make", "inner": torch.randn(3, 4, generator=g), "scale": _scale(g)},
            {"kind": "make", "inner": base[1:, 2:].t(), "scale": _scale(g)},
            _run(g, "a + 1", [(3, 4)], lambda a: a + 1, scaled=[True]),
        ]
    if check == "ops_match_dense":
        cases = [
            ("a + b", [(3, 4), (3, 4)], lambda a, b: a + b, [True, True]),
            ("a * b", [(3, 4), (4,)], lambda a, b: a * b, [True, False]),
            ("a * 2.0 + 1", [(3, 4)], lambda a: a * 2.0 + 1, [True]),
            ("torch.tanh(a)", [(5,)], torch.tanh, [True]),
            ("a.sum(dim=0)", [(3, 4)], lambda a: a.sum(dim=0), [True]),
            ("F.softmax(a, dim=-1)", [(2, 5)], lambda a: F.softmax(a, dim=-1), [True]),
            ("a.max(dim=1)", [(3, 4)], lambda a: a.max(dim=1), [True]),
            ("a > b", [(3, 4), (3, 4)], lambda a, b: a > b, [True, True]),
            ("a.argmax()", [(3, 4)], lambda a: a.argmax(), [True]),
            ("a.sum().item()", [(3, 4)], lambda a: a.sum().item(), [True]),
            ("a[torch.tensor([2, 0])]", [(3, 4)], lambda a: a[torch.tensor([2, 0])], [True]),
            ("torch.cat([a, b])", [(2, 3), (1, 3)], lambda a, b: torch.cat([a, b]), [True, True]),
            ("a.to(torch.float64)", [(2, 2)], lambda a: a.to(torch.float64), [True]),
        ]
        return [
            _run(g, label, shapes, fn, dtype=torch.float32, scaled=scaled)
            for label, shapes, fn, scaled in cases
        ]
    if check == "autograd_flows":
        return [_autograd(g, *program) for program in AUTOGRAD_PROGRAMS]
    if check == "matmul_multiplies_scales":
        cases = []
        for label, sa, sb, fn in (
            ("torch.mm(a, b)", (3, 4), (4, 2), torch.mm),
            ("torch.bmm(a, b)", (2, 3, 4), (2, 4, 5), torch.bmm),
            ("a @ b", (4, 3), (3, 3), lambda a, b: a @ b),
        ):
            A = torch.randn(sa, generator=g, dtype=torch.float64)
            B = torch.randn(sb, generator=g, dtype=torch.float64)
            cases.append(
                {
                    "kind": "matmul",
                    "label": label,
                    "fn": fn,
                    "a": (A, _scale(g)),
                    "b": (B, _scale(g)),
                }
            )
        return cases + [
            _run(
                g,
                "a @ w (w a plain tensor)",
                [(3, 4), (4, 2)],
                lambda a, w: a @ w,
                scaled=[True, False],
            ),
            _run(
                g,
                "w @ a (w a plain tensor)",
                [(2, 3), (3, 4)],
                lambda w, a: w @ a,
                scaled=[False, True],
            ),
        ]
    if check == "views_and_inplace":
        cases = []
        for label, view in (
            ("a.t()", lambda a: a.t()),
            ("a[1:]", lambda a: a[1:]),
            ("a.view(-1)", lambda a: a.view(-1)),
            ("a.unsqueeze(0)", lambda a: a.unsqueeze(0)),
            ("a.select(1, 2)", lambda a: a.select(1, 2)),
        ):
            inner = torch.randn(3, 4, generator=g, dtype=torch.float64)
            cases.append(
                {"kind": "view", "label": label, "fn": view, "inner": inner, "scale": _scale(g)}
            )
        for label, fn in (
            ("a.add_(b)", lambda a, b: a.add_(b)),
            ("a.mul_(b)", lambda a, b: a.mul_(b)),
            ("a[0] = b[1]", lambda a, b: a.__setitem__(0, b[1])),
        ):
            A = torch.randn(3, 4, generator=g, dtype=torch.float64)
            B = torch.randn(3, 4, generator=g, dtype=torch.float64)
            s1, s2 = _scale(g), _scale(g)
            cases.append({"kind": "inplace", "label": label, "fn": fn, "a": (A, s1), "b": (B, s2)})
        return cases
    if check == "random_sweep":
        families = [_pointwise, _reductions, _matmuls, _views, _indexing, _inplace, _structure]
        cases = []
        for i in range(70):
            label, shapes, fn = families[i % len(families)](g)
            dtype = torch.float32 if _ri(g, 0, 3) == 0 else torch.float64
            cases.append(_run(g, f"sweep case {i}: {label}", shapes, fn, dtype=dtype))
        return cases
    if check == "random_autograd":
        cases = []
        for case in range(6):
            n = _ri(g, 2, 4)
            chosen = [_pick(g, _steps()) for _ in range(_ri(g, 2, 5))]

            def program(a, w, chosen=chosen):
                h = a
                for _, step in chosen:
                    h = step(h, w)
                return h.sum()

            label = "a -> " + " -> ".join(name for name, _ in chosen) + " -> sum"
            kinds = _pick(g, ["sd", "ss"])
            cases.append(
                _autograd(g, f"random program {case}: {label}", [(n, n), (n, n)], kinds, program)
            )
        cases.append(
            _autograd(
                g,
                "h = a * 1; h[0] = b[1]; h.mul_(2); h.t()[1:].add_(b.t()[1:]); (h * a).sum()",
                [(3, 3), (3, 3)],
                "ss",
                inplace_on_nonleaf,
            )
        )
        return cases
    raise ValueError(f"no subclass check {check!r}")


def _scaled_leaf(ScaledTensor, v, depth: int = 0) -> dict:
    """A value a program gave, as plain data. A ScaledTensor (or subclass): ``{"kind": "scaled",
    "type", "exact": whether it is exactly a ScaledTensor, "meta": [shape, dtype, device] as its
    TensorImpl records them (torch functions disabled: the class's __torch_function__ is not
    asked), "inner": _scaled_leaf of .inner (None when it is not a tensor), "scale": .scale when
    exactly a float or int, else {"type", "float", "int": what it is an instance of}}``; a plain
    tensor ``{"kind": "tensor", "value"}``; another tensor ``{"kind": "tensor_sub", "type"}``; a
    Python number ``{"kind": "number", "value"}`` (exactly bool, int or float) or ``{"kind":
    "number_sub", "type", "base"}``; anything else ``{"kind": "other", "type"}``."""
    import torch

    name = type(v).__name__
    if isinstance(v, ScaledTensor):
        inner, scale = getattr(v, "inner", None), getattr(v, "scale", None)
        with torch._C.DisableTorchFunctionSubclass():
            meta = [[int(s) for s in v.shape], v.dtype, v.device]
        if not isinstance(inner, torch.Tensor):
            inner = None
        elif depth > 9 and type(inner) is ScaledTensor:
            inner = {"kind": "deep", "type": type(inner).__name__}
        else:
            inner = _scaled_leaf(ScaledTensor, inner, depth + 1)
        if type(scale) not in (float, int):
            scale = {
                "type": type(scale).__name__,
                "float": isinstance(scale, float),
                "int": isinstance(scale, int) and not isinstance(scale, bool),
            }
        return {
            "kind": "scaled",
            "type": name,
            "exact": type(v) is ScaledTensor,
            "meta": meta,
            "inner": inner,
            "scale": scale,
        }
    if isinstance(v, torch.Tensor):
        if type(v) in (torch.Tensor, torch.nn.Parameter):
            return {"kind": "tensor", "type": name, "value": v.detach().clone()}  # as of now
        return {"kind": "tensor_sub", "type": name}
    if type(v) in (bool, int, float):
        return {"kind": "number", "type": name, "value": v}
    if isinstance(v, (int, float)):
        return {
            "kind": "number_sub",
            "type": name,
            "base": "int" if isinstance(v, int) else "float",
        }
    return {"kind": "other", "type": name}


def _flat(ScaledTensor, value) -> list:
    """The leaves of ``value`` (torch's pytree), each as :func:`_scaled_leaf` gives it."""
    from torch.utils._pytree import tree_flatten

    return [_scaled_leaf(ScaledTensor, v) for v in tree_flatten(value)[0]]


def _make_scaled(ScaledTensor, inner, scale, made: list):
    """``ScaledTensor(inner, scale)``; appends to ``made`` what it is (:func:`_scaled_leaf`)."""
    t = ScaledTensor(inner, scale)
    made.append(_scaled_leaf(ScaledTensor, t))
    return t


def _subclass_case(ScaledTensor, case: dict) -> dict:
    """Run one case of :func:`subclass_cases` on the answer's class (see :func:`scaled_tensor`)."""
    import torch

    made: list = []
    seen: dict = {"made": made}
    kind = case["kind"]
    if kind == "make":
        inner = case["inner"]
        t = _make_scaled(ScaledTensor, inner, case["scale"], made)
        with torch._C.DisableTorchFunctionSubclass():
            seen["requires_grad"] = bool(t.requires_grad)
        seen["same_inner"] = getattr(t, "inner", None) is inner
        with torch._C.DisableTorchFunctionSubclass():
            seen["layout"] = [[list(t.stride()), t.storage_offset()],
                              [list(inner.stride()), inner.storage_offset()]]
        keys = torch._C._dispatch_keys(t)
        seen["keys"] = repr(keys)
        seen["python_key"] = keys.has(torch._C.DispatchKey.Python)
    elif kind == "run":
        ins = [
            _make_scaled(ScaledTensor, inner.clone(), s, made)
            if is_scaled
            else (inner * s).clone()
            for inner, s, is_scaled in case["inputs"]
        ]
        try:
            out = case["fn"](*ins)
        except Exception as exc:
            from grader.checks import raised

            seen["fn_raised"] = raised(exc)
            return seen
        seen["out"] = _flat(ScaledTensor, out)
        seen["after"] = [
            _scaled_leaf(ScaledTensor, x) if is_scaled else None
            for x, (_, _, is_scaled) in zip(ins, case["inputs"])
        ]
    elif kind == "autograd":
        leaves = []
        for inner, s, leaf_kind in case["leaves"]:
            leaf = _make_scaled(ScaledTensor, inner, s, made) if leaf_kind == "s" else inner * s
            with torch._C.DisableTorchFunctionSubclass():  # the leaf itself
                leaf.requires_grad_()
            leaves.append(leaf)
        out = case["program"](*leaves)
        seen["out"] = _flat(ScaledTensor, out)
        recorded = False
        if isinstance(out, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():
                recorded = bool(out.requires_grad and out.grad_fn is not None)
        seen["recorded"] = recorded
        if recorded:
            try:
                grads = torch.autograd.grad(out, leaves, case["v"], allow_unused=True)
            except Exception as exc:
                from grader.checks import raised

                seen["grads_raised"] = raised(exc)
                return seen
            seen["grads"] = [None if x is None else _scaled_leaf(ScaledTensor, x) for x in grads]
    elif kind == "matmul":
        (A, s1), (B, s2) = case["a"], case["b"]
        out = case["fn"](
            _make_scaled(ScaledTensor, A, s1, made), _make_scaled(ScaledTensor, B, s2, made)
        )
        seen["out"] = _flat(ScaledTensor, out)
    elif kind == "view":
        inner = case["inner"]
        a = _make_scaled(ScaledTensor, inner, case["scale"], made)
        v = case["fn"](a)
        seen["out"] = _flat(ScaledTensor, v)
        v_inner = getattr(v, "inner", None)
        seen["shares"] = (
            isinstance(v_inner, torch.Tensor)
            and v_inner.untyped_storage().data_ptr() == inner.untyped_storage().data_ptr()
        )
        try:
            case["fn"](a).mul_(-2.0)
        except Exception as exc:
            from grader.checks import raised

            seen["after_raised"] = raised(exc)
            return seen
        seen["after"] = _scaled_leaf(ScaledTensor, a)
    elif kind == "inplace":
        (A, s1), (B, s2) = case["a"], case["b"]
        a = _make_scaled(ScaledTensor, A, s1, made)
        b = _make_scaled(ScaledTensor, B, s2, made)
        out = case["fn"](a, b)
        seen["after"] = _scaled_leaf(ScaledTensor, a)
        seen["same"] = out is a
    return seen


@probe
def scaled_tensor(ScaledTensor, check: str, seed: int) -> dict:
    """The cases of :func:`subclass_cases` ``(check, seed)`` run on the answer's class, as far as
    they get: ``{"class": {"tensor_class": whether it is a torch.Tensor subclass, "type": its
    type's name, "dispatch": whether it defines its own __torch_dispatch__}, "cases": one dict per
    case, or ``{"raised": record}`` for the case where the answer raised (the last)}``. Each case
    gives ``"made"``: the ScaledTensors it built (:func:`_scaled_leaf`), and by kind: "make":
    "requires_grad", "same_inner" (.inner is the tensor given), "keys" and "python_key" (its
    DispatchKeySet has Python); "run": "out" (the leaves of fn's result), "after" (each scaled
    input afterwards) or "fn_raised" (the record of what fn raised); "autograd": "out",
    "recorded" (the output requires grad and has a grad_fn), "grads" (the leaves' gradients
    for the incoming gradient v) or "grads_raised"; "matmul": "out"; "view": "out", "shares"
    (the view's .inner shares the original inner's storage), "after" (the original after
    view(a).mul_(-2.0)) or "after_raised";
    "inplace": "after" (a after fn(a, b)), "same" (fn returned a itself)."""
    import torch

    from grader.checks import raised

    facts = {
        "tensor_class": isinstance(ScaledTensor, type) and issubclass(ScaledTensor, torch.Tensor),
        "type": type(ScaledTensor).__name__,
        "dispatch": False,
    }
    if not facts["tensor_class"]:
        return {"class": facts, "cases": []}
    facts["dispatch"] = ScaledTensor.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__
    if not facts["dispatch"]:
        return {"class": facts, "cases": []}
    cases = []
    for case in subclass_cases(check, seed):
        try:
            cases.append(_subclass_case(ScaledTensor, case))
        except Exception as exc:
            cases.append({"raised": raised(exc)})
            break
        if "fn_raised" in cases[-1]:
            break
    return {"class": facts, "cases": cases}


# ------------------------------------------------------------------------ dispatcher.functionalize
#: programs the judge sends are compiled under this name, so tracebacks through them count as the
#: course's own (a program is the judge's input, not the learner's code)
PROGRAM_FILE = str(__import__("pathlib").Path(__file__).with_name("<program>"))


def compile_program(source: str):
    """The function ``fn`` that ``source`` (``def fn(...): ...``) defines, with ``torch`` in
    scope."""
    import torch

    namespace = {"torch": torch}
    exec(compile(source, PROGRAM_FILE, "exec"), namespace)  # noqa: S102
    return namespace["fn"]


class _Off(RuntimeError):
    """Raised by PyTorch's own functionalization while the probe has it switched off."""


@contextlib.contextmanager
def _functionalization_off(called: list):
    """Replace the ways into PyTorch's own functionalization (``torch.func.functionalize``,
    functorch's ``_wrap_functional_tensor``, ``torch._to_functional_tensor``,
    ``FunctionalTensorMode``) by functions that append their name to ``called`` and raise
    :class:`_Off`; put them back on the way out."""
    import torch
    import torch._functorch.eager_transforms as eager
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    def refuse(what):
        def refused(*args, **kwargs):
            called.append(what)
            raise _Off(f"{what} is switched off while the check runs your answer")
        return refused

    saved = []
    try:
        for owner, attr, what in (
                (torch.func, "functionalize", "torch.func.functionalize"),
                (eager, "functionalize", "torch.func.functionalize"),
                (eager, "_wrap_functional_tensor", "torch.func.functionalize"),
                (torch._C._functorch, "_wrap_functional_tensor", "_wrap_functional_tensor"),
                (torch, "_to_functional_tensor", "torch._to_functional_tensor"),
                (FunctionalTensorMode, "__init__", "FunctionalTensorMode")):
            saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, refuse(what))
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def _shares(a, b) -> bool:
    """Whether tensors ``a`` and ``b`` share memory (a view and its base, or one tensor twice)."""
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.nbytes() > 0 and sa.data_ptr() == sb.data_ptr()


def _below(inputs):
    """A TorchDispatchMode, entered before the answer's ``g`` runs (so below any mode it enters),
    that records each operator reaching it on plain tensors, as plain data: ``{"op": its name,
    "schema": its schema as a string, "functionalize": whether Functionalize is in the
    thread-local include set, "into": the index of the input of ``inputs`` that is its first
    argument (None when none is), "shares": whether an output shares memory with a tensor
    argument, "unknown": the shapes of the tensors it read that are neither inputs nor outputs
    of an earlier recorded operator}``. An operator with a tensor-subclass argument is left to
    the subclass (``NotImplemented``: what it runs on plain tensors comes back here); one on
    meta tensors only is not recorded."""
    import torch
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    class Below(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.inputs = list(inputs)
            self.known = {id(t): t for t in inputs}   # (kept alive, so ids are not reused)
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in flat):
                return NotImplemented
            out = func(*args, **kwargs)
            outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            if all(t.device.type == "meta" for t in flat + outs):
                return out
            first = args[0] if args else None
            self.ops.append({
                "op": str(func), "schema": str(func._schema),
                "functionalize": torch._C._dispatch_tls_is_dispatch_key_included(
                    torch._C.DispatchKey.Functionalize),
                "into": next((i for i, t in enumerate(self.inputs) if first is t), None),
                "shares": any(_shares(o, t) for o in outs for t in flat),
                "unknown": [list(t.shape) for t in flat if id(t) not in self.known]})
            for t in outs:
                self.known[id(t)] = t
            return out

    return Below()


def _returned(out, known: dict) -> dict:
    """What ``g`` returned: ``{"type": its type's name, "seq": whether it is a tuple or list,
    "items": tensor_entry of each item (of ``out`` itself when not a sequence), "known": for
    each, whether it is an input or an output of a recorded operator}``."""
    seq = isinstance(out, (tuple, list))
    items = list(out) if seq else [out]
    return {"type": type(out).__name__, "seq": seq, "items": [tensor_entry(t) for t in items],
            "known": [id(t) in known for t in items]}


def _functionalized_one(functionalize, source: str, args: list) -> dict:
    """One program of :func:`functionalized`."""
    import torch

    from grader.checks import raised

    fn = compile_program(source)
    inputs = [t.t() if how == "t" else t for t, how in args]
    below = _below(inputs)
    called: list = []
    seen: dict = {"refused": called}
    with _functionalization_off(called):
        try:
            g = functionalize(fn)
        except Exception as exc:
            return {**seen, "raised": raised(exc)}
        if not callable(g):
            return {**seen, "not_callable": type(g).__name__}
        depth = torch._C._len_torch_dispatch_stack()
        out, seen["g_raised"] = None, None
        with below:
            try:
                out = g(*inputs)
            except Exception as exc:
                seen["g_raised"] = raised(exc)
            finally:
                seen["left"] = torch._C._len_torch_dispatch_stack() - depth - 1
                for _ in range(max(seen["left"], 0)):
                    torch._C._pop_torch_dispatch_stack()
    seen["ops"] = below.ops
    if seen["g_raised"] is None:
        seen["out"] = _returned(out, below.known)
        seen["args"] = [tensor_entry(t) for t in inputs]
    return seen


@probe
def functionalized(functionalize, programs: list) -> list:
    """Each ``[source, args]`` of ``programs`` (``source`` defines ``fn``; ``args`` are
    ``[tensor, "t" or ""]``, "t" for an argument passed transposed), as far as they get:
    ``g = functionalize(fn)`` with PyTorch's functionalization switched off, then ``g(*args)``
    under the recording mode of :func:`_below`. One dict per program: "refused" (the switched-off
    entry points the answer called), then "raised" (functionalize(fn) raised: the last program),
    "not_callable" (the type of what it returned), or "g_raised" (None, or the record of what
    g raised), "left" (dispatch modes g left on the stack), "ops" (see :func:`_below`) and, when
    g returned, "out" (see :func:`_returned`) and "args" (the arguments afterwards)."""
    runs = []
    for source, args in programs:
        runs.append(_functionalized_one(functionalize, source, args))
        if "raised" in runs[-1]:
            break
    return runs


# ------------------------------------------------------------------------ dispatcher.privateuse1
#: PrivateUse1's name until a process renames it (c10/core/DeviceType.cpp)
DEFAULT_BACKEND_NAME = "privateuseone"
_HOOKS: dict = {"hooks": None}


def _hooks():
    """PrivateUse1 hooks and a device guard, registered once per process (a second registration
    is refused by torch and returns False); available only while a probe runs the backend."""
    import torch

    if _HOOKS["hooks"] is None:
        class Hooks(torch._C._acc.PrivateUse1Hooks):
            active = False

            def is_available(self):
                return Hooks.active

            def has_primary_context(self, device_index):
                return True

            def is_built(self):
                return True

        class Guard(torch._C._acc.DeviceGuard):
            def type_(self):
                return torch._C._autograd.DeviceType.PrivateUse1

        _HOOKS["hooks"] = (Hooks, Hooks(), Guard())
        torch._C._acc.register_python_privateuseone_hook(_HOOKS["hooks"][1])
        torch._C._acc.register_python_privateuseone_device_guard(_HOOKS["hooks"][2])
    return _HOOKS["hooks"][0]


class _DeviceModule:
    """The minimal ``torch.<backend>`` module torch asks a PrivateUse1 backend for."""

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def is_initialized():
        return True

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def _is_in_bad_fork():
        return False

    @staticmethod
    def manual_seed_all(seed):
        pass


@contextlib.contextmanager
def backend_usable():
    """Make the PrivateUse1 device usable (a device module ``torch.<name>`` when absent, the
    hooks reporting it available) and yield its name; afterwards the module is removed again and
    the hooks report "not available". What the answer registers (its kernels) is not here."""
    import sys

    import torch

    name = torch._C._get_privateuse1_backend_name()
    added_module = not hasattr(torch, name)
    if added_module:
        torch._register_device_module(name, _DeviceModule())
    Hooks = _hooks()
    was_active, Hooks.active = Hooks.active, True
    try:
        yield name
    finally:
        Hooks.active = was_active
        if added_module:
            delattr(torch, name)
            sys.modules.pop(f"torch.{name}", None)


def _device_seen(v) -> dict:
    """A value a step gave, as plain data: ``{"type": its type's name, "tensor": whether it is a
    torch.Tensor, "plain": whether exactly a Tensor}``, and for a plain tensor "device" (str),
    "device_type", "shape", "dtype" (its TensorImpl's metadata) and "value" (a copy of its values
    when on the CPU, else None: a device tensor's values are read only by a "cpu" step)."""
    import torch

    seen = {"type": type(v).__name__, "tensor": isinstance(v, torch.Tensor),
            "plain": type(v) in (torch.Tensor, torch.nn.Parameter)}
    if seen["plain"]:
        seen.update(device=str(v.device), device_type=v.device.type, shape=list(v.shape),
                    dtype=v.dtype, value=v.detach().clone() if v.device.type == "cpu" else None)
    return seen


def _device_step(step: list, args: list, slots: list, name: str) -> dict:
    """Run one step of a backend program (see :func:`backend_programs`); append its value to
    ``slots``; return what it gave (:func:`_device_seen`)."""
    import torch

    def ref(r):
        return {"arg": args, "slot": slots}[r[0]][r[1]] if r[0] != "num" else r[1]

    kind, extra = step[0], {}
    if kind == "empty":
        value = torch.empty(tuple(step[1]), dtype=step[2], device=name)
    elif kind == "to":
        value = ref(step[1]).to(name) if step[2] is None else ref(step[1]).to(name, dtype=step[2])
    elif kind == "astype":
        value = ref(step[1]).to(step[2])
    elif kind == "add":
        a, b = ref(step[1]), ref(step[2])
        value = a + b if step[3] is None else torch.add(a, b, alpha=step[3])
    elif kind == "copy_":
        dst = ref(step[1])
        value = dst.copy_(ref(step[2]))
        extra = {"same": value is dst}
    elif kind == "cpu":
        value = ref(step[1]).cpu()
    elif kind == "t":
        value = ref(step[1]).t()
    elif kind == "inplace":
        value = getattr(ref(step[1]), step[2])(step[3])
    else:
        raise ValueError(f"no backend step {kind!r}")
    slots.append(value)
    return {**_device_seen(value), **extra}


def _backend_run(register_backend, programs: list) -> dict:
    """:func:`backend_programs` under the process's current PrivateUse1 name."""
    import torch

    from grader.checks import raised

    with backend_usable() as name:
        reply: dict = {"name": name}
        lib = torch.library.Library("aten", "IMPL")
        try:
            try:
                returned = register_backend(lib)
            except Exception as exc:
                return {**reply, "raised": raised(exc)}
            reply["returned"] = None if returned is None else {
                "type": type(returned).__name__,
                "library": isinstance(returned, torch.library.Library)}
            reply["registered"] = len(lib._op_impls)
            runs = reply["programs"] = []
            for steps, args in programs:
                slots: list = []
                seen: list = []
                try:
                    for step in steps:
                        seen.append(_device_step(step, args, slots, name))
                except Exception as exc:
                    runs.append({"raised": raised(exc), "steps": seen})
                    break
                runs.append(seen)
        finally:
            lib._destroy()
    return reply


def _renamed_run(register_backend, programs: list, name: str) -> dict:
    """In a forked child: rename PrivateUse1 to ``name``, then :func:`_backend_run`."""
    import torch

    torch.set_num_threads(1)
    torch.utils.rename_privateuse1_backend(name)
    try:
        torch.device(name)  # (parsed by c10: the rename took effect)
    except RuntimeError:
        return {"rename_failed": name}
    return _backend_run(register_backend, programs)


@probe
def backend_programs(register_backend, programs: list, rename: str | None = None) -> dict:
    """``register_backend(lib)`` on a fresh ``Library("aten", "IMPL")`` with the PrivateUse1
    device usable (:func:`backend_usable`), then each ``[steps, args]`` of ``programs``, as far
    as they get; the Library is destroyed afterwards. ``args`` are CPU tensors; each step makes
    one value (slot k for step k), from references ``["arg", i]``, ``["slot", k]`` or ``["num",
    v]``: ``["empty", shape, dtype]`` (torch.empty on the device), ``["to", r, dtype]`` (r.to
    the device, with dtype unless None), ``["astype", r, dtype]``, ``["add", a, b, alpha]`` (a +
    b, or torch.add with alpha unless None), ``["copy_", dst, src]``, ``["cpu", r]``, ``["t",
    r]``, ``["inplace", r, method, number]`` (e.g. x.add_(1.0) on the CPU). Reply: ``{"name":
    the device's name, "returned": None or {"type", "library"} (what register_backend returned),
    "registered": how many kernels the Library holds, "programs": per program the list of what
    each step gave (:func:`_device_seen`; a copy_ step adds "same": it returned dst), or
    {"raised": record, "steps": what the earlier steps gave} where a step raised (the last)}``,
    or ``{"name", "raised": record}`` when register_backend raised. With ``rename``, all of it
    runs in a forked child with PrivateUse1 renamed to ``rename``: ``{"renamed_already": the
    name}`` when this process has renamed it already (a child inherits the name),
    ``{"rename_failed": rename}``, or ``{"child_error": what went wrong}``."""
    import torch

    from labs.dispatcher.forked import ChildError, run_forked

    if rename is None:
        return _backend_run(register_backend, programs)
    current = torch._C._get_privateuse1_backend_name()
    if current != DEFAULT_BACKEND_NAME:
        return {"renamed_already": current}
    try:
        return run_forked(_renamed_run, register_backend, programs, rename)
    except ChildError as exc:
        return {"child_error": str(exc)}
