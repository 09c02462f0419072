"""Checks of ``compile.recompiles``: ``recompiles = {"predicted": ..., "compile_once": ...}``.

``predicted(calls) -> int``: the number of frames Dynamo compiles when ``programs.scaled_sum`` is
compiled fresh and called with ``calls`` (a list of ``(x, scale)`` tuples), predicted without
compiling. The probe :func:`labs.compile.probes.predictions` calls it in the kernel on each
sequence and reports the answers and the frames Dynamo compiled meanwhile
(:class:`~labs.compile.probes.FrameCount`; any fails: a prediction
that runs the compiler is a count, not a prediction); the oracle is a ``CompileCounter`` backend
(``torch/_dynamo/testing.py``) in the judge: each sequence is run at check time on an empty cache
with torch's default config. Public: ``programs.call_sequences()``; hidden: seeded random sequences
(:func:`random_calls`).

``compile_once(fn, backend)`` must return a compiled ``fn``, compiled by ``backend``, that compiles
exactly one frame for a sequence of calls whose tensors keep their dtype and number of dims (every
size >= 2, the first call's sizes all different) and whose Python ints (>= 2) and floats vary, with
outputs equal to eager, every call running that one graph (none run eagerly, as calls past
``recompile_limit`` are), and ``torch._dynamo.config`` left as it was. The probe
:func:`labs.compile.probes.compiled_once` runs each sequence through ``compile_once(fn, counter)``
in the kernel and reports the frames counted, the calls that ran a compiled graph, the config
entries changed and the outputs; the judge compares the outputs with eager ``fn`` run here. Public:
the sequences of ``call_sequences()`` that qualify; hidden: seeded random sequences for functions
of one or two tensors and an int or a float (``scaled_sum``, a reshape by an int, a matmul scaled
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


def verify_predictions(recompiles, sequences: list[tuple]) -> None:
    """``recompiles["predicted"](calls)`` equals the frames a fresh ``torch.compile(scaled_sum)``
    compiles for each sequence ``(label, calls)``, and compiled nothing itself."""
    seen = recompiles.probe(probes.predictions, [[[list(a) for a in calls], _marks(calls)]
                                                 for _, calls in sequences])
    _parts(seen["shape"])
    if not seen["callable"]:
        raise CheckFailure(f"recompiles['predicted'] is a {seen['type']}; it is a function "
                           "predicted(calls) -> int.")
    wrong = []
    for (label, calls), got in paired(sequences, seen["answers"], "sequences"):
        if got.get("replaced") is not False:
            raise CheckFailure(
                f"on {label}, predicted(calls) put something else in place of Dynamo's frame "
                "compiler (torch._dynamo.convert_frame._compile): the check cannot see what it "
                "compiled. Predict without touching the compiler.")
        if type(got["frames"]) is not int or got["frames"]:
            raise CheckFailure(
                f"on {label}, predicted(calls) made Dynamo compile {got['frames']} frame(s): it "
                "ran torch.compile to count. Predict without compiling: model the cache (its "
                "entries, the guards each accepts, what automatic dynamic makes symbolic).")
        answer = got["answer"]
        if type(answer["value"]) is not int:
            raise CheckFailure(f"on {label}, predicted(calls) returned a {answer['type']}, "
                               "not an int.")
        with probes.fresh_compiler():
            frames = _frames(programs.scaled_sum, calls)
        if answer["value"] != frames:
            wrong.append(f"{label} (you said {answer['value']}; the calls: "
                         f"{describe(programs.scaled_sum, calls)})")
    if wrong:
        raise CheckFailure(
            f"{len(wrong)} prediction(s) of {len(sequences)} are not right: "
            f"{'; '.join(wrong[:3])}. For each call, ask whether the graphs compiled so far have "
            "guards it passes (shape, dtype, the value of a specialized number), and what "
            "Dynamo makes symbolic when one fails (automatic dynamic; sizes 0 and 1 stay "
            "specialized, ints do not).")


@check(EXERCISE)
def predictions(recompiles, ctx):
    """predicts the frames compiled for each sequence of programs.call_sequences()"""
    verify_predictions(recompiles, [(f"the sequence '{name}'", calls)
                                    for name, calls in programs.call_sequences().items()])


def random_calls(g) -> list[tuple]:
    """3 to 6 seeded random calls of ``scaled_sum(x, scale)``: x of 2 dims of sizes 1 to 6 (a
    size kept from the call before more often than not), float32 or now and then float64, the
    first one marked dynamic on dim 0 now and then; scale of one kind for the sequence (int 1
    to 4, float, bool), often kept from the call before."""
    def pick(seq):
        return seq[int(torch.randint(0, len(seq), (1,), generator=g))]

    def chance(p: float) -> bool:
        return float(torch.rand((), generator=g)) < p

    kind = pick(((1, 2, 3, 4), (0.5, 1.5, 2.5), (True, False)))
    calls = []
    for k in range(int(torch.randint(3, 7, (1,), generator=g))):
        last = calls[-1] if calls else None
        b = pick((1, 2, 3, 4, 5, 6)) if last is None or chance(0.6) else last[0].shape[0]
        c = pick((2, 3, 4)) if last is None or chance(0.25) else last[0].shape[1]
        x = torch.randn(b, c, generator=g,
                        dtype=torch.float64 if chance(0.3) else torch.float32)
        if last is None and b >= 2 and chance(0.2):
            torch._dynamo.mark_dynamic(x, 0)
        calls.append((x, pick(kind) if last is None or chance(0.5) else last[1]))
    return calls


@check(EXERCISE, hidden=True)
def predictions_on_random_sequences(recompiles, ctx):
    """predicts the frames compiled for seeded random sequences of scaled_sum calls"""
    g = ctx.generator()
    verify_predictions(recompiles, [(f"random sequence {k + 1}", random_calls(g))
                                    for k in range(12)])


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
        frames, changed = run["frames"], run["config"]
        if type(changed) is not list or changed:
            raise CheckFailure(
                f"on {label}, compile_once changed torch._dynamo.config ({changed}): a global, "
                "which every function compiled in this process then sees (a recompile_limit of "
                "1 makes each of them run eagerly after its first guard fails). Choose how fn "
                "is compiled with torch.compile's own arguments.")
        if frames == 0:
            raise CheckFailure(f"on {label}, the backend passed to compile_once compiled no "
                               "frame: use the backend you are given (torch.compile(fn, "
                               "backend=backend, ...)); returning fn itself runs it eagerly.")
        if run["graph_runs"] != len(calls):
            raise CheckFailure(
                f"on {label}, {len(calls) - run['graph_runs']} of the {len(calls)} calls ran no "
                "compiled graph: Dynamo ran them eagerly (it gives up on a frame once "
                "recompile_limit graphs failed their guards). Compile once means one graph "
                "that every call runs.")
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
