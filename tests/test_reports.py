"""Report formats (grader.reports): each a view of the JSON results, read as "given these
results, this report". Results are built in code (one of each status, a skipped CUDA exercise,
a notebook that could not be graded at all) plus one real toy submission graded in a kernel,
whose executed notebook supplies the answer-cell outputs."""
import base64
import csv
import json
import os
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, replace

import jsonschema
import nbformat
import pytest
from junitparser.xunit2 import JUnitXml

from grader import notebook
from grader.reports import feedback, write_reports
from grader.reports.feedback import feedback_html, feedback_markdown
from grader.reports.gradebook import gradebook_rows, write_gradebook_csv
from grader.reports.graded import Graded, load_graded
from grader.reports.gradescope import gradescope_results, write_gradescope_json
from grader.reports.junit import junit_xml, write_junit_xml
from grader.reports.summary import class_summary, summary_html
from grader.judge.grade import grade_notebook
from grader.results import Environment, ExerciseResult, LabResult
from tests.conftest import FIXTURES, ROOT

GRADESCOPE_SCHEMA = json.loads((ROOT / "grader" / "gradescope.schema.json").read_text())
CPU = Environment("2.13.0+cpu", "cpu", 7, "0.1.0", "3.11.7", "2026-01-01T00:00:00+00:00")
GPU = Environment("2.13.0+cu128", "cuda", 7, "0.1.0", "3.11.7", "2026-01-01T00:00:00+00:00")
TITLES = {"toy.add": "Add two numbers", "toy.mul": "Multiply two numbers",
          "toy.gpu": "Something that needs a GPU", "demo.one": "The <only> exercise"}
SCRIPT = "expected 6, got '<script>alert(1)</script>'"
# a 1x1 PNG
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5"
       "ErkJggg==")


def ex(eid, status, points, max_points, message="", duration=0.5):
    return ExerciseResult(eid, TITLES[eid], status, points, max_points, message, duration)


def lab(name, env, *exercises, error=None):
    return LabResult(lab=name, notebook=f"subs/{name}.ipynb", exercises=tuple(exercises),
                     environment=env, duration_s=2.2, error=error)


ALICE_TOY = lab("toy", CPU, ex("toy.add", "passed", 1, 1, "3/3 checks passed (seed 7)"),
                ex("toy.mul", "failed", 0, 2, SCRIPT),
                ex("toy.gpu", "skipped", 0, 1, "needs cuda; this machine has cpu", 0.0))
ALICE_DEMO = lab("demo", CPU, ex("demo.one", "passed", 5, 5, "1/1 checks passed"))
BOB_TOY = lab("toy", GPU, ex("toy.add", "error", 0, 1, "NameError: \x1b[31mname 'x'\x1b[0m \x00"),
              ex("toy.mul", "timeout", 0, 2, "over the time limit of 3 s"),
              ex("toy.gpu", "passed", 1, 1, "1/1 checks passed"))
CAROL_TOY = lab("toy", CPU, ex("toy.add", "crashed", 0, 1, "the kernel died"),
                ex("toy.mul", "passed", 2, 2, "1/1 checks passed"),
                ex("toy.gpu", "skipped", 0, 1, "needs cuda; this machine has cpu", 0.0))
DAVE = lab("unknown", CPU, error="x.ipynb: not a readable Jupyter notebook <oops>")

SYNTHETIC = [Graded("alice_90_toy", "alice", ALICE_TOY), Graded("bob_90_toy", "bob", BOB_TOY),
             Graded("alice_91_demo", "alice", ALICE_DEMO),
             Graded("carol_90_toy", "carol", CAROL_TOY), Graded("x", "dave", DAVE)]


@pytest.fixture(scope="module")
def erin(tmp_path_factory):
    """A real toy submission graded in a kernel: add is wrong and prints text, a value and an
    image; mul's answer cell defines mul, then raises."""
    tmp = tmp_path_factory.mktemp("erin")
    nb = notebook.read(FIXTURES / "notebooks" / "90_toy.ipynb")
    sources = {
        "toy.add": ("import base64\nfrom IPython.display import Image, display\n"
                    "print('hello from add <b>bold</b>')\n"
                    f"display(Image(data=base64.b64decode('{PNG}')))\n"
                    "def add(a, b):\n    return a - b\nadd(2, 2)"),
        "toy.mul": "def mul(a, b):\n    return a * b\nraise ValueError('bad <mul>')"}
    for cell in nb.cells:
        if notebook.role(cell) == "answer" and notebook.exercise_of(cell) in sources:
            cell.source = sources[notebook.exercise_of(cell)]
    path = tmp / "erin_90_toy.ipynb"
    notebook.write(nb, path)
    grade_notebook(path, tmp / "out", device="cpu", seed=7)
    return load_graded(tmp / "out" / "erin_90_toy.json", learner="erin")


