"""export.dynamic-shapes: plausible wrong dynamic_shapes specs for Window fail, called directly
through run_checks. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import pytest
from torch.export import Dim

from tests.conftest import assert_rejected

EX = "export.dynamic-shapes"


def auto_everywhere(max_batch, max_seq):
    """Lets export infer everything: the ranges start at 2 and have no end."""
    a = Dim.AUTO
    return {"tokens": (a, a, Dim.STATIC), "mask": (a, a), "prev": (a, a, Dim.STATIC)}


def independent(max_batch, max_seq):
    """Gives prev's length a Dim of its own instead of deriving it from seq."""
    batch, seq = Dim("batch", min=1, max=max_batch), Dim("seq", min=2, max=max_seq)
    longer = Dim("longer", min=3, max=max_seq + 1)
    return {"tokens": (batch, seq, Dim.STATIC), "mask": (batch, seq),
            "prev": (batch, longer, Dim.STATIC)}


def no_maximum(max_batch, max_seq):
    batch, seq = Dim("batch", min=1), Dim("seq", min=2)
    return {"tokens": (batch, seq, Dim.STATIC), "mask": (batch, seq),
            "prev": (batch, seq + 1, Dim.STATIC)}


def static_batch(max_batch, max_seq):
    """Only seq varies: the example's batch is baked in."""
    seq = Dim("seq", min=2, max=max_seq)
    return {"tokens": (Dim.STATIC, seq, Dim.STATIC), "mask": (Dim.STATIC, seq),
            "prev": (Dim.STATIC, seq + 1, Dim.STATIC)}


def public_maxima(max_batch, max_seq):
    """Right for the public case only: 64 and 128 typed in."""
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=2, max=128)
    return {"tokens": (batch, seq, Dim.STATIC), "mask": (batch, seq),
            "prev": (batch, seq + 1, Dim.STATIC)}


@pytest.mark.parametrize("answer, phrase", [
    (auto_everywhere, "gives batch the range [2, int_oo] (ep.range_constraints), not [1, 64]"),
    (independent, "Constraints violated (longer)! - The values of longer"),
    (independent, "Suggested fixes: longer = seq + 1"),
    (no_maximum, "gives batch the range [1, int_oo] (ep.range_constraints), not [1, 64]"),
    (static_batch, "rejected batch 1, seq 2 (prev 3 long), inside the ranges batch 1..64"),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_typed_in_maxima_fail_on_a_hidden_case():
    v = assert_rejected(EX, public_maxima, "Give the batch Dim max=max_batch")
    assert v.message.startswith("hidden check 2/2"), v.message
