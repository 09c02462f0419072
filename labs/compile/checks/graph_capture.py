"""Checks of ``compile.graph-capture``: ``GraphRecorder``, a Dynamo backend that records every FX
graph it is handed.

For each case the probe :func:`labs.compile.probes.recorded` compiles a function with
``torch.compile(fn, backend=GraphRecorder())`` in the kernel, calls it once and reports what the
recorder kept (each graph's ``call_function`` / ``call_method`` targets, the shapes of its
example inputs) and what the compiled function returned. The judge runs the same function here:
``torch._dynamo.explain(fn)(*args)`` (the oracle: Dynamo's own record of the same compile) gives
the number of graphs, each graph's targets in order and the shapes of each graph's example
inputs (the ``example_value`` of its placeholders), and eager ``fn`` the output the compiled
function must return. Public: the functions of ``programs.BREAKING`` and a function without
breaks; hidden: seeded random straight-line functions of one or two tensors with graph breaks
(``torch._dynamo.graph_break()``, ``Tensor.item()``) at random places, and a function whose
breaks cut it into identical graphs (:func:`repeated_function`: a recorder that drops a graph
equal to one it kept fails).
"""

from __future__ import annotations

import torch
import torch._dynamo

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.compile import probes, programs

EXERCISE = "compile.graph-capture"


def _placeholder_shapes(gm) -> list:
    """The shapes (tuples) of the graph's placeholders' example values; None for non-tensors."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("example_value")
            out.append(tuple(v.shape) if isinstance(v, torch.Tensor) else None)
    return out


def _shape(v):
    """A shape the probe reported (a list) as a tuple; a type's name, in words."""
    return tuple(v) if type(v) is list else f"a {v}, not a tensor"


def oracle(spec: list, args: tuple):
    """(eager output, Dynamo's explain) of the case's function on ``args``, here."""
    fn = probes.capture_function(spec)
    with probes.fresh_compiler(), probes._quiet():
        want = fn(*args)
        explained = torch._dynamo.explain(fn)(*args)
    return want, explained


def _fresh(state: dict) -> None:
    for name in ("graphs", "example_inputs"):
        s = state[name]
        if not s["present"]:
            raise CheckFailure(f"a new GraphRecorder has no attribute `{name}`: set "
                               f"self.{name} = [] in __init__.")
        if not s["list"]:
            raise CheckFailure(f"a new recorder's `{name}` has type {s['type']}, not a list.")
        if s["len"]:
            raise CheckFailure(f"a new GraphRecorder's `{name}` is not empty: start each "
                               "recorder with empty lists.")


