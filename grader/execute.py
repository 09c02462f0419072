"""Execution: a papermill engine that runs an assembled notebook one exercise at a time.

papermill parameterizes the notebook, tracks per-cell state and writes the executed copy; this
engine (``engine_name="grader"``) replaces its run-to-first-error loop with one that never
trusts the submission: the notebook is cut into *parts*, each ending at an exercise's grade cell;
each part runs under its exercise's time limit; a timeout interrupts the kernel and grading goes
on; a dead (or unresponsive) kernel costs that exercise only: a fresh kernel replays the earlier
parts and grading resumes at the next exercise. Every exercise gets an :class:`Outcome`.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async
from nbformat import NotebookNode
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import Engine, papermill_engines

from grader import notebook
from grader.selfcheck import VERDICT_MIME

#: seconds a cell outside any exercise (after the last grade cell) may run
EPILOGUE_CELL_TIMEOUT = 120
#: seconds an interrupted kernel has to become responsive again before it is replaced
INTERRUPT_GRACE = 10


class KernelLost(Exception):
    """The kernel died (status ``crashed``) or ignored an interrupt (``timeout``); either way
    it is replaced and the current exercise is lost."""

    def __init__(self, message: str, duration_s: float, status: str = "crashed"):
        super().__init__(message)
        self.duration_s, self.status = duration_s, status


@dataclass
class Part:
    """Consecutive code cells (indices into the notebook) ending with ``exercise``'s grade cell;
    ``exercise`` is None for the cells after the last grade cell."""

    exercise: str | None
    cells: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    """What running one exercise's part produced: ``status`` is a result status,
    ``verdict`` the grade cell's verdict dict (None if it produced none), ``answer_errors``
    the ``ename: evalue`` of answer cells that raised, ``duration_s`` wall seconds."""

    exercise: str
    status: str
    message: str
    duration_s: float
    verdict: dict | None = None
    answer_errors: tuple[str, ...] = ()


def parts(nb: NotebookNode) -> list[Part]:
    """Cut ``nb`` into parts at its grade cells (code cells only)."""
    out, current = [], Part(None)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        current.cells.append(i)
        if notebook.role(cell) == "grade":
            current.exercise = notebook.exercise_of(cell)
            out.append(current)
            current = Part(None)
    if current.cells:
        out.append(current)
    return out


def _errors(cell: NotebookNode) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", [])
            if o.get("output_type") == "error"]


def _verdict(cell: NotebookNode) -> dict | None:
    for o in cell.get("outputs", []):
        if o.get("output_type") == "display_data" and VERDICT_MIME in o.get("data", {}):
            return dict(o["data"][VERDICT_MIME])
    return None


class GraderEngine(Engine):
    """papermill engine ``grader``: per-exercise time limits, interrupt, restart and resume."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, *, timeouts: dict[str, float],
                                 on_outcome: Callable[[Outcome], None], start_timeout=60,
                                 **kwargs):
        client = PapermillNotebookClient(
            nb_man, kernel_name=kernel_name, allow_errors=True, startup_timeout=start_timeout,
            shutdown_kernel="immediate", interrupt_on_timeout=False)
        todo = parts(nb_man.nb)
        done = 0
        while done < len(todo):
            with client.setup_kernel():
                if done:
                    cls._replay(client, todo[:done], timeouts)
                while done < len(todo):
                    part = todo[done]
                    done += 1
                    try:
                        outcome = cls._run_part(client, nb_man, part, timeouts)
                    except KernelLost as lost:
                        outcome = Outcome(part.exercise, lost.status, str(lost), lost.duration_s)
                        if part.exercise:
                            on_outcome(outcome)
                        break
                    if part.exercise:
                        on_outcome(outcome)
        return nb_man.nb

    @classmethod
    def _run_part(cls, client, nb_man, part: Part, timeouts) -> Outcome:
        start = time.monotonic()
        limit = timeouts.get(part.exercise) if part.exercise else None
        answer_errors: list[str] = []
        for index in part.cells:
            cell = nb_man.nb.cells[index]
            remaining = (limit - (time.monotonic() - start)) if limit else EPILOGUE_CELL_TIMEOUT
            nb_man.cell_start(cell, index)
            try:
                cls._execute(client, cell, index, remaining, start)
            except CellTimeoutError:
                nb_man.cell_complete(cell, index)
                what = "your answer" if notebook.role(cell) == "answer" else (
                    "the checks" if notebook.role(cell) == "grade" else f"cell {cell.id!r}")
                message = (f"exceeded the time limit of {limit or EPILOGUE_CELL_TIMEOUT:g} s while "
                           f"running {what}; look for an endless loop or work that grows too fast "
                           "with the input size.")
                cls._interrupt(client, message, start)
                return Outcome(part.exercise, "timeout", message + " The kernel was interrupted "
                               "and grading went on.", time.monotonic() - start)
            if errors := _errors(cell):
                nb_man.cell_exception(cell, index)
                if notebook.role(cell) == "answer":
                    answer_errors.extend(errors)
            nb_man.cell_complete(cell, index)
        duration = time.monotonic() - start
        if part.exercise is None:
            return Outcome("", "passed", "", duration)
        grade_cell = nb_man.nb.cells[part.cells[-1]]
        verdict = _verdict(grade_cell)
        if verdict is None:
            detail = "; ".join(_errors(grade_cell)) or "it produced no verdict"
            return Outcome(part.exercise, "error", f"the checks could not run: {detail}",
                           duration, None, tuple(answer_errors))
        return Outcome(part.exercise, verdict["status"], verdict["message"], duration, verdict,
                       tuple(answer_errors))

    @staticmethod
    def _execute(client, cell, index, seconds: float, start: float) -> None:
        if seconds <= 0:
            raise CellTimeoutError("no time left")
        client.timeout = max(1, math.ceil(seconds))
        try:
            client.execute_cell(cell, index)
        except DeadKernelError as exc:
            raise KernelLost(
                f"the kernel died while running cell {cell.id!r} ({exc}): a crash, os._exit, "
                "or running out of memory. The rest of the lab was graded in a fresh kernel.",
                time.monotonic() - start) from exc

    @staticmethod
    def _interrupt(client, message: str, start: float) -> None:
        """Interrupt the kernel and wait until it answers again; KernelLost if it does not."""
        run_sync(lambda: ensure_async(client.km.interrupt_kernel()))()
        probe = copy.deepcopy(NotebookNode(cell_type="code", source="pass", metadata={},
                                           outputs=[], execution_count=None, id="probe"))
        client.timeout = INTERRUPT_GRACE
        try:
            client.execute_cell(probe, 0, store_history=False)
        except (CellTimeoutError, DeadKernelError) as exc:
            raise KernelLost(message + " The kernel ignored the interrupt and was replaced by a "
                             "fresh one.", time.monotonic() - start, "timeout") from exc

    @classmethod
    def _replay(cls, client, done: list[Part], timeouts) -> None:
        """Re-run the earlier parts' cells (not their grade cells) in a fresh kernel, on copies,
        so later exercises find the state they expect. Failures here are not graded."""
        for part in done:
            for index in part.cells:
                cell = copy.deepcopy(client.nb.cells[index])
                if notebook.role(cell) == "grade":
                    continue
                client.timeout = math.ceil(timeouts.get(part.exercise, EPILOGUE_CELL_TIMEOUT))
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    try:
                        cls._interrupt(client, "replay", time.monotonic())
                    except KernelLost:
                        return
                except DeadKernelError:
                    return


papermill_engines.register("grader", GraderEngine)
