"""Checks of ``compile.graph-breaks``: ``fixed``, a dict name -> rewrite of each function of
``programs.BREAKING`` without its graph break.

For each name the probe :func:`labs.compile.probes.rewrites` runs, in the kernel,
``torch._dynamo.explain(f)(x)`` (its graph-break count and first reason) and
``torch.compile(f, backend="eager", fullgraph=True)(x)`` (which raises on any break) and reports
the output; the judge wants no graph break, a compile that succeeds, and an output equal to the
original function's, run eagerly here (the oracle), on the given inputs (public: one check per
function) and on seeded random ``(n, d)`` inputs (hidden: n in 2..9, d in 1..7; drawn away from
ties, so that both functions must pick the same rows, and with sums of both signs for
``branch``).
"""

from __future__ import annotations

import contextlib
import io

import torch

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.compile import probes, programs

EXERCISE = "compile.graph-breaks"
NAMES = tuple(programs.BREAKING)


def _entries(fixed) -> None:
    """The answer's dict has exactly the names, each a callable (asked of the kernel)."""
    seen = fixed.probe(probes.entries)
    if not seen["dict"]:
        raise CheckFailure(f"fixed has type {seen['type']}, not a dict.")
    keys = seen["keys"]
    missing = [n for n in NAMES if n not in keys]
    if missing:
        raise CheckFailure(f"fixed has no entry for {', '.join(map(repr, missing))}: give a "
                           f"rewrite for each of {', '.join(map(repr, NAMES))}.")
    extra = [k for k in keys if k not in NAMES]
    if extra:
        raise CheckFailure(f"fixed has key(s) {', '.join(map(repr, extra))} that name no program:"
                           f" the keys are exactly {', '.join(map(repr, NAMES))}.")
    for name in NAMES:
        if seen["callable"].get(name) is not True:
            raise CheckFailure(f"fixed[{name!r}] is a {seen['types'].get(name)}, not a "
                               "function: map each name to your rewrite of that program.")


def _original(name: str, x: torch.Tensor) -> torch.Tensor:
    with contextlib.redirect_stdout(io.StringIO()):  # (logged prints)
        return programs.BREAKING[name](x.clone())


def _no_breaks(fixed, name: str, seen: dict) -> None:
    """explain found no graph break in ``fixed[name]``; when it did, the message names the
    config entries the notebook changed, which the check ran without."""
    if seen["breaks"]:
        changed = fixed.probe(probes.changed_config)
        note = (f" The check ran with torch's default config, not this notebook's: it set "
                f"{', '.join(map(str, changed[:4]))} back to the default while it ran, so the "
                "notebook may show fewer breaks than this." if type(changed) is list and changed
                else "")
        raise CheckFailure(f"torch._dynamo.explain finds {seen['breaks']} graph "
                           f"break(s) in fixed[{name!r}]; the first: {seen['reason']}. Rewrite "
                           f"that part with tensor operations Dynamo can put in the graph.{note}")


def _same(name: str, seen: dict, x: torch.Tensor, where: str) -> None:
    """``torch.compile(f, fullgraph=True)`` compiled on ``x`` and returned the original's
    value."""
    if "failed" in seen:
        r = seen["failed"]
        raise CheckFailure(
            f"torch.compile(fixed[{name!r}], fullgraph=True) fails on {where}: "
            f"{r['ename']}: {r['first']}{r['where']}. fullgraph=True refuses "
            "any graph break, including one that only shows up at this shape.")
    want = _original(name, x)
    got = seen["output"]["value"]
    if type(got) is not torch.Tensor or got.shape != want.shape:
        what = tuple(got.shape) if type(got) is torch.Tensor else seen["output"]["type"]
        raise CheckFailure(f"fixed[{name!r}] returns {what} on {where}; programs.{name} "
                           f"returns shape {tuple(want.shape)}.")
    if got.dtype != want.dtype or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise CheckFailure(f"fixed[{name!r}] returns different values from programs.{name} on "
                           f"{where} (largest difference "
                           f"{(got.double() - want.double()).abs().max().item():.3g}): a rewrite "
                           "must compute the same thing, only without the break.")


def _judge(fixed, cases: list[tuple]) -> None:
    """``cases``: (name, x, explain, where); one probe for them all, judged in order."""
    _entries(fixed)
    reply = fixed.probe(probes.rewrites, [[name, x, explain] for name, x, explain, _ in cases])
    for (name, x, explain, where), seen in paired(cases, reply, "inputs"):
        if "raised" in seen:
            raise AnswerRaised(seen["raised"])
        if explain:
            _no_breaks(fixed, name, seen)
        _same(name, seen, x, where)


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


def zero_sum_input(g) -> torch.Tensor:
    """A seeded random (n, d) input for branch whose sum is exactly 0 (small integers, the last
    one set to balance the rest: exact in float32), where ``x.sum() > 0`` is False: the
    boundary a rewrite with ``>=`` gets wrong."""
    n = int(torch.randint(2, 10, (1,), generator=g))
    d = int(torch.randint(1, 8, (1,), generator=g))
    x = torch.randint(-3, 4, (n * d,), generator=g).float()
    x[-1] -= x.sum()
    return x.reshape(n, d)


@check(EXERCISE)
def names(fixed, ctx):
    """is a dict with a function for each program of programs.BREAKING"""
    _entries(fixed)


def _public(name: str):
    def run(fixed, ctx):
        xs = public_inputs(name)
        many = len(xs) > 1
        _judge(fixed, [(name, x, i == 0, f"the example input{f' {i + 1}' if many else ''}")
                       for i, x in enumerate(xs)])

    run.__doc__ = f"fixed[{name!r}] has no graph break and matches programs.{name}"
    run.__name__ = f"public_{name}"
    return run


for _name in NAMES:
    check(EXERCISE)(_public(_name))


@check(EXERCISE, hidden=True)
def random_inputs(fixed, ctx):
    """every rewrite compiles with fullgraph=True and matches on seeded random inputs"""
    g = ctx.generator()
    cases = []
    for name in NAMES:
        for k in range(4):
            x = hidden_input(name, g, k)
            cases.append((name, x, False, f"a random input of shape {tuple(x.shape)}"))
    x = zero_sum_input(g)
    cases.append(("branch", x, False, f"a random input of shape {tuple(x.shape)} whose sum is "
                                      "exactly 0 (x.sum() > 0 is False)"))
    _judge(fixed, cases)