def judge(seen: dict, want, explained, label: str) -> None:
    """Compare what the probe saw of one case with eager ``want`` and Dynamo's ``explained``."""
    if "raised" in seen:
        raise AnswerRaised(seen["raised"])
    if "not_callable" in seen:
        raise CheckFailure(f"on {label}, your backend returned something Dynamo cannot "
                           "call: return a callable that runs the graph (gm.forward, or gm "
                           "itself).")
    if "call_failed" in seen:
        r = seen["call_failed"]
        raise CheckFailure(f"on {label}, calling the compiled function raised "
                           f"{r['ename']}: {r['first']}{r['where']}. The callable your "
                           "backend returns must run the graph on the inputs it is given and "
                           "return what the graph returns (gm.forward does).")
    _fresh(seen["fresh"])
    got = seen["output"]
    try:
        if got["unplain"]:
            raise TypeError(f"it returned a {got['type']}")
        torch.testing.assert_close(got["value"], want, rtol=1e-5, atol=1e-6)
    except (AssertionError, TypeError) as exc:
        raise CheckFailure(f"on {label}, the compiled function's output differs from eager "
                           f"({str(exc).splitlines()[0]}): the callable your backend returns "
                           "must run the graph unchanged (return gm.forward).") from None
    graphs, inputs = seen["graphs"], seen["inputs"]
    if graphs is None or inputs is None:
        which = "graphs" if graphs is None else "example_inputs"
        raise CheckFailure(f"after compiling {label}, recorder.{which} is no longer a list: "
                           "append to the lists, do not replace them.")
    if any(n for n in seen["other"]):
        raise CheckFailure("a second GraphRecorder, never used as a backend, holds graphs too: "
                           "the lists are shared by all recorders. Create them in __init__ "
                           "(self.graphs = []), not in the class body.")
    for i, gm in enumerate(graphs):
        if not gm["module"]:
            raise CheckFailure(f"on {label}, recorder.graphs[{i}] is a {gm['type']}, not "
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
        calls, want_calls = gm["calls"], probes.call_names(theirs)
        if calls != want_calls:
            raise CheckFailure(
                f"on {label}, graph {i} calls {calls}, but Dynamo's graph {i} calls "
                f"{want_calls}: keep the graphs in the order your backend receives them.")
        if type(ex) is not list:
            raise CheckFailure(f"on {label}, recorder.example_inputs[{i}] is a "
                               f"{ex.get('type', type(ex).__name__)}: append the list of "
                               "example inputs your backend is given.")
        shapes, expected = [_shape(v) for v in ex], _placeholder_shapes(theirs)
        # (a placeholder that is not a tensor, e.g. a SymInt, is compared by position only)
        shapes = [s if e is not None else None for s, e in zip(shapes, expected)] + shapes[
            len(expected):]
        if shapes != expected:
            raise CheckFailure(
                f"on {label}, the example inputs kept for graph {i} have shapes {shapes}; the "
                f"graph's inputs have shapes {expected}: append the example_inputs passed "
                "with that graph.")


def verify(GraphRecorder, cases: list[tuple]) -> None:
    """``cases``: (spec, args, label). One probe for them all; each compared in order."""
    seen = GraphRecorder.probe(probes.recorded, [[spec, list(args)] for spec, args, _ in cases])
    if not seen["class"]:
        raise CheckFailure(f"GraphRecorder is a {seen['type']}; define a class whose instances "
                           "are backends (its __call__ takes gm and example_inputs).")
    for (spec, args, label), got in paired(cases, seen["cases"], "functions"):
        want, explained = oracle(spec, args)
        judge(got, want, explained, label)


@check(EXERCISE)
def breaking_programs(GraphRecorder, ctx):
    """records explain's graphs for exercise 2's programs and a function without breaks"""
    g = torch.Generator().manual_seed(0)
    cases = [(["no_break"], (torch.randn(4, 3, generator=g), torch.randn(3, 5, generator=g)),
              "a function without breaks")]
    x = torch.randn(5, 3, generator=g)
    cases += [(["program", name], (x,), f"programs.{name}") for name in programs.BREAKING]
    verify(GraphRecorder, cases)


# ------------------------------------------------------------------ hidden: random functions
_UNARY = ("t.sin()", "torch.cos(t)", "t.relu()", "torch.tanh(t)", "t.sigmoid()", "t * 2.5",
          "t - 1", "t.abs()", "t.neg()")
_BINARY = ("t + y", "t * y", "t - y", "torch.maximum(t, y)")
_BREAKS = ("torch._dynamo.graph_break()",
           "s = t.abs().max().item()\n    t = t / (s + 1.0)")


def random_function(g):
    """A seeded random straight-line function of x (and y) with 1-3 graph breaks; returns
    (source, args)."""

    def pick(seq):
        return seq[int(torch.randint(0, len(seq), (1,), generator=g))]

    two = bool(torch.randint(0, 2, (1,), generator=g))
    ops = [f"t = {pick(_BINARY if two and float(torch.rand((), generator=g)) < 0.4 else _UNARY)}"
           for _ in range(int(torch.randint(3, 8, (1,), generator=g)))]
    for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
        ops.insert(int(torch.randint(0, len(ops) + 1, (1,), generator=g)), pick(_BREAKS))
    lines = ["t = x + y" if two else "t = x.cos()", *ops, "return t"]
    src = f"def fn({'x, y' if two else 'x'}):\n    " + "\n    ".join(lines) + "\n"
    n, d = (int(torch.randint(1, 7, (1,), generator=g)) for _ in range(2))
    args = tuple(torch.randn(n, d, generator=g) for _ in range(2 if two else 1))
    return src, args


def repeated_function(g):
    """A seeded function whose graph breaks cut it into 2-4 identical graphs (one op, on inputs
    of one shape): each is handed to the backend, and each must be kept. Returns (source,
    args)."""
    op = _UNARY[int(torch.randint(0, len(_UNARY), (1,), generator=g))]
    body = "\n    torch._dynamo.graph_break()\n    ".join(
        [f"t = {op}"] * int(torch.randint(2, 5, (1,), generator=g)))
    src = f"def fn(t):\n    {body}\n    return t\n"  # (t: each graph's input has one name)
    n, d = (int(torch.randint(1, 7, (1,), generator=g)) for _ in range(2))
    return src, (torch.randn(n, d, generator=g),)


@check(EXERCISE, hidden=True)
def random_functions(GraphRecorder, ctx):
    """records explain's graphs for seeded random functions with graph breaks, one of them cut
    into identical graphs"""
    g = ctx.generator()
    src, args = repeated_function(g)
    cases = [(["source", src], args, "a function cut into identical graphs "
                                     f"(input of shape {tuple(args[0].shape)})")]
    for k in range(4):
        src, args = random_function(g)
        shape = tuple(args[0].shape)
        cases.append((["source", src], args, f"random function {k + 1} (inputs of shape {shape})"))
    verify(GraphRecorder, cases)
