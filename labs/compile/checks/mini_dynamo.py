"""Checks of ``compile.mini-dynamo``: ``MiniDynamo(fn)`` traces ``fn``'s bytecode into FX graphs
and caches them under a guard (each input's shape and dtype). The probe
:func:`labs.compile.probes.traced` builds ``MiniDynamo(fn)`` in the kernel, calls it on the
judge's inputs in order and reports each output, how many graphs ``.graphs`` holds after each
call, what ``graphs[-1]`` is (an ``fx.GraphModule``, its placeholders, its output on new inputs)
and what a watch saw (a ``sys.setprofile`` hook for a frame of ``fn.__code__``: no eager call,
no ``torch.fx.symbolic_trace``; ``torch._dynamo.utils.counters["frames"]``: Dynamo did not
run). Oracle, in the judge: ``fn`` itself, run eagerly (outputs compared with rtol 1e-5, atol
1e-6), and the graph count the guard rules imply. Checked on the functions of
``programs.TRACED`` and on seeded random straight-line functions (source text exec'd on both
sides: torch functions, tensor methods, keywords, constants, binary ops, 1-3 tensor inputs):
outputs equal eager; ``graphs[-1]`` is a ``torch.fx.GraphModule`` with one placeholder per input
that, run on new inputs, equals eager; the same shapes again add no graph, a new shape or dtype
adds exactly one, an earlier shape none, a new dtype of the last input alone one more (where eager
accepts the mix: ``programs.sin_plus`` does); and a function with an ``if`` must raise
(:func:`labs.compile.probes.unsupported`)."""

from __future__ import annotations

import random

import torch

from grader.checks import AnswerRaised, CheckFailure, check
from labs.compile import probes, programs

EXERCISE = "compile.mini-dynamo"
RTOL, ATOL = 1e-5, 1e-6


def _watched(name: str, seen: dict) -> None:
    """What the probe's watch saw: fn's code ran, or Dynamo compiled a frame."""
    if seen.get("ran"):
        raise CheckFailure(
            f"{name}'s code ran (a frame of {name}.__code__ was called): MiniDynamo "
            "must read fn's bytecode with dis.get_instructions and never call fn, not even "
            "with proxies as torch.fx.symbolic_trace does.")
    if seen.get("dynamo"):
        raise CheckFailure(
            f"torch._dynamo compiled a frame while MiniDynamo ran {name}: build the "
            "graph yourself from the bytecode, without torch.compile or torch._dynamo.")


def _flat(value, what: str) -> list[torch.Tensor]:
    items = list(value) if type(value) is tuple else [value]
    for i, v in enumerate(items):
        if type(v) is not torch.Tensor:
            at = f"item {i} of {what}" if type(value) is tuple else what
            raise CheckFailure(f"{at} has type {type(v).__name__}, not a Tensor.")
    return items


def _same(seen: dict, want, what: str, where: str) -> None:
    """The output a probe reported (``returned``) has ``want``'s structure and values."""
    if seen["unplain"]:
        raise CheckFailure(f"{what} {where} returned a {seen['type']}; fn returns tensors.")
    got = seen["value"]
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


def _verify(cls, name: str, spec: list, fn, shapes, new_shapes, g) -> None:
    """Trace, compare, and walk the guard rules for ``fn`` (first ``shapes``, then
    ``new_shapes``), asked of the kernel in one probe."""
    first = _inputs(shapes, g)
    fresh = _inputs(shapes, g)
    steps = [(first, 1, "the first call"),
             (_inputs(shapes, g), 0, "the same shapes and dtype again, new values"),
             (_inputs(new_shapes, g), 1, "new shapes"),
             (_inputs(shapes, g), 0, "the first shapes again"),
             (_inputs(shapes, g, torch.float64), 1, "the first shapes in float64")]
    if len(shapes) > 1:  # (a guard on every input, not only the first: where eager mixes them)
        mixed = _inputs(shapes, g)
        mixed[-1] = mixed[-1].double()
        try:
            fn(*mixed)
        except RuntimeError:  # (e.g. a matmul of float32 by float64)
            pass
        else:
            steps.append((mixed, 1, "the first shapes, only the last input in float64"))
    seen = cls.probe(probes.traced, spec, [args for args, _, _ in steps], fresh)
    _class(seen)
    built = seen["built"]
    _watched(name, built)
    if "raised" in built:
        raise AnswerRaised(built["raised"])
    reply = seen["steps"]
    stopped = (type(reply) is list and reply and type(reply[-1]) is dict
               and "raised" in reply[-1])
    if type(reply) is not list or (len(reply) != len(steps) and not stopped):
        n = len(reply) if type(reply) is list else type(reply).__name__
        raise CheckFailure(f"what came back from your answer covers {n} of the "
                           f"{len(steps)} calls the check asked about: the grader's probe did "
                           "not run as shipped (answers must not modify the grader).")
    expected = 0
    for k, ((args, adds, why), step) in enumerate(zip(steps, reply)):
        _watched(name, step)
        if "raised" in step:
            raise AnswerRaised(step["raised"])
        graphs = step["graphs"]
        if not graphs["list"]:
            raise CheckFailure(f"MiniDynamo({name}).graphs has type {graphs['type']}, not a "
                               "list.")
        expected += adds
        where = f"on ({_describe(args)})"
        if graphs["len"] != expected:
            raise CheckFailure(
                f"after calling MiniDynamo({name}) {where} ({why}), .graphs holds "
                f"{graphs['len']} graph(s); {expected} expected. "
                + ("A guard miss (a new shape or dtype of any input) must trace once more."
                   if graphs["len"] < expected else
                   "A guard hit (every input's shape and dtype as in an earlier call) must "
                   "reuse the cached graph, not trace again."))
        _same(step["output"], fn(*args), f"MiniDynamo({name})", where)
        if k == 0:
            _last(name, seen["last"], fn, shapes, fresh)


