"""``grader dist``: a learner's copy of the course (no solution, no hidden check; its self-check
works) and a Gradescope autograder (graded as Gradescope runs it)."""
import ast
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest
import yaml

from grader import dist
from grader.checks import checks_for
from grader.errors import GraderError
from grader.labs import load_lab
from grader.release import BEGIN, END
from tests.conftest import ROOT

#: the course's labs in the course's order (without tests/fixtures' toy lab, which the
#: grader's tests add)
COURSE_LABS = sorted((p.parent.name for p in (ROOT / "labs").glob("*/lab.toml")),
                     key=lambda lab: load_lab(lab).notebook)
#: the lab whose notebooks are graded here (its reference grades in about 15 s)
LAB = "allocator"
#: a leak is this many consecutive lines of a reference answer or a hidden check (blank lines
#: and comments aside) found in a row in a file of the copy: one line alone is often an idiom
#: that public code writes too (``rank, p = dist.get_rank(), dist.get_world_size()``)
WINDOW = 3
#: (answer or hidden check, file of the copy): the same lines, for the reason given
IDIOMS = {
    ("02_autograd.ipynb:hk-answer", "labs/autograd/viz.py"):
        "a depth-first walk over grad_fn.next_functions, which the lab's graph pictures take too",
}


def _env() -> dict:
    """The environment for a copy's own commands: none of this checkout on PYTHONPATH."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "course"
    dist.student(ROOT, out)
    return out


def _code(lines) -> list[str]:
    return [s for line in lines if (s := line.strip()) and not s.startswith("#")]


def _windows(lines: list[str]) -> set[tuple[str, ...]]:
    return set(zip(*(lines[i:] for i in range(WINDOW))))


def _secrets() -> dict[str, list[str]]:
    """What must not ship: each reference answer (``<notebook>:<cell id>``: the lines between
    its solution markers), each hidden check (``<exercise>:<function>``: its source) and each
    function and class of a lab's ``instructor_only`` modules (``<path>:<name>``)."""
    found = {}
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(path, 4).cells:
            inside = False
            for line in cell.source.splitlines():
                if BEGIN.match(line) or END.match(line):
                    inside = bool(BEGIN.match(line))
                elif inside:
                    found.setdefault(f"{path.name}:{cell.id}", []).append(line)
    for lab in COURSE_LABS:
        for e in load_lab(lab).exercises:
            for c in checks_for(e.id):
                if c.hidden:
                    found[f"{e.id}:{c.fn.__name__}"] = inspect.getsource(c.fn).splitlines()
        for name in load_lab(lab).instructor_only:
            path = ROOT / "labs" / lab / name
            text = path.read_text(encoding="utf-8")
            for node in ast.parse(text).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    found[f"labs/{lab}/{name}:{node.name}"] = \
                        ast.get_source_segment(text, node).splitlines()
    return {what: _code(lines) for what, lines in found.items()}


def _public_lines() -> set[str]:
    """Lines anyone may see: the released notebooks and the public checks' own code."""
    lines = set()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in nbformat.read(path, 4).cells:
            lines.update(_code(cell.source.splitlines()))
    for lab in COURSE_LABS:
        for e in load_lab(lab).exercises:
            for c in checks_for(e.id):
                if not c.hidden:
                    lines.update(_code(inspect.getsource(c.fn).splitlines()))
    return lines


def test_the_learners_copy_has_no_solution_and_no_hidden_check(copy):
    """Every run of WINDOW lines of every reference answer and every hidden check, unless all
    of them are public, is looked for in every file of the copy (notebooks cell by cell)."""
    shipped = {}
    for path in copy.rglob("*"):
        if path.is_file():
            text = path.read_bytes().decode("utf-8", "replace")
            lines = ([line for c in nbformat.reads(text, 4).cells
                      for line in _code(c.source.splitlines())]
                     if path.suffix == ".ipynb" else _code(text.splitlines()))
            shipped[str(path.relative_to(copy))] = _windows(lines)
    assert not [p for p in shipped if p.startswith(("solutions/", "tests/"))]
    public = _public_lines()
    secrets = _secrets()
    looked_for, leaks = 0, []
    for what, lines in secrets.items():
        for window in _windows(lines):
            if all(line in public for line in window):
                continue
            looked_for += 1
            leaks += [(what, window, path) for path, windows in shipped.items()
                      if window in windows and (what, path) not in IDIOMS]
    assert len(secrets) > 100 and looked_for > 1500  # (the grep has something to find)
    assert not leaks, "\n".join(f"{w}: {lines} in {p}" for w, lines, p in leaks[:20])


