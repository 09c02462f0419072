"""autograd.saved-tensor-hooks: plausible wrong answers fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected

EX = "autograd.saved-tensor-hooks"


# ------------------------------------------------------------------ plausible wrong answers
def never_restores_dtype(dtype=torch.bfloat16):
    """Packs in the small dtype but hands the small tensor back to backward."""
    return torch.autograd.graph.saved_tensors_hooks(
        lambda t: t.to(dtype) if t.is_floating_point() else t.detach(), lambda p: p)


def casts_integers_too(dtype=torch.bfloat16):
    """Compresses every saved tensor, indices included, and casts back on unpack."""
    return torch.autograd.graph.saved_tensors_hooks(
        lambda t: (t.to(dtype), t.dtype), lambda p: p[0].to(p[1]))


def compresses_nothing(dtype=torch.bfloat16):
    """A correct pair of hooks that does not compress."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda p: p)


def keeps_the_original_too(dtype=torch.bfloat16):
    """Stores the compressed copy AND the original (saves no memory)."""
    def pack(t):
        return (t.to(dtype), t.detach()) if t.is_floating_point() else (t.detach(), t.detach())
    return torch.autograd.graph.saved_tensors_hooks(pack, lambda p: p[1])


def recasts_narrow_floats(dtype=torch.bfloat16):
    """Casts every floating tensor, float16 ones included, to dtype."""
    def pack(t):
        return (t.to(dtype), t.dtype, t.device) if t.is_floating_point() else t.detach()

    def unpack(p):
        return p[0].to(device=p[2], dtype=p[1]) if isinstance(p, tuple) else p
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def returns_the_pair(dtype=torch.bfloat16):
    """Returns (pack, unpack) instead of a saved_tensors_hooks object."""
    return (lambda t: (t.to(dtype), t.dtype), lambda p: p[0].to(p[1]))


def forgets_the_device(dtype=torch.bfloat16):
    """Stores on the CPU and leaves it there (invisible on CPU runs, so it must not break them)."""
    def pack(t):
        return (t.to("cpu", dtype), t.dtype) if t.is_floating_point() and t.element_size() > 2 \
            else t.detach()

    def unpack(p):
        return p[0].to(p[1]) if isinstance(p, tuple) else p
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


@pytest.mark.parametrize("wrong", [never_restores_dtype, casts_integers_too, compresses_nothing,
                                   keeps_the_original_too, recasts_narrow_floats, returns_the_pair])
def test_wrong_answers_fail(wrong):
    assert_rejected(EX, wrong)


def test_a_cpu_only_answer_passes_on_cpu():
    # on a CPU run the device is never lost; the same checks on a CUDA run would catch it
    assert run_checks(EX, forgets_the_device, seed=0, hidden=True).status == "passed"


def test_integer_casting_is_only_caught_by_the_hidden_checks():
    assert run_checks(EX, casts_integers_too, seed=0, hidden=False).status == "passed"
    v = run_checks(EX, casts_integers_too, seed=0, hidden=True)
    assert v.status == "failed" and v.message.startswith("hidden check")
