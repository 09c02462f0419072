"""Checks of ``compile.fusion``: ``fused(x)`` must return ``programs.unfused(x)``'s values
(allclose, rtol 1e-5, atol 1e-6; the oracle is ``unfused`` run eagerly by the judge) on the
given inputs and on seeded hidden ones (odd shapes, rows of large positive and negative values),
and ``torch.compile(fused, fullgraph=True)`` (Inductor) must emit at most
``programs.MAX_KERNELS`` kernels: the kernels the generated wrapper's ``call`` launches
(``cpp_fused_*`` on CPU, ``triton_*`` on CUDA, read from
``torch._inductor.utils.run_and_get_code``) plus the ATen fallback and extern calls it makes.
The probes :func:`labs.compile.probes.fused_outputs` and :func:`labs.compile.probes.fused_kernels`
call ``fused`` and compile it in the kernel and report its outputs and the kernels Inductor's
code launches; the judge compares the compiled output with eager ``unfused`` too. Cold Inductor
compiles cost seconds, so a grading compiles ``fused`` once (in the kernel), and ``unfused``
(in the judge) only to quote its count when the answer has too many.
:mod:`labs.compile.checks.fusion_gpu` runs the same checks on a CUDA tensor."""

from __future__ import annotations

import random

import torch

from grader.checks import CheckFailure, check, paired
from labs.compile import probes, programs

EXERCISE = "compile.fusion"
RTOL, ATOL = 1e-5, 1e-6
kernels_in = probes.kernels_in


def compile_and_count(fn, x: torch.Tensor, what: str):
    """Compile ``fn`` with Inductor (fullgraph) here, run it on ``x``; (output, generated,
    fallbacks). Raises CheckFailure on a graph break."""
    with probes.fresh_compiler():
        seen = probes.compiled_kernels(fn, x)
    _compiled(seen, what)
    return seen["output"]["value"], seen["generated"], seen["fallbacks"]


def _compiled(seen: dict, what: str) -> None:
    """What compiled_kernels saw: a graph break, or no kernel at all, is refused."""
    if "unsupported" in seen:
        raise CheckFailure(
            f"torch.compile({what}, fullgraph=True) found a graph break ({seen['unsupported']}). "
            "Code outside the graph runs eagerly, op by op: keep the whole computation in torch "
            "ops Dynamo can trace.")
    if not seen["codes"] or not seen["generated"] + seen["fallbacks"]:
        raise CheckFailure(f"torch.compile({what}) made Inductor generate no kernel: does {what} "
                           "compute with torch ops (not disabled for Dynamo)?")


def _describe(generated: list[str], fallbacks: list[str]) -> str:
    parts = []
    if generated:
        parts.append(f"{len(generated)} generated ({', '.join(generated)})")
    if fallbacks:
        parts.append(f"{len(fallbacks)} ATen fallback/extern call(s) ({', '.join(fallbacks)})")
    return " and ".join(parts) or "none"


def _output(seen: dict, x: torch.Tensor, device: str, what: str) -> torch.Tensor:
    """The output a probe reported (``{"output": returned, "device"}``), a plain tensor of
    ``x``'s shape and dtype on ``device``."""
    got = seen["output"]["value"]
    if type(got) is not torch.Tensor:
        raise CheckFailure(f"the value {what} returned has type {seen['output']['type']}, not a "
                           "Tensor.")
    if (got.shape != x.shape or got.dtype != x.dtype or seen["device"] is None
            or torch.device(seen["device"]).type != device):
        raise CheckFailure(
            f"{what} returned a {got.dtype} tensor of shape {list(got.shape)} on "
            f"{seen['device']} for a {x.dtype} input of shape {list(x.shape)} on {device}; "
            "return the same shape, dtype and device as programs.unfused.")
    return got


def _same(seen: dict, x: torch.Tensor, device: str, what: str, label: str) -> None:
    got = _output(seen, x, device, what)
    want = programs.unfused(x.to(device)).cpu()  # (eager, on the run's device: the oracle)
    if not torch.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=False):
        bad = ~torch.isclose(got, want, rtol=RTOL, atol=ATOL)
        row, col = (int(i) for i in bad.nonzero()[0])
        raise CheckFailure(
            f"on {label} (shape {list(x.shape)}), {what} differs from programs.unfused at "
            f"[{row}, {col}]: {got[row, col].item():.6g} instead of {want[row, col].item():.6g} "
            f"(row {row} of x spans {x[row].min().item():.4g} .. {x[row].max().item():.4g}; "
            f"{int(bad.sum())} of {bad.numel()} values differ). Keep the same math: a max and "
            "totals per row (dim 1), the clamp, the scale.")


def public_inputs(seed: int) -> list[torch.Tensor]:
    """The given inputs (CPU tensors: the probe moves them to the run's device)."""
    g = torch.Generator().manual_seed(seed)
    # (the first has rows spread wide enough for the clamp at 1e-4 to matter)
    scales = (6.0, 1.0, 1.0)
    return [torch.randn(s, generator=g) * k for s, k in zip(((4, 6), (16, 33), (3, 1)), scales)]


def hidden_inputs(seed: int) -> list[torch.Tensor]:
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
        out.append(torch.stack(rows))
    return out


def verify_values(fused, inputs: list[torch.Tensor], device: str, what: str,
                  label: str) -> None:
    """``fused`` (asked of the kernel, on ``device``) returns unfused's values on each input."""
    reply = fused.probe(probes.fused_outputs, inputs, device)
    for k, (x, seen) in enumerate(paired(inputs, reply, "inputs")):
        _same(seen, x, device, what, f"{label} {k + 1}")


def verify_kernels(fused, x: torch.Tensor, device: str, what: str, where: str) -> None:
    """One Inductor compile of ``fused`` on ``x`` (in the kernel): the output equals unfused's,
    and at most MAX_KERNELS kernels (generated plus fallbacks)."""
    seen = fused.probe(probes.fused_kernels, x, device)
    _compiled(seen, what)
    _same(seen, x, device, f"torch.compile({what})", "the compiled input")
    generated, fallbacks = seen["generated"], seen["fallbacks"]
    total = len(generated) + len(fallbacks)
    if total <= programs.MAX_KERNELS:
        return
    _, gen0, fb0 = compile_and_count(programs.unfused, x.to(device), "programs.unfused")
    raise CheckFailure(
        f"torch.compile({what}) on {where} runs {total} kernels: {_describe(generated, fallbacks)}"
        f"; at most {programs.MAX_KERNELS} are allowed (programs.unfused runs "
        f"{len(gen0) + len(fb0)}: {_describe(gen0, fb0)}). Each fallback is an ATen kernel "
        "Inductor cannot fuse, and it splits the generated code around it: write the same math "
        "with ops Inductor lowers itself (reductions over dim 1, pointwise ops).")


@check(EXERCISE)
def given_values(fused, ctx):
    """returns programs.unfused's values on the given inputs"""
    verify_values(fused, public_inputs(ctx.seed), "cpu", "fused", "given input")


@check(EXERCISE)
def kernel_count(fused, ctx):
    """torch.compile(fused) runs at most programs.MAX_KERNELS kernels on CPU"""
    verify_kernels(fused, public_inputs(ctx.seed)[1], "cpu", "fused", "a CPU tensor")


@check(EXERCISE, hidden=True)
def hidden_values(fused, ctx):
    """returns unfused's values on odd shapes, large and negative rows"""
    verify_values(fused, hidden_inputs(ctx.seed), "cpu", "fused", "hidden input")
