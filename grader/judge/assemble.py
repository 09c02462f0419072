"""Assemble what runs: the release's cells, the submission's answers, and the grader's check cells.

The submission is trusted for answer cells and the cells the learner added, nothing else:
every other cell that came with the release (narrative, setup, demos, self-checks) is restored
from the release by cell id, or by content for cells without the release's id (a changed one
is reported and not run; a deleted one is put back).
Learner cells keep their place after the nearest release cell above them. Each exercise's
self-check cell becomes a *grade cell*, placed after the exercise's self-check or its last answer
cell, whichever comes later, so an answer moved further down is still defined when it is checked.
(Like nbgrader's ``OverwriteCells``, keyed by cell id and exercise id instead of checksums.)
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

import nbformat.v4 as v4
from nbformat import NotebookNode

from grader import notebook
from grader.labs import Lab

#: cell tags the grader owns: a learner cell carrying them loses them
_RESERVED_TAGS = {"parameters", "injected-parameters"}


@dataclass
class Assembled:
    """The notebook to execute plus what assembly found.

    ``missing`` lists exercise ids without an answer code cell (``markdown`` those whose answer
    cells were all turned into markdown); ``edited`` the release cells the learner changed
    (restored); ``skipped`` maps exercise id -> reason its checks are not run; ``notes`` says
    what else assembly repaired or how it read the submission (for the result's notes)."""

    nb: NotebookNode
    missing: list[str] = field(default_factory=list)
    edited: list[NotebookNode] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    markdown: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def grade_source(exercise_id: str) -> str:
    """The source of the grader's check cell for ``exercise_id``: a comment (the judge runs in
    the grader's own process; the cell's place is where its probes run, each as a cell of its
    own: ``grader.judge.execute``)."""
    return f"# {exercise_id} is judged by the grader, in its own process: its probes run here"


def prologue_source() -> str:
    """The source of the grader's first cell, before any learner cell: note the threads and
    child processes the kernel has (:func:`grader.kernel.strays.begin`)."""
    return "from grader.kernel.strays import begin as _begin\n_begin()"


def _learner_cell(cell: NotebookNode) -> NotebookNode:
    """A learner cell as it will run: outputs dropped, grader-owned tags removed, and any role
    but ``answer`` replaced by ``learner``."""
    cell = copy.deepcopy(cell)
    meta = cell.setdefault("metadata", {})
    if notebook.role(cell) != "answer":
        meta["course"] = {"role": "learner"}
    if tags := meta.get("tags"):
        meta["tags"] = [t for t in tags if t not in _RESERVED_TAGS]
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    return cell


def assemble(release: NotebookNode, submission: NotebookNode, lab: Lab, *,
             skipped: dict[str, str] | None = None) -> Assembled:
    """Build the notebook to grade (``release`` and ``submission`` are not modified).

    ``skipped`` maps exercise ids whose requirements are unmet to the reason: their answer cells
    do not run (a CUDA answer could fail or hang on a CPU runner) and they get no grade cell."""
    skipped = dict(skipped or {})
    kept = {c.id: c for c in release.cells if notebook.role(c) != "answer"}
    submission, relabelled = _answer_metadata(release, submission, lab)
    attached: dict[str | None, list[NotebookNode]] = {}
    edited: list[NotebookNode] = []
    anchor: str | None = None
    answers: dict[str, list[NotebookNode]] = {}
    seen_release: list[str] = []
    # Cells whose id matches no release cell (saved before nbformat 4.5 gave cells ids, or
    # re-created) are matched by their content to the release cells no id claimed.
    claimed = {c.get("id") for c in submission.cells if notebook.role(c) != "answer"}
    # (cells of the same content, e.g. the progress cells at the top and the end, in order)
    by_content: dict[tuple[str, str], list[NotebookNode]] = {}
    for c in kept.values():
        if c.id not in claimed:
            by_content.setdefault((c.cell_type, c.source), []).append(c)
    owners = _owners(kept, submission)
    for index, cell in enumerate(submission.cells):
        rel = kept.get(cell.get("id")) if owners.get(cell.get("id")) == index else None
        if rel is None and (same := by_content.get((cell.cell_type, cell.source))):
            rel = same.pop(0)
        if rel is not None and notebook.role(cell) != "answer":
            anchor = rel.id
            seen_release.append(rel.id)
            if not _unchanged(cell, rel):
                edited.append(rel)
            continue
        if notebook.role(cell) == "answer":
            answers.setdefault(str(notebook.exercise_of(cell)), []).append(cell)
            if notebook.exercise_of(cell) in skipped:
                continue
        attached.setdefault(anchor, []).append(_learner_cell(cell))
    notes = _answer_notes(answers, lab) + _release_notes(release, kept, seen_release)
    if relabelled:
        notes.append(f"{relabelled} answer cell(s) had lost their metadata (some editors drop "
                     "it); they were recognised by their cell ids, or by the answer they define")
    code_answered = {ex for ex, found in answers.items()
                     if any(c.cell_type == "code" for c in found)}

    cells = list(attached.get(None, []))
    for rel in release.cells:
        if rel.id in kept:
            cells.append(copy.deepcopy(rel))
            cells.extend(attached.get(rel.id, []))
    # Each grade cell goes after the later of its self-check cell and its last answer cell;
    # the self-check cells themselves do not run (the judge runs the same checks and more).
    ids = {e.id for e in lab.exercises}
    last = {notebook.exercise_of(c): i for i, c in enumerate(cells)
            if notebook.role(c) in ("check", "answer") and notebook.exercise_of(c) in ids}
    prologue = v4.new_code_cell(prologue_source())
    prologue.id, prologue.metadata["course"] = "grader-prologue", {"role": "prologue"}
    out: list[NotebookNode] = [prologue]
    for i, cell in enumerate(cells):
        if notebook.role(cell) != "check":
            out.append(cell)
        for ex in (e.id for e in lab.exercises if last.get(e.id) == i and e.id not in skipped):
            grade = v4.new_code_cell(grade_source(ex))
            grade.id = f"grade-{ex.replace('.', '-')}"
            grade.metadata["course"] = {"role": "grade", "exercise": ex}
            out.append(grade)
    seen: set[str] = set()
    for i, cell in enumerate(out):  # copied cells may share an id; ids must be unique
        if cell.id in seen:
            cell.id = f"learner-{i}"
        seen.add(cell.id)
    nb = copy.deepcopy(release)
    nb.cells = out
    missing = [e.id for e in lab.exercises if e.id not in code_answered]
    markdown = [ex for ex in missing if ex in answers]
    return Assembled(nb=nb, missing=missing, edited=edited, skipped=skipped, markdown=markdown,
                     notes=notes)


def _owners(kept: dict[str, NotebookNode], submission: NotebookNode) -> dict[str, int]:
    """For each id of a release cell ``kept`` that cells of the submission carry (answer cells
    aside), the index of the one cell that stands for the release cell: the first unchanged
    one, else the first. The others carry the id only because the learner duplicated the cell
    (JupyterLab's copy and paste keeps it): they are the learner's, edited or not."""
    owners: dict[str, int] = {}
    for i, cell in enumerate(submission.cells):
        rel = kept.get(cell.get("id"))
        if rel is None or notebook.role(cell) == "answer":
            continue
        j = owners.get(rel.id)
        if j is None or (_unchanged(cell, rel) and not _unchanged(submission.cells[j], rel)):
            owners[rel.id] = i
    return owners


def _unchanged(cell: NotebookNode, rel: NotebookNode) -> bool:
    return (cell.cell_type, cell.source) == (rel.cell_type, rel.source)


def _defines(source: str) -> set[str]:
    """The names a cell binds at its top level (``def``, ``class``, ``=``); empty when it is
    not valid Python."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _answer_metadata(release: NotebookNode, submission: NotebookNode, lab: Lab
                     ) -> tuple[NotebookNode, int]:
    """``submission`` with answer-cell metadata put back on the code cells that lost it (an
    editor that drops cell metadata): a cell with the id of a release answer cell; and, for an
    exercise with no answer cell left, the last cell of no role, whose content is not a release
    cell's, that defines the exercise's answer name. Also how many cells were relabelled.
    ``submission`` is not modified."""
    answers = {c.id: c.metadata["course"] for c in release.cells if notebook.role(c) == "answer"}
    plain = [i for i, c in enumerate(submission.cells)
             if notebook.role(c) is None and c.cell_type == "code"]
    found = {i: dict(answers[submission.cells[i].get("id")]) for i in plain
             if submission.cells[i].get("id") in answers}
    answered = {notebook.exercise_of(c) for c in submission.cells if notebook.role(c) == "answer"}
    answered |= {meta["exercise"] for meta in found.values()}
    released = {(c.cell_type, c.source) for c in release.cells}
    for ex in (e for e in lab.exercises if e.id not in answered):
        defining = [i for i in plain if i not in found and ("code", submission.cells[i].source)
                    not in released and ex.answer in _defines(submission.cells[i].source)]
        if defining:
            found[defining[-1]] = {"role": "answer", "exercise": ex.id}
    if not found:
        return submission, 0
    submission = copy.deepcopy(submission)
    for i, meta in found.items():
        submission.cells[i].setdefault("metadata", {})["course"] = meta
    return submission, len(found)


def _answer_notes(answers: dict[str, list[NotebookNode]], lab: Lab) -> list[str]:
    """Notes on answer cells that are duplicated, markdown, or name no exercise of ``lab``."""
    ids = {e.id for e in lab.exercises}
    notes = []
    for ex, found in answers.items():
        code = [c for c in found if c.cell_type == "code"]
        if ex not in ids:
            notes.append(f"{len(found)} answer cell(s) name exercise {ex!r}, which lab "
                         f"{lab.id} does not have; they ran as plain cells")
        elif len(code) > 1:
            notes.append(f"{ex} has {len(code)} answer cells; they ran in order, so the last, "
                         f"{notebook.describe(code[-1])}, defines what was graded")
        if len(code) < len(found):
            notes.append(f"{len(found) - len(code)} answer cell(s) of {ex} are markdown, so they "
                         "did not run; change them back to code cells")
    return notes


def _release_notes(release: NotebookNode, kept: dict[str, NotebookNode],
                   seen: list[str]) -> list[str]:
    """Notes on release cells the submission lacks (put back) or has in another order."""
    notes = []
    gone = [c for c in release.cells if c.id in kept and c.id not in seen]
    if gone:
        notes.append(f"{len(gone)} cell(s) of the release were missing and were put back, "
                     f"first {notebook.describe(gone[0])}")
    order = {c.id: i for i, c in enumerate(release.cells)}
    moved = next((kept[b] for a, b in zip(seen, seen[1:]) if order[b] < order[a]), None)
    if moved is not None:
        notes.append(f"cells of the release were moved ({notebook.describe(moved)} and "
                     "others); they ran in the release's order")
    return notes
