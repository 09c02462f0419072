"""Plausible wrong answers to compile.fusion and compile.fusion-gpu (the same contract on a CPU
and on a CUDA tensor), shared by their tests."""
import torch


def keeps_the_cumsum_of_e(x):
    """amax and the row sum fused, but the softmax's total still a cumsum: the fallback splits
    the generated code in two."""
    e = torch.exp(x - x.amax(dim=1, keepdim=True))
    p = e / torch.cumsum(e, dim=1)[:, -1:]
    return torch.clamp(p, min=1e-4) * x.sum(dim=1, keepdim=True)


def forgets_the_clamp(x):
    return torch.softmax(x, dim=1) * x.sum(dim=1, keepdim=True)


def max_of_the_whole_tensor(x):
    """x.max() instead of each row's max: the same in exact arithmetic, but a row far below the
    global max underflows to 0 / 0."""
    e = torch.exp(x - x.max())
    p = e / e.sum(dim=1, keepdim=True)
    return torch.clamp(p, min=1e-4) * x.sum(dim=1, keepdim=True)


def checks_for_overflow(x):
    """A data-dependent `if`: a graph break (fullgraph refuses it)."""
    rowmax = x.amax(dim=1, keepdim=True)
    if (x - rowmax).min() < -80:  # "exp would underflow": shift less
        rowmax = rowmax / 2
    e = torch.exp(x - rowmax)
    p = e / e.sum(dim=1, keepdim=True)
    return torch.clamp(p, min=1e-4) * x.sum(dim=1, keepdim=True)


@torch.library.custom_op("lab4_fusion_tests::row_sum", mutates_args=())
def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=1, keepdim=True)


@row_sum.register_fake
def _(x):
    return x.new_empty(x.shape[0], 1)


def totals_in_a_custom_op(x):
    """The row totals in a custom op (lab 1): Inductor cannot look inside a custom op, so each
    call is a fallback, and the pointwise code before and after it becomes separate kernels."""
    e = torch.exp(x - x.amax(dim=1, keepdim=True))
    return torch.clamp(e / row_sum(e), min=1e-4) * row_sum(x)
