"""extensions.cuda-op (needs a CUDA GPU and nvcc: skipped without them, with the reason): the
reference passes, and a CPU-only source (plausible: the CPU kernel, no CUDA registration)
fails."""
import pytest
import torch
from torch.utils import cpp_extension

from tests.conftest import assert_rejected, load_answer

OP = "extensions.cpp-op"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(cpp_extension.CUDA_HOME is None, reason="needs nvcc (the CUDA toolkit)")
def test_the_cuda_reference_passes_and_a_cpu_only_source_fails():
    from grader.checks import run_checks

    assert run_checks("extensions.cuda-op", load_answer("extensions.cuda-op"),
                      device="cuda").status == "passed"
    assert_rejected("extensions.cuda-op", load_answer(OP), "raised on CUDA tensors")
