"""Hostile and broken submissions (see catalogue.py): each gets the exact status and a message
that names the cause for the exercise it attacks, the other exercises score as the reference
does, and nothing leaks, lingers or lands outside the run.

All fixtures are graded once per session, in parallel worker processes like a batch run."""
from __future__ import annotations

import json
import os
import re
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import psutil
import pytest

from catalogue import FIXTURES, ROOT, SECRET_ENV, write
from grader import notebook
from grader.judge.batch import learner_of
from grader.reports import write_reports
from grader.reports.graded import load_graded
from grader.judge.grade import grade_notebook
from grader.labs import load_lab

SEED = 20261129
BY_NAME = {fx.name: fx for fx in FIXTURES}


def _grade(name: str, timeout: float | None, path: Path, out: Path):
    return name, grade_notebook(path, out, device="cpu", seed=SEED, timeout=timeout, name=name,
                                learner=learner_of(path))


@pytest.fixture(scope="session")
def graded(tmp_path_factory):
    """{fixture name: LabResult}, the output folder, and the submissions folder."""
    subs, out = tmp_path_factory.mktemp("hostile-subs"), tmp_path_factory.mktemp("hostile-out")
    paths = {fx.name: write(fx, subs) for fx in FIXTURES}
    os.environ[SECRET_ENV[0]] = SECRET_ENV[1]  # the workers inherit it; no kernel may see it
    try:
        # slowest first (time limits, crashes, floods), so the two workers finish together
        order = sorted(FIXTURES, key=lambda fx: (fx.timeout is None, "death" not in fx.name,
                                                 "flood" not in fx.name))
        with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
            results = dict(pool.map(_grade, [fx.name for fx in order],
                                    [fx.timeout for fx in order],
                                    [paths[fx.name] for fx in order], [out] * len(order)))
    finally:
        del os.environ[SECRET_ENV[0]]
    return results, out, subs


@pytest.mark.parametrize("name", list(BY_NAME))
def test_each_fixture_costs_only_its_own_exercises(graded, name):
    fx, result = BY_NAME[name], graded[0][name]
    assert result.lab == (fx.result_lab or fx.lab)
    if fx.error:
        assert fx.error in (result.error or ""), result.error
        assert str(graded[2]) not in result.error  # no instructor folders in what learners see
        assert "INSTRUCTOR-ONLY" not in (graded[1] / f"{name}.json").read_text(encoding="utf-8")
    lab = load_lab(fx.lab) if result.lab != "unknown" else None
    got = {e.id: e for e in result.exercises}
    for ex in (lab.exercises if lab else ()):
        slug = ex.id.split(".", 1)[1]
        default = (("error", "") if fx.error else
                   ("skipped", "") if ex.unmet("cpu") else ("passed", ""))
        status, phrase = fx.expect.get(slug, default)
        mine = got[ex.id]
        assert (mine.status, phrase in mine.message) == (status, True), (ex.id, mine.message)
        assert mine.points == (ex.points if status == "passed" else 0)
    notes = " | ".join(result.notes)
    assert not (fx.clean and notes), notes
    for phrase in fx.notes:
        assert phrase in notes, notes


def test_a_flood_of_output_is_stored_truncated_with_a_note(graded):
    name = "recursion-crash-and-output-flood"
    result, out = graded[0][name], graded[1]
    executed = out / f"{name}.executed.ipynb"
    assert executed.stat().st_size < 2_000_000, executed.stat().st_size
    assert executed.read_text(encoding="utf-8").count("characters of output were dropped") == 2
    assert result.duration_s < 120


def test_a_huge_notebook_is_graded_in_bounded_time_without_its_old_outputs(graded):
    result, out = graded[0]["huge-at-unicode-path"], graded[1]
    assert result.duration_s < 120
    assert (out / "huge-at-unicode-path.executed.ipynb").stat().st_size < 2_000_000


def test_stale_outputs_are_not_carried_into_the_graded_notebook(graded):
    text = (graded[1] / "lying-results-and-stale-verdicts.executed.ipynb").read_text(
        encoding="utf-8")
    assert "STALE-OUTPUT" not in text


