"""Checks of ``compile.fusion-gpu`` (needs a CUDA GPU): ``fused_gpu(x)`` on a CUDA tensor must
return ``programs.unfused(x)``'s values (run eagerly on the same device at check time) on the
given and seeded hidden inputs, and ``torch.compile(fused_gpu, fullgraph=True)`` must run at most
``programs.MAX_KERNELS`` kernels: the Triton kernels (``triton_*``) the generated wrapper
launches plus its ATen fallback and extern calls (read from
``torch._inductor.utils.run_and_get_code``, one Inductor compile per grading, in the kernel:
:func:`labs.compile.probes.fused_kernels`). The same judges as :mod:`labs.compile.checks.fusion`,
on the GPU: the inputs are drawn on the CPU and moved to the GPU by the probe, which reports the
outputs' device; eager ``unfused`` runs in the judge."""

from __future__ import annotations

import torch

from grader.checks import CheckFailure, check
from labs.compile.checks.fusion import (
    hidden_inputs,
    public_inputs,
    verify_kernels,
    verify_values,
)

EXERCISE = "compile.fusion-gpu"


def _device(ctx) -> str:
    if ctx.device != "cuda" or not torch.cuda.is_available():
        raise CheckFailure(
            "compile.fusion-gpu needs a CUDA GPU, and this run has none (device "
            f"{ctx.device!r}, torch.cuda.is_available() is {torch.cuda.is_available()}): run "
            "it on a machine with a GPU.")
    return "cuda"


@check(EXERCISE)
def given_values(fused_gpu, ctx):
    """returns programs.unfused's values on the given CUDA inputs"""
    verify_values(fused_gpu, public_inputs(ctx.seed), _device(ctx), "fused_gpu", "given input")


@check(EXERCISE)
def kernel_count(fused_gpu, ctx):
    """torch.compile(fused_gpu) runs at most programs.MAX_KERNELS kernels on the GPU"""
    verify_kernels(fused_gpu, public_inputs(ctx.seed)[1], _device(ctx), "fused_gpu",
                   "a CUDA tensor")


@check(EXERCISE, hidden=True)
def hidden_values(fused_gpu, ctx):
    """returns unfused's values on odd shapes, large and negative rows, on the GPU"""
    verify_values(fused_gpu, hidden_inputs(ctx.seed), _device(ctx), "fused_gpu",
                  "hidden input")
