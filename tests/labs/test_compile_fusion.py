"""compile.fusion: plausible wrong answers fail, called directly through run_checks. Each
wrong answer that reaches the kernel check costs an Inductor compile (seconds cold; Inductor's
on-disk FX graph cache makes a repeat cheap). The reference and the stub are tested for every
exercise in test_exercise_contract.py."""
import torch

import labs.compile.checks.fusion  # noqa: F401  (registers the checks)
from labs.compile import programs
from labs.compile.checks.fusion import compile_and_count, kernels_in
from tests.conftest import assert_rejected

EX = "compile.fusion"


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


def test_unfused_counts_as_measured():
    _, generated, fallbacks = compile_and_count(programs.unfused, torch.randn(5, 7), "unfused")
    assert len(generated) == 2 and all(k.startswith("cpp_fused_") for k in generated)
    assert sorted(fallbacks) == ["aten.cumsum.default"] * 2 + ["aten.sort.stable"]


def test_the_parser_reads_a_triton_wrapper():
    code = '''
triton_per_fused_amax_0 = async_compile.triton('triton_per_fused_amax_0', """...""")
class Runner:
    def call(self, args):
        arg0_1, = args
        with torch.cuda._DeviceGuard(0):
            buf0 = empty_strided_cuda((16, 1), (1, 16), torch.float32)
            stream0 = get_raw_stream(0)
            triton_per_fused_amax_0.run(arg0_1, buf0, 16, 33, stream=stream0)
            # torch.ops.aten.sort.stable in a comment is not a call
            buf1 = extern_kernels.mm(buf0, buf0)
        return (buf1, )
runner = Runner(partitions=[])
'''
    assert kernels_in([code]) == (["triton_per_fused_amax_0"], ["extern_kernels.mm"])


def test_unfused_itself_is_refused():
    v = assert_rejected(EX, programs.unfused, "runs 5 kernels")
    assert "aten.sort.stable" in v.message


def test_keeping_one_cumsum_is_refused():
    assert_rejected(EX, keeps_the_cumsum_of_e, "runs 3 kernels")


def test_custom_ops_are_counted_as_fallbacks():
    v = assert_rejected(EX, totals_in_a_custom_op, "lab4_fusion_tests.row_sum.default")
    assert "runs 4 kernels" in v.message, v.message


def test_forgetting_the_clamp_is_refused():
    v = assert_rejected(EX, forgets_the_clamp, "differs from programs.unfused")
    assert v.message.startswith("check 1/3")


def test_max_of_the_whole_tensor_is_refused_by_hidden_rows():
    v = assert_rejected(EX, max_of_the_whole_tensor, "nan instead of")
    assert v.message.startswith("hidden check 3/3")


def test_a_graph_break_is_refused():
    assert_rejected(EX, checks_for_overflow, "found a graph break")


def test_a_wrong_shape_is_refused():
    assert_rejected(EX, lambda x: programs.unfused(x)[:, :1], "return the same shape")