def test_the_copys_public_nan_check_holds_no_fix_of_the_case(copy):
    """Lab 9's hidden nan checks train the case with torch's own loss (a fix of it); the public
    check compares with the original's curve, so the copy holds neither that loss nor the
    code that puts it in the case."""
    text = (copy / "labs" / "production" / "checks" / "nan.py").read_text(encoding="utf-8")
    assert "def default_settings" in text and "def drawn_settings" not in text
    assert "TORCH_LOSS" not in text and "def with_torchs_loss" not in text
    assert "F.cross_entropy" not in text


def test_the_copy_leaves_out_the_reference_model_that_answers_lab_3(copy):
    """The allocator lab's reference model is ``instructor_only``: absent from the copy, and
    nothing shipped imports it (its notebook and public checks read its recorded runs)."""
    assert load_lab("allocator").instructor_only == ("model.py",)
    for lab in COURSE_LABS:
        for name in load_lab(lab).instructor_only:
            assert (ROOT / "labs" / lab / name).is_file()
            assert not (copy / "labs" / lab / name).exists(), name
    assert (copy / "labs" / "allocator" / "recorded.json").is_file()
    imports = re.compile(r"^\s*(from labs\.allocator import [\w, ]*\bmodel\b|"
                         r"(from|import) labs\.allocator\.model\b)", re.M)
    for path in [*(copy / "labs").rglob("*.py"), *(copy / "notebooks").glob("*.ipynb")]:
        assert not imports.search(path.read_text(encoding="utf-8")), path
    assert imports.search((ROOT / "labs" / "allocator" / "checks" / "_harness.py").read_text())


def test_the_graders_work_ahead_and_what_only_it_reads_stay_out_of_the_copy(copy):
    """Lab 5's judges start their oracles ahead (``@ahead``) from the hidden cases too: those
    functions, and the hidden cases they read, are the grader's only."""
    ours = (ROOT / "labs" / "distributed" / "checks" / "fsdp_memory.py").read_text()
    assert "@ahead(" in ours and "def _hidden(" in ours
    for path in (copy / "labs").rglob("*.py"):
        text = path.read_text()
        assert "@ahead(" not in text and "def _hidden(" not in text, path


def test_the_grep_finds_a_hidden_check_or_an_answer_that_ships(copy, tmp_path):
    """The grep above is not blind: a copy with one hidden check put back, or one reference
    answer pasted into a lab module, is caught."""
    hidden = next(c for c in checks_for(load_lab(LAB).exercises[0].id) if c.hidden)
    source = inspect.getsource(hidden.fn)
    answer = next(lines for what, lines in _secrets().items() if what.startswith("03_"))
    for planted in (source, "\n".join(answer)):
        bad = tmp_path / "bad"
        shutil.copytree(copy, bad)
        with open(bad / "labs" / LAB / "viz.py", "a", encoding="utf-8") as f:
            f.write("\n" + planted + "\n")
        with pytest.raises(AssertionError, match="in labs/allocator/viz.py"):
            test_the_learners_copy_has_no_solution_and_no_hidden_check(bad)
        shutil.rmtree(bad)


