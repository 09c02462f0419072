"""Checks of ``compile.fusion``: ``fused(x)`` must return ``programs.unfused(x)``'s values
(allclose, rtol 1e-5, atol 1e-6; the oracle is ``unfused`` run eagerly at check time) on the
given inputs and on seeded hidden ones (odd shapes, rows of large positive and negative values),
and ``torch.compile(fused, fullgraph=True)`` (Inductor) must emit at most
``programs.MAX_KERNELS`` kernels: the kernels the generated wrapper's ``call`` launches
(``cpp_fused_*`` on CPU, ``triton_*`` on CUDA, read from
``torch._inductor.utils.run_and_get_code``) plus the ATen fallback and extern calls it makes.
Cold Inductor compiles cost seconds, so a grading compiles ``fused`` once (``unfused`` too, only
to quote its count when the answer has too many). :mod:`labs.compile.checks.fusion_gpu` runs
the same checks on a CUDA tensor."""

from __future__ import annotations

import random

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._inductor.utils import fresh_cache, run_and_get_code

from grader.checks import CheckFailure, check, grading, plain_tensor
from labs.compile import programs, viz
from labs.compile.checks._harness import fresh_compiler

EXERCISE = "compile.fusion"
RTOL, ATOL = 1e-5, 1e-6


def kernels_in(codes: list[str]) -> tuple[list[str], list[str]]:
    """(generated kernels launched, ATen fallback / extern calls) in Inductor's output codes, in
    call order (read by :func:`labs.compile.viz.kernels`, the table the notebook shows)."""
    found = viz.kernels(codes)
    return ([name for name, kind in found if kind != "ATen fallback"],
            [name for name, kind in found if kind == "ATen fallback"])


def compile_and_count(fn, x: torch.Tensor, what: str):
    """Compile ``fn`` with Inductor (fullgraph), run it on ``x``; (output, generated,
    fallbacks)."""
    # When grading, an empty cache of its own: nothing in Inductor's caches (the kernel's copy of
    # the grader's warm cache, what the notebook compiled, or planted) stands in for the code;
    # elsewhere, the FX graph cache off, so that the code is generated (and seen) every time
    try:
        with fresh_cache() if grading() else inductor_config.patch(fx_graph_cache=False):
            out, codes = run_and_get_code(torch.compile(fn, fullgraph=True), x)
    except torch._dynamo.exc.Unsupported as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckFailure(
            f"torch.compile({what}, fullgraph=True) found a graph break ({first}). Code outside "
            "the graph runs eagerly, op by op: keep the whole computation in torch ops Dynamo "
            "can trace.") from None
    if not codes:
        raise CheckFailure(f"torch.compile({what}) made Inductor generate no code: does {what} "
                           "compute with torch ops (not disabled for Dynamo)?")
    generated, fallbacks = kernels_in(codes)
    return out, generated, fallbacks


def _describe(generated: list[str], fallbacks: list[str]) -> str:
    parts = []
    if generated:
        parts.append(f"{len(generated)} generated ({', '.join(generated)})")
    if fallbacks:
        parts.append(f"{len(fallbacks)} ATen fallback/extern call(s) ({', '.join(fallbacks)})")
    return " and ".join(parts) or "none"


def _output(got, x: torch.Tensor, what: str) -> torch.Tensor:
    plain_tensor(got, f"the value {what} returned")
    if got.shape != x.shape or got.dtype != x.dtype or got.device != x.device:
        raise CheckFailure(
            f"{what} returned a {got.dtype} tensor of shape {list(got.shape)} on {got.device} "
            f"for a {x.dtype} input of shape {list(x.shape)} on {x.device}; return the same "
            "shape, dtype and device as programs.unfused.")
    return got


