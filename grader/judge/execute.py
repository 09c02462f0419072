"""Execution: a papermill engine that runs an assembled notebook one exercise at a time.

papermill parameterizes the notebook, tracks per-cell state and writes the executed copy; this
engine (``engine_name="grader"``) replaces its run-to-first-error loop with one that never
trusts the submission: the notebook is cut into *parts*, each ending at an exercise's grade cell;
each part runs under its exercise's time limit; a timeout interrupts the kernel and grading goes
on; a dead (or unresponsive) kernel costs that exercise only: a fresh kernel replays the earlier
parts and grading resumes at the next exercise. Every exercise gets an :class:`Outcome`.

Each kernel starts in the run's own working folder under the limits of :mod:`grader.judge.sandbox`;
its stored output is capped (per cell and per notebook); errors are read from the kernel's
execute replies (which a learner cannot restyle, unlike the displayed traceback); and verdicts
come only from the judges, which run here, in the grader's process: each probe of the answer is
a cell run in the kernel in the grade cell's place (:class:`_KernelAnswer`).
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import signal
import stat
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import nbformat.v4 as v4
import psutil
from jupyter_client import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import Engine, papermill_engines
from traitlets import Int, List, Unicode
from traitlets.config import Config

from grader import notebook
from grader.kernel import probe
from grader.checks import (Answer, AnswerError, CheckFailure, ProbeLost, Verdict, explain,
                           out_of_memory, run_checks)
from grader.judge.sandbox import PACKER, Limits, kernel_env

#: seconds a cell outside any exercise (after the last grade cell) may run
EPILOGUE_CELL_TIMEOUT = 120
#: seconds an interrupted kernel has to go idle again before it is replaced
INTERRUPT_GRACE = 10
#: characters of output stored per cell, and per notebook; the rest is dropped with a note
MAX_CELL_OUTPUT = 200_000
MAX_NOTEBOOK_OUTPUT = 5_000_000
#: seconds between two saves of the executed notebook while it runs (papermill saves the whole
#: notebook before and after every cell: 2 s of a lab's grading); the last save is never skipped
SAVE_EVERY_S = 5.0


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager that starts its kernel under :class:`grader.judge.sandbox.Limits`
    (``memory`` bytes, ``cpu`` seconds, as ``user`` "uid:gid" with ``hide`` hidden and all but
    ``writable`` read-only), whatever the kernelspec says."""

    memory = Int(4 << 30, help="bytes of writable memory the kernel may use").tag(config=True)
    cpu = Int(3600, help="CPU seconds the kernel may use").tag(config=True)
    user = Unicode("", help="uid:gid the kernel runs as (empty: the grader's)").tag(config=True)
    hide = List(Unicode(), help="paths the kernel must not see").tag(config=True)
    writable = List(Unicode(), help="folders it may write (all else read-only)").tag(config=True)

    def format_kernel_cmd(self, extra_arguments=None) -> list[str]:
        argv = super().format_kernel_cmd(extra_arguments)
        user = tuple(map(int, self.user.split(":"))) if self.user else None
        return Limits(self.memory, self.cpu, user=user, hide=tuple(self.hide),
                      writable=tuple(self.writable)).argv(
            [*argv, f"--Session.packer={PACKER}"])


def _size(content: dict) -> int:
    """Characters an output message would store."""
    if "text" in content:
        return len(content["text"])
    if "data" in content:
        return sum(len(v) if isinstance(v, str) else len(json.dumps(v))
                   for v in content["data"].values())
    return sum(map(len, content.get("traceback", []))) + len(str(content.get("evalue", "")))


