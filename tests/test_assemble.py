"""Assembly: the submission is trusted for answers and added cells only."""
import copy

import nbformat.v4 as v4

from grader import notebook
from grader.judge.assemble import assemble
from grader.labs import load_lab
from tests.conftest import FIXTURES

RELEASE = notebook.read(FIXTURES / "notebooks" / "90_toy.ipynb")
LAB = load_lab("toy")


def _submission():
    return copy.deepcopy(RELEASE)


def _cell(nb, cell_id):
    return next(c for c in nb.cells if c.id == cell_id)


def _ids(nb):
    return [c.id for c in nb.cells]


def _run(sub, **kw):
    return assemble(RELEASE, sub, LAB, **kw)


def test_release_as_submission_runs_release_cells_with_grade_cells_for_self_checks():
    built = _run(_submission())
    assert _ids(built.nb) == ["grader-prologue", "intro", "parameters", "setup", "progress-top",
                              "add-md", "add-answer", "grade-toy-add", "mul-md", "mul-answer",
                              "grade-toy-mul", "gpu-md", "gpu-answer", "grade-toy-gpu", "outro",
                              "progress-end"]
    grade = _cell(built.nb, "grade-toy-add")
    assert grade.source == ("# toy.add is judged by the grader, in its own process: its probes "
                            "run here")
    assert "_begin()" in _cell(built.nb, "grader-prologue").source
    assert built.missing == [] and built.edited == []


def test_edited_release_cells_are_restored_and_reported():
    sub = _submission()
    _cell(sub, "setup").source = "check = lambda *a: None"
    _cell(sub, "intro").source = "# my notes"
    built = _run(sub)
    assert _cell(built.nb, "setup").source == _cell(RELEASE, "setup").source
    assert sorted(c.id for c in built.edited) == ["intro", "setup"]


def test_deleted_release_cells_come_back_and_are_noted():
    sub = _submission()
    sub.cells = [c for c in sub.cells if c.id not in ("setup", "mul-md")]
    built = _run(sub)
    assert "setup" in _ids(built.nb) and "mul-md" in _ids(built.nb)
    assert built.notes == ["2 cell(s) of the release were missing and were put back, first the "
                           f"code cell starting \"{_cell(RELEASE, 'setup').source.splitlines()[0]}\""]


def test_moved_release_cells_run_in_release_order_and_are_noted():
    sub = _submission()
    outro = _cell(sub, "outro")
    sub.cells.remove(outro)
    sub.cells.insert(0, outro)
    built = _run(sub)
    assert _ids(built.nb)[-2:] == ["outro", "progress-end"]
    assert len(built.notes) == 1 and built.notes[0].startswith("cells of the release were moved")


def test_duplicated_markdown_and_unknown_answer_cells_are_noted():
    sub = _submission()
    add = _cell(sub, "add-answer")
    first_try = copy.deepcopy(add)
    first_try.id, first_try.source = "first-try", "def add(a, b):\n    return a - b"
    sub.cells.insert(sub.cells.index(add), first_try)
    mul = _cell(sub, "mul-answer")
    sub.cells[sub.cells.index(mul)] = v4.new_markdown_cell(mul.source, id=mul.id,
                                                           metadata=mul.metadata)
    stray = copy.deepcopy(add)
    stray.id, stray.metadata["course"]["exercise"] = "stray", "toy.nope"
    sub.cells.append(stray)
    built = _run(sub)
    assert built.missing == ["toy.mul"] and built.markdown == ["toy.mul"]
    notes = " | ".join(built.notes)
    assert "toy.add has 2 answer cells; they ran in order, so the last, the code cell" in notes
    assert "1 answer cell(s) of toy.mul are markdown" in notes
    assert "1 answer cell(s) name exercise 'toy.nope', which lab toy does not have" in notes


def test_learner_cells_stay_where_they_stand_and_lose_grader_tags():
    sub = _submission()
    helper = v4.new_code_cell("def helper(a):\n    return a")
    helper.id, helper.metadata["tags"] = "my-helper", ["parameters", "mine"]
    sub.cells.insert(_ids(sub).index("add-md") + 1, helper)
    built = _run(sub)
    ids = _ids(built.nb)
    assert ids.index("add-md") + 1 == ids.index("my-helper")
    assert _cell(built.nb, "my-helper").metadata["tags"] == ["mine"]


def test_a_moved_answer_is_graded_after_it_is_defined():
    sub = _submission()
    answer = _cell(sub, "add-answer")
    sub.cells.remove(answer)
    sub.cells.insert(_ids(sub).index("outro"), answer)
    ids = _ids(_run(sub).nb)
    assert ids.index("add-answer") < ids.index("grade-toy-add")


def test_a_split_answer_keeps_both_parts_and_a_deleted_one_is_missing():
    sub = _submission()
    first = _cell(sub, "add-answer")
    second = copy.deepcopy(first)
    second.id, second.source = "add-answer-2", "ADD_TWO = 2"
    sub.cells.insert(_ids(sub).index("add-answer") + 1, second)
    sub.cells.remove(_cell(sub, "mul-answer"))
    built = _run(sub)
    ids = _ids(built.nb)
    assert ids.index("add-answer") < ids.index("add-answer-2") < ids.index("grade-toy-add")
    assert built.missing == ["toy.mul"]
    assert "mul-answer" not in ids and "grade-toy-mul" in ids  # still checked: a clear failure


def test_copied_cells_get_unique_ids_and_fake_check_roles_are_dropped():
    sub = _submission()
    copied = copy.deepcopy(_cell(sub, "add-check"))  # a copied self-check, new id
    copied.id = "copied-check"
    twin = copy.deepcopy(_cell(sub, "add-answer"))  # a pasted cell that kept its id
    sub.cells[5:5] = [copied, twin]
    built = _run(sub)
    assert len(set(_ids(built.nb))) == len(built.nb.cells)
    assert notebook.role(_cell(built.nb, "copied-check")) == "learner"  # plain learner code now
    assert sum(notebook.role(c) == "grade" for c in built.nb.cells) == 3


