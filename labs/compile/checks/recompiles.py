"""Checks of ``compile.recompiles``: ``recompiles = {"predicted": ..., "compile_once": ...}``.

``predicted`` (a dict, or a function with no arguments returning it): sequence name -> the
number of frames Dynamo compiles when ``programs.scaled_sum`` is compiled fresh and called with
that sequence of ``programs.call_sequences()``. The probe :func:`labs.compile.probes.predictions`
reports the predictions; the oracle is a ``CompileCounter`` backend
(``torch/_dynamo/testing.py``) in the judge: each sequence is run at check time on an empty cache
with torch's default config, and each prediction is compared with the frames it counted.

``compile_once(fn, backend)`` must return a compiled ``fn``, compiled by ``backend``, that
compiles exactly one frame for a sequence of calls whose tensors keep their dtype and number of
dims (every size >= 2, the first call's sizes all different) and whose Python ints (>= 2) and
floats vary, with outputs equal to eager. The probe :func:`labs.compile.probes.compiled_once`
runs each sequence through ``compile_once(fn, counter)`` in the kernel and reports the frames
counted and the outputs; the judge compares the outputs with eager ``fn`` run here. Public: the
sequences of ``call_sequences()`` that qualify; hidden: seeded random sequences for functions of
one or two tensors and an int or a float (``scaled_sum``, a reshape by an int, a matmul scaled
by a float).
"""

from __future__ import annotations

import inspect

import torch

from grader.checks import CheckFailure, check, paired
from labs.compile import probes, programs

EXERCISE = "compile.recompiles"
KEYS = ("predicted", "compile_once")


def _parts(shape: dict) -> None:
    """The answer is a dict with both keys (as the probe saw it)."""
    if not shape["dict"]:
        raise CheckFailure(f"recompiles has type {shape['type']}, not a dict.")
    missing = [k for k in KEYS if k not in shape["keys"]]
    if missing:
        raise CheckFailure(f"recompiles has no {', '.join(map(repr, missing))}: it is a dict "
                           "with the keys 'predicted' and 'compile_once'.")


def _predictions(seen: dict, names) -> dict:
    """The learner's predictions as a dict, checked for names and int values."""
    what = "recompiles['predicted'] (or what it returns)"
    got = seen["value"]
    if seen["unplain"] or type(got) is not dict:
        raise CheckFailure(f"{what} has type {seen['type']}, not a dict.")
    missing = [n for n in names if n not in got]
    extra = [k for k in got if k not in names]
    if missing or extra:
        raise CheckFailure(
            f"recompiles['predicted'] has no prediction for {missing or 'nothing'} and unknown "
            f"keys {extra or 'none'}: its keys are the names of programs.call_sequences(): "
            f"{', '.join(map(repr, names))}.")
    for name in names:
        if type(got[name]) is not int:
            raise CheckFailure(f"the prediction for {name!r} has type "
                               f"{type(got[name]).__name__}, not a int.")
    return got


def _value(v) -> str:
    if isinstance(v, torch.Tensor):
        dims = sorted(getattr(v, "_dynamo_dynamic_indices", ()))
        marked = f" (dim {', '.join(map(str, dims))} marked dynamic)" if dims else ""
        return f"{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}{marked}"
    return repr(v)


def describe(fn, calls: list[tuple]) -> str:
    """What changes from call to call, argument by argument: 'x: (2, 3) float32 -> (3, 3)
    float32; scale: 2 each call' (a tensor is described by its shape and dtype only)."""
    names = list(inspect.signature(fn).parameters)
    parts = []
    for i, name in enumerate(names[: len(calls[0])]):
        shown = [_value(args[i]) for args in calls]
        if all(s == shown[0] for s in shown):
            parts.append(f"{name}: {shown[0]} each call")
        else:
            parts.append(f"{name}: {' -> '.join(shown)}")
    return "; ".join(parts)


def _plain_compile(fn, backend):
    return torch.compile(fn, backend=backend)


@check(EXERCISE)
def predictions(recompiles, ctx):
    """predicts the frames compiled for each sequence of programs.call_sequences()"""
    seen = recompiles.probe(probes.predictions)
    _parts(seen["shape"])
    names = list(programs.call_sequences())
    guess = _predictions(seen["predicted"], names)
    wrong = []
    for name in names:
        calls = programs.call_sequences()[name]  # (fresh tensors: mark_dynamic on new ones)
        with probes.fresh_compiler():
            frames = _frames(programs.scaled_sum, calls)
        if guess[name] != frames:
            wrong.append(f"'{name}' (you said {guess[name]}; the calls: "
                         f"{describe(programs.scaled_sum, calls)})")
    if wrong:
        raise CheckFailure(
            f"{len(wrong)} prediction(s) are not right: {'; '.join(wrong)}. For each call, "
            "ask whether the graphs compiled so far have guards it passes (shape, dtype, the "
            "value of a specialized number), and what Dynamo makes dynamic when one fails "
            "(automatic dynamic shapes; 0/1 specialization).")


