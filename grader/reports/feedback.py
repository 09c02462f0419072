"""Per-submission feedback (Markdown and HTML): the score, what to fix for each exercise that did
not pass, and the outputs of the learner's own cells, capped and without the grading machine's
folders (never the grader's cells, tracebacks or a hidden check's source)."""
from __future__ import annotations

import base64
import binascii
import re
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import grader
from grader import notebook
from grader.errors import GraderError
from grader.reports.graded import Graded
from grader.reports.render import HTML, MARKDOWN
from grader.results import CAVEAT_MARK, CONTROL, mismatch_note

#: characters of one text output shown in feedback; the rest is cut with a note
MAX_TEXT_CHARS = 2000
#: outputs shown per exercise (text, images and errors together)
MAX_OUTPUTS = 20
#: images shown per exercise
MAX_IMAGES = 3
#: base64 characters of one image shown in HTML feedback (about 500 KB of PNG)
MAX_IMAGE_CHARS = 700_000


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
               str(grader.ROOT): "<course>"}
    return sorted(folders.items(), key=lambda item: -len(item[0]))


_FOLDERS = _machine_folders()
#: a run's folder (:func:`grader.judge.grade.runs_folder`: ``<temp>/grader-runs-<uid>/grade-*``)
_RUN_FOLDER = re.compile(re.escape(tempfile.gettempdir()) + r"(/grader-runs-\d+)?/grade-[^/\s]+")


def _unpath(text: str) -> str:
    """``text`` (an output shown to a learner) without the grading machine's folders: warnings
    and tracebacks printed by libraries name their files under the grader's installation."""
    for folder, short in _FOLDERS:
        text = text.replace(folder, short)
    return _RUN_FOLDER.sub("<run>", text)


def _clip(text: str) -> str:
    text = _unpath(CONTROL.sub("", text)).rstrip("\n")
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
    return MARKDOWN.get_template("feedback.md").render(_feedback_context(g))


def feedback_html(g: Graded) -> str:
    """Feedback for one submission as one self-contained HTML page (everything escaped, the
    Markdown code spans of messages and notes shown as ``<code>``; PNG images of the learner's
    cells embedded as base64): what :func:`feedback_markdown` shows. Every table sits in a
    container that scrolls sideways should it not fit the page's column."""
    return HTML.get_template("feedback.html").render(_feedback_context(g))

