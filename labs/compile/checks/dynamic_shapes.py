"""Checks of ``compile.dynamic-shapes``: ``dynamic_shapes = {"shape_guards": ...,
"checked": ...}``.

``shape_guards(fn, example_args, dynamic_dims) -> accepts``: ``accepts(*new_args)`` is True
exactly when the shape guards of the graph Dynamo compiles for ``fn(*example_args)`` (the dims
``dynamic_dims[i]`` of argument ``i`` marked with ``torch._dynamo.maybe_mark_dynamic``, every
other dim static) pass on ``new_args`` (contiguous tensors of the examples' dtypes and number of
dims), predicted without compiling or exporting. The probe
:func:`labs.compile.probes.guard_predictions` calls both in the kernel and reports the answers;
Dynamo compiling a frame or ``torch.export`` tracing meanwhile fails (the exercise's ``models``,
seen whatever Dynamo's counters say). The oracle,
here: the frame itself, compiled with the ``eager`` backend on the marked examples, and its
cache entry's ``guard_manager.check`` on each ``new_args`` (the frame's locals by parameter
name); a wrong answer is told the guard that fails (the first part of ``check_verbose``'s that
is false). (torch/fx/experimental/symbolic_shapes.py: ShapeEnv.evaluate_expr,
ShapeEnv.produce_guards; torch/_dynamo/guards.py: GuardBuilder.SHAPE_ENV.) Public:
``programs.SHAPE_CASES``; hidden: the boundaries a plausible model misses (:func:`boundary_cases`)
and seeded functions of a small family (broadcasts, matmuls, views, ``if`` and ``%`` on a size,
a slice, a concatenation, a Python loop, a floor division, a flatten: :func:`random_case`) with
seeded examples, marked dims and new shapes.

``checked``: a dict, for each function of ``programs.UNBACKED`` (a size or value that comes
from data: an unbacked symbol, on which export cannot branch), a version that exports
(``torch.export.export``, non-strict, the first input's rows ``Dim.AUTO``: the probe
:func:`labs.compile.probes.exported_checks`) and whose program returns what the original returns
eagerly on inputs that keep the function's promise and raises on inputs that break it (the
runtime assertions ``torch._check`` leaves in the graph). Public: fixed shapes, values of ``k``
and data; hidden: seeded ones.
"""

from __future__ import annotations

import inspect
import random

import torch
import torch._dynamo
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from grader.checks import CheckFailure, check, paired
from labs.compile import probes, programs

EXERCISE = "compile.dynamic-shapes"
RTOL, ATOL = 1e-5, 1e-6


def _parts(shape: dict) -> None:
    """The answer is a dict with both keys (as the probe saw it)."""
    if not shape["dict"]:
        raise CheckFailure(f"dynamic_shapes has type {shape['type']}, not a dict.")
    missing = [k for k in probes.DYNAMIC_KEYS if k not in shape["keys"]]
    if missing:
        raise CheckFailure(f"dynamic_shapes has no {', '.join(map(repr, missing))}: it is a dict "
                           "with the keys 'shape_guards' and 'checked'.")


# ------------------------------------------------------------------ shape_guards
def _shapes(args) -> str:
    return ", ".join(f"{name} {tuple(a.shape)}" for name, a in args)


def _case(fn, example: list, dims: list) -> str:
    names = list(inspect.signature(fn).parameters)
    marked = [f"{n} dim{'s' if len(d) > 1 else ''} {', '.join(map(str, d))}"
              for n, d in zip(names, dims) if d]
    return (f"{fn.__name__}({', '.join(names)}) traced on {_shapes(zip(names, example))} with "
            f"{' and '.join(marked) or 'no dim'} marked dynamic")