def _frames(fn, calls: list[tuple]) -> int:
    """The frames a fresh ``torch.compile(fn)`` compiles for ``calls`` (the oracle)."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    compiled = torch.compile(fn, backend=counter)
    for args in calls:
        compiled(*args)
    return counter.frame_count


def _sizes(args: tuple) -> list[int]:
    return [s for a in args if isinstance(a, torch.Tensor) for s in a.shape]


def _qualifies(calls: list[tuple]) -> bool:
    """Whether compile_once's contract covers this sequence: tensors keep dtype and dims, every
    size >= 2, sizes equal in the first call stay equal (duck sizing gives them one symbol),
    numbers are ints (>= 2) or floats that keep their type, no bools."""
    first = calls[0]
    pairs = [(i, j) for i, a in enumerate(_sizes(first)) for j, b in enumerate(_sizes(first))
             if i < j and a == b]
    for args in calls:
        if len(args) != len(first) or any(_sizes(args)[i] != _sizes(args)[j] for i, j in pairs):
            return False
        for a, b in zip(first, args):
            if isinstance(b, bool) or type(b) is not type(a):
                return False
            if isinstance(b, torch.Tensor) and (b.dtype != a.dtype or b.dim() != a.dim()
                                                or min(b.shape, default=2) < 2):
                return False
            if isinstance(b, int) and b < 2:
                return False
    return True


def _marks(calls: list[tuple]) -> list:
    """``[call, arg, dims]`` of each tensor of ``calls`` marked dynamic."""
    return [[k, i, sorted(a._dynamo_dynamic_indices)] for k, args in enumerate(calls)
            for i, a in enumerate(args)
            if isinstance(a, torch.Tensor) and getattr(a, "_dynamo_dynamic_indices", None)]


def verify_once(recompiles, cases: list[tuple]) -> None:
    """compile_once(fn, counter) compiles one frame for each case's calls and matches eager;
    ``cases``: (fn, calls, label), asked of the kernel in one probe."""
    seen = recompiles.probe(probes.compiled_once, [[fn.__name__, [list(a) for a in calls],
                                                    _marks(calls)] for fn, calls, _ in cases])
    _parts(seen["shape"])
    if not seen["callable"]:
        raise CheckFailure(f"recompiles['compile_once'] is a {seen['type']}; "
                           "it is a function compile_once(fn, backend).")
    for (fn, calls, label), run in paired(cases, seen["runs"], "sequences"):
        if not run["callable"]:
            raise CheckFailure(f"it returned {run['returned']}, not a callable (the compiled "
                               "function).")
        frames = run["frames"]
        if frames == 0:
            raise CheckFailure(f"on {label}, the backend passed to compile_once compiled no "
                               "frame: use the backend you are given (torch.compile(fn, "
                               "backend=backend, ...)); returning fn itself runs it eagerly.")
        if frames > 1:
            raise CheckFailure(f"on {label}, compile_once's function compiled {frames} frames, "
                               f"not 1. The calls: {describe(fn, calls)}. Each recompile is a "
                               "guard that failed: make sizes and numbers symbolic from the "
                               "first call.")
        for k, (args, got) in enumerate(paired(calls, run["outs"], "calls")):
            expected = fn(*args)
            got = got["value"]
            if type(got) is not torch.Tensor or got.shape != expected.shape or not (
                    torch.allclose(got, expected, rtol=1e-4, atol=1e-5)):
                raise CheckFailure(f"on {label}, call {k + 1} returns a different value from "
                                   "eager fn: compile fn, without changing what it computes.")


@check(EXERCISE)
def once_on_the_sequences(recompiles, ctx):
    """compile_once compiles once for each sequence of call_sequences() it covers"""
    verify_once(recompiles, [(programs.scaled_sum, calls, f"the sequence '{name}'")
                             for name, calls in programs.call_sequences().items()
                             if _qualifies(calls)])


# ------------------------------------------------------------------ hidden: random sequences
def random_sequence(g, which: int) -> tuple:
    """(fn, calls): 4 seeded random calls of one of three functions, within compile_once's
    contract (drawn again until they are)."""
    fn = (programs.scaled_sum, probes.regroup, probes.scaled_matmul)[which]
    as_int = bool(torch.randint(0, 2, (1,), generator=g))

    def size() -> int:
        return int(torch.randint(2, 10, (1,), generator=g))

    def number(integer: bool):
        return size() if integer else round(float(torch.rand((), generator=g)) * 4 + 0.1, 3)

    def call() -> tuple:
        a, b, c = size(), size(), size()
        if which == 0:
            return torch.randn(a, b, generator=g), number(as_int)
        if which == 1:
            return torch.randn(c * a, b, generator=g), c
        return torch.randn(a, b, generator=g), torch.randn(b, c, generator=g), number(False)

    while True:
        calls = [call() for _ in range(4)]
        if _qualifies(calls):
            return fn, calls


@check(EXERCISE, hidden=True)
def once_on_random_sequences(recompiles, ctx):
    """compile_once compiles once on seeded random sequences of three functions"""
    g = ctx.generator()
    cases = []
    for which in range(3):
        fn, calls = random_sequence(g, which)
        cases.append((fn, calls, f"a random sequence of {fn.__name__} calls"))
    verify_once(recompiles, cases)