def test_the_copy_registers_every_public_check_and_counts_the_hidden_ones(copy):
    """In the copy, each exercise has the same public checks (same names, same order) and as
    many withheld hidden checks as the course has hidden ones; no name is left undefined."""
    want = {e.id: ([c.name for c in checks_for(e.id) if not c.hidden],
                   sum(c.hidden for c in checks_for(e.id)))
            for lab in COURSE_LABS for e in load_lab(lab).exercises}
    script = ("import json, grader.checks as g\n"
              "from grader.labs import lab_ids, load_lab\n"
              "ex = [e for lab in lab_ids() for e in load_lab(lab).exercises]\n"
              "print(json.dumps({e.id: ([c.name for c in g.checks_for(e.id)], e.withheld, len("
              "g.checks_for(e.id)) - len(g.checks_for(e.id, hidden=False))) for e in ex}))")
    run = subprocess.run([sys.executable, "-c", script], cwd=copy, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert {k: (names, withheld) for k, (names, withheld, _) in got.items()} == want
    assert all(hidden == 0 for _, _, hidden in got.values())
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F821,F811",
                           "--no-cache", "labs"], cwd=copy, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout[-3000:]


def test_the_copy_has_what_a_learner_needs(copy):
    for name in ("README.md", "Makefile", "pyproject.toml", "environment.yml", ".gitignore",
                 ".github/workflows/classroom.yml", "grader/kernel/selfcheck.py",
                 *(f"notebooks/{load_lab(lab).notebook}.ipynb" for lab in COURSE_LABS)):
        assert (copy / name).is_file(), name
    for lab in COURSE_LABS:  # every module the released notebooks import is there
        for cell in nbformat.read(copy / "notebooks" / f"{load_lab(lab).notebook}.ipynb",
                                  4).cells:
            for module in re.findall(r"^from (labs\.[\w.]+) import", cell.source, re.M):
                assert (copy / Path(*module.split("."))).with_suffix(".py").exists() or \
                    (copy / Path(*module.split(".")) / "__init__.py").exists(), module
    pyproject = (copy / "pyproject.toml").read_text()
    assert '"torch==2.13.0"' in pyproject and "pytest" not in pyproject
    readme = (copy / "README.md").read_text()
    assert "make lab" in readme and "make check" in readme and "hidden" in readme
    make = subprocess.run(["make", "-n", "check", "VENV=.venv-none"], cwd=copy,
                          capture_output=True, text=True)
    assert "-m grader grade notebooks --out build/check" in make.stdout, make.stdout


