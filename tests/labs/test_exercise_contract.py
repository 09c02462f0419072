"""What every exercise of every lab must show: the reference answer passes its public and hidden
checks on two seeds (and the checks leave the global RNG alone), the released stub is reported
as the stub. The second seed is tests/test_labs_end_to_end.py's: it grades every reference
notebook, public and hidden checks, at seed 20261129; here they run at seed 1. Each lab's
tests/labs/test_<lab>_<slug>.py adds its plausible wrong answers.
Exercises that need what this machine lacks (a CUDA GPU) are skipped with the reason."""
import pytest
import torch

from grader.checks import run_checks
from grader.labs import lab_ids, load_lab
from tests.conftest import ROOT

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EXERCISES = [e.id for lab in lab_ids() if load_lab(lab).root == ROOT for e in load_lab(lab).exercises]


def _runnable(exercise_id: str) -> None:
    reason = load_lab(exercise_id.split(".", 1)[0]).exercise(exercise_id).unmet(DEVICE)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("seed", [1])
@pytest.mark.parametrize("exercise", EXERCISES)
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
