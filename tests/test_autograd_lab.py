"""The autograd lab end to end: the reference notebook scores full marks, the released notebook
scores zero with every exercise naming NotImplementedError, and the release is current."""
import shutil


from grader import notebook
from grader.grade import grade_notebook
from grader.labs import load_lab
from grader.release import release
from tests.conftest import ROOT

LAB = load_lab("autograd")


def _grade(src, tmp_path):
    path = tmp_path / src.name
    shutil.copy(src, path)
    return grade_notebook(path, tmp_path / "out", device="cpu", seed=20261129)


def test_release_is_current():
    release(ROOT, check=True)


def test_reference_solution_scores_full_marks_and_runs_clean(tmp_path):
    result = _grade(ROOT / "solutions" / f"{LAB.notebook}.ipynb", tmp_path)
    assert {e.id: e.status for e in result.exercises} == {e.id: "passed" for e in LAB.exercises}, \
        [e.message for e in result.exercises if e.status != "passed"]
    assert result.score == result.max_score == LAB.max_score
    executed = notebook.read(tmp_path / "out" / f"{LAB.notebook}.executed.ipynb")
    errors = [(c.id, o.get("ename")) for c in executed.cells if c.cell_type == "code"
              for o in c.outputs if o.get("output_type") == "error"]
    assert errors == []


def test_released_notebook_scores_zero_naming_the_stub(tmp_path):
    result = _grade(ROOT / "notebooks" / f"{LAB.notebook}.ipynb", tmp_path)
    assert result.score == 0 and result.error is None
    for e in result.exercises:
        assert e.status in ("failed", "error"), (e.id, e.status)
        assert "NotImplementedError" in e.message and e.id in e.message, (e.id, e.message)
