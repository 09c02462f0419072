"""Grading whole notebooks of the toy lab in real kernels: one behaviour per test, read as
"given this submission, this status and this message"."""
import copy
import json
import os
import py_compile
import shutil
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest

from grader import notebook
from grader.cli import main
from grader.judge.grade import grade_notebook
from grader.judge.sandbox import keep_warm_cache
from tests.conftest import FIXTURES, ROOT

RELEASE = notebook.read(FIXTURES / "notebooks" / "90_toy.ipynb")
SCHEMA = json.loads((ROOT / "grader" / "result.schema.json").read_text())
ADD = "def add(a, b):\n    return a + b"
MUL = "def mul(a, b):\n    return a * b"


def submit(tmp_path, name="sub", **answers):
    """Write a toy submission whose answer cells (by exercise slug) have the given sources."""
    nb = copy.deepcopy(RELEASE)
    for cell in nb.cells:
        slug = (notebook.exercise_of(cell) or "").removeprefix("toy.")
        if notebook.role(cell) == "answer" and slug in answers:
            cell.source = answers[slug]
    path = tmp_path / f"{name}.ipynb"
    notebook.write(nb, path)
    return path


def grade(path, **kw):
    result = grade_notebook(path, path.parent / "out", device="cpu", seed=11, **kw)
    data = json.loads((path.parent / "out" / f"{path.stem}.json").read_text())
    jsonschema.validate(data, SCHEMA)
    assert len(data.pop("digest")) == 64 and data == result.to_dict()
    return {e.id: e for e in result.exercises}, result


def test_reference_scores_full_marks_over_what_can_run(tmp_path):
    path = tmp_path / "90_toy.ipynb"
    shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", path)
    ex, result = grade(path)
    assert ex["toy.add"].status == ex["toy.mul"].status == "passed"
    assert ex["toy.gpu"].status == "skipped" and "needs cuda" in ex["toy.gpu"].message
    assert (result.score, result.runnable_max_score, result.max_score) == (3, 3, 4)
    assert result.environment.seed == 11 and result.error is None


def test_a_kernel_starts_from_the_warm_cache_and_only_the_reference_writes_it(tmp_path,
                                                                             monkeypatch):
    from grader.judge import grade as grade_module

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "seeded").write_text("compiled by the reference")
    monkeypatch.setattr(grade_module, "warm_cache_dir", lambda lab: warm)
    kept = []
    monkeypatch.setattr(grade_module, "keep_warm_cache",
                        lambda home, to: kept.append(to) or keep_warm_cache(home, to))
    plant = ("import os\ncache = os.environ['TORCHINDUCTOR_CACHE_DIR']\n"
             "print('SEEN', os.environ['OMP_NUM_THREADS'], "
             "os.path.exists(os.path.join(cache, 'seeded')))\n"
             "open(os.path.join(cache, 'planted'), 'w').write('x')\n" + ADD)
    ex, _ = grade(submit(tmp_path, add=plant, mul=MUL), threads=1)
    executed = (tmp_path / "out" / "sub.executed.ipynb").read_text()
    assert ex["toy.add"].status == "passed" and "SEEN 1 True" in executed
    assert sorted(p.name for p in warm.iterdir()) == ["seeded"] and kept == []  # not kept
    path = tmp_path / "90_toy.ipynb"
    shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", path)
    grade(path)
    assert kept == [warm]  # the reference's run adds what its kernel compiled


def test_the_executed_notebook_is_saved_now_and_then_and_in_full_at_the_end(tmp_path,
                                                                           monkeypatch):
    import papermill.engines

    from grader.judge import execute

    saves, write = [], papermill.engines.write_ipynb
    monkeypatch.setattr(papermill.engines, "write_ipynb",
                        lambda nb, path: (saves.append(path), write(nb, path)))
    monkeypatch.setattr(execute, "SAVE_EVERY_S", 3600.0)
    path = tmp_path / "90_toy.ipynb"
    shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", path)
    ex, _ = grade(path)
    assert len(saves) == 2  # when it starts, and when it ends (not before and after each cell)
    executed = notebook.read(tmp_path / "out" / "90_toy.executed.ipynb")
    assert all(c.get("execution_count") for c in executed.cells if c.cell_type == "code")


def test_stubs_are_errors_naming_not_implemented(tmp_path):
    ex, result = grade(submit(tmp_path))
    assert result.score == 0
    for eid in ("toy.add", "toy.mul"):
        assert ex[eid].status == "error"
        assert "NotImplementedError" in ex[eid].message and "still the stub" in ex[eid].message


def test_a_wrong_answer_fails_with_the_input_that_shows_it(tmp_path):
    ex, _ = grade(submit(tmp_path, add="def add(a, b):\n    return a - b", mul=MUL))
    assert ex["toy.add"].status == "failed"
    assert "expected" in ex["toy.add"].message and "seed 11" in ex["toy.add"].message
    assert ex["toy.mul"].status == "passed"