class GraderClient(PapermillNotebookClient):
    """papermill's client plus what grading needs: each cell's execute reply is kept, and
    stored output is capped at MAX_CELL_OUTPUT characters per cell and MAX_NOTEBOOK_OUTPUT per
    notebook (the verdict is always kept)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replies: dict[int, dict] = {}
        self.dropped: dict[int, int] = defaultdict(int)
        self._used: dict[int, int] = defaultdict(int)
        self._total = 0
        self.on_cell_executed = self._keep_reply

    def _keep_reply(self, cell, cell_index, execute_reply):
        self.replies[cell_index] = execute_reply.get("content", {})

    def start_cell(self, index: int) -> None:
        """Forget what an earlier run of cell ``index`` stored (before running it again)."""
        self._total -= self._used.pop(index, 0)
        self.dropped.pop(index, None)
        self.replies.pop(index, None)

    def output(self, outs, msg, display_id, cell_index):
        content = msg["content"]
        size = _size(content)
        room = max(0, min(MAX_CELL_OUTPUT - self._used[cell_index],
                          MAX_NOTEBOOK_OUTPUT - self._total))
        if size > room:
            if "text" not in content or not room:
                self.dropped[cell_index] += size
                return None
            msg = {**msg, "content": {**content, "text": content["text"][:room]}}
            self.dropped[cell_index] += size - room
            size = room
        self._used[cell_index] += size
        self._total += size
        return super().output(outs, msg, display_id, cell_index)

    def note_dropped(self, cell: NotebookNode, index: int) -> None:
        """Append a note to ``cell`` saying how much of its output was dropped, if any."""
        if n := self.dropped.get(index):
            cell.outputs.append(v4.new_output(
                "stream", name="stderr", text=f"\n[grader] {n:,} more characters of output were "
                f"dropped: at most {MAX_CELL_OUTPUT:,} are kept per cell and "
                f"{MAX_NOTEBOOK_OUTPUT:,} per notebook.\n"))


@contextlib.contextmanager
def _reaping(client):
    """On leaving, kill every process the kernel started that is still running (the kernel is a
    subreaper, so detached ones are among its descendants too)."""
    try:
        yield
    finally:
        process = getattr(getattr(client.km, "provisioner", None), "process", None)
        try:
            for child in psutil.Process(process.pid).children(recursive=True):
                child.kill()
        except (AttributeError, psutil.Error):  # no kernel process left
            pass


def _death(client, limits: Limits) -> str:
    """Why the kernel process ended, in words, from its exit status."""
    process = getattr(getattr(client.km, "provisioner", None), "process", None)
    code = process.poll() if process is not None else None
    if code is None:
        return "it stopped responding"
    if code >= 0:
        return f"it exited with status {code} (os._exit(), or a fatal error in native code)"
    sig = -code
    if sig == signal.SIGSEGV:
        return ("it crashed with a segmentation fault (SIGSEGV): native code touched memory it "
                "does not own, e.g. through ctypes, or a recursion overflowed the C stack")
    if sig == signal.SIGXCPU:
        return f"it used more than {limits.cpu} s of CPU time, the grader's limit (SIGXCPU)"
    if sig == signal.SIGKILL:
        return ("it was killed (SIGKILL): by itself or another process, or by the system when "
                "memory ran out")
    if sig == signal.SIGABRT:
        return "it aborted (SIGABRT): a fatal error in native code"
    return f"it was killed by signal {signal.Signals(sig).name}"


class KernelLost(ProbeLost):
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
    """Cut ``nb`` into parts at its grade cells (code cells only). The grader's prologue is a
    part of its own: its time does not count against the first exercise's limit."""
    out, current = [], Part(None)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if notebook.role(cell) == "prologue":
            out.append(Part(None, [i]))
            continue
        current.cells.append(i)
        if notebook.role(cell) == "grade":
            current.exercise = notebook.exercise_of(cell)
            out.append(current)
            current = Part(None)
    if current.cells:
        out.append(current)
    return out


def _reply_error(client: GraderClient, index: int) -> tuple[str, str] | None:
    """(ename, evalue) when cell ``index`` raised, from its execute reply, else None."""
    reply = client.replies.get(index, {})
    if reply.get("status") != "error":
        return None
    return str(reply.get("ename", "Error")), str(reply.get("evalue", ""))


#: the mimetype of the verdicts the grader's check cell displayed when checks ran in the kernel
#: (grader 0.4.0 and earlier): a learner's cell that displays one is passing off a verdict
VERDICT_MIME = "application/vnd.pytorch-internals.verdict+json"

#: the ename nbclient reports for a cell it interrupted at its time limit
TIMEOUT_ENAME = "GraderTimeLimit"



