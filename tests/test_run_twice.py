"""Every cell can run twice: each reference notebook runs top to bottom, then every code cell
once more in order in the same kernel (a learner re-runs cells), with no error either time; a
cell that registers something (a backend, an operator, a kernel) can run again. For the labs
whose references are slowest (HEAVY: lab 4's compiles, lab 5's ranks, lab 6's AOTInductor and
ONNX exports, about 80 s twice over on two cores, lab 9's case runs), their releases run twice
instead: their answer cells then only define stubs, and their demo cells run as a learner first
meets them."""
import pytest

from grader.labs import load_lab
from tests.conftest import ROOT
from tests.test_run_all import HEAVY, LABS, run_all


@pytest.mark.parametrize("lab_id", LABS)
def test_every_cell_runs_twice(lab_id):
    lab = load_lab(lab_id)
    folder = "notebooks" if lab_id in HEAVY else "solutions"
    assert run_all(ROOT / folder / f"{lab.notebook}.ipynb", lab, 2) == []
