"""What every exercise of every lab must show: the reference answer passes its public and hidden
checks, the released stub is reported as the stub, and a test file of plausible wrong answers
(tests/labs/test_<lab>_<slug>.py) exists.

The references of the exercises a CPU can run are graded in a real kernel by
tests/test_labs_end_to_end.py (the whole solution notebook, public and hidden checks); here run
the references of the exercises that need more than a CPU (a CUDA GPU), which that test, grading
on the CPU, skips; where this machine lacks what they need they are skipped with the reason.
(That checks leave the learner's RNG alone is tests/test_checks.py's.)"""
import pytest
import torch

from grader.kernel import probe
from grader.checks import LocalAnswer, run_checks
from grader.labs import lab_ids, load_lab
from tests.conftest import ROOT

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EXERCISES = [e.id for lab in lab_ids() if load_lab(lab).root == ROOT for e in load_lab(lab).exercises]
BEYOND_CPU = [ex for ex in EXERCISES
              if load_lab(ex.split(".", 1)[0]).exercise(ex).unmet("cpu")]


def _runnable(exercise_id: str) -> None:
    reason = load_lab(exercise_id.split(".", 1)[0]).exercise(exercise_id).unmet(DEVICE)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("exercise", [pytest.param(ex, marks=pytest.mark.gpu)
                                      for ex in BEYOND_CPU])
def test_reference_passes_public_and_hidden_checks(reference, exercise, seed):
    _runnable(exercise)
    answer = reference(exercise)  # (its notebook's setup seeds the RNG)
    state = torch.get_rng_state()
    v = run_checks(exercise, answer, seed=seed, device=DEVICE, hidden=True)
    assert v.status == "passed", v.message
    assert torch.equal(torch.get_rng_state(), state), "the checks changed the global RNG"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_stub_is_reported_as_the_stub(stub, exercise):
    _runnable(exercise)
    v = run_checks(exercise, stub(exercise), seed=0, device=DEVICE, hidden=True)
    assert v.status == "error" and f"NotImplementedError: {exercise} is still the stub" in v.message


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_exercise_has_tests_of_wrong_answers(exercise):
    lab, slug = exercise.split(".", 1)
    path = f"tests/labs/test_{lab}_{slug.replace('-', '_')}.py"
    assert (ROOT / path).is_file(), f"{path} is missing"


def _emptied(value):
    """``value`` with every list and tuple in it emptied (what a kernel that replaced a probe
    can send back)."""
    if type(value) in (list, tuple):
        return type(value)()
    if type(value) is dict:
        return {k: _emptied(v) for k, v in value.items()}
    return value


def _shortened(value):
    """``value`` with the last item of every list and tuple in it dropped."""
    if type(value) in (list, tuple):
        return type(value)(_shortened(v) for v in value[:-1])
    if type(value) is dict:
        return {k: _shortened(v) for k, v in value.items()}
    return value


class _Tampered(LocalAnswer):
    """The reference answer behind a kernel that rewrites every probe's reply."""

    def __init__(self, obj, exercise_id, seed, rewrite):
        super().__init__(obj, exercise_id, seed)
        self.rewrite, self.changed = rewrite, False

    def send(self, probe_name, args, kwargs) -> bytes:
        reply = probe.decode(super().send(probe_name, args, kwargs))
        if "value" in reply:
            new = self.rewrite(reply["value"])
            self.changed |= probe.encode(new) != probe.encode(reply["value"])
            reply["value"] = new
        return probe.encode(reply)


@pytest.mark.parametrize("rewrite", [_emptied, _shortened])
@pytest.mark.parametrize("exercise", EXERCISES)
def test_a_reply_the_kernel_empties_or_shortens_never_passes(reference, exercise, rewrite):
    """A kernel can replace any probe, so a judge must check that a reply covers every case it
    asked about: a reply with its lists emptied or shortened (the reference's own, otherwise)
    must not pass."""
    _runnable(exercise)
    answer = _Tampered(reference(exercise), exercise, 0, rewrite)
    v = run_checks(exercise, answer, seed=0, device=DEVICE, hidden=True)
    if not answer.changed:
        pytest.skip("no reply of this exercise holds a list or tuple to empty or shorten")
    assert v.status != "passed", v.message
