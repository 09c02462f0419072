"""Release: solutions -> learner notebooks (markers, errors, idempotence, --check)."""
import shutil

import pytest

from grader import notebook
from grader.errors import ReleaseError, ReleaseOutOfDate
from grader.release import release, release_notebook, stub_source
from tests.conftest import FIXTURES, ROOT

TOY = FIXTURES / "solutions" / "90_toy.ipynb"


def test_stub_keeps_code_outside_markers_and_indents_the_stub():
    src = "def f(x):\n    '''doc'''\n    # BEGIN SOLUTION\n    y = x + 1\n    return y\n    # END SOLUTION\n"
    assert stub_source(src, "toy.add", "here") == (
        "def f(x):\n    '''doc'''\n    raise NotImplementedError(\"toy.add\")")


def test_every_block_of_a_cell_is_stubbed():
    src = ("class A:\n    def f(self):\n        # BEGIN SOLUTION\n        return 1\n        # END SOLUTION\n"
           "    def g(self):\n        # BEGIN SOLUTION\n        return 2\n        # END SOLUTION")
    out = stub_source(src, "x.y", "here")
    assert out.count('raise NotImplementedError("x.y")') == 2 and "return" not in out


@pytest.mark.parametrize("src, words", [
    ("# BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n# END SOLUTION\n", "has no BEGIN"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "nested"),
])
def test_bad_markers_are_clear_errors(src, words):
    with pytest.raises(ReleaseError, match=words) as info:
        stub_source(src, "toy.add", "sol.ipynb: cell 'c'")
    assert "sol.ipynb: cell 'c'" in str(info.value)


def test_release_clears_answers_and_outputs_and_keeps_the_rest():
    nb = notebook.read(TOY)
    nb.cells[4].outputs = [{"output_type": "stream", "name": "stdout", "text": "hi"}]
    nb.cells[4].execution_count = 3
    out = release_notebook(nb, "90_toy.ipynb")
    answer = next(c for c in out.cells if notebook.exercise_of(c) == "toy.add"
                  and notebook.role(c) == "answer")
    assert answer.source == 'def add(a, b):\n    raise NotImplementedError("toy.add")'
    assert all(c.get("outputs", []) == [] and c.get("execution_count") is None
               for c in out.cells if c.cell_type == "code")
    assert [c.id for c in out.cells] == [c.id for c in nb.cells]
    assert [c.source for c in out.cells if notebook.role(c) != "answer"] == \
        [c.source for c in nb.cells if notebook.role(c) != "answer"]
    assert release_notebook(out, "again") == out  # releasing a release changes nothing


def test_markers_outside_an_answer_cell_are_refused():
    nb = notebook.read(TOY)
    nb.cells[-1].source = "# BEGIN SOLUTION\nx = 1\n# END SOLUTION"
    with pytest.raises(ReleaseError, match="only allowed in answer code cells"):
        release_notebook(nb, "90_toy.ipynb")


def test_every_exercise_needs_one_answer_and_one_check_cell():
    nb = notebook.read(TOY)
    nb.cells = [c for c in nb.cells if not (notebook.role(c) == "check"
                                            and notebook.exercise_of(c) == "toy.mul")]
    with pytest.raises(ReleaseError, match="toy.mul needs exactly one check cell, found 0"):
        release_notebook(nb, "90_toy.ipynb")


def test_check_detects_a_stale_or_orphan_release(tmp_path):
    root = tmp_path / "course"
    shutil.copytree(FIXTURES / "solutions", root / "solutions")
    release(root)
    release(root, check=True)  # up to date: no error
    sol = notebook.read(root / "solutions" / "90_toy.ipynb")
    sol.cells[0].source += "\nA new sentence."
    notebook.write(sol, root / "solutions" / "90_toy.ipynb")
    with pytest.raises(ReleaseOutOfDate, match="90_toy.ipynb"):
        release(root, check=True)
    release(root)
    (root / "notebooks" / "99_orphan.ipynb").write_text("{}")
    with pytest.raises(ReleaseOutOfDate, match="99_orphan.ipynb"):
        release(root, check=True)


def test_committed_fixture_release_is_current():
    release(FIXTURES, check=True)


def test_release_notebooks_name_the_course_kernel_so_jupyterlab_rewrites_nothing():
    """JupyterLab sets a notebook's kernelspec to its kernel's on open (a change to save): the
    release carries the course kernel's own, the one `grader lab` installs."""
    from grader.lab import display_name
    from grader.results import PINNED_TORCH, installed_torch, is_pinned_torch

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        spec = notebook.read(path).metadata["kernelspec"]
        assert spec == {"display_name": f"PyTorch internals (torch {PINNED_TORCH})",
                        "language": "python", "name": "python3"}, path.name
        if is_pinned_torch(installed_torch()):
            assert spec["display_name"] == display_name()
