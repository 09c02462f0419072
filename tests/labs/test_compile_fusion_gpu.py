"""compile.fusion-gpu: plausible wrong answers fail on a CUDA tensor (Triton kernels counted).

Without CUDA the exercise is skipped with its reason (and its checks, if run anyway, fail with
a message that says a GPU is needed); the tests that compile for the GPU are skipped here with
theirs. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import pytest
import torch

import labs.compile.checks.fusion_gpu  # noqa: F401  (registers the checks)
from grader.checks import run_checks
from grader.labs import load_lab
from labs.compile import programs
from labs.compile.checks.fusion import compile_and_count
from labs.compile.probes import fresh_compiler
from tests.labs._fusion_answers import (
    checks_for_overflow,
    forgets_the_clamp,
    max_of_the_whole_tensor,
    totals_in_a_custom_op,
)

EX = "compile.fusion-gpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the "
                                "checks count the Triton kernels Inductor generates for a CUDA "
                                "tensor")


def cuda(test):
    """Marks a test that needs CUDA: ``gpu`` (``make gpu-check`` runs these), skipped without."""
    return pytest.mark.gpu(needs_cuda(test))


def _rejected(answer, phrase: str, seed: int = 0):
    v = run_checks(EX, answer, seed=seed, device="cuda", hidden=True)
    assert v.status in ("failed", "error"), v.message
    assert phrase in v.message, (phrase, v.message)
    assert "def " not in v.message and "raise CheckFailure" not in v.message, v.message
    return v


def on_the_cpu(x):
    """Computes on the CPU and returns a CPU tensor for a CUDA input."""
    x = x.cpu()
    e = torch.exp(x - x.amax(dim=1, keepdim=True))
    return torch.clamp(e / e.sum(dim=1, keepdim=True), min=1e-4) * x.sum(dim=1, keepdim=True)


def test_the_exercise_is_skipped_without_cuda():
    reason = load_lab("compile").exercise(EX).unmet("cpu")
    assert reason and "cuda" in reason


def test_without_a_gpu_the_checks_say_so(reference):
    v = run_checks(EX, reference(EX), seed=0, device="cpu", hidden=True)
    assert v.status == "failed" and "needs a CUDA GPU" in v.message, v.message


@cuda
def test_the_reference_runs_few_triton_kernels(reference):
    x = torch.randn(16, 33, device="cuda")
    with fresh_compiler():
        out, generated, fallbacks = compile_and_count(reference(EX), x, "fused_gpu")
    assert generated and all(name.startswith("triton_") for name in generated), generated
    assert len(generated) + len(fallbacks) <= programs.MAX_KERNELS, (generated, fallbacks)
    torch.testing.assert_close(out, programs.unfused(x), rtol=1e-5, atol=1e-6)


@cuda
def test_unfused_is_judged_by_its_measured_count():
    x = torch.randn(16, 33, device="cuda")
    with fresh_compiler():
        _, generated, fallbacks = compile_and_count(programs.unfused, x, "unfused")
    v = run_checks(EX, programs.unfused, seed=0, device="cuda", hidden=True)
    too_many = len(generated) + len(fallbacks) > programs.MAX_KERNELS
    assert (v.status == "failed") == too_many, (generated, fallbacks, v.message)


@cuda
def test_custom_op_totals_are_refused():
    _rejected(totals_in_a_custom_op, "lab4_fusion_tests.row_sum.default")


@cuda
def test_forgetting_the_clamp_is_refused():
    _rejected(forgets_the_clamp, "differs from programs.unfused")


@cuda
def test_max_of_the_whole_tensor_is_refused_by_hidden_rows():
    v = _rejected(max_of_the_whole_tensor, "nan instead of")
    assert v.message.startswith("hidden check")


@cuda
def test_a_graph_break_is_refused():
    _rejected(checks_for_overflow, "found a graph break")


@cuda
def test_a_cpu_result_is_refused():
    _rejected(on_the_cpu, "on cpu for a torch.float32 input")