def test_child_processes_do_not_outlive_their_run(graded):
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and p.info["cmdline"][-2:] in (["sleep", "3607"],
                                                                ["sleep", "3608"])]
    assert not left


def test_files_a_learner_writes_stay_in_the_run_folder(graded):
    _, out, subs = graded
    places = [ROOT, ROOT / "tests", ROOT / "tests" / "hostile", out, subs, Path.cwd()]
    assert not [p for p in places if (p / "learner-wrote-this.txt").exists()]


def test_a_compiler_cache_a_submission_poisons_is_its_own_and_goes_with_its_run(graded):
    text = (graded[1] / "compile-state.executed.ipynb").read_text(encoding="utf-8")
    found = re.search(r"POISONED-CACHE (\S+?)(?:\\n|\s|\")", text)
    assert found, "the fixture did not report its cache folder"
    cache = Path(found.group(1))
    assert cache.parts[-3:-1] == ("home", "tmp"), cache  # the run's own folder
    assert cache.name.startswith("torchinductor_"), cache
    assert cache.parent.parent.parent.name.startswith("grade-"), cache
    assert not cache.exists()  # deleted with the run


def test_libraries_a_submission_plants_are_in_its_own_extensions_folder_and_go_with_it(graded):
    text = (graded[1] / "extension-plant.executed.ipynb").read_text(encoding="utf-8")
    found = re.search(r"PLANTED-EXTENSIONS (\S+?)(?:\\n|\s|\")", text)
    assert found, "the fixture did not report its extensions folder"
    folder = Path(found.group(1))
    assert folder.parts[-4:] == ("home", "tmp", "torch_extensions", "course"), folder
    assert folder.parents[3].name.startswith("grade-"), folder
    assert not folder.exists()  # deleted with the run


def test_paths_with_spaces_and_non_ascii_names_keep_their_learner(graded):
    assert graded[0]["huge-at-unicode-path"].learner == "Zoë Müller"


def _check_lines() -> set[str]:
    """Distinctive lines of every lab's check source (what must never reach a learner)."""
    lines = set()
    for path in (ROOT / "labs").glob("*/checks/*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if len(line) >= 40 and not line.startswith(("#", '"', "'", "f\"", "raise", "from ")):
                lines.add(line)
    return lines


def test_no_check_source_in_any_result_report_or_graded_output(graded):
    results, out, _ = graded
    write_reports([load_graded(out / f"{name}.json") for name in results], out)
    texts = [p.read_text(encoding="utf-8") for p in out.rglob("*")
             if p.is_file() and p.suffix in (".json", ".md", ".html", ".xml", ".csv")]
    for executed in out.glob("*.executed.ipynb"):  # its outputs (the sources are not the checks')
        nb = notebook.read(executed)
        texts += [json.dumps(c.get("outputs", [])) for c in nb.cells]
    lines = _check_lines()
    assert len(lines) > 100
    leaked = {line for line in lines for text in texts if line in text}
    assert not leaked, sorted(leaked)[:5]


def test_every_executed_notebook_names_its_input_instead_of_holding_a_second_copy(graded):
    results, out, _ = graded
    for executed in out.glob("*.executed.ipynb"):
        source = json.loads(executed.read_text(encoding="utf-8"))["metadata"]["papermill"]
        assert isinstance(source["input_path"], str), executed.name
        assert source["input_path"].endswith(".ipynb"), executed.name


def test_text_utf8_cannot_hold_is_shown_replaced_without_a_kernel_traceback(graded):
    nb = notebook.read(graded[1] / "learner-io.executed.ipynb")
    cell = next(c for c in nb.cells if notebook.role(c) == "answer"
                and notebook.exercise_of(c) == "dispatcher.key-priority")
    text = json.dumps(cell.outputs, ensure_ascii=False)
    assert "caf\ufffd \ufffd done" in text
    assert "Traceback" not in text and "site-packages" not in text


def test_answer_cells_that_lost_their_metadata_are_graded_and_shown_as_answers(graded):
    nb = notebook.read(graded[1] / "copy-without-metadata.executed.ipynb")
    answers = [notebook.exercise_of(c) for c in nb.cells if notebook.role(c) == "answer"]
    assert answers == [e.id for e in load_lab("autograd").exercises]
