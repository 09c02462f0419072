"""Which lab a notebook is: its metadata, its cells (release ids, exercise ids), its file name,
whatever copying did to the name."""
import copy

import pytest

from grader import notebook
from grader.errors import GraderError
from grader.labs import lab_from_name, lab_of, plain_stem
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