@pytest.fixture
def graded(erin):
    return SYNTHETIC + [erin]


# --------------------------------------------------------------------------- gradebook

def test_gradebook_has_one_row_per_learner_with_exercise_columns_and_totals(graded, tmp_path):
    path = write_gradebook_csv(graded, tmp_path / "gradebook.csv")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = {r["learner"]: r for r in reader}
        columns = reader.fieldnames
    assert columns == ["learner", "toy.add", "toy.mul", "toy.gpu", "toy:score", "toy:max",
                       "toy:runnable_max", "demo.one", "demo:score", "demo:max",
                       "demo:runnable_max", "score", "max_score", "runnable_max_score",
                       "grading_errors"]
    assert list(rows) == ["alice", "bob", "carol", "dave", "erin"]  # first-seen order
    alice = rows["alice"]  # two labs, one row
    assert (alice["toy.add"], alice["toy.mul"], alice["toy.gpu"], alice["demo.one"]) == ("1", "0", "0", "5")
    assert (alice["toy:score"], alice["toy:max"], alice["toy:runnable_max"]) == ("1", "4", "3")
    assert (alice["score"], alice["max_score"], alice["runnable_max_score"]) == ("6", "9", "8")
    bob = rows["bob"]  # no demo result: empty cells, and demo counts as 0 of its 5 points
    assert bob["demo.one"] == bob["demo:score"] == ""
    assert (bob["toy:score"], bob["toy:runnable_max"]) == ("1", "4")
    assert (bob["score"], bob["max_score"], bob["runnable_max_score"]) == ("1", "9", "9")
    dave = rows["dave"]  # nothing could be graded: a row of zeros and the reason
    assert dave["toy.add"] == "" and dave["score"] == "0" and dave["max_score"] == "9"
    assert "not a readable Jupyter notebook" in dave["grading_errors"]
    for row in rows.values():  # the totals are the sums of the per-lab cells
        assert float(row["score"]) == sum(float(row[f"{lab}:score"] or 0) for lab in ("toy", "demo"))
        assert float(row["toy:score"] or 0) == sum(float(row[e] or 0) for e in ("toy.add", "toy.mul", "toy.gpu"))
    assert rows["erin"]["toy:score"] == str(int(graded[-1].result.score))


def test_two_results_of_one_learner_for_one_lab_count_the_best_and_say_so():
    def again(status, points):
        return replace(CAROL_TOY, exercises=tuple(replace(e, status=status, points=points(e))
                                                  for e in CAROL_TOY.exercises))

    worse, better = again("failed", lambda e: 0), again("passed", lambda e: e.max_points)
    for extra, counted, score in ((worse, "alice_90_toy", "1"), (better, "again", "4")):
        _, rows = gradebook_rows(SYNTHETIC + [Graded("again", "alice", extra)])
        alice = next(r for r in rows if r["learner"] == "alice")
        assert alice["toy:score"] == score
        assert (f"toy: several results (alice_90_toy, again); the best, {counted}, is counted"
                in alice["grading_errors"])


def test_assigned_labs_set_every_maximum_and_a_learner_of_another_lab_keeps_a_row():
    erin = Graded("erin_91_demo", "erin", ALICE_DEMO)  # erin handed in only a lab not assigned
    columns, rows = gradebook_rows(SYNTHETIC + [erin], {"toy": 4, "other": 10})
    assert [c for c in columns if c.endswith(":max")] == ["toy:max", "other:max"]
    book = {r["learner"]: r for r in rows}
    assert {r["max_score"] for r in rows} == {"14"}
    assert (book["erin"]["score"], book["alice"]["score"]) == ("0", "1")  # demo counts nothing
    assert "erin_91_demo: lab demo is not among the assigned labs" in book["erin"]["grading_errors"]


