"""Checks of ``extensions.cuda-op`` (needs a CUDA GPU): ``mul_tanh_cuda_source()``, which returns a
CUDA source (built by nvcc through torch.utils.cpp_extension) that defines ``mul_tanh(Tensor x,
Tensor y) -> Tensor`` with a CUDA kernel (``TORCH_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CUDA,
m)``): a ``__global__`` function launched on the current stream over the elements.

Oracle: ``x * torch.tanh(y)`` on the CPU, computed here. Public: float32 inputs. Hidden
(seeded): float64, non-contiguous and empty inputs, and a size that is not a multiple of the
block size."""
from __future__ import annotations

from grader.checks import CheckFailure, check
from labs.extensions import probes
from labs.extensions.checks._common import built, first_lines, results, tensor

EXERCISE = "extensions.cuda-op"


def _judge(source, pairs) -> None:
    import torch

    seen = built(source.probe(probes.cuda_op, [list(p) for p in pairs]), EXERCISE, "mul_tanh")
    found = results(seen, pairs)
    for (x, y), got in zip(pairs, found):
        where = f"x {tuple(x.shape)} {x.dtype}" + ("" if x.is_contiguous() else " (strided)")
        if "error" in got:
            raise CheckFailure(f"mul_tanh raised on CUDA tensors ({where}): "
                               f"{first_lines(got['error']['text'])}")
        if got.get("device") != "cuda":
            raise CheckFailure(f"for CUDA inputs ({where}) mul_tanh returned a tensor on "
                               f"{got.get('device')}: allocate the output like x.")
        out, want = tensor(got["out"], "mul_tanh's output"), x * torch.tanh(y)
        if out.shape != want.shape or out.dtype != want.dtype or not torch.allclose(
                out, want, rtol=1e-5, atol=1e-6):
            raise CheckFailure(f"for {where} the CUDA kernel's output differs from x * tanh(y) "
                               "on the CPU.")


@check(EXERCISE)
def float32_on_the_gpu(mul_tanh_cuda_source, ctx):
    """float32 inputs, against x * tanh(y) on the CPU"""
    import torch

    g = ctx.generator()
    _judge(mul_tanh_cuda_source, [(torch.randn(64, 33, generator=g),
                                   torch.randn(64, 33, generator=g))])


@check(EXERCISE, hidden=True)
def dtypes_strides_and_sizes(mul_tanh_cuda_source, ctx):
    """float64, non-contiguous, empty, and an odd number of elements"""
    import torch

    g = ctx.generator(1)
    n = int(torch.randint(1000, 5000, (1,), generator=g))
    _judge(mul_tanh_cuda_source, [
        (torch.randn(n, generator=g, dtype=torch.float64),
         torch.randn(n, generator=g, dtype=torch.float64)),
        (torch.randn(40, 30, generator=g).t(), torch.randn(30, 40, generator=g)),
        (torch.randn(0, 5, generator=g), torch.randn(0, 5, generator=g))])
