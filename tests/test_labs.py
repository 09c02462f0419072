"""Which lab a notebook is: its metadata, its cells (release ids, exercise ids), its file name,
whatever copying did to the name."""
import copy

import pytest

from grader import notebook
from grader.errors import GraderError
from grader import labs
from grader.labs import lab_from_name, lab_ids, lab_of, load_hints, load_lab, plain_stem
from tests.conftest import FIXTURES, ROOT

TOY = notebook.read(FIXTURES / "notebooks" / "90_toy.ipynb")
AUTOGRAD = notebook.read(ROOT / "notebooks" / "02_autograd.ipynb")


def _bare(nb, keep_ids=True, keep_cell_metadata=False):
    """``nb`` without its notebook metadata (and, as asked, its cell ids and cell metadata)."""
    nb = copy.deepcopy(nb)
    nb.metadata = {}
    for i, cell in enumerate(nb.cells):
        cell.id = cell.id if keep_ids else f"cell-{i}"
        cell.metadata = cell.metadata if keep_cell_metadata else {}
    return nb


@pytest.mark.parametrize("stem, plain", [
    ("02_autograd", "02_autograd"), ("02_autograd-Copy1", "02_autograd"),
    ("Copy of 02_autograd (2)", "02_autograd"), ("Copy of Copy of 02_autograd", "02_autograd"),
    ("alice_02_autograd copy 2", "alice_02_autograd"), ("02_autograd (1)-Copy2", "02_autograd")])
def test_copy_marks_are_removed_from_a_stem(stem, plain):
    assert plain_stem(stem) == plain


@pytest.mark.parametrize("name, lab", [
    ("alice_02_autograd.ipynb", "autograd"), ("02_autograd-Copy1.ipynb", "autograd"),
    ("Copy of 02_autograd (2).ipynb", "autograd"), ("Bob Lee - autograd.ipynb", "autograd"),
    ("homework.ipynb", None), ("autograd_and_dispatcher.ipynb", None),  # none, or two: no lab
    ("redispatcher.ipynb", None)])
def test_the_file_name_names_a_lab_as_a_word(name, lab):
    assert lab_from_name(name) == lab


def test_metadata_says_first_then_release_ids_then_exercise_ids_then_the_name():
    assert lab_of(AUTOGRAD, "01_dispatcher.ipynb") == "autograd"  # metadata
    assert lab_of(_bare(AUTOGRAD), "homework.ipynb") == "autograd"  # its cells' release ids
    assert lab_of(_bare(TOY, keep_ids=False, keep_cell_metadata=True), "x.ipynb") == "toy"
    assert lab_of(_bare(TOY, keep_ids=False), "alice_90_toy-Copy1.ipynb") == "toy"  # the name
    with pytest.raises(GraderError, match="cannot tell which lab this is"):
        lab_of(_bare(TOY, keep_ids=False), "homework.ipynb")


def test_a_few_shared_ids_are_not_enough_to_name_a_lab():
    nb = _bare(AUTOGRAD, keep_ids=False)
    nb.cells[0].id, nb.cells[1].id = "a-s1-title", "a-s1-edges"  # two of autograd's own ids
    with pytest.raises(GraderError):
        lab_of(nb, "homework.ipynb")


@pytest.mark.parametrize("lab_id", [lab for lab in lab_ids() if lab != "toy"])
def test_every_exercise_of_a_course_lab_has_two_or_three_hints(lab_id):
    hints = load_hints(lab_id)
    assert set(hints) == {e.id for e in load_lab(lab_id).exercises}
    assert all(len(h) in (2, 3) for h in hints.values())


@pytest.mark.parametrize("text, why", [
    ('"toy.nope" = ["a", "b"]', "'toy.nope' is not an exercise of lab 'toy'"),
    ('"toy.add" = ["only one"]', "'toy.add' needs a list of 2-3 non-empty strings"),
    ('"toy.add" = ["a", " "]', "needs a list of 2-3 non-empty strings"),
    ('"toy.add" = [', "malformed hints"),
])
def test_a_malformed_hints_file_is_refused_with_the_reason(tmp_path, monkeypatch, text, why):
    table = tmp_path / "toy" / "lab.toml"
    table.parent.mkdir()
    table.write_text((FIXTURES / "labs" / "toy" / "lab.toml").read_text())
    (table.parent / "hints.toml").write_text(text)
    monkeypatch.setattr(labs, "_tables", lambda: {"toy": table})
    load_hints.cache_clear()
    try:
        with pytest.raises(GraderError, match=why):
            load_hints("toy")
    finally:
        load_hints.cache_clear()


def test_an_exercise_that_builds_cuda_needs_nvcc(monkeypatch):
    from torch.utils import cpp_extension

    from grader.labs import Exercise

    exercise = Exercise("x.y", "t", "a", 1, requires=("cpu", "nvcc"))
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert "needs nvcc" in exercise.unmet("cpu")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    assert exercise.unmet("cpu") is None
