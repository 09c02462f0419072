"""Checks of ``compile.guards``: ``would_recompile(fn, args, new_args) -> bool``, read from
Dynamo's guards.

The probe :func:`labs.compile.probes.answers` calls ``would_recompile`` in the kernel on an
empty cache, for each case, and reports its answer and the frames Dynamo compiled during the
call. The oracle is the cache itself, in the judge: for each case the check compiles ``fn`` with
a ``CompileCounter`` backend on an empty cache (``torch._dynamo.reset``), calls it with ``args``
and then with ``new_args``, and sees whether the frame count grew. The learner's answer must
agree, and must come from the guards: during the learner's call Dynamo may compile at most one
frame (counted by :class:`~labs.compile.probes.FrameCount`, which neither ``reset`` nor clearing
Dynamo's counters touches), so calling the compiled function on ``new_args`` to see what happens
is refused, and so is asking Dynamo under a compile stance (``torch.compiler.set_stance``:
``models`` in lab.toml). When an answer is wrong, the message quotes the guard that fails
(``GuardManager.check_verbose``).
Public: ``programs.scaled_sum`` with seven changes (batch size, dtype, requires_grad, a
transposed input, a new int, new values, a bool flip) and two that do not recompile; hidden:
seeded random functions and changes (dims, dtype, int/float/bool constants, the length of a
list of tensors, a tensor or None for an argument with a default), and the cases where comparing
the arguments by hand and reading the guards disagree (:func:`boundary_cases`).
"""

from __future__ import annotations

import inspect

import torch
import torch._dynamo
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.testing import CompileCounter

from grader.checks import CheckFailure, check, paired
from labs.compile import probes, programs

EXERCISE = "compile.guards"


def _show(v) -> str:
    """An argument in words: a tensor by shape, dtype and the flags guards look at."""
    if isinstance(v, torch.Tensor):
        flags = [str(v.dtype).replace("torch.", "")]
        if v.requires_grad:
            flags.append("requires_grad")
        if not v.is_contiguous():
            flags.append(f"strides {v.stride()}")
        return f"tensor {tuple(v.shape)} {' '.join(flags)}"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_show(a) for a in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner})"
    return repr(v)


def _call(fn, args: tuple) -> str:
    return f"{fn.__name__}({', '.join(_show(a) for a in args)})"


def truth(fn, args: tuple, new_args: tuple) -> tuple[bool, str]:
    """(whether calling the compiled fn on new_args after args recompiles, the first guard of
    the cache entry that fails on new_args, or '')."""
    with probes.fresh_compiler():
        counter = CompileCounter()
        compiled = torch.compile(fn, backend=counter)
        compiled(*args)
        before = counter.frame_count
        failing = ""
        entries = _debug_get_cache_entry_list(fn.__code__)
        if entries:
            bound = inspect.signature(fn).bind(*new_args)
            bound.apply_defaults()
            info = entries[0].guard_manager.check_verbose(dict(bound.arguments))
            if not info.result and info.verbose_code_parts:
                failing = info.verbose_code_parts[0].split("#")[0].strip()
        compiled(*new_args)
        return counter.frame_count > before, failing


def _marks(args: tuple) -> list:
    """``[i, dims]`` of each tensor of ``args`` marked dynamic."""
    return [[i, sorted(a._dynamo_dynamic_indices)] for i, a in enumerate(args)
            if isinstance(a, torch.Tensor) and getattr(a, "_dynamo_dynamic_indices", None)]


def verify(would_recompile, cases: list[tuple]) -> None:
    """The learner's answer for each case (what, fn, args, new_args) agrees with the cache,
    compiling at most one frame; one probe for them all."""
    reply = would_recompile.probe(probes.answers, [
        [fn.__name__, list(args), list(new_args), _marks(args)]
        for _, fn, args, new_args in cases])
    wrong = [message for (what, fn, args, new_args), seen in paired(cases, reply, "cases")
             if (message := _judge(seen, fn, args, new_args, what))]
    if len(wrong) == len(cases) > 2:
        raise CheckFailure(
            f"your answers are the opposite of the cache's on all {len(cases)} cases (the first: "
            f"{wrong[0]}). would_recompile is True when the second call compiles again: when "
            "no cache entry's guards all pass on new_args (GuardManager.check returns False "
            "for every entry).")
    if wrong:
        raise CheckFailure(wrong[0])


