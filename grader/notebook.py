"""The course's cell conventions, read and written with nbformat.

A cell's role lives in ``cell.metadata["course"]``:

- ``{"role": "setup"}``: the lab's imports and helpers (the checks' tests run these first);
- ``{"role": "answer", "exercise": "<lab>.<slug>"}``: the learner's answer, between
  ``# BEGIN SOLUTION`` / ``# END SOLUTION`` in ``solutions/``;
- ``{"role": "check", "exercise": "<lab>.<slug>"}``: the one-line self-check
  ``check("<lab>.<slug>")``.

The grader's assembled notebook adds roles of its own: ``prologue`` (its first cell, which notes
what the kernel runs before any learner code), ``grade`` (its check cells) and ``learner`` (cells
the learner added).

The notebook's ``metadata["course"]["lab"]`` names its lab; the papermill ``parameters`` cell
(tag ``parameters``) defines ``device`` and ``seed``.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbformat.warnings import DuplicateCellId

from grader.errors import GraderError

#: the largest submission the grader reads, in bytes (outputs included)
MAX_NOTEBOOK_BYTES = 100_000_000


#: what to do with a notebook that is not valid JSON
_DOWNLOAD = "JupyterLab saves one with File > Download while the notebook is still open in it"
_RESAVE = f"fix it there in a text editor, or hand in a good copy: {_DOWNLOAD}"
#: what to do about a notebook whose file was cut short (nothing after the cut can be fixed)
_COMPLETE = f"hand in a complete copy: {_DOWNLOAD}"


def kernelspec(torch_version: str) -> dict[str, str]:
    """The course kernel's spec as a notebook's metadata names it: ``python3``, shown as
    ``PyTorch internals (torch 2.13.0)`` (the release notebooks carry the pinned torch's, so
    JupyterLab, whose kernel has that name, has nothing to rewrite when it opens one)."""
    return {"display_name": f"PyTorch internals (torch {torch_version.split('+')[0]})",
            "language": "python", "name": "python3"}


def _keep_duplicate_ids(nb: NotebookNode, text: str) -> None:
    """Give back the ids nbformat renamed because two cells shared them (JupyterLab's copy and
    paste keeps a cell's id; nbformat keeps the first and renames the others): which copy is the
    learner's is assembly's to decide (``grader.judge.assemble``), not the order of the cells."""
    cells = json.loads(text).get("cells")
    if not isinstance(cells, list) or len(cells) != len(nb.cells):
        return
    ids = [c.get("id") if isinstance(c, dict) else None for c in cells]
    for cell, original in zip(nb.cells, ids):
        if isinstance(original, str) and ids.count(original) > 1:
            cell.id = original


def read(path: str | Path) -> NotebookNode:
    """Read a notebook as nbformat 4 (upgrading older minor versions, adding missing cell ids),
    tolerating what editors add: a UTF-8 byte-order mark before the JSON, and Windows line
    endings in cell text (read as ``\\n``, so such cells equal the release's).

    Raises GraderError naming the file when it is not a readable notebook (for broken JSON:
    the line and column, and how to get a good copy), is saved in a newer nbformat, or is
    larger than MAX_NOTEBOOK_BYTES."""
    size = Path(path).stat().st_size if Path(path).is_file() else 0
    if size > MAX_NOTEBOOK_BYTES:
        raise GraderError(f"{path}: {size / 1e6:.0f} MB is more than the "
                          f"{MAX_NOTEBOOK_BYTES / 1e6:.0f} "
                          "MB a submission may be; clear its outputs (Edit > Clear Outputs of All "
                          "Cells) and save it again")
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")  # (the BOM Windows editors write)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DuplicateCellId)
            nb = nbformat.reads(text, as_version=4)
        _keep_duplicate_ids(nb, text)
    except Exception as exc:  # JSON errors, schema errors, missing files: all "unreadable"
        if "Unsupported nbformat version" in str(exc):
            version = str(exc).rsplit(" ", 1)[-1]
            raise GraderError(f"{path}: saved as nbformat {version}, newer than the grader reads "
                              "(nbformat 4); save it as nbformat 4 (as JupyterLab 4 does)"
                              ) from exc
        # (never quote the content: the path may lead to a file that is not the learner's)
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
        if type(exc).__name__ == "NotJSONError" and not text.strip():
            why = "the file is empty"
        elif type(exc).__name__ == "NotJSONError":
            why = "it is not JSON"
            try:
                json.loads(text)
            except json.JSONDecodeError as bad:  # (its message quotes no content)
                said = bad.msg if bad.msg.endswith(" at") else f"{bad.msg} at"  # ("starting at")
                why += (f": {said} line {bad.lineno}, column {bad.colno}; {_RESAVE}"
                        if text.rstrip().endswith("}") else
                        f": the file ends early, at line {text.count(chr(10)) + 1} (cut short by "
                        f"a save, upload or copy that did not finish); {_COMPLETE}")
            except Exception:  # noqa: BLE001  (nbformat's reasons are enough)
                pass
        raise GraderError(f"{path}: not a readable Jupyter notebook ({why})") from exc
    nb.nbformat_minor = max(nb.get("nbformat_minor", 5), 5)
    for i, cell in enumerate(nb.cells):
        cell.setdefault("id", f"cell-{i}")
        if isinstance(cell.get("source"), str) and "\r" in cell.source:
            cell.source = cell.source.replace("\r\n", "\n")
    return nb


def write(nb: NotebookNode, path: str | Path) -> None:
    """Write ``nb`` in the committed form (nbformat 4.5, indent 1, trailing newline)."""
    Path(path).write_text(dumps(nb), encoding="utf-8")


def dumps(nb: NotebookNode) -> str:
    """The notebook's committed text; equal notebooks give identical text."""
    return nbformat.writes(nb, version=4) + "\n"


def role(cell: NotebookNode) -> str | None:
    """The cell's course role (``setup``, ``answer``, ``check``) or None."""
    meta = cell.get("metadata", {}).get("course")
    return meta.get("role") if isinstance(meta, dict) else None


def exercise_of(cell: NotebookNode) -> str | None:
    """The exercise id an answer or check cell belongs to, or None."""
    meta = cell.get("metadata", {}).get("course")
    return meta.get("exercise") if isinstance(meta, dict) else None


def describe(cell: NotebookNode) -> str:
    """How a learner finds a cell (JupyterLab does not show ids): its first non-empty line."""
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    first = first if len(first) <= 60 else first[:57] + "..."
    if not first:
        return f"an empty {cell.cell_type} cell"
    return f'the {cell.cell_type} cell starting "{first}"'


def code_of(nb: NotebookNode, wanted_role: str, exercise: str | None = None) -> list[str]:
    """The sources of the code cells with ``wanted_role`` (and ``exercise``), in order."""
    return [c.source for c in nb.cells if c.cell_type == "code" and role(c) == wanted_role
            and (exercise is None or exercise_of(c) == exercise)]