def test_the_class_summary_counts_one_result_per_learner_and_lab_the_best():
    worse = replace(CAROL_TOY, exercises=tuple(replace(e, status="failed", points=0)
                                               for e in CAROL_TOY.exercises))
    toy = class_summary(SYNTHETIC + [Graded("carol_again", "carol", worse)])["labs"]["toy"]
    assert toy["submissions"] == 3 and toy["scores"] == [1, 1, 2]


# --------------------------------------------------------------------------- atomic writes

@pytest.mark.parametrize("first_time", [True, False])
def test_a_gradebook_interrupted_midway_leaves_no_partial_file(tmp_path, monkeypatch, first_time):
    path = tmp_path / "gradebook.csv"
    if not first_time:
        write_gradebook_csv(SYNTHETIC[:1], path)
    before = path.read_bytes() if path.exists() else None
    rows_written = []

    def writerow(self, row):
        if rows_written:
            raise OSError("disk full")  # the second row never makes it
        rows_written.append(row)
        return original(self, row)

    original = csv.DictWriter.writerow
    monkeypatch.setattr(csv.DictWriter, "writerow", writerow)
    with pytest.raises(OSError, match="disk full"):
        write_gradebook_csv(SYNTHETIC, path)
    assert rows_written  # it did fail midway
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if first_time else ["gradebook.csv"])
    assert (path.read_bytes() if path.exists() else None) == before


@pytest.mark.parametrize("write", [
    lambda path: write_junit_xml(SYNTHETIC, path),
    lambda path: write_gradescope_json(ALICE_TOY, path),
    lambda path: write_gradebook_csv(SYNTHETIC, path)], ids=["junit", "gradescope", "csv"])
def test_a_failure_before_the_rename_keeps_the_old_report(tmp_path, monkeypatch, write):
    path = tmp_path / "report"
    path.write_text("old, complete report")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        write(path)
    assert path.read_text() == "old, complete report"
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_write_reports_writes_every_view_and_refuses_bad_names_before_writing(graded, tmp_path):
    written = write_reports(graded, tmp_path / "r")
    names = sorted(str(p.relative_to(tmp_path / "r")) for p in written)
    per_sub = [f"{d}/{g.name}.{x}" for g in graded for d, x in
               (("feedback", "md"), ("feedback", "html"), ("gradescope", "json"))]
    assert names == sorted(["gradebook.csv", "junit.xml", "summary.html", *per_sub])
    assert sorted(str(p.relative_to(tmp_path / "r")) for p in (tmp_path / "r").rglob("*")
                  if p.is_file()) == names  # and nothing else (no temporary files)
    for bad in ([*graded, graded[0]], [Graded("../x", "eve", ALICE_TOY)]):
        with pytest.raises(ValueError):
            write_reports(bad, tmp_path / "nothing")
        assert not (tmp_path / "nothing").exists()


# --------------------------------------------------------------------------- JUnit

def test_junit_has_a_suite_per_submission_and_a_case_per_exercise(graded, tmp_path):
    path = write_junit_xml(graded, tmp_path / "junit.xml")
    root = ET.parse(path).getroot()  # well-formed, despite the ANSI codes and NUL in a message
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [f"{g.learner}.{g.result.lab}" for g in graded]
    for g, suite in zip(graded, suites):
        r = g.result
        cases = suite.findall("testcase")
        statuses = [e.status for e in r.exercises]
        expected = {"failures": statuses.count("failed"), "skipped": statuses.count("skipped"),
                    "errors": sum(s in ("error", "timeout", "crashed") for s in statuses)}
        if not r.exercises:  # a notebook that could not be graded still shows as one error
            expected["errors"] = 1
            assert [c.get("name") for c in cases] == ["grading"]
            assert r.error in cases[0].find("error").get("message")
        else:
            assert [c.get("name") for c in cases] == [e.id for e in r.exercises]
        assert int(suite.get("tests")) == len(cases)
        assert {k: int(suite.get(k)) for k in expected} == expected
        props = {p.get("name"): p.get("value") for p in suite.find("properties")}
        assert props["seed"] == "7" and props["device"] == r.environment.device
        assert float(props["score"]) == r.score and float(props["runnable_max_score"]) == r.runnable_max_score
        for e, case in zip(r.exercises, cases):
            assert case.get("classname") == f"{g.learner}.{r.lab}"
            assert float(case.get("time")) == e.duration_s
            points = {p.get("name"): float(p.get("value")) for p in case.find("properties")}
            assert points == {"points": e.points, "max_points": e.max_points}
            outcome = [c for c in case if c.tag in ("failure", "error", "skipped")]
            if e.status == "passed":
                assert outcome == []
            else:
                (o,) = outcome
                assert o.tag == {"failed": "failure", "skipped": "skipped"}.get(e.status, "error")
                assert o.get("type") == e.status
                assert o.get("message") == e.message.replace("\x00", "").replace(
                    "\x1b[31m", "").replace("\x1b[0m", "")
    xml = JUnitXml.fromfile(str(path))  # and junitparser reads back the same counts
    assert xml.tests == sum(max(len(g.result.exercises), 1) for g in graded)
    assert xml.failures == sum(e.status == "failed" for g in graded for e in g.result.exercises)


