"""The torch-version policy: given an installed torch other than the pinned release, the CLI
refuses to grade unless --allow-torch-mismatch, which records both versions and marks the
exercises whose checks depend on the pinned release in the result and in every report; the
notebooks' setup cells warn, refuse or allow by their ``torch_policy`` parameter; and
``grader timings`` puts a CPU and a CUDA grading side by side.

The installed version is simulated by answering for torch in ``importlib.metadata.version``,
which :func:`grader.results.installed_torch` reads."""
import csv
import io
import json
import shutil
import sys
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import replace
from importlib import metadata

import jsonschema
import pytest
from rich.console import Console

import grader.judge.grade
import grader.labs
import grader.kernel.selfcheck as selfcheck
from grader.cli import main
from grader.errors import GraderError
from grader.judge.grade import grade_notebook
from grader.labs import load_lab
from grader.reports.console import print_result
from grader.reports.feedback import feedback_html, feedback_markdown
from grader.reports.gradebook import gradebook_rows
from grader.reports.graded import Graded, load_graded
from grader.reports.gradescope import gradescope_results
from grader.reports.junit import junit_xml
from grader.reports.summary import class_summary, summary_html
from grader.results import PINNED_TORCH, Environment, ExerciseResult, LabResult
from tests.conftest import FIXTURES, ROOT

OTHER = "2.11.0+cu126"
RESULT_SCHEMA = json.loads((ROOT / "grader" / "result.schema.json").read_text())


@pytest.fixture
def installed(monkeypatch):
    """``installed(version)``: from now on the installed torch is ``version``."""
    real = metadata.version

    def pretend(version: str) -> None:
        monkeypatch.setattr(metadata, "version",
                            lambda name: version if name == "torch" else real(name))
    return pretend


@pytest.fixture
def toy_marked(monkeypatch):
    """The toy lab as the grader loads it, with toy.mul marked ``pinned_behaviour``."""
    real = grader.judge.grade.load_lab

    def load(lab_id):
        lab = real(lab_id)
        return replace(lab, exercises=tuple(replace(e, pinned_behaviour=e.id == "toy.mul")
                                            for e in lab.exercises))
    monkeypatch.setattr(grader.judge.grade, "load_lab", load)


def test_the_pinned_version_is_pyproject_s():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch=={PINNED_TORCH}" in deps


# ------------------------------------------------------------------ the CLI and grade_notebook

