"""Checks of ``compile.mini-dynamo``: ``MiniDynamo(fn)`` traces ``fn``'s bytecode into FX graphs
and caches them under a guard (each input's shape and dtype). Oracle: ``fn`` itself, run eagerly
by the check (outputs compared with rtol 1e-5, atol 1e-6), and the graph count the guard rules
imply. Checked on the functions of ``programs.TRACED`` and on seeded random straight-line
functions (source text exec'd: torch functions, tensor methods, keywords, constants, binary ops,
1-3 tensor inputs): outputs equal eager; ``graphs[-1]`` is a ``torch.fx.GraphModule`` with one
placeholder per input that, run on new inputs, equals eager; the same shapes again add no graph,
a new shape or dtype adds exactly one, an earlier shape none. ``fn``'s code must never run (a
``sys.setprofile`` hook watches for a frame of ``fn.__code__``: no eager call, no
``torch.fx.symbolic_trace``), Dynamo must not run (``torch._dynamo.utils.counters["frames"]``
unchanged), and a function with an ``if`` must raise."""

from __future__ import annotations

import contextlib
import random
import sys

import torch
from torch import fx
from torch._dynamo.utils import counters

from grader.checks import CheckFailure, check, exact, plain_tensor
from labs.compile import programs

EXERCISE = "compile.mini-dynamo"
RTOL, ATOL = 1e-5, 1e-6


class _Watch:
    """While active: notes a call of ``code`` (fn's code ran) and Dynamo compiling a frame."""

    def __init__(self, name: str, code):
        self.name, self.code, self.ran = name, code, False

    def _hook(self, frame, event, arg):
        if event == "call" and frame.f_code is self.code:
            self.ran = True

    @contextlib.contextmanager
    def __call__(self):
        frames = sum(counters["frames"].values())
        before = sys.getprofile()
        sys.setprofile(self._hook)
        try:
            yield
        finally:
            sys.setprofile(before)
            self._verify(frames)

    def _verify(self, frames: int) -> None:
        if self.ran:
            raise CheckFailure(
                f"{self.name}'s code ran (a frame of {self.name}.__code__ was called): MiniDynamo "
                "must read fn's bytecode with dis.get_instructions and never call fn, not even "
                "with proxies as torch.fx.symbolic_trace does.")
        if sum(counters["frames"].values()) != frames:
            raise CheckFailure(
                f"torch._dynamo compiled a frame while MiniDynamo ran {self.name}: build the "
                "graph yourself from the bytecode, without torch.compile or torch._dynamo.")


def _flat(value, what: str) -> list[torch.Tensor]:
    if isinstance(value, tuple):
        exact(value, tuple, what)
        return [plain_tensor(v, f"item {i} of {what}") for i, v in enumerate(value)]
    return [plain_tensor(value, what)]


def _same(got, want, what: str, where: str) -> None:
    if isinstance(want, tuple) != isinstance(got, tuple) or (
            isinstance(want, tuple) and len(got) != len(want)):
        shape = (f"a tuple of {len(want)}" if isinstance(want, tuple) else "one tensor")
        raise CheckFailure(f"{what} {where} returned {type(got).__name__}"
                           f"{f' of {len(got)}' if isinstance(got, tuple) else ''}; fn returns "
                           f"{shape}: the graph's output must have fn's structure.")
    for k, (g, w) in enumerate(zip(_flat(got, what), _flat(want, "fn's result"))):
        item = f" (item {k})" if isinstance(want, tuple) else ""
        if g.shape != w.shape or g.dtype != w.dtype:
            raise CheckFailure(
                f"{what} {where} returned{item} a {g.dtype} tensor of shape {list(g.shape)}; "
                f"fn returns {w.dtype}, {list(w.shape)}.")
        if not torch.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
            raise CheckFailure(
                f"{what} {where} returned{item} values that differ from fn's (max difference "
                f"{(g - w).abs().max().item():.3g}): the graph computes something else than the "
                "bytecode does. Check the order of operands (BINARY_OP pops the right one first)"
                " and of arguments.")


def _inputs(shapes, g, dtype=torch.float32) -> list[torch.Tensor]:
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


def _describe(args) -> str:
    return ", ".join(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}" for a in args)


def _verify(cls, name: str, fn, shapes, new_shapes, g) -> None:
    """Trace, compare, and walk the guard rules for ``fn`` (first ``shapes``, then
    ``new_shapes``)."""
    watch = _Watch(name, fn.__code__)
    with watch():
        md = cls(fn)
    expected = 0

    def step(args, adds: int, why: str):
        nonlocal expected
        want = fn(*args)
        with watch():
            got = md(*args)
        graphs = getattr(md, "graphs", None)
        exact(graphs, list, f"MiniDynamo({name}).graphs")
        expected += adds
        where = f"on ({_describe(args)})"
        if len(graphs) != expected:
            raise CheckFailure(
                f"after calling MiniDynamo({name}) {where} ({why}), .graphs holds {len(graphs)} "
                f"graph(s); {expected} expected. "
                + ("A guard miss (a new shape or dtype of any input) must trace once more."
                   if len(graphs) < expected else
                   "A guard hit (every input's shape and dtype as in an earlier call) must "
                   "reuse the cached graph, not trace again."))
        _same(got, want, f"MiniDynamo({name})", where)
        return graphs

    first = _inputs(shapes, g)
    graphs = step(first, 1, "the first call")
    gm = graphs[-1]
    if not isinstance(gm, fx.GraphModule):  # (each GraphModule has a class of its own)
        raise CheckFailure(f"MiniDynamo({name}).graphs[-1] is a {type(gm).__name__}; append "
                           "the torch.fx.GraphModule you traced.")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(shapes):
        raise CheckFailure(
            f"MiniDynamo({name}).graphs[-1] has {len(placeholders)} placeholder(s); {name} "
            f"takes {len(shapes)} input(s): one placeholder per argument, in order.")
    fresh = _inputs(shapes, g)
    _same(gm(*fresh), fn(*fresh), f"MiniDynamo({name}).graphs[-1]",
          f"called on new inputs ({_describe(fresh)})")
    step(_inputs(shapes, g), 0, "the same shapes and dtype again, new values")
    step(_inputs(new_shapes, g), 1, "new shapes")
    step(_inputs(shapes, g), 0, "the first shapes again")
    step(_inputs(shapes, g, torch.float64), 1, "the first shapes in float64")