def _failing(parts: list[str], f_locals: dict) -> str:
    """The first guard of ``parts`` (``check_verbose``'s, with their comments) that is false on
    ``f_locals``; the first part when none can be evaluated here (a TENSOR_MATCH message)."""
    code = [p.split("  #")[0].strip() for p in parts]
    for c in code:
        try:
            if not eval(c, {}, {"L": f_locals}):  # (torch's guard text, judged here)
                return c
        except Exception:  # noqa: BLE001,S112  (not an expression: a TENSOR_MATCH message)
            continue
    return code[0] if code else ""


def truth(fn, example: list, dims: list, news: list) -> list[tuple[bool, str]]:
    """For each new argument list: (whether the guards of the frame Dynamo compiles for
    ``fn(*example)``, with ``dims`` marked ``maybe_mark_dynamic``, pass on it, the guard that
    fails or '')."""
    names = list(inspect.signature(fn).parameters)
    with probes.fresh_compiler():
        args = [t.clone() for t in example]
        for t, ds in zip(args, dims):
            for d in ds:
                torch._dynamo.maybe_mark_dynamic(t, d)
        torch.compile(fn, backend="eager", fullgraph=True)(*args)
        (entry,) = _debug_get_cache_entry_list(fn.__code__)
        out = []
        for new in news:
            f_locals = dict(zip(names, new))
            info = entry.guard_manager.check_verbose(f_locals)
            out.append((bool(info.result), "" if info.result
                        else _failing(list(info.verbose_code_parts), f_locals)))
        return out


def verify_guards(answer, cases: list[tuple]) -> None:
    """``cases``: (spec, fn, example, dims, news, source or None); the learner's accepts agrees
    with the frame's guards on each new argument list, computed without compiling."""
    seen = answer.probe(probes.guard_predictions,
                        [[spec, example, dims, news] for spec, _, example, dims, news, _ in cases])
    _parts(seen["shape"])
    if not seen["callable"]:
        raise CheckFailure(f"dynamic_shapes['shape_guards'] is a {seen['type']}; it is a "
                           "function shape_guards(fn, example_args, dynamic_dims) -> accepts.")
    for (_, fn, example, dims, news, source), got in paired(cases, seen["cases"], "cases"):
        case = _case(fn, example, dims)
        if not got["callable"]:
            raise CheckFailure(f"for {case}, shape_guards returned a {got['type']}; it returns "
                               "a function accepts(*new_args) -> bool.")
        if len(got["answers"]) != len(news):
            raise CheckFailure(f"what came back covers {len(got['answers'])} of the "
                               f"{len(news)} argument lists the check asked about: the "
                               "grader's probe did not run as shipped.")
        names = list(inspect.signature(fn).parameters)
        for new, answer_seen, (passes, failing) in zip(news, got["answers"],
                                                       truth(fn, example, dims, news)):
            said = answer_seen["value"]
            if type(said) is not bool:
                raise CheckFailure(f"for {case}, accepts returned a value of type "
                                   f"{answer_seen['type']}, not a bool.")
            if said == passes:
                continue
            at = f"for {case}, on new arguments {_shapes(zip(names, new))}"
            shown = f"\nThe function:\n{source}" if source else ""
            if said:
                raise CheckFailure(
                    f"{at} you said True, but Dynamo's guards refuse them: `{failing}`. A "
                    "frame's shape guards are every question tracing the example asked about a "
                    "size (a broadcast, a view, a Python if or loop on a size: "
                    "ShapeEnv.evaluate_expr answers it from the example and records a guard), "
                    "each symbol's range (sizes 0 and 1 are specialized) and each static "
                    f"size.{shown}")
            raise CheckFailure(
                f"{at} you said False, but all of Dynamo's guards pass on them. A guard exists "
                "only where tracing the example asked about a size; a marked dim is a symbol of "
                "its own (equal example sizes are not assumed equal); sizes that run eagerly "
                f"are not necessarily refused, nor accepted.{shown}")


def _tensors(shapes, g) -> list[torch.Tensor]:
    return [torch.randn(*s, generator=g) for s in shapes]


def _program_case(fn, shapes, dims, new_shapes, g) -> tuple:
    return (["program", fn.__name__], fn, _tensors(shapes, g), dims,
            [_tensors(new, g) for new in new_shapes], None)