def test_junit_is_equal_for_equal_inputs():
    assert junit_xml(SYNTHETIC) == junit_xml(list(SYNTHETIC))


# --------------------------------------------------------------------------- Gradescope

def test_gradescope_results_validate_and_count_skipped_exercises_in_max_score(graded, tmp_path):
    for g in graded:
        data = json.loads(write_gradescope_json(g.result, tmp_path / f"{g.name}.json").read_text())
        jsonschema.validate(data, GRADESCOPE_SCHEMA)
        assert data == json.loads(json.dumps(gradescope_results(g.result)))
    alice = gradescope_results(ALICE_TOY)
    assert (alice["score"], alice["extra_data"]["max_score"]) == (1, 4)  # toy.gpu skipped, counted
    assert "max_score" not in alice  # (not in Gradescope's specification's top level)
    assert alice["extra_data"]["runnable_max_score"] == 3
    assert "1/3 over what could run" in alice["output"] and "seed 7" in alice["output"]
    assert "device cpu" in alice["output"]
    assert alice["extra_data"]["environment"] == asdict(CPU)
    gpu = alice["tests"][2]
    assert gpu["name"] == "toy.gpu: Something that needs a GPU"
    assert (gpu["status"], gpu["score"], gpu["max_score"]) == ("failed", 0, 1)
    assert gpu["output"].startswith("skipped: needs cuda") and gpu["visibility"] == "visible"
    assert [t["status"] for t in gradescope_results(BOB_TOY)["tests"]] == ["failed", "failed", "passed"]
    dave = gradescope_results(DAVE)
    assert dave["tests"] == [] and "not a readable Jupyter notebook" in dave["output"]


# --------------------------------------------------------------------------- feedback

def test_feedback_escapes_messages_and_shows_both_scores(graded):
    alice = graded[0]
    html = feedback_html(alice)
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "1 / 4" in html and "1 / 3" in html and "seed 7" in html and "torch 2.13.0+cpu" in html
    md = feedback_markdown(alice)
    assert "<script" not in md and "&lt;script&gt;" in md
    assert "**Score: 1 / 4**" in md and "**1 / 3** over what could run here" in md
    assert "| toy.gpu | Something that needs a GPU | skipped | 0 / 1 | 0.0 s |" in md
    assert "- **failed** `toy.mul`" in md and "- **skipped** `toy.gpu`" in md
    assert "toy.add (" not in md  # passed exercises are not in "what to look at"
    assert "No executed notebook" in md


def test_learners_see_their_notebook_s_name_not_the_instructor_s_folders():
    result = replace(ALICE_TOY, notebook="/home/prof/class-2026/alice/90_toy.ipynb")
    g = Graded("alice_90_toy", "alice", result)
    for text in (feedback_markdown(g), feedback_html(g), json.dumps(gradescope_results(result))):
        assert "90_toy.ipynb" in text and "/home/prof" not in text


def test_feedback_for_a_notebook_that_could_not_be_graded_says_why():
    g = SYNTHETIC[-1]
    for text in (feedback_markdown(g), feedback_html(g)):
        assert "No exercise was graded" in text and "not a readable Jupyter notebook" in text
        assert "&lt;oops&gt;" in text