class GraderEngine(Engine):
    """papermill engine ``grader``: per-exercise time limits, interrupt, restart and resume,
    sandboxed kernels, capped output, judges in this process."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, *, timeouts: dict[str, float],
                                 on_outcome: Callable[[Outcome], None], workdir: Path,
                                 home: Path,
                                 limits: Limits, input_name: str, seed: int,
                                 device: str, start_timeout=60, **kwargs):
        # papermill records its input there: here the assembled notebook itself, a second copy
        # of everything in the executed one; the submission's file name says what was graded
        nb_man.nb.metadata.papermill["input_path"] = input_name
        save = nb_man.save
        nb_man.save = lambda **kw: (  # papermill's notebook_complete, after this, saves in full
            save(**kw) if (nb_man.now() - nb_man.last_save_time).total_seconds() >= SAVE_EVERY_S
            else None)
        try:
            return cls._execute(nb_man, kernel_name, timeouts=timeouts, on_outcome=on_outcome,
                                workdir=workdir, home=home, limits=limits,
                                start_timeout=start_timeout, seed=seed, device=device)
        finally:
            nb_man.save = save

    @classmethod
    def _execute(cls, nb_man, kernel_name, *, timeouts, on_outcome, workdir, home, limits,
                 start_timeout, seed, device):
        interrupted: set[int] = set()

        def on_cell_error(cell, cell_index, execute_reply):
            if execute_reply["content"].get("ename") == TIMEOUT_ENAME:
                interrupted.add(cell_index)

        # On a timeout nbclient interrupts the kernel and waits up to iopub_timeout for it to go
        # idle; a kernel that stays busy raises CellTimeoutError and is replaced.
        client = GraderClient(
            nb_man, kernel_name=kernel_name, allow_errors=True, startup_timeout=start_timeout,
            shutdown_kernel="immediate", interrupt_on_timeout=True,
            error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": "time limit", "traceback": []},
            iopub_timeout=INTERRUPT_GRACE, on_cell_error=on_cell_error,
            kernel_manager_class=SandboxKernelManager,
            # local IPC sockets and the connection file (in the run's home folder, outside the
            # kernel's working folder, which holds only what the learner writes; not in the
            # grader's runtime folder, beside every other kernel's), not TCP on localhost
            config=Config(KernelManager={"transport": "ipc", "ip": str(home / "kernel"),
                                         "connection_file": str(home / "kernel.json")},
                          SandboxKernelManager={
                              "memory": limits.memory, "cpu": limits.cpu,
                              "hide": list(limits.hide), "writable": list(limits.writable),
                              "user": ":".join(map(str, limits.user)) if limits.user else ""}))
        run = _Run(client, nb_man, timeouts, interrupted, limits, seed, device, home)
        todo = parts(nb_man.nb)
        done, lost = 0, set()  # parts run so far; those among them that timed out or crashed
        while done < len(todo):
            env = kernel_env(home, limits.threads)
            with client.setup_kernel(env=env, cwd=str(workdir)), _reaping(client):
                if done:
                    run.replay(todo[:done], lost)
                while done < len(todo):
                    part = todo[done]
                    done += 1
                    kernel_gone = False
                    try:
                        outcome = run.part(part)
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


def _lost(cell: NotebookNode, message: str, duration_s: float,
          status: str = "crashed") -> KernelLost:
    """A KernelLost for ``cell``, whose outputs (in the graded notebook) say what happened."""
    cell.outputs.append(v4.new_output("stream", name="stderr", text=f"\n[grader] {message}\n"))
    return KernelLost(message, duration_s, status)


@dataclass
class _Run:
    """One notebook's execution state shared by its parts."""

    client: GraderClient
    nb_man: object
    timeouts: dict[str, float]
    interrupted: set[int]
    limits: Limits
    seed: int
    device: str
    home: Path
    #: cells whose run lost the kernel (it died, ran out of memory, or ignored an interrupt)
    killers: set[int] = field(default_factory=set)

    def _execute(self, cell: NotebookNode, index: int) -> None:
        self.client.start_cell(index)
        self.client.execute_cell(cell, index)
        self.client.note_dropped(cell, index)

    def part(self, part: Part) -> Outcome:
        client, nb = self.client, self.nb_man.nb
        start = time.monotonic()
        limit = self.timeouts.get(part.exercise, EPILOGUE_CELL_TIMEOUT)
        answer_errors: list[str] = []
        for index in part.cells:
            cell = nb.cells[index]
            if notebook.role(cell) == "grade":
                continue  # the judge runs the checks, below
            what = ("your answer" if notebook.role(cell) == "answer"
                    else notebook.describe(cell))
            late = self._late(limit, what)
            remaining = limit - (time.monotonic() - start) if part.exercise else limit
            if remaining <= 0:
                return Outcome(part.exercise, "timeout", late, time.monotonic() - start)
            self._run_cell(cell, index, remaining, late, start, what)
            if index in self.interrupted:
                return Outcome(part.exercise, "timeout", late + " The kernel was interrupted and "
                               "grading went on.", time.monotonic() - start)
            error = _reply_error(client, index)
            if error and out_of_memory(*error):
                self.killers.add(index)
                raise _lost(cell, f"out of memory while running {what}: the kernel may use at "
                            f"most {self.limits.memory / 2**30:g} GiB, the grader's limit "
                            f"({error[0]}: {error[1][:200]}). The rest of the lab was graded in "
                            "a fresh kernel.", time.monotonic() - start)
            if error and notebook.role(cell) == "answer":
                answer_errors.append(explain(*error))
            if error and notebook.role(cell) == "prologue":
                raise RuntimeError(f"the grader's prologue failed: {error[0]}: {error[1]}")
        if part.exercise is None:
            return Outcome("", "passed", "", time.monotonic() - start)
        return self._judge(part.exercise, part.cells[-1], start, limit, tuple(answer_errors))

    @staticmethod
    def _late(limit: float, what: str) -> str:
        return (f"exceeded the time limit of {limit:g} s while running {what}; look for an "
                "endless loop or work that grows too fast with the input size.")

    def _run_cell(self, cell: NotebookNode, index: int, remaining: float, late: str,
                  start: float, what: str) -> None:
        """Execute ``cell`` as cell ``index`` within ``remaining`` seconds; KernelLost when the
        kernel ignored the interrupt (saying ``late``) or died."""
        self.client.timeout = max(1, math.ceil(remaining))
        self.nb_man.cell_start(cell, index)
        try:
            self._execute(cell, index)
        except CellTimeoutError as exc:
            self.killers.add(index)
            raise _lost(cell, late + " The kernel ignored the interrupt and was replaced by a "
                        "fresh one.",
                        time.monotonic() - start, "timeout") from exc
        except DeadKernelError as exc:
            self.killers.add(index)
            raise _lost(cell, f"the kernel died while running {what}: "
                        f"{_death(self.client, self.limits)}. The rest of the lab was graded in "
                        "a fresh kernel.", time.monotonic() - start) from exc
        finally:
            self.nb_man.cell_complete(cell, index)

    def _judge(self, exercise: str, grade_index: int, start: float, limit: float,
               answer_errors: tuple[str, ...]) -> Outcome:
        """Run every check of ``exercise`` here, in the grader's process, each probe of the
        answer in the kernel (:class:`_KernelAnswer`); the verdict is shown in the grade cell
        of the executed notebook."""
        cells = self.nb_man.nb.cells
        cell = cells[grade_index]  # (papermill puts each probe cell in its place: put it back)
        answer = _KernelAnswer(self, exercise, grade_index, start, limit)
        try:
            if stray := answer.strays("after its answer cells ran"):
                v = Verdict(exercise, "error", stray + " The checks did not run.", 0, 0,
                            self.seed)
            else:
                v = run_checks(exercise, answer, seed=self.seed, device=self.device, hidden=True)
                if stray := answer.strays("while the checks called it"):
                    v = Verdict(exercise, "error", stray, 0, 0, self.seed)
        except _Interrupted:
            cells[grade_index] = cell
            return Outcome(exercise, "timeout", self._late(limit, "the checks") + " The kernel "
                           "was interrupted and grading went on.", time.monotonic() - start,
                           answer_errors)
        except ProbeLost:
            cells[grade_index] = cell
            raise
        message = v.message
        if any(VERDICT_MIME in o.get("data", {}) for c in cells[:grade_index]
               if notebook.role(c) in ("answer", "learner") for o in c.get("outputs", [])):
            message += (" (Your notebook displayed a verdict of its own: only the grader's "
                        "judge, outside your kernel, gives verdicts, so it counted for nothing.)")
        cell.outputs = [v4.new_output("display_data", data={
            "text/plain": f"{exercise}: {v.status} (judged by the grader)\n{message}"})]
        cell.execution_count = cells[grade_index].get("execution_count")  # (its last probe's)
        cells[grade_index] = cell
        return Outcome(exercise, v.status, message, time.monotonic() - start, answer_errors)

    def replay(self, done: list[Part], lost: set[int]) -> None:
        """Re-run earlier parts in a fresh kernel, on copies, so later exercises find the state
        they expect (not graded): no grade cells, and from the parts in ``lost`` (that timed out
        or crashed) only the release's own cells (setup, demos), none of the learner's. A cell
        that lost a kernel or was interrupted is not run again: a demo cell that calls the
        learner's answer (a picture of it) would otherwise kill every fresh kernel in turn, and
        each later exercise with it."""
        client = self.client
        for number, part in enumerate(done):
            client.timeout = math.ceil(self.timeouts.get(part.exercise, EPILOGUE_CELL_TIMEOUT))
            for index in part.cells:
                cell = copy.deepcopy(client.nb.cells[index])
                skip = {"grade", "answer", "learner"} if number in lost else {"grade"}
                if notebook.role(cell) in skip or index in self.killers | self.interrupted:
                    continue
                try:
                    self._execute(cell, index)
                except (CellTimeoutError, DeadKernelError):
                    return


