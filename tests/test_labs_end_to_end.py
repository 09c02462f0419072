"""Every lab end to end, in real kernels: the reference notebook scores full marks and runs
without an error, and (lab 5's) the released notebook scores zero with every exercise naming
NotImplementedError (or skipped where this machine lacks what it needs), its demo cells running
on without an error.

The released notebook is graded whole for the lab whose narrative hands the learner's answers to
other processes (lab 5's forked ranks): for every lab, each released stub is run through its
checks by tests/labs/test_exercise_contract.py, hostile fixtures grade stubs in kernels
(tests/hostile/catalogue.py), and each release runs top to bottom (tests/test_run_all.py,
tests/test_run_twice.py); a whole-notebook grading of the other releases would cost CI about 20 s
each for little more."""
import shutil

import pytest

from grader import notebook
from grader.judge.grade import grade_notebook
from grader.labs import lab_ids, load_lab
from grader.release import release
from tests.conftest import ROOT

LABS = [lab for lab in lab_ids() if load_lab(lab).root == ROOT]
#: the labs whose released notebook is also graded whole (the stubs' verdicts, from real ranks)
STUBS_GRADED_WHOLE = ["distributed"]


def _grade(src, tmp_path):
    path = tmp_path / src.name
    shutil.copy(src, path)
    return grade_notebook(path, tmp_path / "out", device="cpu", seed=20261129)


def test_release_is_current():
    release(ROOT, check=True)


#: the labs that compile (AOTInductor, Inductor) first: a reference's grading writes the lab's warm
#: compiler cache, which every later kernel of that lab starts from (a fresh clone starts cold)
COMPILING_FIRST = sorted(LABS, key=lambda lab: lab not in ("export", "compile"))


@pytest.mark.parametrize("lab_id", COMPILING_FIRST)
def test_reference_solution_scores_full_marks_and_runs_clean(lab_id, tmp_path):
    lab = load_lab(lab_id)
    result = _grade(ROOT / "solutions" / f"{lab.notebook}.ipynb", tmp_path)
    runnable = {e.id: "passed" for e in lab.exercises if not e.unmet("cpu")}
    assert {e.id: e.status for e in result.exercises if e.status != "skipped"} == runnable, \
        [e.message for e in result.exercises if e.status not in ("passed", "skipped")]
    assert result.score == result.runnable_max_score
    # (the in-kernel verdicts of exercises still judged there are the grader's own)
    assert not [e.id for e in result.exercises if "displayed a verdict" in e.message]
    executed = notebook.read(tmp_path / "out" / f"{lab.notebook}.executed.ipynb")
    errors = [(c.id, o.get("ename")) for c in executed.cells if c.cell_type == "code"
              for o in c.outputs if o.get("output_type") == "error"]
    assert errors == []


@pytest.mark.parametrize("lab_id", STUBS_GRADED_WHOLE)
def test_released_notebook_scores_zero_naming_the_stub(lab_id, tmp_path):
    lab = load_lab(lab_id)
    result = _grade(ROOT / "notebooks" / f"{lab.notebook}.ipynb", tmp_path)
    assert result.score == 0 and result.error is None
    for e in result.exercises:
        if e.status == "skipped":
            continue
        assert e.status in ("failed", "error"), (e.id, e.status)
        assert "NotImplementedError" in e.message and e.id in e.message, (e.id, e.message)
    # Run All of the release goes on: a demo cell that needs an answer says what it will show
    executed = notebook.read(tmp_path / "out" / f"{lab.notebook}.executed.ipynb")
    errors = [(c.id, o.get("ename")) for c in executed.cells if c.cell_type == "code"
              for o in c.outputs if o.get("output_type") == "error"]
    assert errors == []