def _judge(seen: dict, fn, args: tuple, new_args: tuple, what: str) -> str | None:
    """None when the learner's answer for this case agrees with the cache, else why not;
    raises CheckFailure for an answer that is not a bool or that compiled new_args."""
    got, compiled = seen["answer"], seen["frames"]
    if type(got["value"]) is not bool:
        raise CheckFailure(f"would_recompile's answer for {what} has type {got['type']}, not a "
                           "bool.")
    got = got["value"]
    if seen.get("replaced") is not False:
        raise CheckFailure(
            f"for {what}, your would_recompile put something else in place of Dynamo's frame "
            "compiler (torch._dynamo.convert_frame._compile): the check cannot count what it "
            "compiled. Compile with torch.compile and read the guards it installed.")
    if type(compiled) is not int or compiled > 1:
        raise CheckFailure(
            f"for {what}, Dynamo compiled {compiled} frames during your would_recompile: compile "
            "fn once, on args; answer from its guards (the cache entries' guard_manager), "
            "without calling the compiled function on new_args.")
    recompiles, failing = truth(fn, args, new_args)
    if got == recompiles:
        return None
    case = f"{what}: {_call(fn, args)}, then {_call(fn, new_args)}"
    if recompiles:
        because = f" (Dynamo's guard check says: `{failing}`)" if failing else ""
        return (f"for {case}, you said False, but the second call recompiles{because}. "
                "Answer from the guards themselves (check each cache entry's guard_manager "
                "on new_args), not from a comparison of the arguments: a guard can test what "
                "such a comparison leaves out.")
    defaults = len(new_args) < len(inspect.signature(fn).parameters)
    note = (" new_args leave a parameter to its default, and the frame's locals still hold it."
            if defaults else "")
    return (f"for {case}, you said True, but the second call reuses the graph compiled for "
            "args: all its guards pass. Guards test what the graph was specialized on, not "
            f"everything about the inputs.{note}")


def public_cases() -> list[tuple]:
    """(what, fn, args, new_args) for scaled_sum: the notebook's changes."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=g)
    marked = torch.randn(4, 3, generator=g)
    torch._dynamo.mark_dynamic(marked, 0)
    r = lambda *shape: torch.randn(*shape, generator=g)
    f = programs.scaled_sum
    return [
        ("a new batch size", f, (x, 2), (r(5, 3), 2)),
        ("a new dtype", f, (x, 2), (x.double(), 2)),
        ("requires_grad", f, (x, 2), (x.clone().requires_grad_(), 2)),
        ("a transposed input", f, (x, 2), (r(3, 4).t(), 2)),
        ("a new int", f, (x, 2), (x, 3)),
        ("the same shape, new values", f, (x, 2), (r(4, 3), 2)),
        ("a bool flip", f, (x, True), (x, False)),
        ("a new batch size after mark_dynamic", f, (marked, 2), (r(7, 3), 2)),
        ("the same int, a new tensor", f, (x, 3), (x.clone(), 3)),
    ]


@check(EXERCISE)
def scaled_sum_changes(would_recompile, ctx):
    """agrees with the cache on nine changes to scaled_sum's arguments"""
    verify(would_recompile, public_cases())


# ------------------------------------------------------------------ hidden: random cases
reduce_last, scale_by, stack_sum, with_bias, pair, ignores_y = (
    probes.reduce_last, probes.scale_by, probes.stack_sum, probes.with_bias, probes.pair,
    probes.ignores_y)