def test_a_failure_names_the_settings_the_notebook_changed_in_its_kernel(tmp_path):
    wrong = ("import os\nimport torch\nos.environ['GLOO_SOCKET_IFNAME'] = 'en0'\n"
             "torch.set_grad_enabled(False)\n\n\ndef add(a, b):\n    return a - b")
    ex, _ = grade(submit(tmp_path, add=wrong, mul=MUL))
    assert ex["toy.add"].status == "failed", ex["toy.add"].message
    assert "GLOO_SOCKET_IFNAME='en0' (unset when the kernel started)" in ex["toy.add"].message
    assert "grad mode is off" in ex["toy.add"].message
    assert ex["toy.mul"].status == "passed" and "Note" not in ex["toy.mul"].message


def test_an_answer_cell_that_raises_costs_only_its_exercise(tmp_path):
    ex, _ = grade(submit(tmp_path, add="import nonexistent_module\n" + ADD, mul=MUL))
    assert ex["toy.add"].status == "error"
    assert "ModuleNotFoundError" in ex["toy.add"].message
    assert ex["toy.mul"].status == "passed"


def test_a_hang_is_interrupted_at_the_time_limit_and_grading_goes_on(tmp_path):
    ex, _ = grade(submit(tmp_path, add="import time\ntime.sleep(60)\n" + ADD, mul=MUL), timeout=3)
    assert ex["toy.add"].status == "timeout" and "time limit of 3 s" in ex["toy.add"].message
    assert ex["toy.add"].duration_s < 10
    assert ex["toy.mul"].status == "passed"


def test_a_hang_that_swallows_the_interrupt_gets_a_fresh_kernel(tmp_path):
    stubborn = ("while True:\n    try:\n        __import__('time').sleep(1)\n"
                "    except KeyboardInterrupt:\n        pass\n")
    ex, _ = grade(submit(tmp_path, add=stubborn + ADD, mul=MUL), timeout=3)
    assert ex["toy.add"].status == "timeout" and "replaced" in ex["toy.add"].message
    assert ex["toy.mul"].status == "passed"


def test_a_dead_kernel_costs_only_its_exercise(tmp_path):
    ex, result = grade(submit(tmp_path, add="import os\nos._exit(1)", mul=MUL))
    assert ex["toy.add"].status == "crashed" and "kernel died" in ex["toy.add"].message
    assert ex["toy.mul"].status == "passed"
    assert result.score == 2


def test_a_crash_in_a_later_exercise_keeps_the_earlier_verdicts(tmp_path):
    ex, _ = grade(submit(tmp_path, add=ADD, mul="import os\nos._exit(3)"))
    assert ex["toy.add"].status == "passed" and ex["toy.mul"].status == "crashed"


def test_a_missing_answer_cell_is_a_clear_per_exercise_error(tmp_path):
    nb = copy.deepcopy(RELEASE)
    nb.cells = [c for c in nb.cells if not (notebook.role(c) == "answer"
                                            and notebook.exercise_of(c) == "toy.add")]
    path = tmp_path / "missing.ipynb"
    notebook.write(nb, path)
    ex, result = grade(path)
    assert ex["toy.add"].status == "error"
    assert "No answer cell for toy.add" in ex["toy.add"].message
    assert "`add` is not defined" in ex["toy.add"].message
    assert "no answer cell for toy.add" in result.notes


def test_an_unreadable_notebook_still_writes_a_result(tmp_path):
    path = tmp_path / "90_toy.ipynb"
    path.write_text("{ not json")
    ex, result = grade(path)
    assert result.error and "not a readable Jupyter notebook" in result.error
    assert result.lab == "toy" and result.score == 0  # the file name still says which lab
    assert all(e.status == "error" and "not graded" in e.message for e in ex.values())
    assert set(ex) == {"toy.add", "toy.mul", "toy.gpu"}


