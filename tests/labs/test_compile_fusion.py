"""compile.fusion: plausible wrong answers fail, called directly through run_checks. Each
wrong answer that reaches the kernel check costs an Inductor compile (seconds cold; Inductor's
on-disk FX graph cache makes a repeat cheap). The reference and the stub are tested for every
exercise in test_exercise_contract.py."""
import torch

import labs.compile.checks.fusion  # noqa: F401  (registers the checks)
from labs.compile import programs
from labs.compile.checks.fusion import compile_and_count, kernels_in
from tests.conftest import assert_rejected
from tests.labs._fusion_answers import (
    checks_for_overflow,
    forgets_the_clamp,
    keeps_the_cumsum_of_e,
    max_of_the_whole_tensor,
    totals_in_a_custom_op,
)

EX = "compile.fusion"


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