def random_case(g) -> tuple:
    """(what, fn, args, new_args): a seeded random function and change."""

    def pick(seq):
        return seq[int(torch.randint(0, len(seq), (1,), generator=g))]

    n, d = (int(torch.randint(2, 7, (1,), generator=g)) for _ in range(2))
    r = lambda *shape: torch.randn(*shape, generator=g)
    x = r(n, d)
    fn = pick((reduce_last, scale_by, stack_sum, with_bias, pair))
    tensor_changes = {
        "new values": lambda t: r(*t.shape),
        "a new size": lambda t: r(t.shape[0] + 1, *t.shape[1:]),
        "one more dim": lambda t: r(*t.shape, 2),
        "float64": lambda t: t.double(),
        "requires_grad": lambda t: t.detach().clone().requires_grad_(),
        "non-contiguous": lambda t: r(*reversed(t.shape)).t(),
    }
    if fn is reduce_last or fn is pair:
        shaped = ("a new size", "one more dim")  # (pair needs x and y of one shape)
        change = pick([c for c in tensor_changes if fn is reduce_last or c not in shaped])
        args = (x,) if fn is reduce_last else (x, r(n, d))
        new_args = (tensor_changes[change](x),) + args[1:]
    elif fn is scale_by:
        c = pick((2, 3, 2.5, True, False))
        change, new_c = pick([
            ("the same constant", c),
            ("a new constant of the same type", {bool: not c, int: c + 1,
                                                 float: c + 1.0}[type(c)]),
            ("a number of another type", float(c) if not isinstance(c, float) else int(c)),
            ("new tensor values", c),
        ])
        args, new_args = (x, c), (r(n, d) if change == "new tensor values" else x, new_c)
    elif fn is stack_sum:
        xs = [r(n, d) for _ in range(int(torch.randint(2, 4, (1,), generator=g)))]
        change, new_xs = pick([
            ("same length, new values", [r(n, d) for _ in xs]),
            ("one more tensor", [*xs, r(n, d)]),
            ("one tensor fewer", xs[:-1]),
            ("a float64 list", [t.double() for t in xs]),
        ])
        args, new_args = (xs,), (new_xs,)
    else:
        bias = None if bool(torch.randint(0, 2, (1,), generator=g)) else r(d)
        change, new_bias = pick([
            ("the same kind of bias", None if bias is None else r(d)),
            ("a bias instead of None, or None instead of a bias", r(d) if bias is None
             else None),
        ])
        args = (x,) if bias is None else (x, bias)  # (bias left to its default)
        new_args = (x, new_bias) if new_bias is not None else (x,)
    return f"a random case ({change})", fn, args, new_args


def boundary_cases(g) -> list[tuple]:
    """(what, fn, args, new_args) where comparing the arguments by hand and reading the guards
    disagree: an argument the function never reads (no guard on it), a size-1 dim whose stride
    changes while both tensors are contiguous (the stride is guarded), a view at another
    storage offset (not guarded), and batch 1 or 0 after ``mark_dynamic`` (the symbol's guard
    is ``2 <= size``: 0 and 1 are specialized)."""
    r = lambda *shape: torch.randn(*shape, generator=g)
    n, d = (int(torch.randint(3, 7, (1,), generator=g)) for _ in range(2))
    x = r(n, d)
    column = r(n, 1)
    marked = r(n, d)
    torch._dynamo.mark_dynamic(marked, 0)
    batch = int(torch.randint(0, 2, (1,), generator=g))
    return [
        ("an argument the function never reads, of a new dtype and shape", ignores_y,
         (x, r(2)), (x, r(5, 2).double())),
        ("a size-1 dim with a new stride (both contiguous)", reduce_last, (column,),
         (r(1, n).t(),)),
        ("a view at another storage offset", reduce_last, (x,), (r(n + 1, d)[1:],)),
        (f"batch {batch} after mark_dynamic", programs.scaled_sum, (marked, 2),
         (r(batch, d), 2)),
    ]


@check(EXERCISE, hidden=True)
def boundaries(would_recompile, ctx):
    """agrees with the cache where comparing arguments by hand does not: an unused argument,
    a size-1 dim's stride, a storage offset, batch 0 or 1 after mark_dynamic"""
    verify(would_recompile, boundary_cases(ctx.generator()))


@check(EXERCISE, hidden=True)
def random_changes(would_recompile, ctx):
    """agrees with the cache on seeded random functions and changes"""
    g = ctx.generator()
    x = torch.randn(3, 4, generator=g)
    cases = [("an argument left to its default both times", with_bias, (x,),
              (torch.randn(3, 4, generator=g),))]
    cases += [random_case(g) for _ in range(12)]
    verify(would_recompile, cases)
