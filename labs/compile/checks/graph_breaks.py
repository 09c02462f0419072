"""Checks of ``compile.graph-breaks``: ``fixed``, a dict name -> rewrite of each function of
``programs.BREAKING`` without its graph break.

For each name the oracle is Dynamo and the original function: ``torch._dynamo.explain(f)(x)``
must count no graph break, ``torch.compile(f, backend="eager", fullgraph=True)`` (which raises
on any break) must compile, and its output must equal the original's, run eagerly, on the given
inputs (public: one check per function) and on seeded random ``(n, d)`` inputs (hidden: n in
2..9, d in 1..7; drawn away from ties, so that both functions must pick the same rows, and with
sums of both signs for ``branch``).
"""

from __future__ import annotations

import contextlib
import io

import torch
import torch._dynamo

from grader.checks import CheckFailure, check, exact, learner_line
from labs.compile import programs
from labs.compile.checks._harness import fresh_compiler

EXERCISE = "compile.graph-breaks"
NAMES = tuple(programs.BREAKING)


def _entries(fixed) -> dict:
    """The answer's dict, after checking its keys and that every value is callable."""
    exact(fixed, dict, "fixed")
    missing = [n for n in NAMES if n not in fixed]
    if missing:
        raise CheckFailure(f"fixed has no entry for {', '.join(map(repr, missing))}: give a "
                           f"rewrite for each of {', '.join(map(repr, NAMES))}.")
    extra = [k for k in fixed if k not in NAMES]
    if extra:
        raise CheckFailure(f"fixed has key(s) {', '.join(map(repr, extra))} that name no program:"
                           f" the keys are exactly {', '.join(map(repr, NAMES))}.")
    for name in NAMES:
        if not callable(fixed[name]):
            raise CheckFailure(f"fixed[{name!r}] is a {type(fixed[name]).__name__}, not a "
                               "function: map each name to your rewrite of that program.")
    return fixed


def _original(name: str, x: torch.Tensor) -> torch.Tensor:
    with contextlib.redirect_stdout(io.StringIO()):  # (logged prints)
        return programs.BREAKING[name](x)


def _no_breaks(name: str, f, x: torch.Tensor) -> None:
    """explain finds no graph break in ``f`` on ``x``."""
    with fresh_compiler(), contextlib.redirect_stdout(io.StringIO()):
        found = torch._dynamo.explain(f)(x)
    if found.graph_break_count:
        reason = str(found.break_reasons[0].reason).strip().splitlines()[0][:300]
        raise CheckFailure(f"torch._dynamo.explain finds {found.graph_break_count} graph "
                           f"break(s) in fixed[{name!r}]; the first: {reason}. Rewrite that "
                           "part with tensor operations Dynamo can put in the graph.")


def _same(name: str, f, x: torch.Tensor, where: str) -> None:
    """``torch.compile(f, fullgraph=True)`` compiles on ``x`` and returns the original's value."""
    want = _original(name, x)
    with fresh_compiler(), contextlib.redirect_stdout(io.StringIO()):
        compiled = torch.compile(f, backend="eager", fullgraph=True)
        try:
            got = compiled(x)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001  (any failure to compile is the answer's)
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise CheckFailure(
                f"torch.compile(fixed[{name!r}], fullgraph=True) fails on {where}: "
                f"{type(exc).__name__}: {first}{learner_line(exc)}. fullgraph=True refuses "
                "any graph break, including one that only shows up at this shape.") from None
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        what = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailure(f"fixed[{name!r}] returns {what} on {where}; programs.{name} "
                           f"returns shape {tuple(want.shape)}.")
    if got.dtype != want.dtype or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise CheckFailure(f"fixed[{name!r}] returns different values from programs.{name} on "
                           f"{where} (largest difference "
                           f"{(got.double() - want.double()).abs().max().item():.3g}): a rewrite "
                           "must compute the same thing, only without the break.")


def public_inputs(name: str) -> list[torch.Tensor]:
    """The notebook's example inputs for ``name``: a (5, 3) tensor, shifted to a positive and
    a negative sum for branch."""
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    if name == "branch":
        return [x - x.mean() + 0.5, x - x.mean() - 0.5]
    return [x]


def _gap(values: torch.Tensor, k: int) -> float:
    """The gap between the k-th and (k+1)-th largest of ``values`` (inf when there is none)."""
    if values.numel() <= k:
        return float("inf")
    top = torch.topk(values.double(), k + 1).values
    return float(top[k - 1] - top[k])


def hidden_input(name: str, g, k: int) -> torch.Tensor:
    """A seeded random (n, d) input for ``name``, away from ties; for branch with a sum whose
    sign alternates with k, for generator with the best window last or first for some k."""
    while True:
        n, d = int(torch.randint(2, 10, (1,), generator=g)), int(
            torch.randint(1, 8, (1,), generator=g))
        x = torch.randn(n, d, generator=g) * float(torch.rand((), generator=g) * 4 + 0.1)
        if name == "branch":
            x = x if (x.sum() > 0) == (k % 2 == 0) else -x
            ok = abs(float(x.sum())) > 1e-3
        elif name == "item":
            ok = float(x.abs().max()) > 1e-3
        elif name == "builtin":
            ok = _gap(x.sum(1), 2) > 1e-3
        elif name == "generator":
            if k % 3 < 2:  # the best window last (k = 0, 3) or first (k = 1): the edges count
                rows = slice(-2, None) if k % 3 == 0 else slice(0, 2)
                x[rows] += x.abs().max() * 2 / d
            ok = _gap(x[:-1].sum(1) + x[1:].sum(1), 1) > 1e-3
        else:
            ok = True
        if ok:
            return x


@check(EXERCISE)
def names(fixed, ctx):
    """is a dict with a function for each program of programs.BREAKING"""
    _entries(fixed)


def _public(name: str):
    def run(fixed, ctx):
        f = _entries(fixed)[name]
        xs = public_inputs(name)
        _no_breaks(name, f, xs[0])
        for i, x in enumerate(xs):
            _same(name, f, x, f"the example input{f' {i + 1}' if len(xs) > 1 else ''}")

    run.__doc__ = f"fixed[{name!r}] has no graph break and matches programs.{name}"
    run.__name__ = f"public_{name}"
    return run


for _name in NAMES:
    check(EXERCISE)(_public(_name))


@check(EXERCISE, hidden=True)
def random_inputs(fixed, ctx):
    """every rewrite compiles with fullgraph=True and matches on seeded random inputs"""
    f = _entries(fixed)
    g = ctx.generator()
    for name in NAMES:
        for k in range(4):
            x = hidden_input(name, g, k)
            _same(name, f[name], x, f"a random input of shape {tuple(x.shape)}")
