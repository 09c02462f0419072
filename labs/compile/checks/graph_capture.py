"""Checks of ``compile.graph-capture``: ``GraphRecorder``, a Dynamo backend that records every FX
graph it is handed.

Each check compiles a function with ``torch.compile(fn, backend=GraphRecorder())``, calls it once
and compares what the recorder kept with what ``torch._dynamo.explain(fn)(*args)`` (the oracle:
Dynamo's own record of the same compile) reports: the number of graphs, each graph's
``call_function`` / ``call_method`` targets in order, and the shapes of each graph's example
inputs (the ``example_value`` of its placeholders). The compiled function's output must equal
eager. Public: the functions of ``programs.BREAKING`` and a function without breaks; hidden:
seeded random straight-line functions of one or two tensors with graph breaks
(``torch._dynamo.graph_break()``, ``Tensor.item()``) at random places.
"""

from __future__ import annotations

import contextlib
import io

import torch
import torch._dynamo
from torch import fx

from grader.checks import CheckFailure, check, exact, learner_line
from labs.compile import programs
from labs.compile.checks._harness import fresh_compiler

EXERCISE = "compile.graph-capture"


def _calls(gm: fx.GraphModule) -> list[str]:
    """The graph's call_function / call_method targets, in order, as names."""
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
            if n.op in ("call_function", "call_method")]


def _placeholder_shapes(gm: fx.GraphModule) -> list:
    """The shapes (tuples) of the graph's placeholders' example values; None for non-tensors."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("example_value")
            out.append(tuple(v.shape) if isinstance(v, torch.Tensor) else None)
    return out


def _shape(v):
    """A tensor's shape (a tuple); for anything else, what it is, in words."""
    return tuple(v.shape) if isinstance(v, torch.Tensor) else f"a {type(v).__name__}, not a tensor"


def _run_compiled(compiled, args, label: str):
    """Call the compiled function; turn Dynamo's wrapping of a backend failure into a message
    (the learner's own exception comes back unwrapped, so its line is reported)."""
    try:
        return compiled(*args)
    except torch._dynamo.exc.BackendCompilerFailed as exc:
        inner = exc.inner_exception
        if isinstance(inner, AssertionError) and "did not return callable" in str(inner):
            raise CheckFailure(f"on {label}, your backend returned something Dynamo cannot "
                               "call: return a callable that runs the graph (gm.forward, or gm "
                               "itself).") from None
        raise inner from None
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001  (reported with the learner's line)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise CheckFailure(f"on {label}, calling the compiled function raised "
                           f"{type(exc).__name__}: {first}{learner_line(exc)}. The callable your "
                           "backend returns must run the graph on the inputs it is given and "
                           "return what the graph returns (gm.forward does).") from None