def _same(got: torch.Tensor, x: torch.Tensor, what: str, label: str) -> None:
    want = programs.unfused(x)
    _output(got, x, what)
    if not torch.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=False):
        bad = ~torch.isclose(got, want, rtol=RTOL, atol=ATOL)
        row, col = (int(i) for i in bad.nonzero()[0])
        raise CheckFailure(
            f"on {label} (shape {list(x.shape)}), {what} differs from programs.unfused at "
            f"[{row}, {col}]: {got[row, col].item():.6g} instead of {want[row, col].item():.6g} "
            f"(row {row} of x spans {x[row].min().item():.4g} .. {x[row].max().item():.4g}; "
            f"{int(bad.sum())} of {bad.numel()} values differ). Keep the same math: a max and "
            "totals per row (dim 1), the clamp, the scale.")


def public_inputs(seed: int, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # (the first has rows spread wide enough for the clamp at 1e-4 to matter)
    scales = (6.0, 1.0, 1.0)
    return [(torch.randn(s, generator=g) * k).to(device)
            for s, k in zip(((4, 6), (16, 33), (3, 1)), scales)]


def hidden_inputs(seed: int, device: str) -> list[torch.Tensor]:
    """Odd shapes (n, d in 1..40); each row standard normal, or far above or below zero (exp of
    x minus a max taken over the wrong rows underflows there)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, 1), (1, rng.randint(2, 40)), (rng.randint(2, 40), 1)]
    shapes += [(rng.randint(1, 40), rng.randint(1, 40)) for _ in range(5)]
    out = []
    for n, d in shapes:
        rows = []
        for _ in range(n):
            kind = rng.choice(["normal", "high", "low"])
            scale, offset = {"normal": (1.0, 0.0),
                             "high": (rng.uniform(1, 10), rng.uniform(100, 300)),
                             "low": (rng.uniform(1, 10), -rng.uniform(100, 300))}[kind]
            rows.append(torch.randn(d, generator=g) * scale + offset)
        out.append(torch.stack(rows).to(device))
    return out


def verify_values(fn, inputs: list[torch.Tensor], what: str, label: str) -> None:
    for k, x in enumerate(inputs):
        _same(fn(x.clone()), x, what, f"{label} {k + 1}")


def verify_kernels(fn, x: torch.Tensor, what: str, where: str) -> None:
    """One Inductor compile of ``fn`` on ``x``: the output equals unfused's, and at most
    MAX_KERNELS kernels (generated plus fallbacks)."""
    with fresh_compiler():
        out, generated, fallbacks = compile_and_count(fn, x.clone(), what)
        _same(out, x, f"torch.compile({what})", "the compiled input")
        total = len(generated) + len(fallbacks)
        if total <= programs.MAX_KERNELS:
            return
        _, gen0, fb0 = compile_and_count(programs.unfused, x.clone(), "programs.unfused")
    raise CheckFailure(
        f"torch.compile({what}) on {where} runs {total} kernels: {_describe(generated, fallbacks)}"
        f"; at most {programs.MAX_KERNELS} are allowed (programs.unfused runs "
        f"{len(gen0) + len(fb0)}: {_describe(gen0, fb0)}). Each fallback is an ATen kernel "
        "Inductor cannot fuse, and it splits the generated code around it: write the same math "
        "with ops Inductor lowers itself (reductions over dim 1, pointwise ops).")


@check(EXERCISE)
def given_values(fused, ctx):
    """returns programs.unfused's values on the given inputs"""
    verify_values(fused, public_inputs(ctx.seed, "cpu"), "fused", "given input")


@check(EXERCISE)
def kernel_count(fused, ctx):
    """torch.compile(fused) runs at most programs.MAX_KERNELS kernels on CPU"""
    verify_kernels(fused, public_inputs(ctx.seed, "cpu")[1], "fused", "a CPU tensor")


@check(EXERCISE, hidden=True)
def hidden_values(fused, ctx):
    """returns unfused's values on odd shapes, large and negative rows"""
    verify_values(fused, hidden_inputs(ctx.seed, "cpu"), "fused", "hidden input")