def test_feedback_shows_answer_cell_outputs_but_nothing_of_the_grade_cells(erin):
    assert erin.executed is not None and erin.name == "erin_90_toy"
    status = {e.id: e.status for e in erin.result.exercises}
    assert (status["toy.add"], status["toy.gpu"]) == ("failed", "skipped")
    executed = notebook.read(erin.executed)
    grade_cells = [c for c in executed.cells if notebook.role(c) == "grade"]
    assert grade_cells and all("judged by the grader" in c.source for c in grade_cells)  # ...
    html, md = feedback_html(erin), feedback_markdown(erin)
    for text in (html, md):  # ...and leave no trace in the feedback
        assert "judged by the grader" not in text and "probe" not in text
        assert "toy.add: failed" not in text  # the grade cell's text/plain output
        assert "Traceback" not in text and "\x1b" not in text
    assert "hello from add &lt;b&gt;bold&lt;/b&gt;" in html
    assert '<pre class="text">-0</pre>' in html or '<pre class="text">0</pre>' in html
    assert f'src="data:image/png;base64,{PNG}"' in html
    assert "ValueError: bad &lt;mul&gt;" in html
    assert "hello from add <b>bold</b>" in md  # inside a code block, where it is literal
    assert "```text\nValueError: bad <mul>\n```" in md
    assert "(an image): see the HTML feedback" in md.replace("*", "")


def test_outputs_are_capped(tmp_path, erin):
    nb = notebook.read(erin.executed)
    cell = next(c for c in nb.cells if notebook.exercise_of(c) == "toy.add"
                and notebook.role(c) == "answer")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 50_000)
                    for _ in range(30)]
    path = tmp_path / "big.executed.ipynb"
    notebook.write(nb, path)
    outputs, note = feedback.answer_outputs(path)
    assert note is None
    shown = outputs["toy.add"]
    assert len(shown) == feedback.MAX_OUTPUTS + 1 and shown[-1].text == "(more outputs not shown)"
    assert len(shown[0].text) < feedback.MAX_TEXT_CHARS + 100 and "more characters" in shown[0].text
    broken = tmp_path / "broken.executed.ipynb"
    broken.write_text("{ not json")
    g = Graded("b", "b", erin.result, broken)
    assert "could not be read" in feedback_markdown(g)


def test_outputs_name_no_folder_of_the_grading_machine(tmp_path, erin):
    import sysconfig

    nb = notebook.read(erin.executed)
    cell = next(c for c in nb.cells if notebook.exercise_of(c) == "toy.add"
                and notebook.role(c) == "answer")
    site = sysconfig.get_paths()["purelib"]
    cell.outputs = [nbformat.v4.new_output(
        "stream", name="stderr", text=f"{site}/IPython/core/interactiveshell.py:3831: "
        f"UserWarning: To exit: use 'exit'\n{ROOT}/labs/x.py and {tempfile.gettempdir()}"
        "/grade-k2j4/work/data.csv\n")]
    path = tmp_path / "paths.executed.ipynb"
    notebook.write(nb, path)
    text = feedback.answer_outputs(path)[0]["toy.add"][0].text
    assert "<site-packages>/IPython/core/interactiveshell.py:3831: UserWarning" in text
    assert "<course>/labs/x.py and <run>/work/data.csv" in text
    assert site not in text and str(ROOT) not in text


# --------------------------------------------------------------------------- class summary

