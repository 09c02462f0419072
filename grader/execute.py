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

from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from traitlets.config import Config
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import Engine, papermill_engines

from grader import notebook
from grader.selfcheck import VERDICT_MIME

#: seconds a cell outside any exercise (after the last grade cell) may run
EPILOGUE_CELL_TIMEOUT = 120
#: seconds an interrupted kernel has to go idle again before it is replaced
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
    ``answer_errors`` the ``ename: evalue`` of answer cells that raised, ``duration_s`` wall
    seconds."""

    exercise: str
    status: str
    message: str
    duration_s: float
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


#: the ename nbclient reports for a cell it interrupted at its time limit
TIMEOUT_ENAME = "GraderTimeLimit"


class GraderEngine(Engine):
    """papermill engine ``grader``: per-exercise time limits, interrupt, restart and resume."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, *, timeouts: dict[str, float],
                                 on_outcome: Callable[[Outcome], None], start_timeout=60,
                                 **kwargs):
        interrupted: set[int] = set()

        def on_cell_error(cell, cell_index, execute_reply):
            if execute_reply["content"].get("ename") == TIMEOUT_ENAME:
                interrupted.add(cell_index)

        # On a timeout nbclient interrupts the kernel and waits up to iopub_timeout for it to go
        # idle; a kernel that stays busy raises CellTimeoutError and is replaced.
        client = PapermillNotebookClient(
            nb_man, kernel_name=kernel_name, allow_errors=True, startup_timeout=start_timeout,
            shutdown_kernel="immediate", interrupt_on_timeout=True,
            error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": "time limit", "traceback": []},
            iopub_timeout=INTERRUPT_GRACE, on_cell_error=on_cell_error,
            # local IPC sockets (in the run's temporary working folder), not TCP on localhost
            config=Config(KernelManager={"transport": "ipc"}))
        todo = parts(nb_man.nb)
        done, lost = 0, set()  # parts run so far; those among them that timed out or crashed
        while done < len(todo):
            with client.setup_kernel():
                if done:
                    cls._replay(client, todo[:done], lost, timeouts)
                while done < len(todo):
                    part = todo[done]
                    done += 1
                    kernel_gone = False
                    try:
                        outcome = cls._run_part(client, nb_man, part, timeouts, interrupted)
                    except KernelLost as exc:
                        outcome = Outcome(part.exercise, exc.status, str(exc), exc.duration_s)
                        kernel_gone = True
                    if outcome.status in ("timeout", "crashed"):
                        lost.add(done - 1)
                    if part.exercise:
                        on_outcome(outcome)
                    if kernel_gone:
                        break  # start a fresh kernel and replay
        return nb_man.nb

    @classmethod
    def _run_part(cls, client, nb_man, part: Part, timeouts, interrupted: set[int]) -> Outcome:
        start = time.monotonic()
        limit = timeouts.get(part.exercise, EPILOGUE_CELL_TIMEOUT)
        answer_errors: list[str] = []
        for index in part.cells:
            cell = nb_man.nb.cells[index]
            what = "your answer" if notebook.role(cell) == "answer" else (
                "the checks" if notebook.role(cell) == "grade" else notebook.describe(cell))
            late = (f"exceeded the time limit of {limit:g} s while running {what}; look for an "
                    "endless loop or work that grows too fast with the input size.")
            remaining = limit - (time.monotonic() - start) if part.exercise else limit
            if remaining <= 0:
                return Outcome(part.exercise, "timeout", late, time.monotonic() - start)
            client.timeout = max(1, math.ceil(remaining))
            nb_man.cell_start(cell, index)
            try:
                client.execute_cell(cell, index)
            except CellTimeoutError as exc:
                raise KernelLost(late + " The kernel ignored the interrupt and was replaced by a "
                                 "fresh one.", time.monotonic() - start, "timeout") from exc
            except DeadKernelError as exc:
                raise KernelLost(
                    f"the kernel died while running {what} (a crash, os._exit, or running out "
                    "of memory); the rest of the lab was graded in a fresh kernel.",
                    time.monotonic() - start) from exc
            finally:
                nb_man.cell_complete(cell, index)
            if index in interrupted:
                return Outcome(part.exercise, "timeout", late + " The kernel was interrupted and "
                               "grading went on.", time.monotonic() - start)
            if notebook.role(cell) == "answer":
                answer_errors.extend(_errors(cell))
        duration = time.monotonic() - start
        if part.exercise is None:
            return Outcome("", "passed", "", duration)
        grade_cell = nb_man.nb.cells[part.cells[-1]]
        verdict = _verdict(grade_cell)
        if verdict is None:
            detail = "; ".join(_errors(grade_cell)) or "it produced no verdict"
            return Outcome(part.exercise, "error", f"the checks could not run: {detail}",
                           duration, tuple(answer_errors))
        return Outcome(part.exercise, verdict["status"], verdict["message"], duration,
                       tuple(answer_errors))

    @staticmethod
    def _replay(client, done: list[Part], lost: set[int], timeouts) -> None:
        """Re-run earlier parts in a fresh kernel, on copies, so later exercises find the state
        they expect (not graded): no grade cells, and from the parts in ``lost`` (that timed out
        or crashed) only the release's own cells (setup, demos), none of the learner's."""
        for number, part in enumerate(done):
            client.timeout = math.ceil(timeouts.get(part.exercise, EPILOGUE_CELL_TIMEOUT))
            for index in part.cells:
                cell = copy.deepcopy(client.nb.cells[index])
                skip = {"grade", "answer", "learner"} if number in lost else {"grade"}
                if notebook.role(cell) in skip:
                    continue
                try:
                    client.execute_cell(cell, index)
                except (CellTimeoutError, DeadKernelError):
                    return


papermill_engines.register("grader", GraderEngine)
