"""Batches: who submitted what, parallel grading equal to serial, resume, CI exit codes."""
import copy
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from grader import notebook
from grader.judge.batch import Submission, find_submissions, grade_all, learner_of
from grader.labs import load_lab
from grader.cli import build_parser, default_out, main
from grader.judge.grade import kernel_isolation
from grader.reports.console import summary_table
from grader.results import LabResult, read_verified
from tests.conftest import FIXTURES, ROOT

RELEASE = notebook.read(FIXTURES / "notebooks" / "90_toy.ipynb")


@pytest.mark.parametrize("path, learner", [
    ("subs/alice/90_toy.ipynb", "alice"),
    ("subs/bob_90_toy.ipynb", "bob"),
    ("subs/carol_toy.ipynb", "carol"),
    ("subs/dan_smith_90_toy.ipynb", "dan_smith"),
    ("subs/Eve Ng - 90_toy.ipynb", "Eve Ng"),
    ("subs/whatever.ipynb", "whatever"),
])
def test_learners_are_named_by_folder_or_file_prefix(path, learner):
    assert learner_of(Path(path)) == learner


def test_the_folder_under_the_searched_one_names_the_learner_and_names_never_collide(tmp_path):
    files = ["alice/homework.ipynb", "bob/homework.ipynb", "bob/alice_90_toy.ipynb",
             "carol/90_toy (1).ipynb", "dave/Copy of 90_toy.ipynb", "erin_90_toy.ipynb",
             "erin/erin_90_toy.ipynb"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("{}")
    subs = {s.path.relative_to(tmp_path).as_posix(): (s.learner, s.name)
            for s in find_submissions([str(tmp_path)])}
    assert subs == {
        "alice/homework.ipynb": ("alice", "alice-homework"),
        "bob/alice_90_toy.ipynb": ("bob", "bob-alice_90_toy"),
        "bob/homework.ipynb": ("bob", "bob-homework"),
        "carol/90_toy (1).ipynb": ("carol", "carol-90_toy (1)"),
        "dave/Copy of 90_toy.ipynb": ("dave", "dave-Copy of 90_toy"),
        "erin/erin_90_toy.ipynb": ("erin", "erin_90_toy"),
        "erin_90_toy.ipynb": ("erin", "erin_90_toy-2")}


def _class(root: Path) -> Path:
    """A class folder: a reference, a stub, a half-right and a broken submission."""
    subs = root / "subs"
    for learner in ("ann", "ben", "cid", "dee"):
        (subs / learner).mkdir(parents=True)
    shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", subs / "ann" / "90_toy.ipynb")
    shutil.copy(FIXTURES / "notebooks" / "90_toy.ipynb", subs / "ben" / "90_toy.ipynb")
    half = copy.deepcopy(RELEASE)
    for cell in half.cells:
        if notebook.role(cell) == "answer" and notebook.exercise_of(cell) == "toy.mul":
            cell.source = "def mul(a, b):\n    return a * b"
    notebook.write(half, subs / "cid" / "90_toy.ipynb")
    (subs / "dee" / "90_toy.ipynb").write_text("{broken")
    return subs


def test_a_submission_that_kills_its_grading_worker_costs_only_its_own_result(tmp_path):
    subs = _class(tmp_path)
    killer = copy.deepcopy(RELEASE)
    for cell in killer.cells:
        if notebook.role(cell) == "answer" and notebook.exercise_of(cell) == "toy.add":
            cell.source = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"
    (subs / "eve").mkdir()
    notebook.write(killer, subs / "eve" / "90_toy.ipynb")
    results = {s.learner: r for s, r, _ in grade_all(find_submissions([str(subs)]), tmp_path / "out",
                                                     device="cpu", seed=5, timeout=None, jobs=2)}
    assert [results[k].score for k in ("ann", "ben", "cid")] == [3, 0, 2]
    if kernel_isolation().namespace:  # the kernel sees no process outside its own namespace
        eve = {e.id: e.status for e in results["eve"].exercises}
        assert results["eve"].error is None and eve["toy.add"] == "crashed", eve
    else:
        assert "the grading worker died" in results["eve"].error
    assert sorted(p.name for p in (tmp_path / "out").glob("*.json")) == [
        f"{k}-90_toy.json" for k in ("ann", "ben", "cid", "dee", "eve")]


def test_resume_reuses_unchanged_work_and_regrades_changes(tmp_path):
    subs = find_submissions([str(_class(tmp_path))])
    out = tmp_path / "out"
    first = {s.learner: reused for s, _, reused in grade_all(subs, out, device="cpu", seed=1,
                                                             timeout=None)}
    assert not any(first.values())
    (tmp_path / "subs" / "ben" / "90_toy.ipynb").write_bytes(
        (FIXTURES / "solutions" / "90_toy.ipynb").read_bytes())  # ben finishes his work
    second = {s.learner: (reused, r.score) for s, r, reused in grade_all(
        subs, out, device="cpu", seed=2, timeout=None)}
    assert second == {"ann": (True, 3), "ben": (False, 3), "cid": (True, 2), "dee": (True, 0)}
    reseeded = [reused for _, _, reused in grade_all(subs[:1], out, device="cpu", seed=3,
                                                     timeout=None, same_seed=True)]
    assert reseeded == [False]  # an explicit new seed is a new grading
    forced = [reused for _, _, reused in grade_all(subs[:1], out, device="cpu", seed=2,
                                                   timeout=None, force=True)]
    assert forced == [False]
    changed_limit = [reused for _, _, reused in grade_all(subs[:1], out, device="cpu", seed=2,
                                                          timeout=7)]
    assert changed_limit == [False]  # a different time limit is a different grading


def test_ci_exit_codes(tmp_path, capsys):
    subs = _class(tmp_path)
    shutil.rmtree(subs / "dee")
    out = str(tmp_path / "out")
    assert main(["grade", str(subs / "ann"), "--out", out, "--device", "cpu",
                 "--fail-under", "100", "--jobs", "2"]) == 0
    assert "grading 1 notebook(s) on cpu, seed " in (said := capsys.readouterr().out)
    assert ", 1 job(s) -> " in said  # (one notebook takes one job, and every core)
    assert main(["grade", str(subs), "--out", out, "--device", "cpu", "--jobs", "2",
                 "--fail-under", "50"]) == 3  # ben scores 0
    assert "below --fail-under 50%" in capsys.readouterr().out
    assert main(["grade", str(subs), "--out", out, "--device", "cpu"]) == 0


def test_markup_in_paths_and_contents_is_printed_as_text(tmp_path, capsys):
    subs = tmp_path / "subs"
    (subs / "[/bold] mallory").mkdir(parents=True)
    (subs / "[/bold] mallory" / "90_toy.ipynb").write_text("[/bold] [red]x")
    (subs / "root:x:0:0").mkdir()
    (subs / "root:x:0:0" / "90_toy.ipynb").write_text("[/red]")
    (subs / "\x1b]0;title\x07\x1b[2J").mkdir()
    (subs / "\x1b]0;title\x07\x1b[2J" / "90_toy.ipynb").write_text("x")
    assert main(["grade", str(subs), "--out", str(tmp_path / "out"), "--device", "cpu"]) == 1
    out = "".join(capsys.readouterr().out.split())  # rich wraps lines at 80 columns here
    assert "[/bold]mallory" in out and "root:x:0:0" in out
    assert "\x1b" not in out and "\\x1b]0;title\\x07\\x1b[2J" in out
    assert (tmp_path / "out" / "gradebook.csv").is_file()


def _without_times(data):
    """A report with its wall-clock fields (times, start stamps) removed, and the digest that
    covers them."""
    if isinstance(data, dict):
        return {k: _without_times(v) for k, v in data.items()
                if k not in ("execution_time", "duration_s", "started_at", "digest")}
    if isinstance(data, list):
        return [_without_times(v) for v in data]
    return re.sub(r"started \S+", "", data) if isinstance(data, str) else data


def test_two_jobs_grade_and_report_exactly_as_one(tmp_path, capsys):
    subs = _class(tmp_path)
    assert [s.learner for s in find_submissions([str(subs)])] == ["ann", "ben", "cid", "dee"]
    for jobs in ("1", "2"):
        assert main(["grade", str(subs), "--out", str(tmp_path / jobs), "--device", "cpu",
                     "--seed", "4", "--jobs", jobs]) == 1  # dee's broken file: exit 1
    one, two = tmp_path / "1", tmp_path / "2"
    results = {}
    for learner in ("ann", "ben", "cid", "dee"):
        a, b = (json.loads((d / f"{learner}-90_toy.json").read_text()) for d in (one, two))
        assert _without_times(a) == _without_times(b), learner
        results[learner] = a
    assert [results[k]["score"] for k in ("ann", "ben", "cid")] == [3, 0, 2]
    assert "not a readable Jupyter notebook" in results["dee"]["error"]
    assert (one / "gradebook.csv").read_text() == (two / "gradebook.csv").read_text()
    rows = (one / "gradebook.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows] == ["learner", "ann", "ben", "cid", "dee"]
    for name in ("ann-90_toy", "ben-90_toy", "cid-90_toy"):
        a, b = (json.loads((d / "gradescope" / f"{name}.json").read_text()) for d in (one, two))
        assert _without_times(a) == _without_times(b)
        assert (one / "feedback" / f"{name}.html").is_file()
    assert "<img" in (one / "summary.html").read_text()
    _three_shards_merged_report_as(one, subs, tmp_path, capsys)


def _report_files(folder: Path) -> dict[str, str]:
    """Every file ``grader grade`` writes in ``folder``, by relative path, as text with its
    wall-clock figures (seconds, start stamps) blanked."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.endswith(".executed.ipynb") and path.name != \
                ".results-key":  # (each folder's own)
            text = path.read_text(encoding="utf-8") if path.suffix != ".png" else path.name
            text = re.sub(r'"digest": "[0-9a-f]+"', '"digest": <digest>', text)
            text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+(\+00:00|Z)?", "<stamp>", text)
            text = re.sub(r"\b\d+(\.\d+)? s\b", "<s> s", text)
            out[str(path.relative_to(folder))] = re.sub(
                r'(duration_s"?: |execution_time"?: |time=")[\d.]+', r"\1<s>", text)
    return out


#: a stand-in for Slurm's sbatch: runs the job at once (each task of an --array in turn, as
#: SLURM_ARRAY_TASK_ID), writing its --output; prints a job id (--parsable)
FAKE_SBATCH = """#!{python}
import os, subprocess, sys
opts, argv = {{}}, sys.argv[1:]
while argv and argv[0].startswith("--"):
    key, _, value = argv.pop(0)[2:].partition("=")
    opts[key] = value
first, last = map(int, opts.get("array", "0-0").split("-"))
for task in range(first, last + 1):
    env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(task), SLURM_CPUS_PER_TASK="1")
    command = ["bash", "-c", opts["wrap"]] if "wrap" in opts else ["bash", *argv]
    with open(opts["output"].replace("%a", str(task)), "w") as log:
        subprocess.run(command, env=env, stdout=log, stderr=log)
print("4242")
"""


def _three_shards_merged_report_as(unsharded: Path, subs: Path, tmp_path: Path, capsys):
    """The class ``subs`` graded in three shards by slurm/grade-class.sh (seed 4), merged: the
    reports are those of the unsharded run in ``unsharded``, up to wall-clock figures."""
    capsys.readouterr()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH.format(python=sys.executable))
    (bin_dir / "sbatch").chmod(0o755)
    out = tmp_path / "merged"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SEED="4",
               PYTHON=sys.executable)
    run = subprocess.run(["bash", str(ROOT / "slurm" / "grade-class.sh"), str(subs), "3",
                          str(out)], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"seed 4, cpu: job array 4242 grades {subs} in 3 shards" in run.stdout
    shards = [out / "shards" / str(k) for k in (1, 2, 3)]
    assert [len(list(f.glob("*-90_toy.json"))) for f in shards] == [2, 1, 1]  # ann+dee, ben, cid
    assert all(json.loads((f / "shard.json").read_text())["batch"] == [
        "ann-90_toy", "ben-90_toy", "cid-90_toy", "dee-90_toy"] for f in shards)
    merge_log = (out / "slurm" / "merge.log").read_text()
    assert "merged 4 result(s) from 3 folder(s)" in merge_log
    # (dee's notebook is not JSON: the merge exits 1, and says why)
    assert "1 notebook(s) could not be graded" in merge_log and "dee-90_toy: " in merge_log
    one, merged = _report_files(unsharded), _report_files(out)
    assert "junit.xml" in one
    assert sorted(one) == sorted(p for p in merged if p.split("/")[0] not in ("shards", "slurm"))
    for name in one:
        assert one[name] == merged[name], name
    grade = ["grade", str(subs), "--device", "cpu", "--seed", "4", "--jobs", "1"]
    # a shard needs the batch's seed; an empty shard grades nothing; results differ: refused
    assert main(["grade", str(subs), "--shard", "1/3", "--out", str(tmp_path / "x")]) == 2
    assert "--shard needs --seed" in capsys.readouterr().err
    assert main([*grade, "--shard", "5/5", "--out", str(tmp_path / "x")]) == 0
    assert "is empty: nothing to grade" in capsys.readouterr().out
    other = tmp_path / "other"
    shutil.copytree(shards[0], other)
    LabResult.from_dict(json.loads((other / "ann-90_toy.json").read_text().replace(
        '"seed": 4', '"seed": 5'))).write(other / "ann-90_toy.json")  # (sealed by a grader)
    assert main(["merge", str(shards[0]), str(other), "--out", str(tmp_path / "m2")]) == 2
    assert "two different results" in capsys.readouterr().err
    # a result changed by anything but the grader is refused, and named
    forged = tmp_path / "forged"
    shutil.copytree(shards[1], forged)
    (forged / "ben-90_toy.json").write_text(
        (forged / "ben-90_toy.json").read_text().replace('"points": 0.0', '"points": 1.0'))
    assert main(["merge", str(shards[0]), str(forged), str(shards[2]), "--out",
                 str(tmp_path / "m6")]) == 1
    said = capsys.readouterr().out
    assert "refused" in said and "ben-90_toy.json: its digest does not verify" in said
    # ...and counts for nothing, with a row that says why until ben's notebook is graded again
    ben = read_verified(tmp_path / "m6" / "ben-90_toy.json")
    assert ben.score == 0 and ben.learner == "ben" and "digest does not verify" in ben.error
    book = (tmp_path / "m6" / "gradebook.csv").read_text()
    assert book.count("\n") == 5 and "grade this notebook again" in book
    # a lost shard, or one stopped mid-way, is named (the reports are written); so are
    # shards of two splits
    assert main(["merge", str(shards[0]), str(shards[2]), "--out", str(tmp_path / "m3")]) == 1
    said = capsys.readouterr().out
    assert "incomplete" in said and "shard 2/3: no result for 1 of its 1 notebook(s) " \
        "(ben-90_toy)" in said and "shard 1/3:" not in said and "disagree" not in said
    assert (tmp_path / "m3" / "gradebook.csv").read_text().count("\n") == 4  # ann cid dee
    assert main(["merge", str(shards[0]), str(tmp_path / "x"), "--out",
                 str(tmp_path / "m5")]) == 1  # (then which shard owes what is not said)
    said = capsys.readouterr().out
    assert "the shards disagree on the batch or its split" in said and "no result" not in said
    (shards[0] / "dee-90_toy.json").unlink()
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "m4")]) == 1
    assert "shard 1/3: no result for 1 of its 2 notebook(s) (dee-90_toy)" in \
        capsys.readouterr().out


def test_regrading_one_learner_keeps_the_class_reports(tmp_path):
    subs = _class(tmp_path)
    out = str(tmp_path / "out")
    assert main(["grade", str(subs), "--out", out, "--device", "cpu", "--seed", "1"]) == 1
    (subs / "ben" / "90_toy.ipynb").write_bytes((FIXTURES / "solutions" / "90_toy.ipynb").read_bytes())
    assert main(["grade", str(subs / "ben"), "--out", out, "--device", "cpu", "--seed", "1"]) == 0
    rows = {r.split(",")[0]: r for r in (tmp_path / "out" / "gradebook.csv").read_text().splitlines()}
    assert set(rows) == {"learner", "ann", "ben", "cid", "dee"}
    assert sorted(p.name for p in (tmp_path / "out").glob("*.json")) == \
        ["ann-90_toy.json", "ben-90_toy.json", "cid-90_toy.json", "dee-90_toy.json"]


@pytest.mark.parametrize("flag, value", [("--timeout", "-5"), ("--timeout", "0"), ("--jobs", "0"),
                                         ("--fail-under", "150")])
def test_nonsense_numbers_are_usage_errors(tmp_path, flag, value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["grade", str(tmp_path), flag, value])
    assert info.value.code == 2 and "is not" in capsys.readouterr().err


@pytest.mark.parametrize("path, learner", [
    ("subs/alice_90_toy-Copy1.ipynb", "alice"),             # JupyterLab's copy
    ("subs/Copy of bob_90_toy (2).ipynb", "bob"),           # a browser's or Drive's copy
    ("subs/carol_90_toy copy 2.ipynb", "carol"),            # macOS Finder's copy
    ("subs/Copy of 90_toy (2).ipynb", "subs"),              # no learner in the name
])
def test_copy_marks_are_not_part_of_the_learners_name(path, learner):
    assert learner_of(Path(path)) == learner


def test_each_use_gets_its_own_default_output_folder(tmp_path, monkeypatch):
    assert default_out(["solutions"]) == Path("build/grades/solutions")
    assert default_out(["work/02_autograd.ipynb"]) == Path("build/grades/work")
    assert default_out(["submissions/"]) == Path("build/grades/submissions")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", tmp_path / "work" / "90_toy.ipynb")
    assert main(["grade", "work/90_toy.ipynb", "--device", "cpu"]) == 0
    assert sorted(p.name for p in (tmp_path / "build" / "grades").iterdir()) == ["work"]
    assert (tmp_path / "build" / "grades" / "work" / "gradebook.csv").is_file()


def test_help_names_the_reports_and_the_naming_and_jobs_defaults_to_the_cores(capsys):
    with pytest.raises(SystemExit):
        main(["grade", "--help"])
    text = capsys.readouterr().out
    for phrase in ("gradebook.csv", "junit.xml", "summary.html", "feedback/<name>.md",
                   "gradescope/<name>.json", "<learner>-<stem>", "--keep-missing", "--labs"):
        assert phrase in text, phrase
    assert build_parser().parse_args(["grade", "x"]).jobs == (os.cpu_count() or 1)


def _gradebook(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "gradebook.csv", newline="") as f:
        return {row["learner"]: row for row in csv.DictReader(f)}


def test_a_learners_maximum_is_over_the_labs_the_class_was_assigned(tmp_path):
    subs = _class(tmp_path)
    out = tmp_path / "out"
    assert main(["grade", str(subs), "--out", str(out), "--device", "cpu", "--seed", "1"]) == 1
    assert {row["max_score"] for row in _gradebook(out).values()} == {"4"}  # the labs present
    assert main(["grade", str(subs), "--out", str(out), "--device", "cpu", "--seed", "1",
                 "--labs", "toy,autograd"]) == 1
    book = _gradebook(out)
    # toy's 4 + autograd's points
    maximum = f"{4 + load_lab('autograd').max_score:g}"
    assert {row["max_score"] for row in book.values()} == {maximum}
    assert book["ann"]["autograd:score"] == "" and book["ann"]["autograd:max"] == ""
    assert book["ann"]["score"] == "3"
    with pytest.raises(SystemExit):
        main(["grade", str(subs), "--labs", "toy,nope"])


def test_an_ungradable_notebook_has_the_batch_labs_maximum_in_every_report(tmp_path):
    subs = tmp_path / "subs"
    (subs / "ann").mkdir(parents=True)
    (subs / "zed").mkdir()
    shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", subs / "ann" / "90_toy.ipynb")
    (subs / "zed" / "homework.ipynb").write_text('{"cells": [],}')
    nameless = copy.deepcopy(notebook.read(FIXTURES / "solutions" / "90_toy.ipynb"))
    nameless.metadata = {}
    for i, cell in enumerate(nameless.cells):
        cell.metadata, cell.id = {}, f"mine-{i}"  # no lab, no release ids: nothing says toy
    (subs / "yan").mkdir()
    notebook.write(nameless, subs / "yan" / "homework.ipynb")
    out = tmp_path / "out"
    assert main(["grade", str(subs), "--out", str(out), "--device", "cpu"]) == 1
    zed = json.loads((out / "zed-homework.json").read_text())
    console = Console(file=io.StringIO(), width=100)
    console.print(summary_table([(Submission(subs / "zed" / "homework.ipynb", "zed", "zed"),
                                  LabResult.from_dict(zed), False)]))
    row = console.file.getvalue()  # (the reason has a line of its own, not the table's row)
    assert "not graded (the reason is" in row and "column 14" not in row
    assert (zed["lab"], zed["max_score"]) == ("toy", 4) and "line 1, column 14" in zed["error"]
    assert zed["notes"] == ["it could not be read to tell which lab it is; it was counted as "
                            "toy, the lab this batch assigns"]
    assert _gradebook(out)["zed"]["max_score"] == "4"
    zed_json = json.loads((out / "gradescope" / "zed-homework.json").read_text())
    assert zed_json["extra_data"]["max_score"] == 4
    assert "Score: 0 / 4" in (out / "feedback" / "zed-homework.html").read_text()
    assert 'name="max_score" value="4"' in (out / "junit.xml").read_text()
    yan = json.loads((out / "yan-homework.json").read_text())
    assert yan["lab"] == "toy" and yan["score"] == 3
    assert any("graded as toy, the lab this batch assigns" in n for n in yan["notes"])


def test_a_deleted_hand_in_is_named_and_does_not_outrank_the_new_one(tmp_path, capsys):
    subs = tmp_path / "subs"
    (subs / "alice").mkdir(parents=True)
    shutil.copy(FIXTURES / "solutions" / "90_toy.ipynb", subs / "alice" / "90_toy.ipynb")
    out = tmp_path / "out"
    assert main(["grade", str(subs), "--out", str(out), "--device", "cpu"]) == 0
    (subs / "alice" / "90_toy.ipynb").unlink()  # alice hands in a new file instead
    half = copy.deepcopy(RELEASE)
    for cell in half.cells:
        if notebook.role(cell) == "answer" and notebook.exercise_of(cell) == "toy.mul":
            cell.source = "def mul(a, b):\n    return a * b"
    notebook.write(half, subs / "alice" / "90_toy-v2.ipynb")
    capsys.readouterr()
    assert main(["grade", str(subs), "--out", str(out), "--device", "cpu"]) == 0
    said = capsys.readouterr().out
    assert "submission gone, its result left out of the reports: alice-90_toy.json" in said
    book = _gradebook(out)["alice"]
    assert (book["score"], book["grading_errors"]) == ("2", "")
    assert main(["grade", str(subs), "--out", str(out), "--device", "cpu",
                 "--keep-missing"]) == 0
    assert _gradebook(out)["alice"]["score"] == "3"  # asked for: the best counts again


def test_console_output_into_a_file_keeps_lines_and_paths_whole(tmp_path, capsys):
    deep = tmp_path / ("a-folder-with-a-rather-long-name-" * 4) / "learner-with-a-long-name"
    deep.mkdir(parents=True)
    shutil.copy(FIXTURES / "notebooks" / "90_toy.ipynb", deep / "90_toy.ipynb")
    shutil.copy(FIXTURES / "notebooks" / "90_toy.ipynb", deep / "90_toy (1).ipynb")
    assert main(["grade", str(deep), "--out", str(tmp_path / "out"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert any(str(deep / "90_toy (1).ipynb") in line for line in out.splitlines())
    assert "…" not in out
    stub = "NotImplementedError: toy.add is still the stub"
    main(["grade", str(deep / "90_toy.ipynb"), "--out", str(tmp_path / "one"), "--device", "cpu"])
    assert any(stub in line for line in capsys.readouterr().out.splitlines())


def test_files_without_a_learners_name_right_in_the_searched_folder_are_each_their_own(tmp_path):
    for f in ("90_toy-Copy1.ipynb", "Copy of 90_toy (2).ipynb", "dan_90_toy.ipynb"):
        (tmp_path / f).write_text("{}")
    assert sorted(s.learner for s in find_submissions([str(tmp_path)])) == [
        "90_toy-Copy1", "Copy of 90_toy (2)", "dan"]