def test_class_summary_matches_statistics_computed_by_hand():
    s = class_summary(SYNTHETIC)
    assert (s["submissions"], s["learners"]) == (5, 4)
    assert s["ungraded"] == [{"name": "x", "learner": "dave", "error": DAVE.error}]
    assert list(s["labs"]) == ["toy", "demo"]
    toy = s["labs"]["toy"]
    # alice 1 of 4 (3 runnable), bob 1 of 4 (4 runnable, on a GPU), carol 2 of 4 (3 runnable)
    assert toy["submissions"] == 3 and toy["devices"] == {"cpu": 2, "cuda": 1}
    assert toy["max_score"] == 4 and toy["scores"] == [1, 1, 2]
    assert toy["score"] == {"mean": round(4 / 3, 4), "median": 1, "min": 1, "max": 2}
    assert toy["mean_fraction"] == round((1 / 4 + 1 / 4 + 2 / 4) / 3, 4)
    assert toy["mean_runnable_fraction"] == round((1 / 3 + 1 / 4 + 2 / 3) / 3, 4)
    assert toy["histogram"]["edges"] == [round(0.4 * i, 4) for i in range(11)]
    assert toy["histogram"]["counts"] == [0, 0, 2, 0, 0, 1, 0, 0, 0, 0]  # 1 in [0.8, 1.2), 2 in [2, 2.4)
    ex = toy["exercises"]
    assert ex["toy.add"]["counts"] == {"passed": 1, "failed": 0, "error": 1, "timeout": 0,
                                       "crashed": 1, "skipped": 0}
    assert (ex["toy.add"]["mean_points"], ex["toy.add"]["pass_rate"]) == (round(1 / 3, 4), round(1 / 3, 4))
    assert (ex["toy.mul"]["mean_points"], ex["toy.mul"]["pass_rate"]) == (round(2 / 3, 4), round(1 / 3, 4))
    # toy.gpu ran only on bob's GPU runner: its statistics are over that one run
    assert (ex["toy.gpu"]["ran"], ex["toy.gpu"]["counts"]["skipped"]) == (1, 2)
    assert (ex["toy.gpu"]["mean_points"], ex["toy.gpu"]["pass_rate"]) == (1, 1)
    demo = s["labs"]["demo"]
    assert demo["score"] == {"mean": 5, "median": 5, "min": 5, "max": 5}
    assert demo["histogram"]["counts"][-1] == 1  # the top score falls in the last (closed) bin
    with pytest.raises(ValueError):
        class_summary([])


def test_summary_html_embeds_a_histogram_per_lab_of_a_class_and_escapes(graded):
    html = summary_html(graded)
    images = [part.split('"', 1)[0] for part in html.split('src="data:image/png;base64,')[1:]]
    assert len(images) == 1  # toy's 3 learners; demo's one score is no distribution
    assert all(base64.b64decode(i).startswith(b"\x89PNG\r\n\x1a\n") for i in images)
    assert '<img alt="histogram of toy scores"' in html
    assert "histogram of demo" not in html and '<h2 id="lab-demo">' in html
    assert "<script" not in html and "&lt;oops&gt;" in html and "The &lt;only&gt; exercise" in html
    assert 'href="feedback/alice_90_toy.html"' in html
    assert "_grade(" not in html


def test_summary_html_shows_means_and_medians_with_at_most_one_decimal():
    def sub(name, points):
        return Graded(name, name, lab("demo", CPU, ex("demo.one", "failed", points, 30)))

    graded = [sub("a", 28), sub("b", 28), sub("c", 29), sub("d", 28.5)]
    s = class_summary(graded)["labs"]["demo"]
    assert s["score"]["mean"] == 28.375 and s["score"]["median"] == 28.25  # the JSON: 4 decimals
    html = summary_html(graded)
    assert "mean 28.4 · median 28.2 · min 28 · max 29" in html  # 28.25 rounds half to even
    assert '<td class="num">28.4</td>' in html  # demo.one's mean points
    assert "28.375" not in html and "28.25" not in html
    thirds = summary_html(graded[:3])
    assert "mean 28.3 ·" in thirds and "28.333" not in thirds


def test_feedback_html_shows_code_spans_as_code_and_keeps_everything_escaped():
    message = ("`run_backward` is not defined; got `<b>x</b>` and <script>alert(1)</script>; "
               "``a `tick` here`` and one ` alone")
    result = replace(ALICE_TOY, exercises=(ex("toy.add", "failed", 0, 1, message),),
                     notes=("the notebook replaced `torch.allclose`",),
                     error="`x.ipynb`: <oops>")
    g = Graded("alice_90_toy", "alice", result)
    html = feedback_html(g)
    assert "<code>run_backward</code> is not defined" in html
    assert "got <code>&lt;b&gt;x&lt;/b&gt;</code> and &lt;script&gt;" in html
    assert "<code>a `tick` here</code> and one ` alone" in html
    assert "the notebook replaced <code>torch.allclose</code>" in html
    assert "<code>x.ipynb</code>: &lt;oops&gt;" in html
    assert "<script" not in html and "<b>" not in html
    md = feedback_markdown(g)  # Markdown keeps its code spans as written
    assert "`run_backward` is not defined; got `<b>x</b>` and &lt;script&gt;" in md
    assert "the notebook replaced `torch.allclose`" in md