# ------------------------------------------------------------------ random functions
_UNARY = ("sin", "cos", "tanh", "relu", "sigmoid")


def random_source(rng: random.Random, name: str) -> tuple[str, int]:
    """A random straight-line function of 1-3 square tensors (same shape): its source, and how
    many inputs it takes."""
    nargs = rng.randint(1, 3)
    params = "abc"[:nargs]
    values = list(params)
    lines = []
    for k in range(rng.randint(2, 6)):
        v, w = rng.choice(values), rng.choice(values)
        c = rng.choice(["2", "3", "0.5", "1.5", "-1"])
        expr = rng.choice([
            f"torch.{rng.choice(_UNARY)}({v})",
            f"{v}.{rng.choice(_UNARY)}()",
            f"torch.exp(torch.tanh({v}))",
            f"{v}.tanh().exp()",
            f"{v} + {w}", f"{v} - {w}", f"{v} * {w}",
            f"{v} * {c}", f"{v} + {c}", f"{c} - {v}", f"{v} / 4.0", f"{v} ** 2",
            f"-{v}", f"{v} @ {w}", f"torch.matmul({v}, {w})", f"{v}.t()",
            f"(({v} - {w}) * {c}).sigmoid()",
        ])
        lines.append(f"    v{k} = {expr}")
        values.append(f"v{k}")
    last, other = values[-1], rng.choice(values)
    ret = rng.choice([
        last, f"{last}.sum(1)", f"torch.sum({last}, dim=0)", f"{last}.mean(dim=1)",
        f"{last}, {other}.reshape(-1)", f"torch.cat(({last}, {other}), dim=1)",
        f"{last}.reshape(1, -1) * 2", f"({last}.t() @ {other}).sum(dim=0)",
    ])
    lines.append(f"    return {ret}")
    return f"def {name}({', '.join(params)}):\n" + "\n".join(lines) + "\n", nargs


def random_function(seed: int, k: int):
    rng = random.Random(seed * 1000 + k)
    name = f"hidden_{k}"
    source, nargs = random_source(rng, name)
    namespace = {"torch": torch}
    exec(compile(source, f"<hidden function {k}>", "exec"), namespace)  # noqa: S102
    n = rng.randint(2, 6)
    return name, namespace[name], [(n, n)] * nargs, [(n + 1, n + 1)] * nargs, source


def branchy(x):
    """An ``if`` on a tensor's value: COMPARE_OP and a jump, outside the subset."""
    if x.sum() > 0:
        return x * 2
    return x - 1


def _class(cls):
    if not isinstance(cls, type):
        raise CheckFailure(f"MiniDynamo is a {type(cls).__name__}; define it as a class "
                           "(MiniDynamo(fn) makes the callable object).")
    return cls


@check(EXERCISE)
def given_functions(cls, ctx):
    """traces the given functions: eager's values, one graph, guards on shape and dtype"""
    g = ctx.generator()
    for name, (fn, shapes, new_shapes) in programs.TRACED.items():
        _verify(_class(cls), f"programs.{name}", fn, shapes, new_shapes, g)


@check(EXERCISE)
def unsupported_opcode(cls, ctx):
    """an opcode outside the subset (an if) raises instead of being skipped"""
    watch = _Watch("branchy", branchy.__code__)
    x = torch.randn(3, 4, generator=ctx.generator())
    try:
        with watch():
            _class(cls)(branchy)(x)
    except CheckFailure:
        raise
    except NotImplementedError as exc:
        if exc.args == (EXERCISE,):
            raise
    except Exception:  # noqa: BLE001  (any exception will do; it must not go on silently)
        return
    raise CheckFailure(
        "MiniDynamo(branchy)(x), where branchy has `if x.sum() > 0:`, returned without "
        "raising: an opcode outside the subset (COMPARE_OP, a jump) must raise "
        "TypeError(f'unsupported opcode {name}'), never be skipped.")


@check(EXERCISE, hidden=True)
def random_functions(cls, ctx):
    """traces seeded random straight-line functions: values, graphs and guards"""
    g = ctx.generator()
    for k in range(6):
        name, fn, shapes, new_shapes, source = random_function(ctx.seed, k)
        try:
            _verify(_class(cls), name, fn, shapes, new_shapes, g)
        except (CheckFailure, AssertionError) as exc:
            raise CheckFailure(f"{exc}\nThe function ({name}):\n{source}") from None