def verify(GraphRecorder, fn, args: tuple, label: str) -> None:
    """Compile ``fn`` with a fresh recorder, call it once on ``args``, and compare the recorder's
    graphs and example inputs with Dynamo's explain of the same call."""
    if not isinstance(GraphRecorder, type):
        raise CheckFailure(f"GraphRecorder is a {type(GraphRecorder).__name__}; define a class "
                           "whose instances are backends (its __call__ takes gm and "
                           "example_inputs).")
    quiet = io.StringIO()  # (programs.logged prints)
    with fresh_compiler(), contextlib.redirect_stdout(quiet):
        want = fn(*args)
        explained = torch._dynamo.explain(fn)(*args)
        torch._dynamo.reset()
        other = GraphRecorder()  # must not see this function's graphs
        recorder = GraphRecorder()
        for name in ("graphs", "example_inputs"):
            if not hasattr(recorder, name):
                raise CheckFailure(f"a new GraphRecorder has no attribute `{name}`: set "
                                   f"self.{name} = [] in __init__.")
            exact(getattr(recorder, name), list, f"a new recorder's `{name}`")
            if getattr(recorder, name):
                raise CheckFailure(f"a new GraphRecorder's `{name}` is not empty: start each "
                                   "recorder with empty lists.")
        got = _run_compiled(torch.compile(fn, backend=recorder), args, label)
    try:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    except (AssertionError, TypeError) as exc:
        raise CheckFailure(f"on {label}, the compiled function's output differs from eager "
                           f"({str(exc).splitlines()[0]}): the callable your backend returns "
                           "must run the graph unchanged (return gm.forward).") from None
    graphs, inputs = recorder.graphs, recorder.example_inputs
    exact(graphs, list, "recorder.graphs")
    exact(inputs, list, "recorder.example_inputs")
    if other.graphs or other.example_inputs:
        raise CheckFailure("a second GraphRecorder, never used as a backend, holds graphs too: "
                           "the lists are shared by all recorders. Create them in __init__ "
                           "(self.graphs = []), not in the class body.")
    for i, gm in enumerate(graphs):
        if not isinstance(gm, fx.GraphModule):
            raise CheckFailure(f"on {label}, recorder.graphs[{i}] is a {type(gm).__name__}, not "
                               "an fx.GraphModule: append the GraphModule your backend is "
                               "given (gm), not a part of it.")
    n = explained.graph_count
    breaks = explained.graph_break_count
    if len(graphs) != n:
        raise CheckFailure(
            f"on {label}, your recorder kept {len(graphs)} graph(s); Dynamo captured {n} "
            f"({breaks} graph break(s)). Append every graph your backend is called with, one per "
            "call, in the order of the calls.")
    if len(inputs) != n:
        raise CheckFailure(f"on {label}, recorder.example_inputs has {len(inputs)} entries for "
                           f"{n} graphs: append each graph's example_inputs (the whole list).")
    for i, (gm, theirs, ex) in enumerate(zip(graphs, explained.graphs, inputs)):
        if _calls(gm) != _calls(theirs):
            raise CheckFailure(
                f"on {label}, graph {i} calls {_calls(gm)}, but Dynamo's graph {i} calls "
                f"{_calls(theirs)}: keep the graphs in the order your backend receives them.")
        if not isinstance(ex, (list, tuple)):
            raise CheckFailure(f"on {label}, recorder.example_inputs[{i}] is a "
                               f"{type(ex).__name__}: append the list of example inputs your "
                               "backend is given.")
        shapes, expected = [_shape(v) for v in ex], _placeholder_shapes(theirs)
        # (a placeholder that is not a tensor, e.g. a SymInt, is compared by position only)
        shapes = [s if e is not None else None for s, e in zip(shapes, expected)] + shapes[
            len(expected):]
        if shapes != expected:
            raise CheckFailure(
                f"on {label}, the example inputs kept for graph {i} have shapes {shapes}; the "
                f"graph's inputs have shapes {expected}: append the example_inputs passed "
                "with that graph.")


def _no_break(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A function without graph breaks: one graph."""
    return torch.relu(x @ w).sum(1) + 1


@check(EXERCISE)
def breaking_programs(GraphRecorder, ctx):
    """records explain's graphs for exercise 2's programs and a function without breaks"""
    g = torch.Generator().manual_seed(0)
    verify(GraphRecorder, _no_break, (torch.randn(4, 3, generator=g),
                                      torch.randn(3, 5, generator=g)), "a function without breaks")
    x = torch.randn(5, 3, generator=g)
    for name, fn in programs.BREAKING.items():
        verify(GraphRecorder, fn, (x,), f"programs.{name}")


# ------------------------------------------------------------------ hidden: random functions
_UNARY = ("t.sin()", "torch.cos(t)", "t.relu()", "torch.tanh(t)", "t.sigmoid()", "t * 2.5",
          "t - 1", "t.abs()", "t.neg()")
_BINARY = ("t + y", "t * y", "t - y", "torch.maximum(t, y)")
_BREAKS = ("torch._dynamo.graph_break()",
           "s = t.abs().max().item()\n    t = t / (s + 1.0)")


def random_function(g):
    """A seeded random straight-line function of x (and y) with 1-3 graph breaks; returns
    (function, args)."""

    def pick(seq):
        return seq[int(torch.randint(0, len(seq), (1,), generator=g))]

    two = bool(torch.randint(0, 2, (1,), generator=g))
    ops = [f"t = {pick(_BINARY if two and float(torch.rand((), generator=g)) < 0.4 else _UNARY)}"
           for _ in range(int(torch.randint(3, 8, (1,), generator=g)))]
    for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
        ops.insert(int(torch.randint(0, len(ops) + 1, (1,), generator=g)), pick(_BREAKS))
    lines = ["t = x + y" if two else "t = x.cos()", *ops, "return t"]
    src = f"def fn({'x, y' if two else 'x'}):\n    " + "\n    ".join(lines) + "\n"
    namespace = {"torch": torch}
    exec(compile(src, "<a function of the checks>", "exec"), namespace)  # noqa: S102
    n, d = (int(torch.randint(1, 7, (1,), generator=g)) for _ in range(2))
    args = tuple(torch.randn(n, d, generator=g) for _ in range(2 if two else 1))
    return namespace["fn"], args


@check(EXERCISE, hidden=True)
def random_functions(GraphRecorder, ctx):
    """records explain's graphs for seeded random functions with graph breaks"""
    g = ctx.generator()
    for k in range(4):
        fn, args = random_function(g)
        shape = tuple(args[0].shape)
        verify(GraphRecorder, fn, args, f"random function {k + 1} (inputs of shape {shape})")