def _added_cell(source, *texts):
    """A code cell the learner added (as the assembled notebook marks it), with stdout."""
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["course"] = {"role": "learner"}
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in texts]
    return cell


def test_feedback_shows_outputs_of_cells_the_learner_added_under_the_next_graded_exercise(
        tmp_path, erin):
    nb = notebook.read(erin.executed)
    roles = [(notebook.role(c), notebook.exercise_of(c)) for c in nb.cells]
    add_answer = roles.index(("answer", "toy.add"))
    assert roles.index(("grade", "toy.add")) > add_answer  # add's grade cell follows its answer
    setup = nb.cells[roles.index(("setup", None))]
    setup.outputs = [nbformat.v4.new_output("stream", name="stdout", text="setup says hi")]
    nb.cells.insert(add_answer + 1, _added_cell("# trying add\nprint(add(2, 2))", "add gave 0"))
    nb.cells.insert(add_answer + 1, nbformat.v4.new_markdown_cell("my notes"))
    nb.cells.append(_added_cell("print('the end')", "after every exercise"))
    path = tmp_path / "added.executed.ipynb"
    notebook.write(nb, path)
    outputs, note = feedback.answer_outputs(path)
    assert note is None
    add = outputs["toy.add"]
    assert add[0].text == "hello from add <b>bold</b>" and add[0].cell == ""  # the answer first
    assert (add[-1].text, add[-1].cell) == (
        "add gave 0", 'a cell you added (the code cell starting "# trying add")')
    # after the last grade cell (mul's: gpu is skipped and has none): under mul
    assert [(o.text, o.cell) for o in outputs["toy.mul"]][-1] == (
        "after every exercise", """a cell you added (the code cell starting "print('the end')")""")
    shown = [o.text for outs in outputs.values() for o in outs]
    assert "setup says hi" not in shown and "done" not in shown  # setup and narrative cells
    assert not any("toy.add:" in t or "toy.mul:" in t for t in shown)  # nor the grade cells'

    g = Graded("erin", "erin", erin.result, path)
    html, md = feedback_html(g), feedback_markdown(g)
    assert ('<p class="from">From a cell you added (the code cell starting '
            '&#34;# trying add&#34;):</p>\n<pre class="text">add gave 0</pre>') in html
    assert ('From a cell you added (the code cell starting "# trying add"):\n\n'
            '```text\nadd gave 0\n```') in md
    for text in (html, md):
        assert "after every exercise" in text and "setup says hi" not in text
        assert "showed no output" not in text
        assert text.index("hello from add") < text.index("add gave 0") < text.index("bad ")


def test_outputs_of_added_cells_alone_are_shown_and_count_toward_the_caps(tmp_path, erin):
    nb = notebook.read(erin.executed)
    for cell in nb.cells:
        if notebook.role(cell) == "answer":
            cell.outputs = []
    path = tmp_path / "quiet.executed.ipynb"
    notebook.write(nb, path)
    quiet = Graded("erin", "erin", erin.result, path)
    for text in (feedback_markdown(quiet), feedback_html(quiet)):
        assert "Your answer cells and the cells you added showed no output." in text
    i = next(i for i, c in enumerate(nb.cells) if notebook.role(c) == "grade")
    nb.cells.insert(i, _added_cell("for i in range(30): print(i)",
                                   *(f"line {n}\n" for n in range(30))))
    notebook.write(nb, path)
    for text in (feedback_markdown(quiet), feedback_html(quiet)):
        assert "showed no output" not in text and "line 0" in text
    shown = feedback.answer_outputs(path)[0]["toy.add"]
    assert len(shown) == feedback.MAX_OUTPUTS + 1 and shown[-1].text == "(more outputs not shown)"


def test_a_learner_name_a_spreadsheet_would_run_as_a_formula_is_written_as_text(tmp_path):
    names = ["=HYPERLINK(1)", "+1+2", "@SUM(A1)", "-x", "alice"]
    graded = [Graded(f"r{i}", name, ALICE_TOY) for i, name in enumerate(names)]
    write_gradebook_csv(graded, tmp_path / "book.csv")
    with open(tmp_path / "book.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["learner"] for r in rows] == ["'=HYPERLINK(1)", "'+1+2", "'@SUM(A1)", "'-x", "alice"]
    assert {r["score"] for r in rows} == {"1"}