class _Interrupted(ProbeLost):
    """A probe ran past the exercise's time limit; the kernel was interrupted and lives on."""


class _KernelAnswer(Answer):
    """The learner's answer in the kernel, as the judge calls it: each probe is a request file
    (plain data), a cell that runs :func:`grader.kernel.probe.serve` on it in the kernel, within
    what is left of the exercise's time limit, and a reply file read back as plain data (run
    folder's ``home/probe``, outside the kernel's working folder). The probe cell's own output
    (whatever the answer prints) is not kept."""

    def __init__(self, run: _Run, exercise: str, index: int, start: float, limit: float):
        from grader.labs import load_lab

        super().__init__(exercise, run.seed)
        self.run, self.index, self.start, self.limit = run, index, start, limit
        self.name = load_lab(exercise.split(".", 1)[0]).exercise(exercise).answer
        self.folder = run.home / "probe"
        self.folder.mkdir(exist_ok=True)
        self.count = 0

    def strays(self, when: str) -> str:
        """What the answer left running in the kernel, in words
        (:func:`grader.kernel.strays.report`), or ""."""
        self.count += 1
        report = self.folder / f"{self.count}.strays"
        self._cell(f"__import__('grader.kernel.strays').kernel.strays.report("
                   f"{str(report)!r}, {when!r})")
        try:
            fd = os.open(report, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as f:
            text = f.read(2000).decode("utf-8", "replace") if stat.S_ISREG(
                os.fstat(f.fileno()).st_mode) else ""
        report.unlink()
        return text

    def _cell(self, source: str) -> None:
        """Run ``source`` in the kernel, in the grade cell's place, within what is left of the
        exercise's time limit (_Interrupted past it)."""
        cell = copy.deepcopy(self.run.nb_man.nb.cells[self.index])
        cell.source = source
        remaining = self.limit - (time.monotonic() - self.start)
        if remaining <= 0:
            raise _Interrupted()
        late = self.run._late(self.limit, "the checks")
        self.run._run_cell(cell, self.index, remaining, late, self.start, "the checks")
        if self.index in self.run.interrupted:
            raise _Interrupted()

    def send(self, probe_name, args, kwargs) -> bytes:
        self.count += 1
        request = self.folder / f"{self.count}.request"
        reply = self.folder / f"{self.count}.reply"
        reply.unlink(missing_ok=True)
        request.write_bytes(probe.encode({
            "answer": self.name, "probe": probe_name, "args": list(args), "kwargs": kwargs,
            "seed": self.seed, "models": list(self.models), "reply": str(reply)}))
        self._cell(f"__import__('grader.kernel.probe').kernel.probe.serve({str(request)!r})")
        try:  # (the kernel owns the folder: never follow a link, never wait on a pipe)
            fd = os.open(reply, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            error = _reply_error(self.run.client, self.index)
            detail = f"{error[0]}: {error[1]}" if error else "no reply"
            raise AnswerError(f"the grader's probe could not run in your kernel ({detail}): "
                              "answers must not modify the grader or torch's own modules.")
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > probe.MAX_REPLY_BYTES:
                raise CheckFailure("what came back from your answer is not a probe's reply "
                                   f"(a file of at most {probe.MAX_REPLY_BYTES} bytes).")
            data = f.read(probe.MAX_REPLY_BYTES + 1)
        reply.unlink()
        return data


papermill_engines.register("grader", GraderEngine)
