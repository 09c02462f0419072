"""export.cond: plausible wrong Gate classes fail, called directly through run_checks. Each is the
reference answer (rewritten with one method per part, so that one part can be overridden) with
one part changed. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import pytest
import torch
from torch import nn

from tests.conftest import assert_rejected

EX = "export.cond"


class Gate(nn.Module):
    """The reference answer, one method per part."""

    def __init__(self, width=8):
        super().__init__()
        self.up = nn.Linear(width, width)
        self.down = nn.Linear(width, width)

    def predicate(self, x):
        return x.sum() > 0

    def positive(self, x):
        return torch.relu(self.up(x))

    def other(self, x):
        return self.down(x) * 2

    def forward(self, x):
        return torch.cond(self.predicate(x), self.positive, self.other, (x,))


class PythonIf(Gate):
    """GateEager's if, kept."""

    def forward(self, x):
        if self.predicate(x):
            return self.positive(x)
        return self.other(x)


class BoolPredicate(Gate):
    """torch.cond with a Python bool: Dynamo turns it into a SymBool, non-strict cannot."""

    def predicate(self, x):
        return bool(x.sum() > 0)


class Swapped(Gate):
    def forward(self, x):
        return torch.cond(self.predicate(x), self.other, self.positive, (x,))


class Where(Gate):
    """Both branches computed, one picked elementwise: right numbers, no branch."""

    def forward(self, x):
        return torch.where(self.predicate(x), self.positive(x), self.other(x))


class GreaterOrEqual(Gate):
    """Differs from GateEager only when the sum is exactly 0."""

    def predicate(self, x):
        return x.sum() >= 0


@pytest.mark.parametrize("answer, phrase", [
    (PythonIf, "export(Gate(8), (x,), strict=True (TorchDynamo traces the bytecode)) raised "
               "Unsupported: Data-dependent branching"),
    (BoolPredicate, "export(Gate(8), (x,), strict=False (non-strict: Python runs forward on fake "
                    "tensors)) raised GuardOnDataDependentSymNode"),
    (Swapped, "Gate(8) run eagerly differs from GateEager for x of shape (4, 8)"),
    (Where, "has no torch.ops.higher_order.cond node (its ops: gt.Scalar, linear.default, "
            "mul.Tensor, relu.default, sum.default, where.self). It computes torch.where"),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_greater_or_equal_fails_on_a_sum_of_exactly_zero():
    v = assert_rejected(EX, GreaterOrEqual, "with x.sum() == 0 exactly (the else branch")
    assert v.message.startswith("hidden check 2/2"), v.message