@check(EXERCISE)
def given_shape_cases(dynamic_shapes, ctx):
    """shape_guards agrees with the guards of the frames compiled for programs.SHAPE_CASES"""
    g = ctx.generator()
    verify_guards(dynamic_shapes, [_program_case(*case, g) for case in programs.SHAPE_CASES])


def boundary_cases(g) -> list[tuple]:
    """Where a plausible model and the guards disagree: a matmul of a square example with only
    ``x`` marked (each marked dim has a symbol of its own: no duck sizing, and the inner dim is
    specialized by the static ``w``), an example size of 1 in a marked dim (specialized), new
    sizes 0 and 1, a static dim changed, a Python loop (specializes), a view whose example took
    the path where the view keeps dim 0."""
    return [_program_case(*case, g) for case in [
        (programs.project, [(3, 3), (3, 2)], [[0, 1], []],
         [[(5, 3), (3, 2)], [(5, 5), (3, 2)], [(3, 4), (4, 2)]]),
        (programs.scaled_add, [(1, 3), (5, 3)], [[0, 1], [0, 1]],
         [[(1, 4), (6, 4)], [(2, 4), (6, 4)], [(1, 3), (1, 3)], [(1, 0), (6, 0)]]),
        (programs.scaled_add, [(3, 3), (3,)], [[0], [0]],
         [[(0, 3), (3,)], [(7, 3), (3,)], [(7, 3), (4,)], [(7, 4), (4,)]]),
        (programs.row_loop, [(3, 2)], [[0]], [[(3, 2)], [(4, 2)], [(3, 5)]]),
        (programs.pairs, [(2, 4)], [[0, 1]], [[(2, 6)], [(4, 4)], [(3, 2)], [(3, 4)]]),
    ]]


@check(EXERCISE, hidden=True)
def boundaries(dynamic_shapes, ctx):
    """agrees with the guards where a plausible model does not: a square example, sizes 0 and 1,
    a static dim, a loop, a view's path"""
    verify_guards(dynamic_shapes, boundary_cases(ctx.generator()))


#: the family of hidden functions: source templates, formatted with a case's constants
FAMILY = {
    "broadcast": "def fn(x, y):\n    return x * y + 1\n",
    "matmul": "def fn(x, w):\n    return (x @ w).relu()\n",
    "view": "def fn(x):\n    return x.view(-1, {k}).sum(1)\n",
    "branch": ("def fn(x):\n    if x.shape[{d}] > {t}:\n        return x.sum(0)\n"
               "    return x.mean(0)\n"),
    "modulo": ("def fn(x):\n    if x.shape[{d}] % {m} == 0:\n        return x * 2\n"
               "    return x - 1\n"),
    "slice": "def fn(x):\n    return x[:{k}] * 2\n",
    "doubled": "def fn(x, y):\n    return torch.cat([x, x]) + y\n",
    "loop": ("def fn(x):\n    out = x[0]\n    for i in range(1, x.shape[0]):\n"
             "        out = out + x[i]\n    return out\n"),
    "half": "def fn(x):\n    return x[: x.shape[0] // 2].sum(0)\n",
    "flatten": "def fn(x, y):\n    return x.reshape(-1) + y\n",
}