def test_a_duplicated_release_cell_edited_above_its_original_is_the_learner_s():
    """JupyterLab's copy and paste keeps the cell id: the edited copy, above the unchanged
    original, runs as the learner wrote it, and the original is not reported as edited."""
    sub = _submission()
    copy_ = copy.deepcopy(_cell(sub, "outro"))
    copy_.source = "def helper():\n    return 42"
    sub.cells.insert(sub.cells.index(_cell(sub, "outro")), copy_)
    built = _run(sub)
    sources = [c.source for c in built.nb.cells]
    assert "def helper():\n    return 42" in sources
    assert sources.index("def helper():\n    return 42") < sources.index('print("done")')
    assert built.edited == [] and len(set(_ids(built.nb))) == len(built.nb.cells)
    # edited below the original, the same; and with no unchanged original, the first is the
    # release cell (restored, reported) and the second the learner's
    sub.cells.remove(copy_)
    sub.cells.insert(sub.cells.index(_cell(sub, "outro")) + 1, copy_)
    assert "def helper():\n    return 42" in [c.source for c in _run(sub).nb.cells]
    _cell(sub, "outro").source = 'print("mine")'
    built = _run(sub)
    sources = [c.source for c in built.nb.cells]
    assert 'print("mine")' not in sources and "def helper():\n    return 42" in sources
    assert [c.id for c in built.edited] == ["outro"]


def test_a_duplicated_cell_read_from_a_file_keeps_its_id_for_assembly(tmp_path):
    """nbformat renames the later of two cells that share an id (JupyterLab's copy and paste
    keeps it): read() gives it back, so that the edited copy above the original is the
    learner's, as in memory, and nothing is reported as edited."""
    import json

    sub = json.loads(notebook.dumps(_submission()))
    outro = next(i for i, c in enumerate(sub["cells"]) if c["id"] == "outro")
    copy_ = copy.deepcopy(sub["cells"][outro])
    copy_["source"] = "def helper():\n    return 42"
    sub["cells"].insert(outro, copy_)
    path = tmp_path / "90_toy.ipynb"
    path.write_text(json.dumps(sub))
    read = notebook.read(path)
    assert [c.id for c in read.cells].count("outro") == 2
    built = _run(read)
    sources = [c.source for c in built.nb.cells]
    assert "def helper():\n    return 42" in sources and 'print("done")' in sources
    assert built.edited == [] and len(set(_ids(built.nb))) == len(built.nb.cells)


def test_skipped_exercises_neither_run_their_answers_nor_get_a_grade_cell():
    built = _run(_submission(), skipped={"toy.gpu": "needs cuda"})
    assert "grade-toy-gpu" not in _ids(built.nb) and "gpu-answer" not in _ids(built.nb)
    assert built.skipped == {"toy.gpu": "needs cuda"}


def test_cells_without_the_release_ids_are_matched_by_content_even_two_alike():
    assert [c.id for c in RELEASE.cells if c.source == 'progress("toy")'] == [
        "progress-top", "progress-end"]
    sub = _submission()
    for i, cell in enumerate(sub.cells):  # as read from nbformat 3 / 4.4: ids made up
        cell.id = f"cell-{i}"
    built = _run(sub)
    assert built.notes == [] and built.edited == [] and built.missing == []
    assert [c.source for c in built.nb.cells if notebook.role(c) != "grade"][1:] == \
        [c.source for c in RELEASE.cells if notebook.role(c) != "check"]


def test_answer_cells_that_lost_their_metadata_are_recognised_by_their_ids():
    sub = _submission()
    for cell in sub.cells:
        cell.metadata = {}  # an editor that keeps ids but drops metadata
    _cell(sub, "add-answer").source = "def add(a, b):\n    return a + b"
    built = _run(sub)
    assert built.missing == [] and built.edited == []
    answer = _cell(built.nb, "add-answer")
    assert notebook.role(answer) == "answer" and "return a + b" in answer.source
    assert built.notes == ["3 answer cell(s) had lost their metadata (some editors drop it); "
                           "they were recognised by their cell ids, or by the answer they define"]
    assert notebook.role(_cell(sub, "add-answer")) is None  # the submission is not modified


def test_cells_saved_with_windows_line_endings_are_not_edits(tmp_path):
    sub = _submission()
    for cell in sub.cells:
        cell.source = cell.source.replace("\n", "\r\n")
    path = tmp_path / "crlf.ipynb"
    notebook.write(sub, path)
    built = _run(notebook.read(path))
    assert built.edited == [] and built.notes == []


def test_without_ids_or_metadata_an_answer_cell_is_the_last_cell_defining_the_answer():
    sub = _submission()
    for i, cell in enumerate(sub.cells):
        cell.metadata, cell.id = {}, f"mine-{i}"
    _cell_source = {"add": "def add(a, b):\n    return a + b", "mul": "mul = lambda a, b: a * b"}
    for cell in sub.cells:
        for name, source in _cell_source.items():
            if f"NotImplementedError(\"toy.{name}\")" in cell.source:
                cell.source = source
    sub.cells.append(v4.new_code_cell("print(add(2, 3))", id="mine-scratch"))  # uses, not defines
    built = _run(sub)
    assert built.missing == ["toy.gpu"]  # its stub is the release's own cell: not an answer
    answers = {notebook.exercise_of(c): c.source for c in built.nb.cells
               if notebook.role(c) == "answer"}
    assert answers == {"toy.add": _cell_source["add"], "toy.mul": _cell_source["mul"]}