def _last(name: str, last, fn, shapes, fresh) -> None:
    """``graphs[-1]`` after the first call, as the probe saw it."""
    if type(last) is not dict:
        raise CheckFailure(f"MiniDynamo({name}): the probe saw no graphs[-1] after the first "
                           "call (answers must not modify the grader).")
    if not last["module"]:  # (each GraphModule has a class of its own)
        raise CheckFailure(f"MiniDynamo({name}).graphs[-1] is a {last['type']}; append "
                           "the torch.fx.GraphModule you traced.")
    if last["placeholders"] != len(shapes):
        raise CheckFailure(
            f"MiniDynamo({name}).graphs[-1] has {last['placeholders']} placeholder(s); {name} "
            f"takes {len(shapes)} input(s): one placeholder per argument, in order.")
    if "raised" in last:
        raise AnswerRaised(last["raised"])
    _same(last["output"], fn(*fresh), f"MiniDynamo({name}).graphs[-1]",
          f"called on new inputs ({_describe(fresh)})")


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
    """(name, spec, shapes, new shapes, source) of seeded random function ``k``."""
    rng = random.Random(seed * 1000 + k)
    name = f"hidden_{k}"
    source, nargs = random_source(rng, name)
    n = rng.randint(2, 6)
    return name, ["source", source, name], [(n, n)] * nargs, [(n + 1, n + 1)] * nargs, source


def _class(seen: dict) -> None:
    if not seen["class"]:
        raise CheckFailure(f"MiniDynamo is a {seen['type']}; define it as a class "
                           "(MiniDynamo(fn) makes the callable object).")


@check(EXERCISE)
def given_functions(cls, ctx):
    """traces the given functions: eager's values, one graph, guards on shape and dtype"""
    g = ctx.generator()
    for name, (fn, shapes, new_shapes) in programs.TRACED.items():
        _verify(cls, f"programs.{name}", ["program", name], fn, shapes, new_shapes, g)


@check(EXERCISE)
def unsupported_opcode(cls, ctx):
    """an opcode outside the subset (an if) raises instead of being skipped"""
    x = torch.randn(3, 4, generator=ctx.generator())
    seen = cls.probe(probes.unsupported, x)
    _class(seen)
    _watched("branchy", seen)
    r = seen["raised"]
    if r is not None:
        if r.get("ename") == "NotImplementedError" and r.get("evalue") == EXERCISE:
            raise AnswerRaised(r)
        return  # (any exception will do; it must not go on silently)
    raise CheckFailure(
        "MiniDynamo(branchy)(x), where branchy has `if x.sum() > 0:`, returned without "
        "raising: an opcode outside the subset (COMPARE_OP, a jump) must raise "
        "TypeError(f'unsupported opcode {name}'), never be skipped.")


@check(EXERCISE, hidden=True)
def random_functions(cls, ctx):
    """traces seeded random straight-line functions: values, graphs and guards"""
    g = ctx.generator()
    for k in range(6):
        name, spec, shapes, new_shapes, source = random_function(ctx.seed, k)
        fn = probes.traced_function(spec)
        try:
            _verify(cls, name, spec, fn, shapes, new_shapes, g)
        except (CheckFailure, AssertionError) as exc:
            raise CheckFailure(f"{exc}\nThe function ({name}):\n{source}") from None