def random_case(rng: random.Random, name: str, g) -> tuple:
    """(spec, fn, example, dims, news, source): the family's function ``name`` with seeded
    constants, example shapes, marked dims (a random subset of each argument's) and 12 new
    shape lists: random sizes 0 to 11 in the marked dims, the example's sizes mapped value by
    value (equal sizes stay equal), all marked sizes scaled by 2 or 3, a static dim changed."""
    n, d = rng.randint(2, 6), rng.randint(2, 6)
    k = rng.randint(2, 6)
    constants = {"k": rng.choice([2, 3, 4, 6]), "d": rng.randint(0, 1), "t": rng.randint(1, 6),
                 "m": rng.randint(2, 3)}
    shapes = {
        "broadcast": [(n, d), rng.choice([(n, d), (1, d), (d,), (n, 1)])],
        "matmul": [(n, k), (k, d)],
        "view": [(constants["k"] * rng.randint(1, 3), rng.randint(1, 3))],
        "doubled": [(n, d), (2 * n, d)],
        "flatten": [(n, d), (n * d,)],
    }.get(name, [(n, d)])
    if name == "slice":
        constants["k"] = rng.randint(1, 7)
    dims = [sorted(rng.sample(range(len(s)), rng.randint(0, len(s)))) for s in shapes]
    if not any(dims):
        dims[0] = [0]
    values = sorted({v for s in shapes for v in s})
    news = []
    for kind in range(12):
        mapped = {v: rng.randint(0, 11) for v in values}
        scale = rng.choice([2, 3])
        new = []
        for s, ds in zip(shapes, dims):
            sizes = []
            for i, v in enumerate(s):
                if kind < 5:  # random marked sizes
                    sizes.append(rng.randint(0, 11) if i in ds else v)
                elif kind < 8:  # the example's sizes mapped value by value
                    sizes.append(mapped[v] if i in ds else v)
                elif kind < 11:  # every marked size scaled
                    sizes.append(v * scale if i in ds else v)
                else:  # static sizes changed now and then
                    sizes.append(v if i in ds or rng.random() < 0.5 else v + 1)
            new.append(tuple(sizes))
        news.append(new)
    source = FAMILY[name].format(**constants)
    fn = probes.from_source(source, "fn", "<a function of the checks>")
    return (["source", source], fn, _tensors(shapes, g), dims,
            [_tensors(new, g) for new in news], source)


@check(EXERCISE, hidden=True)
def random_functions(dynamic_shapes, ctx):
    """agrees with the guards on seeded functions, examples, marked dims and new shapes"""
    rng, g = random.Random(ctx.seed), ctx.generator()
    verify_guards(dynamic_shapes, [random_case(rng, name, g) for name in FAMILY])


# ------------------------------------------------------------------ checked
def _args(name: str, args: list) -> str:
    shown = [f"x {tuple(args[0].shape)}"] + [f"n = {int(a)}" for a in args[1:]]
    if name == "positive_mean" and not bool((args[0] > 0).any()):
        shown.append("no positive entry")
    return ", ".join(shown)


def _torch_said(error: dict) -> str:
    return f"{error['ename']}: {error.get('first') or error.get('evalue', '')[:300]}"


