"""extensions.cpp-autograd: plausible wrong C++ sources fail (the reference and the stub:
test_exercise_contract.py)."""
from tests.conftest import assert_rejected, load_answer
from tests.labs.test_extensions_cpp_op import _edited

OP, AD = "extensions.cpp-op", "extensions.cpp-autograd"


def test_an_operator_without_an_autograd_kernel_fails_cpp_autograd():
    assert_rejected(AD, load_answer(OP), "no kernel of its own for the Autograd key")


def test_a_backward_that_forgets_the_chain_rule_through_tanh():
    answer = _edited(AD, "grads[0] * saved[0] * (1 - t * t)", "grads[0] * saved[0]")
    assert_rejected(AD, answer, "the gradient of y differs")