def test_the_cli_refuses_a_mismatch_before_grading(installed, tmp_path, capsys):
    installed(OTHER)
    nb = shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", tmp_path / "90_toy.ipynb")
    assert main(["grade", str(nb), "--out", str(tmp_path / "out")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"torch {OTHER} is installed" in err and f"torch {PINNED_TORCH}" in err
    assert f"install torch=={PINNED_TORCH}" in err and "--allow-torch-mismatch" in err
    assert not (tmp_path / "out").exists()  # nothing graded, nothing written


def test_on_the_pinned_release_nothing_is_refused_or_marked(installed):
    installed(f"{PINNED_TORCH}+cu128")
    grader.judge.grade.check_torch(allow_mismatch=False)  # (does not raise)
    env = Environment.current("cpu", 1)
    assert env.torch_pinned == PINNED_TORCH and not env.torch_mismatch


def test_grade_notebook_refuses_a_mismatch_by_default_and_says_why(installed, tmp_path):
    installed(OTHER)
    nb = shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", tmp_path / "90_toy.ipynb")
    result = grade_notebook(nb, tmp_path / "out", seed=1)
    assert result.score == 0 and "--allow-torch-mismatch" in result.error
    assert {e.status for e in result.exercises} == {"error"}
    assert not (tmp_path / "out" / "90_toy.executed.ipynb").exists()  # no kernel ran


def test_with_the_flag_a_grading_records_both_versions_and_marks_in_every_report(
        installed, toy_marked, tmp_path, capsys):
    installed(OTHER)
    nb = shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", tmp_path / "90_toy.ipynb")
    out = tmp_path / "out"
    assert main(["grade", str(nb), "--out", str(out), "--allow-torch-mismatch", "--jobs", "1",
                 "--seed", "3"]) == 0
    console = " ".join(capsys.readouterr().out.split())
    assert f"torch {OTHER}, not the pinned {PINNED_TORCH}: grading anyway" in console
    assert "toy.mul †" in console and f"run with torch {OTHER}, but the course pins" in console

    (result,) = out.glob("*90_toy.json")  # (named after the learner: the folder)
    data = json.loads(result.read_text())
    jsonschema.validate(data, RESULT_SCHEMA)
    assert (data["environment"]["torch_version"], data["environment"]["torch_pinned"]) == (
        OTHER, PINNED_TORCH)
    marks = {e["id"]: (e["status"], e["version_caveat"]) for e in data["exercises"]}
    # toy.mul is marked and ran; toy.add is not marked; toy.gpu did not run (no CUDA here)
    assert marks == {"toy.add": ("passed", False), "toy.mul": ("passed", True),
                     "toy.gpu": ("skipped", False)}

    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    assert rows[0]["torch_caveats"] == f"toy: torch {OTHER}, pinned {PINNED_TORCH}; † toy.mul"
    junit = ET.parse(out / "junit.xml").getroot()
    assert f"run with torch {OTHER}" in _property(junit, "torch_caveat")
    assert [c.get("name") for c in junit.iter("testcase")
            if any(p.get("name") == "version_caveat" for p in c.iter("property"))] == ["toy.mul"]
    assert "toy.mul †" in (out / "summary.html").read_text().replace("<wbr>", "")
    for page in (f"feedback/{result.stem}.md", f"feedback/{result.stem}.html"):
        text = (out / page).read_text()
        assert f"run with torch {OTHER}, but the course pins torch {PINNED_TORCH}" in text
        assert "toy.mul †" in text.replace("<wbr>", "") and "toy.add †" not in text
    gradescope = json.loads((out / "gradescope" / result.name).read_text())
    assert f"run with torch {OTHER}" in gradescope["output"]
    assert [t["extra_data"]["id"] for t in gradescope["tests"]
            if t["output"].startswith("† ")] == ["toy.mul"]


def _property(root, name):
    return next(p.get("value") for p in root.iter("property") if p.get("name") == name)


# ------------------------------------------------------------------ reports, from results

ENV = Environment("2.13.0+cpu", "cpu", 7, "0.3.0", "3.11.7", "2026-01-01T00:00:00+00:00",
                  PINNED_TORCH)
EXERCISES = (ExerciseResult("toy.add", "Add two numbers", "passed", 1, 1, "ok", 0.5),
             ExerciseResult("toy.mul", "Multiply two numbers", "failed", 0, 2, "expected 6", 0.5),
             ExerciseResult("toy.gpu", "Something that needs a GPU", "skipped", 0, 1, "no", 0))


def _graded(env: Environment, caveat: set[str] = frozenset()) -> Graded:
    exercises = tuple(replace(e, version_caveat=e.id in caveat) for e in EXERCISES)
    return Graded("alice_90_toy", "alice", LabResult(lab="toy", notebook="90_toy.ipynb",
                                                     exercises=exercises, environment=env,
                                                     duration_s=2.0))


def _terminal(result: LabResult) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    print_result(result, console)
    return console.export_text()


def _views(g: Graded) -> dict:
    return {"markdown": feedback_markdown(g), "html": feedback_html(g),
            "summary": summary_html([g]), "gradebook": gradebook_rows([g]),
            "terminal": _terminal(g.result)}


def test_on_the_pinned_release_the_reports_read_as_before_the_pin_was_recorded():
    before = _graded(replace(ENV, torch_pinned=None))  # a result written before this change
    assert _views(_graded(ENV)) == _views(before)
    assert "†" not in str(_views(_graded(ENV)))


def test_under_a_mismatch_each_report_names_both_versions_and_marks_the_exercise():
    g = _graded(replace(ENV, torch_version=OTHER), caveat={"toy.mul"})
    views = _views(g)
    note = f"run with torch {OTHER}, but the course pins torch {PINNED_TORCH}"
    for name in ("markdown", "html", "terminal"):
        assert note in " ".join(views[name].split()), name
        assert "toy.mul †" in views[name].replace("<wbr>", ""), name
        assert "toy.add †" not in views[name].replace("<wbr>", ""), name
    summary = views["summary"].replace("<wbr>", "")
    assert "toy.mul †" in summary and "toy.add †" not in summary
    assert f"torch other than the pinned {PINNED_TORCH}</th><td>{OTHER}: 1" in summary
    assert f"cpu · torch {OTHER} (pinned {PINNED_TORCH})" in summary
    lab = class_summary([g])["labs"]["toy"]
    assert lab["torch_mismatch"] == {"pinned": PINNED_TORCH, "versions": {OTHER: 1}}
    assert lab["exercises"]["toy.mul"]["version_caveats"] == 1
    columns, rows = views["gradebook"]
    assert columns[-1] == "torch_caveats" and rows[0]["torch_caveats"].endswith("† toy.mul")
    root = ET.fromstring(junit_xml([g]))
    assert _property(root, "torch_version") == OTHER
    assert _property(root, "torch_pinned") == PINNED_TORCH
    failure = next(c for c in root.iter("testcase") if c.get("name") == "toy.mul")
    assert failure.find("failure").get("message").startswith("† expected 6")
    gradescope = gradescope_results(g.result)
    assert note in gradescope["output"]
    assert gradescope["extra_data"]["environment"]["torch_pinned"] == PINNED_TORCH
    assert [t["output"] for t in gradescope["tests"]][1] == "† failed: expected 6"


def test_a_result_written_before_the_pin_was_recorded_still_loads(tmp_path):
    data = _graded(ENV).result.to_dict()
    del data["environment"]["torch_pinned"]
    for e in data["exercises"]:
        del e["version_caveat"]
    jsonschema.validate(data, RESULT_SCHEMA)
    (tmp_path / "old.json").write_text(json.dumps(data))
    result = load_graded(tmp_path / "old.json").result
    assert result.environment.torch_pinned is None and not result.environment.torch_mismatch
    assert not any(e.version_caveat for e in result.exercises)


# ------------------------------------------------------------------ the lab tables

def test_the_marks_are_read_from_the_lab_tables():
    marked = {e.id for lab in ("allocator", "autograd") for e in load_lab(lab).exercises
              if e.pinned_behaviour}
    assert {"allocator.vs-real", "allocator.round-size", "autograd.derivatives"} <= marked
    assert "autograd.engine" not in marked  # its oracle is the installed torch's engine


def test_a_mark_that_is_not_true_or_false_is_a_malformed_table(tmp_path, monkeypatch):
    table = (FIXTURES / "labs" / "toy" / "lab.toml").read_text().replace(
        "timeout = 20\n", 'timeout = 20\npinned_behaviour = "yes"\n', 1)
    (tmp_path / "lab.toml").write_text(table)
    monkeypatch.setattr(grader.labs, "_tables", lambda: {"toy": tmp_path / "lab.toml"})
    with pytest.raises(GraderError, match="malformed lab table.*not true or false"):
        load_lab("toy")


# ------------------------------------------------------------------ the setup cells

@pytest.fixture
def shown(monkeypatch):
    """Every display call's bundle, in order; the notebook's ``torch_policy`` unset."""
    import IPython.display

    calls = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: calls.append(obj))
    monkeypatch.delattr(sys.modules["__main__"], "torch_policy", raising=False)
    return calls


def _policy(monkeypatch, policy: str) -> None:
    monkeypatch.setattr(sys.modules["__main__"], "torch_policy", policy, raising=False)


def test_warn_shows_both_versions_and_the_lab_s_marked_exercises_and_goes_on(installed, shown):
    installed(OTHER)
    selfcheck.require_torch("compile")  # torch_policy undefined: warn, as in JupyterLab
    (bundle,) = shown
    text = bundle["text/plain"]
    assert text.startswith("⚠ ") and OTHER in text and PINNED_TORCH in text
    marked = [e.id for e in load_lab("compile").exercises if e.pinned_behaviour]
    assert marked and all(f"`{m}`" in text for m in marked)
    assert "`compile.graph-capture`" not in text  # not marked
    assert "<code>compile.fusion</code>" in bundle["text/html"]


def test_refuse_raises_a_clear_error(installed, shown, monkeypatch):
    installed(OTHER)
    _policy(monkeypatch, "refuse")
    with pytest.raises(RuntimeError) as raised:
        selfcheck.require_torch("compile")
    message = str(raised.value)
    assert message.startswith(f"torch {OTHER} is installed; this lab is written for torch "
                              f"{PINNED_TORCH}. Install torch=={PINNED_TORCH}")
    assert message.endswith("or grade with --allow-torch-mismatch.")
    assert shown == []


def test_allow_is_a_one_line_note(installed, shown, monkeypatch):
    installed(OTHER)
    _policy(monkeypatch, "allow")
    selfcheck.require_torch("compile")
    (bundle,) = shown
    assert list(bundle) == ["text/plain"] and "\n" not in bundle["text/plain"]
    assert OTHER in bundle["text/plain"] and "--allow-torch-mismatch" in bundle["text/plain"]


@pytest.mark.parametrize("policy", ["warn", "refuse", "allow"])
def test_on_the_pinned_release_every_policy_is_silent(installed, shown, monkeypatch, policy):
    installed(f"{PINNED_TORCH}+cpu")
    _policy(monkeypatch, policy)
    selfcheck.require_torch("compile")
    assert shown == []


def test_an_unknown_policy_is_refused_with_the_three(shown, monkeypatch):
    _policy(monkeypatch, "never")
    with pytest.raises(ValueError, match="warn, refuse, allow"):
        selfcheck.require_torch("compile")


def test_every_solution_s_setup_cell_applies_the_policy_of_its_parameters_cell():
    from grader import notebook

    for lab_id in ("dispatcher", "autograd", "allocator", "compile", "distributed", "export"):
        nb = notebook.read(ROOT / "solutions" / f"{load_lab(lab_id).notebook}.ipynb")
        cells = {c.id: c.source for c in nb.cells}
        assert 'torch_policy = "warn"' in cells["parameters"], lab_id
        assert f'require_torch("{lab_id}")' in cells["setup"], lab_id
        assert "assert torch.__version__" not in cells["setup"], lab_id


# ------------------------------------------------------------------ grader timings

def _result(lab: str, seconds: float, score: float, device: str) -> LabResult:
    return LabResult(lab=lab, notebook=f"{lab}.ipynb", environment=replace(ENV, device=device),
                     exercises=(ExerciseResult(f"{lab}.one", "One", "passed", score, 10, "ok"),),
                     duration_s=seconds)


def test_timings_puts_each_lab_s_cpu_and_cuda_seconds_and_scores_side_by_side(tmp_path,
                                                                                capsys):
    for folder, results in (("cpu", [_result("autograd", 120.0, 10, "cpu"),
                                     _result("export", 30.0, 10, "cpu")]),
                            ("cuda", [_result("autograd", 30.0, 10, "cuda")])):
        (tmp_path / folder).mkdir()
        for r in results:
            r.write(tmp_path / folder / f"{r.lab}.json")
    (tmp_path / "cpu" / "gradebook.json").write_text("{}")  # not a result: left out
    assert main(["timings", str(tmp_path / "cpu"), str(tmp_path / "cuda")]) == 0
    rows = [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in capsys.readouterr().out.splitlines()]
    table = {r[0]: r[1:] for r in rows if r and r[0] in ("autograd", "export")}
    # lab: CPU s, CUDA s, CPU/CUDA, CPU score, CUDA score (over what could run)
    assert table == {"autograd": ["120.0", "30.0", "4.00", "10/10", "10/10"],
                     "export": ["30.0", "–", "–", "10/10", "–"]}


def test_timings_of_a_folder_that_is_not_a_grading_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["timings", str(tmp_path / "empty"), str(tmp_path / "gone")]) == 2
    assert "no results (give the --out folder of a grading)" in capsys.readouterr().err


