"""What every report reads: one graded submission (:class:`Graded`) and the small helpers the
formats share (points as spreadsheets read them, one result per learner and lab)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grader.results import LabResult


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



def num(x: float) -> str:
    """Points as a spreadsheet reads them: ``3`` for 3.0, ``2.5``, at most 4 decimals."""
    x = round(float(x), 4)
    return str(int(x)) if x.is_integer() else repr(x)


def pct(score: float, maximum: float) -> str:
    return f"{100 * score / maximum:.0f}%" if maximum else "–"




def lab_order(graded: list[Graded]) -> dict[str, list[tuple[str, str]]]:
    """lab id -> [(exercise id, title)], labs and exercises in first-seen order; results with no
    exercises (grading failed before the lab was known) contribute no lab."""
    labs: dict[str, dict[str, str]] = {}
    for g in graded:
        if g.result.exercises:
            seen = labs.setdefault(g.result.lab, {})
            for e in g.result.exercises:
                seen.setdefault(e.id, e.title)
    return {lab: list(ex.items()) for lab, ex in labs.items()}


def best_first(graded: list[Graded]) -> dict[tuple[str, str], list[Graded]]:
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


def check_names(graded: list[Graded]) -> None:
    names = [g.name for g in graded]
    for n in names:
        if not n or n in (".", "..") or "/" in n or "\\" in n:
            raise ValueError(f"report name {n!r} is not a plain file name")
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"several submissions are named {dup[0]!r}; report names must be unique")
