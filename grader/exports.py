"""Report formats: every one a pure function of the graded results (:class:`LabResult`), written
atomically so that an interrupted run never leaves a half-written report.

- :func:`write_gradebook_csv`: one row per learner, one column per exercise, totals;
- :func:`feedback_markdown`, :func:`feedback_html`: per-submission feedback with the relevant
  outputs of the learner's answer cells and added cells (never the grader's cells or tracebacks);
- :func:`write_junit_xml`: one testsuite per (learner, lab), one testcase per exercise;
- :func:`gradescope_results`, :func:`write_gradescope_json`: Gradescope's ``results.json``
  (the subset described by ``grader/gradescope.schema.json``);
- :func:`class_summary`, :func:`summary_html`: per-lab and per-exercise statistics and a
  histogram of lab scores;
- :func:`write_reports`: all of the above into one folder.

Scores are points; durations are wall seconds. Every report shows the score over the whole lab
and over what could run on the grading machine (``runnable_max_score``: skipped exercises,
such as those needing CUDA on a CPU runner, count in the first and not in the second), so a CPU
runner's reports and a GPU runner's compare.
"""
from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import math
import re
import statistics
import sys
import sysconfig
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator

import jinja2
from markupsafe import Markup, escape

from grader import notebook
from grader.errors import GraderError
from grader.files import atomic_open, atomic_write
from grader.results import CAVEAT_MARK, STATUSES, LabResult, mismatch_note

#: characters of one text output shown in feedback; the rest is cut with a note
MAX_TEXT_CHARS = 2000
#: outputs shown per exercise (text, images and errors together)
MAX_OUTPUTS = 20
#: images shown per exercise
MAX_IMAGES = 3
#: base64 characters of one image shown in HTML feedback (about 500 KB of PNG)
MAX_IMAGE_CHARS = 700_000
#: equal-width bins of the lab-score histogram, from 0 to the lab's maximum
HISTOGRAM_BINS = 10
#: submissions a lab needs for summary.html to draw its histogram (one score is no distribution,
#: and drawing it took most of the report time of a one-notebook grading: 0.8 s)
HISTOGRAM_MIN_SUBMISSIONS = 2

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass(frozen=True)
class Graded:
    """One graded submission as the batch hands it to the reports.

    ``name`` names its report files (the result JSON's stem, e.g. ``alice-02_autograd``; no path
    separators); ``learner`` is whose it is (several labs of one learner make one gradebook row);
    ``executed`` is the executed notebook, or None when there is none (grading failed early)."""

    name: str
    learner: str
    result: LabResult
    executed: Path | None = None


def load_graded(result_json: Path, learner: str | None = None) -> Graded:
    """The :class:`Graded` for a result JSON written by the grader: name = the file's stem,
    executed = the ``<stem>.executed.ipynb`` beside it if present, learner = ``learner``, or the
    result's own ``learner``, or the stem. Raises OSError (unreadable), ValueError (not JSON,
    or not a lab result of this schema version), KeyError/TypeError (a field missing or of the
    wrong kind)."""
    result_json = Path(result_json)
    result = LabResult.from_dict(json.loads(result_json.read_text(encoding="utf-8")))
    stem = result_json.name.removesuffix(".json")
    executed = result_json.with_name(f"{stem}.executed.ipynb")
    return Graded(name=stem, learner=learner or result.learner or stem, result=result,
                  executed=executed if executed.is_file() else None)


# --------------------------------------------------------------------------- atomic writes

def _num(x: float) -> str:
    """Points as a spreadsheet reads them: ``3`` for 3.0, ``2.5``, at most 4 decimals."""
    x = round(float(x), 4)
    return str(int(x)) if x.is_integer() else repr(x)


def _pct(score: float, maximum: float) -> str:
    return f"{100 * score / maximum:.0f}%" if maximum else "–"


def _xml_text(text: str) -> str:
    """``text`` without the characters XML 1.0 cannot hold (ANSI escapes, NUL...)."""
    return _XML_ILLEGAL.sub("", _ANSI.sub("", text))


def _lab_order(graded: list[Graded]) -> dict[str, list[tuple[str, str]]]:
    """lab id -> [(exercise id, title)], labs and exercises in first-seen order; results with no
    exercises (grading failed before the lab was known) contribute no lab."""
    labs: dict[str, dict[str, str]] = {}
    for g in graded:
        if g.result.exercises:
            seen = labs.setdefault(g.result.lab, {})
            for e in g.result.exercises:
                seen.setdefault(e.id, e.title)
    return {lab: list(ex.items()) for lab, ex in labs.items()}