# ------------------------------------------------------------------ grader compare

def test_compare_lists_the_exercises_that_differ_under_another_torch(tmp_path, capsys):
    def graded(folder, torch_version, status):
        r = LabResult(lab="autograd", notebook="02_autograd.ipynb",
                      environment=replace(ENV, torch_version=torch_version),
                      exercises=(ExerciseResult("autograd.one", "One", "passed", 10, 10, "ok"),
                                 ExerciseResult("autograd.two", "Two", status,
                                                10 if status == "passed" else 0, 10,
                                                "ok" if status == "passed" else
                                                "check 1/3 raised AttributeError: no aten.foo\n"
                                                "more")))
        (tmp_path / folder).mkdir()
        r.write(tmp_path / folder / "autograd.json")

    graded("pinned", "2.13.0+cpu", "passed")
    graded("same", "2.13.0+cpu", "passed")
    graded("next", "2.14.1+cu130", "error")
    assert main(["compare", str(tmp_path / "pinned"), str(tmp_path / "same")]) == 0
    assert "no exercise differs: 2 exercise(s) of 1 lab(s)" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "pinned"), str(tmp_path / "next")]) == 1
    out = capsys.readouterr().out
    assert "torch 2.13.0+cpu versus torch 2.14.1+cu130" in out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines()]
    assert [r[:3] for r in rows if r and r[0].startswith("autograd.")] == [
        ["autograd.two", "passed 10/10", "error 0/10"]]
    assert "AttributeError: no aten.foo" in out and "more" not in out
