"""Release: ``solutions/NN_<lab>.ipynb`` -> ``notebooks/NN_<lab>.ipynb``.

Each ``# BEGIN SOLUTION`` ... ``# END SOLUTION`` block of an answer cell becomes one line
``raise NotImplementedError("<exercise id>")`` at the BEGIN marker's indentation; outputs and
execution counts are cleared; everything else is kept. The release is also checked against the
lab's table: every exercise has exactly one answer cell and one ``check("<id>")`` cell.
(Like nbgrader's ``ClearSolutions`` preprocessor, on the course's own cell metadata.)
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

from nbformat import NotebookNode

from grader import notebook
from grader.errors import ReleaseError, ReleaseOutOfDate
from grader.labs import lab_of, load_lab
from grader.results import PINNED_TORCH

BEGIN = re.compile(r"^(\s*)#\s*BEGIN SOLUTION\s*$")
END = re.compile(r"^\s*#\s*END SOLUTION\s*$")


def stub_source(source: str, exercise_id: str, where: str) -> str:
    """``source`` with each marked block replaced by the stub. Raises ReleaseError on an unclosed,
    unopened or nested marker, naming ``where`` and the line."""
    out: list[str] = []
    open_at: int | None = None
    for lineno, line in enumerate(source.splitlines(), 1):
        if m := BEGIN.match(line):
            if open_at is not None:
                raise ReleaseError(f"{where}: nested '# BEGIN SOLUTION' at line {lineno} "
                                   f"(the block opened at line {open_at} is not closed)")
            open_at = lineno
            out.append(f'{m.group(1)}raise NotImplementedError("{exercise_id}")')
        elif END.match(line):
            if open_at is None:
                raise ReleaseError(f"{where}: '# END SOLUTION' at line {lineno} has no BEGIN")
            open_at = None
        elif open_at is None:
            out.append(line)
    if open_at is not None:
        raise ReleaseError(f"{where}: '# BEGIN SOLUTION' at line {open_at} is never closed")
    return "\n".join(out)


def _has_marker(source: str) -> bool:
    return any(BEGIN.match(l) or END.match(l) for l in source.splitlines())


def release_notebook(nb: NotebookNode, name: str) -> NotebookNode:
    """The learner's copy of solution notebook ``nb`` (not modified). ``name`` is used in errors.

    Raises ReleaseError for bad markers, a marker outside an answer cell, duplicate cell ids, or
    an exercise of the lab's table without exactly one answer and one check cell."""
    lab = load_lab(lab_of(nb, name))
    out = copy.deepcopy(nb)
    ids = [c.get("id") for c in out.cells]
    if dup := sorted({i for i in ids if ids.count(i) > 1}):
        raise ReleaseError(f"{name}: duplicate cell ids {dup}")
    seen: dict[tuple[str, str], int] = {}
    for cell in out.cells:
        where = f"{name}: cell {cell.get('id')!r}"
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
        cell.metadata.pop("papermill", None)
        role, ex = notebook.role(cell), notebook.exercise_of(cell)
        if role in ("answer", "check"):
            if ex not in {e.id for e in lab.exercises}:
                raise ReleaseError(f"{where}: exercise {ex!r} is not in labs/{lab.id}/lab.toml")
            seen[(role, ex)] = seen.get((role, ex), 0) + 1
        if role == "answer" and cell.cell_type == "code":
            cell.source = stub_source(cell.source, ex, where)
        elif _has_marker(cell.source):
            raise ReleaseError(f"{where}: solution markers are only allowed in answer code cells")
        if role == "check" and cell.source.strip() != f'check("{ex}")':
            raise ReleaseError(f'{where}: a check cell must be exactly check("{ex}")')
    for e in lab.exercises:
        for role in ("answer", "check"):
            if seen.get((role, e.id), 0) != 1:
                raise ReleaseError(f"{name}: exercise {e.id} needs exactly one {role} cell, "
                                   f"found {seen.get((role, e.id), 0)}")
    out.metadata.pop("papermill", None)
    out.metadata["kernelspec"] = notebook.kernelspec(PINNED_TORCH)
    return out


def release(root: Path, *, check: bool = False) -> list[Path]:
    """Release every ``root/solutions/*.ipynb`` into ``root/notebooks/``; return the paths written.

    With ``check``, write nothing and raise ReleaseOutOfDate naming each notebook that is
    missing, stale, or has no solution."""
    solutions = sorted((root / "solutions").glob("*.ipynb"))
    if not solutions:
        raise ReleaseError(f"no solution notebooks in {root / 'solutions'}")
    target = root / "notebooks"
    stale, written = [], []
    for src in solutions:
        text = notebook.dumps(release_notebook(notebook.read(src), str(src)))
        dest = target / src.name
        if check:
            if not dest.is_file() or dest.read_text(encoding="utf-8") != text:
                stale.append(str(dest))
        else:
            target.mkdir(exist_ok=True)
            dest.write_text(text, encoding="utf-8")
            written.append(dest)
    if check:
        names = {s.name for s in solutions}
        stale += [str(p) for p in sorted(target.glob("*.ipynb")) if p.name not in names]
        if stale:
            raise ReleaseOutOfDate("notebooks/ is not what the release step produces; run "
                                   "`make release` and commit. Differs: " + ", ".join(stale))
    return written