def _by_learner_and_lab(graded: list[Graded]) -> dict[tuple[str, str], list[Graded]]:
    """(learner, lab) -> that learner's results for that lab in first-seen order, the best
    (highest score; the first seen among equals) moved to the front, as every report counts
    it. Results with no exercises (grading failed before the lab was known) are left out."""
    found: dict[tuple[str, str], list[Graded]] = {}
    for g in graded:
        if g.result.exercises:
            found.setdefault((g.learner, g.result.lab), []).append(g)
    for results in found.values():
        best = max(results, key=lambda g: g.result.score)  # (max keeps the first of equals)
        results.remove(best)
        results.insert(0, best)
    return found


def _check_names(graded: list[Graded]) -> None:
    names = [g.name for g in graded]
    for n in names:
        if not n or n in (".", "..") or "/" in n or "\\" in n:
            raise ValueError(f"report name {n!r} is not a plain file name")
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"several submissions are named {dup[0]!r}; report names must be unique")


# --------------------------------------------------------------------------- gradebook CSV

def gradebook_rows(graded: list[Graded], assigned: dict[str, float] | None = None
                   ) -> tuple[list[str], list[dict[str, str]]]:
    """The gradebook as (columns, rows), one row per learner in first-seen order.

    Columns: ``learner``; per lab (first-seen order) each exercise id (its points), then
    ``<lab>:score``, ``<lab>:max`` and ``<lab>:runnable_max``; then ``score``, ``max_score``,
    ``runnable_max_score`` (the learner's totals) and ``grading_errors``.

    A lab the learner has no result for has empty cells and counts as 0 of that lab's maximum
    in ``max_score`` and ``runnable_max_score`` (nothing ran, so nothing is excused).
    ``assigned`` maps the labs the class was assigned to their maximum (points): they are the
    gradebook's labs, in that order (one with no result at all gets its score columns only);
    a result of another lab counts for nothing (``grading_errors`` says so) but its learner
    still has a row; by default the labs are those among the results. Skipped
    exercises score 0 and count in ``max_score`` but not ``runnable_max_score``. A result with
    no exercises (grading failed before its lab was known) adds only to ``grading_errors``.
    When one learner has several results for one lab, the best counts, and ``grading_errors``
    says so. When some result was run under a torch other than the pinned release, a last
    column ``torch_caveats`` names, per lab counted, both versions and the exercises marked
    ``version_caveat`` (see :func:`grader.results.mismatch_note`)."""
    labs = _lab_order(graded)
    lab_max = {lab: max(g.result.max_score for g in graded if g.result.lab == lab
                        and g.result.exercises) for lab in labs}
    if assigned is not None:
        labs = {lab: labs.get(lab, []) for lab in assigned}
        lab_max = dict(assigned)
    columns = ["learner"]
    for lab, exercises in labs.items():
        columns += [eid for eid, _ in exercises] + [f"{lab}:score", f"{lab}:max",
                                                    f"{lab}:runnable_max"]
    columns += ["score", "max_score", "runnable_max_score", "grading_errors"]
    if any(g.result.environment.torch_mismatch for g in graded):
        columns.append("torch_caveats")

    by_learner: dict[str, dict[str, Graded]] = {}
    errors: dict[str, list[str]] = {}
    for g in graded:
        by_learner.setdefault(g.learner, {})
        errors.setdefault(g.learner, [])
        if g.result.error:
            errors[g.learner].append(f"{g.name}: {g.result.error}")
        if g.result.exercises and g.result.lab not in labs:
            errors[g.learner].append(f"{g.name}: lab {g.result.lab} is not among the assigned "
                                     "labs; not counted")
    for (learner, lab), results in _by_learner_and_lab(graded).items():
        if lab not in labs:
            continue
        by_learner[learner][lab] = results[0]
        if len(results) > 1:  # several hand-ins: the best one counts
            names = [g.name for g in graded  # (in the order they came)
                     if g.result.exercises and (g.learner, g.result.lab) == (learner, lab)]
            errors[learner].append(f"{lab}: several results ({', '.join(names)}); the best, "
                                   f"{results[0].name}, is counted")

    rows = []
    for learner, mine in by_learner.items():
        row = dict.fromkeys(columns, "")
        row["learner"] = learner
        score = maximum = runnable = 0.0
        for lab in labs:
            if (g := mine.get(lab)) is None:
                maximum += lab_max[lab]
                runnable += lab_max[lab]
                continue
            r = g.result
            row.update({e.id: _num(e.points) for e in r.exercises})
            row.update({f"{lab}:score": _num(r.score), f"{lab}:max": _num(r.max_score),
                        f"{lab}:runnable_max": _num(r.runnable_max_score)})
            score, maximum, runnable = (score + r.score, maximum + r.max_score,
                                        runnable + r.runnable_max_score)
        row.update(score=_num(score), max_score=_num(maximum), runnable_max_score=_num(runnable),
                   grading_errors=" | ".join(errors[learner]))
        if "torch_caveats" in columns:
            row["torch_caveats"] = " | ".join(
                _caveats(g.result) for g in mine.values() if g.result.environment.torch_mismatch)
        rows.append(row)
    return columns, rows