def test_the_copys_self_check_grades_public_checks_only(copy, tmp_path):
    """The copy's released notebook with every reference answer but the last pasted in: Run
    All works without the reference model, each of those exercises passes its public checks
    and the message counts the hidden checks the instructor still runs, and the last exercise
    is still the released stub and scores 0."""
    lab = load_lab(LAB)
    released = nbformat.read(copy / "notebooks" / f"{lab.notebook}.ipynb", 4)
    reference = nbformat.read(ROOT / "solutions" / f"{lab.notebook}.ipynb", 4)
    on_cpu = [e for e in lab.exercises if e.unmet("cpu") is None]
    for e in on_cpu[:-1]:
        answer = next(c for c in reference.cells if c.get("metadata", {}).get("course", {}).get(
            "exercise") == e.id and c.metadata["course"].get("role") == "answer")
        pasted = next(c for c in released.cells if c.get("id") == answer.id)
        pasted.source = answer.source
    work = tmp_path / "work"
    work.mkdir()
    nbformat.write(released, work / f"{lab.notebook}.ipynb")
    out = tmp_path / "check"
    run = subprocess.run([sys.executable, "-m", "grader", "grade", str(work), "--out", str(out),
                          "--jobs", "1", "--seed", "3"], cwd=copy, env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (result,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    ex = {e["id"]: e for e in result["exercises"]}
    for e in on_cpu[:-1]:
        hidden = sum(c.hidden for c in checks_for(e.id))
        assert ex[e.id]["status"] == "passed", ex[e.id]
        assert f"the grader also runs {hidden} hidden check(s)" in ex[e.id]["message"]
    assert result["score"] == sum(e.points for e in on_cpu[:-1])
    hidden_total = sum(c.hidden for e in lab.exercises for c in checks_for(e.id))
    assert (f"public checks only: this copy of the course has none of the lab's {hidden_total} "
            "hidden checks") in " ".join(result["notes"])
    last = ex[on_cpu[-1].id]
    assert last["status"] == "error" and "still the stub" in last["message"], last


def test_the_classroom_workflow_scores_each_exercise_from_the_results(copy, tmp_path):
    """One Classroom test per exercise a GitHub-hosted runner can run, worth its points, each
    passing exactly when the results say the exercise passed; the reporter reads them all."""
    workflow = copy / ".github" / "workflows" / "classroom.yml"
    check = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                            "vendor.github-workflows", str(workflow)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    steps = yaml.safe_load(workflow.read_text())["jobs"]["run-autograding-tests"]["steps"]
    tests = [s for s in steps if "autograding-command-grader" in s.get("uses", "")]
    runnable = [e for lab in COURSE_LABS for e in load_lab(lab).exercises
                if not any(r.startswith("cuda") for r in e.requires)]
    assert [t["name"] for t in tests] == [e.id for e in runnable]
    assert [float(t["with"]["max-score"]) for t in tests] == [e.points for e in runnable]
    reporter = steps[-1]
    assert reporter["with"]["runners"].split(",") == [t["id"] for t in tests]
    assert set(reporter["env"]) == {f"{t['id'].upper()}_RESULTS" for t in tests}
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed: the commands were not run")
    (tmp_path / "build" / "check").mkdir(parents=True)
    passed = {runnable[0].id, runnable[-1].id}
    for lab in COURSE_LABS:
        (tmp_path / "build" / "check" / f"{lab}.json").write_text(json.dumps({"exercises": [
            {"id": e.id, "status": "passed" if e.id in passed else "failed"}
            for e in load_lab(lab).exercises]}))
    for t in tests:
        run = subprocess.run(["bash", "-c", t["with"]["command"]], cwd=tmp_path,
                             capture_output=True, text=True)
        assert (run.returncode == 0) == (t["name"] in passed), (t["name"], run.stderr)


def test_dist_refuses_a_folder_that_is_not_empty_and_a_zip_without_zip(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(GraderError, match="not an empty folder"):
        dist.student(ROOT, tmp_path)
    with pytest.raises(GraderError, match=r"\.zip"):
        dist.gradescope(ROOT, tmp_path / "autograder.tar")
    assert (tmp_path / "mine.txt").read_text() == "keep me"


# --------------------------------------------------------------------------- Gradescope

@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    dist.gradescope(ROOT, path)
    return path


def _run_autograder(zip_path: Path, root: Path, submission: dict[str, bytes]) -> dict:
    """Lay ``root`` out as Gradescope does (source/ from the zip, submission/, results/), run
    run_autograder with this project's Python, and return results.json."""
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
    for name in ("setup.sh", "run_autograder"):  # (zipfile does not restore modes)
        (root / "source" / name).chmod(0o755)
    (root / "submission").mkdir()
    (root / "results").mkdir()
    for name, data in submission.items():
        (root / "submission" / name).write_bytes(data)
    env = _env() | {"AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    run = subprocess.run([str(root / "source" / "run_autograder")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    schema = json.loads((ROOT / "grader" / "gradescope.schema.json").read_text())
    jsonschema.validate(results, schema)
    return results


def test_the_autograder_zip_holds_the_course_with_every_check_and_no_solution(autograder):
    with zipfile.ZipFile(autograder) as zf:
        names = set(zf.namelist())
        setup = zf.read("setup.sh").decode()
    assert {"setup.sh", "run_autograder", "pyproject.toml", "grader/cli.py",
            f"notebooks/{load_lab(LAB).notebook}.ipynb"} <= names
    assert not [n for n in names if n.startswith(("solutions/", "tests/"))]
    for lab in COURSE_LABS:  # the hidden checks are there: the modules are the course's own
        for path in (ROOT / "labs" / lab / "checks").glob("*.py"):
            assert f"labs/{lab}/checks/{path.name}" in names
    assert '"torch==2.13.0"' in setup and "whl/cpu" in setup
    assert subprocess.run(["bash", "-n", "-c", setup]).returncode == 0


def test_the_autograder_grades_a_reference_a_stub_and_a_broken_submission(autograder,
                                                                          tmp_path):
    lab = load_lab(LAB)
    name = f"{lab.notebook}.ipynb"
    ref = _run_autograder(autograder, tmp_path / "ref",
                          {name: (ROOT / "solutions" / name).read_bytes()})
    runnable = [e for e in lab.exercises if e.unmet("cpu") is None]
    assert ref["score"] == ref["extra_data"]["max_score"] == sum(e.points for e in runnable)
    assert [t["extra_data"]["id"] for t in ref["tests"]] == [e.id for e in runnable]
    assert all(t["extra_data"]["status"] == "passed" for t in ref["tests"])
    left_out = [e.id for e in lab.exercises if e not in runnable]  # (needs a GPU)
    assert left_out and all(ex in ref["output"] for ex in left_out)

    stub = _run_autograder(autograder, tmp_path / "stub",
                           {name: (ROOT / "notebooks" / name).read_bytes()})
    assert stub["score"] == 0 and stub["extra_data"]["max_score"] == ref["extra_data"]["max_score"]
    assert any("is still the stub" in t["output"] for t in stub["tests"])

    broken = _run_autograder(autograder, tmp_path / "broken", {name: b"{ not a notebook"})
    assert broken["score"] == 0 and broken["extra_data"]["error"]
    assert all(t["extra_data"]["status"] == "error" for t in broken["tests"])



def test_a_submission_without_a_notebook_gets_results_saying_so(tmp_path):
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "notes.txt").write_text("my answers")
    results = dist.autograde(tmp_path)
    assert results == json.loads((tmp_path / "results" / "results.json").read_text())
    jsonschema.validate(results, json.loads((ROOT / "grader" / "gradescope.schema.json")
                                            .read_text()))
    assert results["score"] == 0 and "no notebook" in results["output"]


def test_an_assignment_grades_its_labs_only_and_scores_a_missing_one_zero(tmp_path):
    """``--labs``: a notebook of another lab is not graded (the output says why), and the
    assignment's lab without a notebook scores 0 of what can run here."""
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "06_export.ipynb").write_text("{ not a notebook")
    results = dist.autograde(tmp_path, ["allocator"])
    jsonschema.validate(results, json.loads((ROOT / "grader" / "gradescope.schema.json")
                                            .read_text()))
    lab = load_lab("allocator")
    runnable = [e for e in lab.exercises if e.unmet("cpu") is None]
    assert results["score"] == 0
    assert results["extra_data"]["max_score"] == sum(e.points for e in runnable)
    assert [t["extra_data"]["id"] for t in results["tests"]] == [e.id for e in runnable]
    assert all("not submitted" in t["output"] for t in results["tests"])
    assert "06_export.ipynb was not graded: it is lab export" in results["output"]
    with zipfile.ZipFile(dist.gradescope(ROOT, tmp_path / "a.zip", ["allocator"])) as zf:
        assert "--labs allocator" in zf.read("run_autograder").decode()


def test_several_notebooks_make_one_results_json_and_a_lab_twice_counts_once():
    from grader.results import Environment, ExerciseResult, LabResult

    def result(lab_id: str, notebook: str, passed: int) -> LabResult:
        lab = load_lab(lab_id)
        return LabResult(lab=lab.id, notebook=f"/sub/{notebook}", environment=Environment.current(
            "cpu", 7), duration_s=2.5, exercises=tuple(
            ExerciseResult(e.id, e.title, "passed" if i < passed else "failed",
                           e.points if i < passed else 0.0, e.points, "msg")
            for i, e in enumerate(lab.exercises)))

    first, again, other = (result("autograd", "02_autograd.ipynb", 1),
                           result("autograd", "02_autograd-Copy1.ipynb", 2),
                           result("export", "06_export.ipynb", 1))
    merged = dist.merge_gradescope([first, again, other])
    jsonschema.validate(merged, json.loads((ROOT / "grader" / "gradescope.schema.json")
                                           .read_text()))
    assert merged["score"] == again.score + other.score
    assert merged["extra_data"]["max_score"] == again.max_score + other.max_score
    assert len(merged["tests"]) == len(again.exercises) + len(other.exercises)
    assert "02_autograd.ipynb is lab autograd too" in merged["output"]
    assert merged["extra_data"]["lab"] == "autograd,export"
    assert dist.merge_gradescope([other])["tests"] == merged["tests"][-len(other.exercises):]