def test_cli_exit_codes(tmp_path, capsys):
    good = submit(tmp_path, add=ADD, mul=MUL)
    assert main(["grade", str(good), "--out", str(tmp_path / "o"), "--device", "cpu"]) == 0
    assert "toy.add" in capsys.readouterr().out
    bad = tmp_path / "broken.ipynb"
    bad.write_text("[]")
    assert main(["grade", str(bad), "--out", str(tmp_path / "o"), "--device", "cpu"]) == 1
    assert (tmp_path / "o" / "broken.json").is_file()
    assert main(["grade", str(tmp_path / "nope.ipynb"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["grade", str(good), "--device", "tpu"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err


def test_a_class_folder_of_per_student_folders_gets_one_result_each(tmp_path, capsys):
    for student in ("alice", "bob"):
        (tmp_path / "subs" / student).mkdir(parents=True)
    shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", tmp_path / "subs" / "alice" / "90_toy.ipynb")
    shutil.copy(FIXTURES / "notebooks" / "90_toy.ipynb", tmp_path / "subs" / "bob" / "90_toy.ipynb")
    (tmp_path / "subs" / "bob" / ".ipynb_checkpoints").mkdir()
    shutil.copy(FIXTURES / "notebooks" / "90_toy.ipynb",
                tmp_path / "subs" / "bob" / ".ipynb_checkpoints" / "90_toy-checkpoint.ipynb")
    out = tmp_path / "grades"
    assert main(["grade", str(tmp_path / "subs"), "--out", str(out), "--device", "cpu"]) == 0
    scores = {p.name: json.loads(p.read_text())["score"] for p in out.glob("*.json")}
    assert scores == {"alice-90_toy.json": 3, "bob-90_toy.json": 0}


def test_after_a_crash_in_the_first_exercise_the_setup_is_replayed_for_the_rest(tmp_path):
    # the setup cell (part of the first exercise's cells) imports operator; mul needs it
    ex, _ = grade(submit(tmp_path, add="import os\nos._exit(1)",
                         mul="def mul(a, b):\n    return operator.mul(a, b)"))
    assert ex["toy.add"].status == "crashed"
    assert ex["toy.mul"].status == "passed", ex["toy.mul"].message


def test_an_unforeseen_failure_costs_only_that_notebook(tmp_path, monkeypatch):
    import grader.judge.grade as grade_module

    def explode(*args, **kwargs):
        raise KeyError("something nobody foresaw")

    monkeypatch.setattr(grade_module, "assemble", explode)
    ex, result = grade(submit(tmp_path, add=ADD, mul=MUL))
    assert "internal error while grading: KeyError" in result.error
    assert result.lab == "toy" and all(e.status == "error" for e in ex.values())


def test_an_output_that_quotes_the_checks_is_withheld_from_every_report(tmp_path):
    checks = (FIXTURES / "labs" / "toy" / "checks.py").read_text()
    quoted = "print(" + repr(checks) + ")\n" + ADD
    ex, result = grade(submit(tmp_path, add=quoted, mul=MUL))
    assert ex["toy.add"].status == "passed"
    executed = (tmp_path / "out" / "sub.executed.ipynb").read_text()
    assert "raise CheckFailure(f\"for ({a}, {b}) expected" not in executed
    assert "quoted the grader's checks and was withheld" in executed
    assert "1 output(s) of the notebook quoted the grader's checks" in " ".join(result.notes)



SEES = """
import glob, os, grader
root = os.path.dirname(os.path.dirname(grader.__file__))
full = [n for n in sorted(os.listdir(root))
        if os.path.isdir(os.path.join(root, n)) and os.listdir(os.path.join(root, n))]
print("SEES course", *full)
print("SEES runs", len(os.listdir(os.path.dirname(os.path.dirname(os.getcwd())))))
print("SEES toy-solutions", *os.listdir(os.path.join(root, "tests", "fixtures", "solutions")))
print("SEES checks", *[p for p in glob.glob(os.path.join(root, "labs", "*", "checks*"))
                       if not os.path.isdir(p) or os.listdir(p)])
print("SEES model", *[p for p in glob.glob(os.path.join(root, "labs", "allocator", "*model*"))
                      + glob.glob(os.path.join(root, "labs", "allocator", "__pycache__", "*"))
                      if os.path.getsize(p)])
""" + ADD


def test_a_kernel_sees_of_the_course_only_what_it_imports_and_of_the_runs_only_its_own(tmp_path):
    """In its mount namespace (as root), a kernel finds the course's folders but ``grader/`` and
    ``labs/`` (and a venv) empty: no reference solutions, no ``.git``, no earlier grades, no
    tests, no lab's checks; and the folder of every run holds only its own."""
    from grader.judge.grade import kernel_isolation, runs_folder

    if not kernel_isolation().namespace:
        pytest.skip(f"no mount namespace here: {kernel_isolation().words}")
    other = tempfile.mkdtemp(prefix="grade-", dir=runs_folder())  # another run's folder
    # lab 3's instructor-only model, compiled as a judge's import leaves it (whatever
    # PYTHONDONTWRITEBYTECODE says): neither the source nor the bytecode may be read
    model = ROOT / "labs" / "allocator" / "model.py"
    compiled = Path(py_compile.compile(str(model), doraise=True))
    try:
        ex, _ = grade(submit(tmp_path, add=SEES, mul=MUL))
    finally:
        os.rmdir(other)
    assert ex["toy.add"].status == "passed"
    nb = notebook.read(tmp_path / "out" / "sub.executed.ipynb")
    said = "".join(o.get("text", "") for c in nb.cells if notebook.exercise_of(c) == "toy.add"
                   and notebook.role(c) == "answer" for o in c.outputs)
    lines = {line.split()[1]: line.split()[2:] for line in said.splitlines()
             if line.startswith("SEES ")}
    venv = os.path.relpath(sys.prefix, ROOT).split(os.sep)[0]
    # (the toy lab's own course, tests/fixtures, is under tests/: that one stays)
    assert set(lines["course"]) <= {"grader", "labs", "tests", venv}, lines
    assert lines["runs"] == ["1"] and lines["checks"] == [] and lines["toy-solutions"] == []
    assert compiled.stat().st_size and lines["model"] == [], lines["model"]
    # and of every lab, its instructor-only files (lab 3's reference model) read empty
    from grader.judge.grade import _course_hidden
    from grader.labs import load_lab

    assert str(ROOT / "labs" / "allocator" / "model.py") in _course_hidden(load_lab("toy"))