def _caveats(r: LabResult) -> str:
    """One lab's torch caveat in one line: both versions and the exercises marked."""
    env = r.environment
    marked = [e.id for e in r.exercises if e.version_caveat]
    return (f"{r.lab}: torch {env.torch_version}, pinned {env.torch_pinned}; "
            + (f"{CAVEAT_MARK} {' '.join(marked)}" if marked else "no exercise marked"))


def write_gradebook_csv(graded: list[Graded], path: Path,
                        assigned: dict[str, float] | None = None) -> Path:
    """Write :func:`gradebook_rows` as CSV (UTF-8, header row, ``csv`` module quoting) to
    ``path``, atomically; return ``path``. A cell that a spreadsheet would run as a formula
    (text starting with ``= + - @``, tab or CR: a learner's name comes from a file name they
    chose) gets a leading ``'``, which spreadsheets show as text. Raises ValueError as
    :func:`gradebook_rows` does, OSError when the folder cannot be written."""
    columns, rows = gradebook_rows(graded, assigned)
    with atomic_open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _as_text(v) for k, v in row.items()})
    return Path(path)


def _as_text(cell: str) -> str:
    """``cell`` as a spreadsheet shows it, never as a formula (points stay numbers)."""
    if cell[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            float(cell)
        except ValueError:
            return "'" + cell
    return cell


# --------------------------------------------------------------------------- notebook outputs

@dataclass(frozen=True)
class Output:
    """One output of a learner's cell as feedback shows it: ``kind`` is ``text`` (text/plain or
    stdout), ``stderr``, ``error`` (``ename: evalue``, never the traceback) or ``image``
    (``png`` is base64, or None when it was too large and ``text`` says so); ``cell`` is ""
    for the exercise's answer cell, else which cell the learner added it came from
    (``a cell you added (the code cell starting "...")``)."""

    kind: str
    text: str = ""
    png: str | None = None
    cell: str = ""


def _machine_folders() -> list[tuple[str, str]]:
    """(folder, what learners see instead), longest first: where Python and its libraries are
    installed, the course, and the grader's temporary run folders."""
    paths = sysconfig.get_paths()
    folders = {paths["purelib"]: "<site-packages>", paths["platlib"]: "<site-packages>",
               paths["stdlib"]: "<python>", sys.prefix: "<python>", sys.base_prefix: "<python>",
               str(Path(__file__).resolve().parent.parent): "<course>"}
    return sorted(folders.items(), key=lambda item: -len(item[0]))


_FOLDERS = _machine_folders()
_RUN_FOLDER = re.compile(re.escape(tempfile.gettempdir()) + r"/grade-[^/\s]+")


def _unpath(text: str) -> str:
    """``text`` (an output shown to a learner) without the grading machine's folders: warnings
    and tracebacks printed by libraries name their files under the grader's installation."""
    for folder, short in _FOLDERS:
        text = text.replace(folder, short)
    return _RUN_FOLDER.sub("<run>", text)


def _clip(text: str) -> str:
    text = _unpath(_ANSI.sub("", text)).rstrip("\n")
    if len(text) > MAX_TEXT_CHARS:
        more = len(text) - MAX_TEXT_CHARS
        text = text[:MAX_TEXT_CHARS] + f"\n… ({more} more characters not shown)"
    return text


def _cell_outputs(cell) -> Iterator[Output]:
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            text = out.get("text", "")
            yield Output("stderr" if out.get("name") == "stderr" else "text",
                         _clip("".join(text) if isinstance(text, list) else text))
        elif kind == "error":
            yield Output("error", _clip(f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"))
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            if "image/png" in data:
                png = data["image/png"]
                png = re.sub(r"\s+", "", "".join(png) if isinstance(png, list) else str(png))
                try:
                    base64.b64decode(png, validate=True)
                except (binascii.Error, ValueError):
                    yield Output("image", "(an image that is not valid PNG data)")
                    continue
                if len(png) > MAX_IMAGE_CHARS:
                    yield Output("image", f"(an image of {len(png) * 3 // 4 // 1024} KB, too "
                                          "large to show)")
                else:
                    yield Output("image", "(an image)", png)
            elif "text/plain" in data:
                text = data["text/plain"]
                yield Output("text", _clip("".join(text) if isinstance(text, list) else text))


def _add_capped(outs: list[Output], new: Iterator[Output]) -> None:
    """Append the non-empty outputs of one cell to one exercise's ``outs``, within the caps."""
    for o in new:
        if o.kind != "image" and not o.text.strip():
            continue
        images = sum(p.kind == "image" for p in outs)
        if len(outs) >= MAX_OUTPUTS or (o.kind == "image" and images >= MAX_IMAGES):
            if not outs or outs[-1].text != "(more outputs not shown)":
                outs.append(Output("text", "(more outputs not shown)", cell=o.cell))
            break
        outs.append(o)


def answer_outputs(executed: Path | None) -> tuple[dict[str, list[Output]], str | None]:
    """The outputs of the learner's cells in the executed notebook, by exercise id, in notebook
    order: its answer cells (metadata ``course.role == "answer"``) under their own exercise,
    and the code cells it added (``course.role == "learner"``) under the exercise whose grade
    cell comes next, or the last graded exercise when they follow every grade cell (such
    outputs carry :attr:`Output.cell`; in a notebook with no grade cell they are not shown).
    Capped per exercise (:data:`MAX_OUTPUTS`, :data:`MAX_IMAGES`, :data:`MAX_TEXT_CHARS`).
    Also a note when there is no notebook to read (None, missing or unreadable), else None.
    Never reads grade, check, setup, narrative or other grader cells."""
    if executed is None:
        return {}, "No executed notebook was kept for this submission."
    try:
        nb = notebook.read(executed)
    except GraderError:
        return {}, "The executed notebook could not be read, so its outputs are not shown."
    cells = [c for c in nb.cells if c.cell_type == "code"]
    grades = [notebook.exercise_of(c) for c in cells if notebook.role(c) == "grade"]
    following = next((ex for ex in reversed(grades) if isinstance(ex, str)), None)
    owner = []  # per cell, the exercise of the next grade cell (or of the last one)
    for cell in reversed(cells):
        if notebook.role(cell) == "grade" and isinstance(ex := notebook.exercise_of(cell), str):
            following = ex
        owner.append(following)
    owner.reverse()
    found: dict[str, list[Output]] = {}
    for cell, next_graded in zip(cells, owner):
        ex, outs = notebook.exercise_of(cell), _cell_outputs(cell)
        if notebook.role(cell) == "answer" and isinstance(ex, str):
            _add_capped(found.setdefault(ex, []), outs)
        elif notebook.role(cell) == "learner" and next_graded is not None:
            label = f"a cell you added ({notebook.describe(cell)})"
            _add_capped(found.setdefault(next_graded, []), (replace(o, cell=label) for o in outs))
    return found, None


def _runs(outs: list[Output]) -> list[tuple[str | None, list[Output]]]:
    """``outs`` cut into runs from one cell each: (heading, outputs); the heading says which cell
    (None for a first run from the answer cell, which needs none)."""
    runs: list[tuple[str | None, list[Output]]] = []
    for i, o in enumerate(outs):
        if i == 0 or o.cell != outs[i - 1].cell:
            runs.append((o.cell or ("your answer cell" if runs else None), []))
        runs[-1][1].append(o)
    return runs


# --------------------------------------------------------------------------- feedback

_MD_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\\": "\\\\", "*": "\\*", "_": "\\_",
               "[": "\\[", "]": "\\]"}


def _spans(text: str) -> Iterator[tuple[bool, str]]:
    """``text`` cut into (is_code, part): code spans as CommonMark reads them (a run of
    backticks up to the next run of as many), backticks included, and the plain text between."""
    start = i = 0
    while (i := text.find("`", i)) >= 0:
        run = len(text) - i - len(text[i:].lstrip("`"))
        end = re.compile(rf"(?<!`){'`' * run}(?!`)").search(text, i + run)
        if end is None:  # no closing run: these backticks are plain text
            i += run
            continue
        if start < i:
            yield False, text[start:i]
        yield True, text[i:end.end()]
        start = i = end.end()
    if start < len(text):
        yield False, text[start:]


def _md(text: object) -> str:
    """Markdown text from plain ``text``: outside code spans ``&``, ``<``, ``>`` become entities
    (so no raw HTML reaches a renderer) and ``\\ * _ [ ]`` are backslash-escaped (so
    ``__torch_dispatch__`` is not bold); code spans (`` `...` ``) are kept as written."""
    return "".join(part if code else "".join(_MD_ESCAPES.get(c, c) for c in part)
                   for code, part in _spans(str(text)))


def _html_code(text: object) -> Markup:
    """HTML from plain ``text`` with its Markdown code spans (`` `...` ``) as ``<code>``
    elements; everything else, and the code itself, escaped."""
    out = []
    for code, part in _spans(str(text)):
        if code:
            part = part.strip("`")  # the fences (the code itself neither starts nor ends with `)
            if part.startswith(" ") and part.endswith(" ") and part.strip(" "):
                part = part[1:-1]  # as CommonMark: one space each side lets code touch a `
            out.append(Markup("<code>%s</code>") % part)
        else:
            out.append(escape(part))
    return Markup("").join(out)


def _breakable(text: object) -> Markup:
    """``text`` escaped, with a line break allowed (``<wbr>``) after each ``. - _ /``, so that
    an id such as ``autograd.saved-tensor-hooks`` can wrap in a narrow table column."""
    return Markup("<wbr>").join(escape(p) for p in re.split(r"(?<=[-._/])(?=.)", str(text)))


def _md_cell(text: object) -> str:
    """:func:`_md` for a table cell: one line, ``|`` escaped."""
    return _md(" ".join(str(text).split())).replace("|", "\\|")


def _md_item(text: object) -> str:
    """:func:`_md` for a list item: continuation lines indented under the bullet."""
    return _md(text).replace("\n", "\n  ")


def _md_code(text: object) -> str:
    """``text`` as one Markdown code span, whatever backticks it holds."""
    text = " ".join(str(text).split())
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


_ENV_ARGS = dict(loader=jinja2.PackageLoader("grader", "templates"),
                 undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                 keep_trailing_newline=True)
_HTML = jinja2.Environment(autoescape=True, **_ENV_ARGS)
_HTML.filters.update(code=_html_code, breakable=_breakable)
_MARKDOWN = jinja2.Environment(autoescape=False, **_ENV_ARGS)
_MARKDOWN.filters.update(md=_md, md_cell=_md_cell, md_item=_md_item, md_code=_md_code,
                         fence=_fence)
for _env in (_HTML, _MARKDOWN):
    # file_name: learners see their notebook's name, not the folders it was graded from
    # num1: statistics (means, medians) with at most 1 decimal, as people read them
    _env.filters.update(num=_num, num1=lambda x: _num(round(float(x), 1)), pct=_pct,
                        file_name=lambda p: Path(p).name)


def _feedback_context(g: Graded) -> dict:
    outputs, note = answer_outputs(g.executed)
    r = g.result
    env = r.environment
    return {"name": g.name, "learner": g.learner, "r": r, "env": env,
            "torch_note": mismatch_note(env) if env.torch_mismatch else None,
            "mark": CAVEAT_MARK,
            "exercises": [(e, _runs(outputs.get(e.id, []))) for e in r.exercises],
            "problems": [e for e in r.exercises if e.status != "passed"],
            "skipped": sum(e.status == "skipped" for e in r.exercises),
            "any_outputs": any(outputs.get(e.id) for e in r.exercises), "outputs_note": note}


def feedback_markdown(g: Graded) -> str:
    """Feedback for one submission as Markdown: the score over the whole lab and over what
    could run (with seed, device, torch version), a table of exercises (status, points, time
    in seconds), what to fix for each exercise that did not pass, and the outputs of the
    learner's answer cells and added cells (:func:`answer_outputs`) in code blocks (images are
    only mentioned: see the HTML). Text outside code is entity-escaped, so no raw HTML reaches
    a Markdown renderer."""
    return _MARKDOWN.get_template("feedback.md").render(_feedback_context(g))


def feedback_html(g: Graded) -> str:
    """Feedback for one submission as one self-contained HTML page (everything escaped, the
    Markdown code spans of messages and notes shown as ``<code>``; PNG images of the learner's
    cells embedded as base64): what :func:`feedback_markdown` shows. Every table sits in a
    container that scrolls sideways should it not fit the page's column."""
    return _HTML.get_template("feedback.html").render(_feedback_context(g))


# --------------------------------------------------------------------------- JUnit XML

def junit_xml(graded: list[Graded]) -> bytes:
    """JUnit XML (the xunit2 dialect pytest writes, which allows testcase properties): one
    ``<testsuite name="<learner>.<lab>">`` per submission with the run's environment and
    scores as properties, one ``<testcase classname="<learner>.<lab>" name="<exercise id>"
    time="<seconds>">`` per exercise with ``points`` and ``max_points`` properties, and
    ``<failure>`` (failed), ``<error type="error|timeout|crashed">`` or ``<skipped>`` whose
    message is the result's message. A submission whose grading failed before any exercise was
    known gets one ``<testcase name="grading">`` with an ``<error type="error">`` saying why,
    so that CI dashboards do not lose it. Under a torch other than the pinned release the
    suite has a ``torch_caveat`` property (:func:`grader.results.mismatch_note`) and each
    exercise marked ``version_caveat`` a ``version_caveat`` property (``true``), its message
    prefixed with the mark. Characters XML cannot hold are dropped."""
    from junitparser import Error, Failure, Skipped
    from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

    root = JUnitXml(name="pytorch-internals-course")
    for g in graded:
        r, env = g.result, g.result.environment
        suite_name = _xml_text(f"{g.learner}.{r.lab}")
        suite = TestSuite(suite_name)
        suite.timestamp = env.started_at
        for key, value in (("name", g.name), ("learner", g.learner), ("lab", r.lab),
                           ("notebook", r.notebook), ("score", _num(r.score)),
                           ("max_score", _num(r.max_score)),
                           ("runnable_max_score", _num(r.runnable_max_score)),
                           *((k, str(v)) for k, v in asdict(env).items() if v is not None),
                           *((("error", r.error),) if r.error else ()),
                           *((("torch_caveat", mismatch_note(env)),)
                             if env.torch_mismatch else ())):
            suite.add_property(key, _xml_text(value))
        cases = []
        for e in r.exercises:
            case = TestCase(_xml_text(e.id), suite_name, e.duration_s)
            case.add_property("points", _num(e.points))
            case.add_property("max_points", _num(e.max_points))
            message = _xml_text(e.message)
            if e.version_caveat:
                case.add_property("version_caveat", "true")
                message = f"{CAVEAT_MARK} {message}"
            if e.status == "failed":
                case.result = [Failure(message, "failed")]
            elif e.status in ("error", "timeout", "crashed"):
                case.result = [Error(message, e.status)]
            elif e.status == "skipped":
                case.result = [Skipped(message, "skipped")]
            for res in case.result:
                res.text = message
            cases.append(case)
        if not r.exercises:
            case = TestCase("grading", suite_name, r.duration_s)
            case.result = [Error(_xml_text(r.error or "no exercises were graded"), "error")]
            case.result[0].text = _xml_text(r.error or "no exercises were graded")
            cases.append(case)
        suite.add_testcases(cases)
        root.add_testsuite(suite)
    root.update_statistics()
    buf = io.BytesIO()
    root.write(buf, pretty=True)
    return buf.getvalue()


def write_junit_xml(graded: list[Graded], path: Path) -> Path:
    """Write :func:`junit_xml` to ``path`` atomically; return ``path``."""
    return atomic_write(path, junit_xml(graded))


# --------------------------------------------------------------------------- Gradescope

def _run_line(r: LabResult) -> str:
    env = r.environment
    return (f"{r.lab}: {_num(r.score)}/{_num(r.max_score)} points over the whole lab, "
            f"{_num(r.score)}/{_num(r.runnable_max_score)} over what could run here "
            f"(device {env.device}) · seed {env.seed} · torch {env.torch_version} · "
            f"grader {env.grader_version} · started {env.started_at}")


def gradescope_results(result: LabResult) -> dict:
    """The submission as Gradescope's autograder ``results.json`` (the subset described by
    ``grader/gradescope.schema.json``): ``score`` and ``max_score`` in points,
    ``execution_time`` in whole seconds (rounded up), ``output`` (the run: score over the
    whole lab and over what could run, seed, device, notes, grading error), one test per
    exercise and the run's environment in ``extra_data``.

    Skipped exercises (e.g. needing CUDA on a CPU runner) count toward ``max_score`` exactly as
    in the lab: Gradescope scores the assignment out of the total set in its own settings (the
    lab's full points), not out of what one runner could run. Such a test shows as ``failed``
    with 0 points and ``skipped: <reason>`` as its output; grade labs that need a GPU on a GPU
    runner. ``output`` and ``extra_data.runnable_max_score`` still give the score over what
    could run. A test's own finer status (error, timeout, crashed, skipped) is in its
    ``extra_data``. Under a torch other than the pinned release ``output`` says so (both
    versions, :func:`grader.results.mismatch_note`) and the output of each test marked
    ``version_caveat`` starts with the mark."""
    env = result.environment
    lines = [_run_line(result)]
    if skipped := [e for e in result.exercises if e.status == "skipped"]:
        lines.append(f"{len(skipped)} exercise(s) could not run on this machine and score 0: "
                     + ", ".join(e.id for e in skipped) + ".")
    lines += [f"note: {n}" for n in result.notes]
    if result.error:
        lines.append(f"grading error: {result.error}")
    if env.torch_mismatch:
        lines.append(f"torch: {mismatch_note(env)}.")
    tests = [{"name": f"{e.id}: {e.title}", "score": e.points, "max_score": e.max_points,
              "status": "passed" if e.status == "passed" else "failed",
              "output": (f"{CAVEAT_MARK} " if e.version_caveat else "")
              + (e.message if e.status == "passed" else f"{e.status}: {e.message}"),
              "visibility": "visible",
              "extra_data": {"id": e.id, "status": e.status, "duration_s": e.duration_s}}
             for e in result.exercises]
    return {"score": result.score, "max_score": result.max_score,
            "execution_time": math.ceil(result.duration_s),
            "output": "\n".join(lines), "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests,
            "extra_data": {"lab": result.lab, "notebook": Path(result.notebook).name,
                           "runnable_max_score": result.runnable_max_score,
                           "error": result.error, "environment": asdict(env)}}


def write_gradescope_json(result: LabResult, path: Path) -> Path:
    """Write :func:`gradescope_results` as JSON to ``path`` atomically; return ``path``."""
    return atomic_write(path, json.dumps(gradescope_results(result), indent=2) + "\n")


# --------------------------------------------------------------------------- class summary

def _stats(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4),
            "median": round(statistics.median(values), 4),
            "min": round(min(values), 4), "max": round(max(values), 4)}


def _histogram(scores: list[float], maximum: float) -> dict:
    """:data:`HISTOGRAM_BINS` equal bins over [0, maximum] (the last one closed), as numpy's."""
    import numpy as np

    counts, edges = np.histogram(scores, bins=HISTOGRAM_BINS, range=(0.0, maximum or 1.0))
    return {"edges": [round(float(x), 4) for x in edges], "counts": [int(c) for c in counts]}


def class_summary(graded: list[Graded]) -> dict:
    """Statistics of a class's results (a JSON-able dict).

    Top level: ``submissions``, ``learners`` (distinct), ``ungraded`` (the results with no
    exercises: ``name``, ``learner``, ``error``) and ``labs``, by lab id in first-seen order:

    - ``submissions`` (one per learner: the best), ``grading_errors`` (results with ``error``
      set), ``devices`` (count per device), ``max_score`` (points, the largest maximum seen);
    - ``score``: ``mean``, ``median``, ``min``, ``max`` in points;
    - ``mean_fraction`` (mean of score / max_score: over the whole lab) and
      ``mean_runnable_fraction`` (mean of score / runnable_max_score over the submissions where
      something could run: over what could run), in [0, 1], None when undefined;
    - ``scores`` (sorted) and ``histogram`` (``edges``, ``counts``: :data:`HISTOGRAM_BINS` equal
      bins over [0, max_score], the last closed);
    - ``exercises`` by id: ``title``, ``max_points``, ``submissions``, ``ran`` (not skipped),
      ``counts`` per status (every status, 0 included), ``mean_points`` and ``pass_rate``
      (passed / ran), both over the submissions that ran it, None when none did, and
      ``version_caveats`` (the results that mark it ``version_caveat``);
    - ``torch_mismatch``: None when every submission ran on the pinned torch, else ``pinned``
      (the release) and ``versions`` (count per other torch version it ran with).

    A lab's statistics count one result per learner, the best, as the gradebook does (two
    copies handed in by one learner are one submission there).

    Raises ValueError for an empty list."""
    if not graded:
        raise ValueError("no results to summarize")
    best = _by_learner_and_lab(graded)
    labs: dict[str, dict] = {}
    for lab, exercises in _lab_order(graded).items():
        mine = [results[0].result for (_, of), results in best.items() if of == lab]
        scores = [r.score for r in mine]
        maximum = max(r.max_score for r in mine)
        whole = [r.score / r.max_score for r in mine if r.max_score]
        runnable = [r.score / r.runnable_max_score for r in mine if r.runnable_max_score]
        devices: dict[str, int] = {}
        for r in mine:
            devices[r.environment.device] = devices.get(r.environment.device, 0) + 1
        per_ex = {}
        for eid, title in exercises:
            results = [e for r in mine for e in r.exercises if e.id == eid]
            ran = [e for e in results if e.status != "skipped"]
            per_ex[eid] = {
                "title": title, "max_points": max(e.max_points for e in results),
                "submissions": len(results), "ran": len(ran),
                "counts": {s: sum(e.status == s for e in results) for s in STATUSES},
                "mean_points": round(statistics.fmean(e.points for e in ran), 4) if ran else None,
                "pass_rate": (round(sum(e.status == "passed" for e in ran) / len(ran), 4)
                              if ran else None),
                "version_caveats": sum(e.version_caveat for e in results)}
        others = [r.environment for r in mine if r.environment.torch_mismatch]
        mismatch = None if not others else {
            "pinned": others[0].torch_pinned,
            "versions": dict(Counter(env.torch_version for env in others))}
        labs[lab] = {
            "submissions": len(mine), "grading_errors": sum(r.error is not None for r in mine),
            "devices": devices, "max_score": maximum, "score": _stats(scores),
            "mean_fraction": round(statistics.fmean(whole), 4) if whole else None,
            "mean_runnable_fraction": round(statistics.fmean(runnable), 4) if runnable else None,
            "scores": sorted(scores), "histogram": _histogram(scores, maximum),
            "exercises": per_ex, "torch_mismatch": mismatch}
    return {"submissions": len(graded), "learners": len({g.learner for g in graded}),
            "ungraded": [{"name": g.name, "learner": g.learner, "error": g.result.error}
                         for g in graded if not g.result.exercises],
            "labs": labs}


def histogram_png(lab: str, lab_summary: dict) -> bytes:
    """A PNG bar chart of one lab's ``histogram`` from :func:`class_summary` (matplotlib's Agg
    canvas, no pyplot state; no timestamp, so equal inputs give equal bytes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    edges, counts = lab_summary["histogram"]["edges"], lab_summary["histogram"]["counts"]
    fig = Figure(figsize=(6, 2.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    widths = [b - a for a, b in zip(edges, edges[1:])]
    ax.bar(edges[:-1], counts, width=widths, align="edge", color="#4c78a8", edgecolor="white")
    ax.set_xlim(edges[0], edges[-1])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"score (points out of {_num(lab_summary['max_score'])})")
    ax.set_ylabel("submissions")
    ax.set_title(f"{lab}: {lab_summary['submissions']} submission(s)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def summary_html(graded: list[Graded]) -> str:
    """The class summary (:func:`class_summary`) as one self-contained HTML page: per lab, the
    score statistics over the whole lab and over what could run, a histogram of lab scores
    (an embedded base64 PNG, for a lab with at least :data:`HISTOGRAM_MIN_SUBMISSIONS`
    submissions), per-exercise statistics, and one row per submission linking to
    its feedback at ``feedback/<name>.html`` (the layout :func:`write_reports` writes). Means
    and medians are shown with at most 1 decimal (the JSON of :func:`class_summary` keeps 4);
    every table sits in a container that scrolls sideways should it not fit the page's column.
    Raises ValueError for an empty list."""
    summary = class_summary(graded)
    images = {lab: base64.b64encode(histogram_png(lab, s)).decode("ascii")
              for lab, s in summary["labs"].items()
              if s["submissions"] >= HISTOGRAM_MIN_SUBMISSIONS}
    return _HTML.get_template("summary.html").render(
        summary=summary, images=images, graded=graded, statuses=STATUSES, mark=CAVEAT_MARK)


# --------------------------------------------------------------------------- everything

def write_reports(graded: list[Graded], out_dir: Path,
                  assigned: dict[str, float] | None = None) -> list[Path]:
    """Write every report for ``graded`` under ``out_dir``: ``gradebook.csv``, ``junit.xml``,
    ``summary.html`` and, per submission, ``feedback/<name>.md``, ``feedback/<name>.html`` and
    ``gradescope/<name>.json``; each file atomically. Return the paths written, in that order.
    ``assigned`` (lab id -> maximum points) fixes the gradebook's labs (:func:`gradebook_rows`).

    Raises ValueError (no results, names that are not unique plain file names, two results of
    one learner for one lab) before writing anything; OSError when a file cannot be written
    (the files already written stay, each complete)."""
    if not graded:
        raise ValueError("no results to report")
    _check_names(graded)
    gradebook_rows(graded, assigned)  # raises on conflicting rows before anything is written
    out_dir = Path(out_dir)
    written = [write_gradebook_csv(graded, out_dir / "gradebook.csv", assigned),
               write_junit_xml(graded, out_dir / "junit.xml"),
               atomic_write(out_dir / "summary.html", summary_html(graded))]
    for g in graded:
        written += [atomic_write(out_dir / "feedback" / f"{g.name}.md", feedback_markdown(g)),
                    atomic_write(out_dir / "feedback" / f"{g.name}.html", feedback_html(g)),
                    write_gradescope_json(g.result, out_dir / "gradescope" / f"{g.name}.json")]
    return written