def verify_checked(answer, cases: list[tuple]) -> None:
    """``cases``: (name, example, valid inputs, invalid inputs). ``checked[name]`` exports on
    ``example``; its program returns the original's eager values on each valid input and
    raises on each invalid one."""
    seen = answer.probe(probes.exported_checks, [[name, example, valid + invalid]
                                                 for name, example, valid, invalid in cases])
    _parts(seen["shape"])
    checked = seen["checked"]
    if not checked["dict"]:
        raise CheckFailure(f"dynamic_shapes['checked'] is a {checked['type']}; it is a dict: "
                           "name -> function, one for each of programs.UNBACKED.")
    if checked["missing"]:
        raise CheckFailure(f"dynamic_shapes['checked'] has no function for "
                           f"{', '.join(map(repr, checked['missing']))}.")
    for (name, example, valid, invalid), got in paired(cases, seen["cases"], "cases"):
        original = programs.UNBACKED[name]
        if got["export"] is not None:
            error = got["export"]
            raise CheckFailure(
                f"exporting checked[{name!r}] on {_args(name, example)} failed{error['where']}: "
                f"{_torch_said(error)}. A size or value that comes from data (.item(), a "
                "boolean mask) is an unbacked symbol (u0): it has no example value, so a Python "
                "branch on it cannot be decided. State what the promise guarantees with "
                "torch._check, one fact per call, before the line that branches.")
        runs = got["runs"]
        if len(runs) != len(valid) + len(invalid):
            raise CheckFailure(f"what came back covers {len(runs)} of the "
                               f"{len(valid) + len(invalid)} inputs the check asked about: the "
                               "grader's probe did not run as shipped.")
        for args, run in zip(valid, runs):
            at = f"checked[{name!r}] exported, on {_args(name, args)} (which keeps the promise)"
            if "error" in run:
                raise CheckFailure(
                    f"{at} raised {_torch_said(run['error'])}. A torch._check states a fact for "
                    "every input: check exactly the promise, no more (and nothing that holds "
                    "only for the example).")
            out = run["output"]
            want = original(*args)
            got_value = out["value"]
            if type(got_value) is not torch.Tensor or got_value.shape != want.shape or (
                    not torch.allclose(got_value, want, rtol=RTOL, atol=ATOL)):
                what = (f"a {out['type']}" if type(got_value) is not torch.Tensor
                        else f"shape {tuple(got_value.shape)}")
                raise CheckFailure(
                    f"{at} returned {what}, not the original's values (shape "
                    f"{tuple(want.shape)}): keep the function's computation; add only checks.")
        for args, run in zip(invalid, runs[len(valid):]):
            if "error" not in run:
                try:
                    original(*args)
                    eager = "returns"  # (never: each invalid input breaks the promise)
                except ValueError as exc:
                    eager = f"raises ValueError: {exc}"
                raise CheckFailure(
                    f"checked[{name!r}] exported, on {_args(name, args)} (which breaks the promise: "
                    f"eagerly the original {eager}), returned a value instead of refusing. A "
                    "torch._check of the promise stays in the exported graph as a runtime "
                    "assertion (aten._assert_scalar); a branch export could decide by itself, or "
                    "a dropped check, does not.")


def _unbacked_cases(rng: random.Random, g) -> list[tuple]:
    """(name, example, valid inputs, invalid inputs) for each function of programs.UNBACKED,
    seeded: rows 2 to 9 (example) and 2 to 12 (inputs), each ``k`` in or out of the promise."""
    d = rng.randint(2, 5)

    def n(k):
        return torch.tensor(k)

    def x(m):
        return torch.randn(m, d, generator=g)

    def positive(m):
        t = x(m)
        t.view(-1)[rng.randrange(m * d)] = 0.5 + abs(float(t.view(-1)[0]))
        return t

    cases = []
    m = rng.randint(2, 9)
    rows = [rng.randint(2, 12) for _ in range(3)]
    cases.append(("top_rows", [x(m), n(rng.randint(1, m))],
                  [[x(r), n(rng.randint(1, r))] for r in rows] + [[x(rows[0]), n(rows[0])],
                                                                  [x(rows[1]), n(1)]],
                  [[x(rows[0]), n(0)], [x(rows[1]), n(rows[1] + 1)], [x(rows[2]), n(-1)]]))
    cases.append(("positive_mean", [positive(m)], [[positive(r)] for r in rows],
                  [[-x(rows[0]).abs() - 0.1], [-x(2).abs()]]))
    k = rng.randint(1, 4)
    groups = [rng.randint(1, 4) for _ in rows]
    cases.append(("regroup", [x(k * rng.randint(2, 3)), n(k)],
                  [[x(q * r), n(q)] for q, r in zip(groups, (2, 3, 4))],
                  [[x(6), n(4)], [x(rows[0]), n(0)], [x(5), n(-5)]]))
    return cases


@check(EXERCISE)
def checked_exports(dynamic_shapes, ctx):
    """each checked function exports, returns the original's values where the promise holds and
    refuses inputs that break it"""
    verify_checked(dynamic_shapes, _unbacked_cases(random.Random(0), torch.Generator()
                                                   .manual_seed(0)))


@check(EXERCISE, hidden=True)
def checked_on_random_inputs(dynamic_shapes, ctx):
    """the same on seeded shapes, values of k and data"""
    verify_checked(dynamic_shapes, _unbacked_cases(random.Random(ctx.seed + 1),
                                                   ctx.generator(1)))
