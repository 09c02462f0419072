"""The gradebook: one CSV row per learner, one column per exercise, per-lab and total scores."""
from __future__ import annotations

import csv
from pathlib import Path

from grader.files import atomic_open
from grader.reports.graded import Graded, best_first, lab_order, num
from grader.results import CAVEAT_MARK, LabResult


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
    labs = lab_order(graded)
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
    for (learner, lab), results in best_first(graded).items():
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
            row.update({e.id: num(e.points) for e in r.exercises})
            row.update({f"{lab}:score": num(r.score), f"{lab}:max": num(r.max_score),
                        f"{lab}:runnable_max": num(r.runnable_max_score)})
            score, maximum, runnable = (score + r.score, maximum + r.max_score,
                                        runnable + r.runnable_max_score)
        row.update(score=num(score), max_score=num(maximum), runnable_max_score=num(runnable),
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

