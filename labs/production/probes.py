"""The production lab's probes and its case runner.

Each exercise hands the learner a small training script (``labs/production/cases/<case>.py``)
that fails or is slow in one realistic way. A script defines ``main(config: dict) -> dict``: it
trains with the settings in ``config`` and returns what it observed as plain JSON data (a loss
curve, memory readings, step times, compile counts). :func:`run` runs a script's text as a
separate process, forked from the caller (the learner's kernel, or the judge), bounded in time
and memory, and reports how it ended; :class:`Case` is what an answer is given.

An answer is a function ``answer(case: Case) -> {"diagnosis": {...}, "script": str}``: what went
wrong, as data the exercise names, found by running the case (``case.run(...)``, with whatever
instruments the learner adds to the script); and the fixed script's text. The probe
:func:`diagnosed` calls it, runs the fixed script (and, where a check needs it, the original)
under the check's settings, and returns the diagnosis and the runs as plain data; the judges in
``labs/production/checks`` run the original and the reference fix here too (:func:`run`, in the
grader's process) and decide. Nothing here knows a right answer."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import linecache
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from grader.checks import probe

#: the case scripts' folder
CASES = Path(__file__).resolve().parent / "cases"
#: seconds a case run may take before its process group is killed (a check may set less)
RUN_TIMEOUT_S = 60.0
#: bytes of address space a case run may add to what its process had when forked
RUN_MEMORY_BYTES = 3 << 30
#: seconds between two samples of a run's heap (Run.heap_growth_bytes)
HEAP_SAMPLE_S = 0.002
#: characters of a run's stdout and stderr kept (the last ones)
KEEP_CHARS = 20_000


def case_source(name: str) -> str:
    """The text of ``cases/<name>.py`` (``name`` with ``_`` for ``-``). Raises FileNotFoundError
    for a case that does not exist."""
    return (CASES / f"{name.replace('-', '_')}.py").read_text(encoding="utf-8")


@dataclasses.dataclass
class Run:
    """How one run of a case script ended.

    ``status``: ``"ok"`` (``main`` returned), ``"raised"`` (it raised: ``error`` is
    ``"Type: message"`` and ``line`` the script's line it was raised from, or None),
    ``"timeout"`` (killed after ``timeout_s``), ``"died"`` (the process ended without a result,
    e.g. killed by a signal or out of memory: ``error`` says how). ``result``: what ``main``
    returned (plain JSON data) or None. ``stdout``/``stderr``: what the process printed (the last
    :data:`KEEP_CHARS` characters of each; the C++ side's warnings included). ``seconds``: wall
    time of the run; ``peak_rss_bytes``: the process's peak resident memory (bytes, its own:
    children such as DataLoader workers or ranks are not counted). ``graphs``: how many graphs
    Dynamo compiled during the run (``torch.compile``'s frames and recompiles; counted by the
    runner, not by the script); ``compiled``: for each function the script defines that Dynamo
    compiled, the entries its code holds in Dynamo's cache (one per graph kept, with its
    guards), read by the runner after ``main`` returned; ``heap_growth_bytes``: how far the
    bytes malloc had handed out rose above their level before the script's module code ran,
    at most, while it and ``main`` ran (where CPU tensors live; sampled by the runner every
    :data:`HEAP_SAMPLE_S` seconds: :class:`_HeapPeak`)."""

    status: str
    result: object = None
    error: str = ""
    line: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    graphs: int = 0
    compiled: dict = dataclasses.field(default_factory=dict)
    heap_growth_bytes: int = 0

    def plain(self) -> dict:
        """The run as plain data (a probe's reply)."""
        return dataclasses.asdict(self)


def _child(code, config: dict, files: dict, memory_bytes: int) -> None:
    """In the forked process: a session of its own, output to files, one intra-op thread,
    bounded address space; run ``main(config)`` and write the result. Never returns."""
    status, err = 3, None
    try:
        os.setsid()
        for fd, key in ((1, "stdout"), (2, "stderr")):
            f = os.open(files[key], os.O_WRONLY | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        err = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115  (the runner's own)
        consoles = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stdin = open(os.devnull)  # noqa: SIM115
        _own_logging_and_warnings(consoles)
        import torch

        torch.set_num_threads(1)  # (a forked OpenMP pool is not safe to use: as DataLoader's)
        pages = int(Path("/proc/self/statm").read_text().split()[0])
        limit = pages * os.sysconf("SC_PAGE_SIZE") + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        namespace = {"__name__": "__case__", "__file__": code.co_filename}
        graphs, heap = _graphs(), _HeapPeak()
        try:
            with heap:  # (from before the script's module code: what it allocates there counts)
                exec(code, namespace)  # noqa: S102  (the case script: what this runs)
                result, error, line, status = namespace["main"](dict(config)), "", None, 0
        except BaseException as exc:  # noqa: BLE001  (the run's own failure, reported)
            # (from the script's frames on: the runner's own frame says nothing to a learner)
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next, file=err)
            frames = [f for f in traceback.extract_tb(exc.__traceback__)
                      if f.filename == code.co_filename]
            result, line, status = None, frames[-1].lineno if frames else None, 1
            error = f"{type(exc).__name__}: {exc}"
        with open(files["result"], "w", encoding="utf-8") as f:
            json.dump({"result": result, "error": error, "line": line,
                       "graphs": _graphs() - graphs,
                       "compiled": _compiled(namespace, code.co_filename),
                       "heap_growth_bytes": heap.growth}, f)
        for stream in (sys.stdout, sys.stderr):  # (the script may have closed or replaced them)
            with contextlib.suppress(Exception):
                stream.flush()
    except BaseException:  # noqa: BLE001  (a result it could not write: "died")
        with contextlib.suppress(Exception):
            traceback.print_exc(file=err)
    finally:
        os._exit(status)


def _own_logging_and_warnings(consoles: set[int]) -> None:
    """In the forked process: what the parent set up to catch output is the parent's. Each
    logging handler that wrote to one of the parent's consoles (``consoles``: the ids of its
    ``sys.stdout`` and ``sys.stderr``, a Jupyter kernel's streams or a terminal) writes to this
    process's stderr instead (handlers that collect records elsewhere are left alone), and warnings are shown on stderr with a fresh interpreter's
    filters (pytest, for one, records them in the parent's memory, where they would be lost)."""
    import logging
    import warnings

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if id(getattr(handler, "stream", None)) in consoles:
                handler.setStream(sys.stderr)
    warnings.resetwarnings()
    for action, category in (("default", DeprecationWarning), ("ignore", DeprecationWarning),
                             ("ignore", PendingDeprecationWarning), ("ignore", ImportWarning),
                             ("ignore", ResourceWarning)):
        warnings.filterwarnings(action, category=category, append=True,
                                module="__main__" if action == "default" else "")
    warnings.showwarning = warnings._showwarning_orig
    warnings._showwarnmsg_impl = _show_warning


def _show_warning(msg) -> None:
    """Show a warning as an interpreter does (warnings._showwarnmsg_impl), on stderr."""
    import warnings

    sys.stderr.write(warnings._formatwarnmsg(msg))


def _graphs() -> int:
    """The graphs Dynamo has compiled in this process so far
    (torch/_dynamo/utils.py: counters["stats"]["unique_graphs"])."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class _HeapPeak:
    """While its ``with`` block runs, a thread samples the bytes malloc has handed out (glibc's
    ``mallinfo2``: ``uordblks + hblkhd``; the CPU allocator's tensors are there,
    c10/core/impl/alloc_cpu.cpp: alloc_cpu) every :data:`HEAP_SAMPLE_S` seconds; ``growth``
    is then the highest sample above the first, in bytes (0 where glibc is absent)."""

    def __init__(self):
        import ctypes

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]

        libc = ctypes.CDLL(None)
        self.info = getattr(libc, "mallinfo2", None)
        if self.info is not None:
            self.info.restype = MallInfo2
        self.growth, self.done = 0, None

    def _bytes(self) -> int:
        info = self.info()
        return info.uordblks + info.hblkhd

    def __enter__(self):
        import threading

        if self.info is None:
            return self
        self.done, start = threading.Event(), self._bytes()

        def sample():
            while not self.done.wait(HEAP_SAMPLE_S):
                self.growth = max(self.growth, self._bytes() - start)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.done is not None:
            self.done.set()
            self.thread.join()
        return False


def _compiled(namespace: dict, filename: str) -> dict:
    """For each function the script defines at its top level that Dynamo compiled: how many
    entries (graphs with their guards) its code object holds in Dynamo's cache
    (torch/csrc/dynamo/cache_entry.h: CacheEntry; ``_debug_get_cache_entry_list``)."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    out = {}
    for name, value in namespace.items():
        code = getattr(value, "__code__", None)
        if code is not None and code.co_filename == filename:
            out[name] = len(_debug_get_cache_entry_list(code))
    return {name: n for name, n in out.items() if n}


def _tail(path: str) -> str:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return text[-KEEP_CHARS:]


def run(source: str, config: dict, *, filename: str = "case.py",
        timeout_s: float = RUN_TIMEOUT_S, memory_bytes: int = RUN_MEMORY_BYTES) -> Run:
    """Run ``source`` (a case script's text) in a process forked from this one: its ``main(
    config)`` is called and what it returns (plain JSON data) comes back in a :class:`Run`.
    Tracebacks and the anomaly mode's reports name the script as ``filename`` with the
    script's own line numbers. The process runs in a session of its own with one intra-op
    thread and at most ``memory_bytes`` more address space than it was forked with; after
    ``timeout_s`` seconds its whole process group (DataLoader workers, ranks) is killed, and
    whatever it started is killed when it ends, a daemon that left the group included (this
    process adopts it: :func:`_adopting_orphans`). Since the process is forked, the settings read
    once at import (``TORCH_LOGS``, ``TORCH_SHOW_CPP_STACKTRACES``) are this process's: set
    logs with ``torch._logging.set_logs`` in the script. Raises SyntaxError for a source that
    does not compile (nothing is run)."""
    import torch._dynamo  # noqa: F401  (an optimizer's first step imports it: 1 to 2 s in
    # every run forked without it; and the runner counts Dynamo's graphs with it)

    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    folder = tempfile.mkdtemp(prefix="case-")
    files = {k: os.path.join(folder, k) for k in ("stdout", "stderr", "result")}
    for path in files.values():
        open(path, "w").close()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    with _adopting_orphans() as before:
        pid = os.fork()
        if pid == 0:
            _child(code, config, files, memory_bytes)
        status, usage = None, None
        try:
            while time.monotonic() - start < timeout_s:
                done, status, usage = os.wait4(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.01)
            else:
                status = None
        finally:
            _kill(pid)
            if status is None:
                _, _, usage = os.wait4(pid, 0)
            _kill_adopted(before)
    seconds = time.monotonic() - start
    out = Run("died", stdout=_tail(files["stdout"]), stderr=_tail(files["stderr"]),
              seconds=round(seconds, 4), peak_rss_bytes=usage.ru_maxrss * 1024)
    try:
        written = json.loads(Path(files["result"]).read_text(encoding="utf-8") or "null")
    except ValueError:
        written = None
    if status is None:
        out.status, out.error = "timeout", f"still running after {timeout_s:g} s: killed"
    elif written is not None:
        out.result, out.error, out.line = written["result"], written["error"], written["line"]
        out.graphs, out.compiled = written["graphs"], written["compiled"]
        out.heap_growth_bytes = written["heap_growth_bytes"]
        out.status = "raised" if written["error"] else "ok"
    elif os.WIFSIGNALED(status):
        out.error = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        out.error = f"exited with status {os.WEXITSTATUS(status)} and no result"
    for path in files.values():
        os.unlink(path)
    os.rmdir(folder)
    return out


@contextlib.contextmanager
def _adopting_orphans():
    """While the body runs, this process is a child subreaper (Linux ``prctl(
    PR_SET_CHILD_SUBREAPER)``): a process a run started that left the run's process group (a
    daemon in a session of its own) becomes this process's child when its parent dies, instead
    of init's, so :func:`_kill_adopted` can end it. Yields the pids of this process's children
    before the body."""
    import ctypes

    import psutil

    libc = ctypes.CDLL(None, use_errno=True)
    before = {p.pid for p in psutil.Process().children()}
    was = ctypes.c_int(0)
    libc.prctl(37, ctypes.byref(was), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    try:
        yield before
    finally:
        libc.prctl(36, was.value, 0, 0, 0)


def _kill_adopted(before: set[int]) -> None:
    """Kill and reap every child of this process not in ``before`` (what a run left behind,
    adopted), until none is left (a killed one's own children are adopted in turn)."""
    import psutil

    for _ in range(50):
        left = [p for p in psutil.Process().children() if p.pid not in before]
        if not left:
            return
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        for p in left:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p.pid, 0)


def _kill(pid: int) -> None:
    """Kill the process group ``pid`` leads (a run and what it started), if any is left."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Case:
    """One case as an answer gets it: ``name`` (e.g. ``"nan"``), ``source`` (the script's
    text, ``cases/<name>.py``), ``config`` (the settings this check runs it with: a dict of
    plain data; its ``"workdir"``, where given, is a folder the runs may write to) and
    :meth:`run`."""

    def __init__(self, name: str, config: dict):
        self.name, self.config = name, dict(config)
        self.filename = f"{name.replace('-', '_')}.py"
        self.source = case_source(name)

    def run(self, source: str | None = None, config: dict | None = None,
            timeout_s: float = RUN_TIMEOUT_S) -> Run:
        """Run ``source`` (default: the case's own script) with ``config`` (default: the case's
        settings; a dict given is laid over them) in a process of its own: see :func:`run`."""
        merged = {**self.config, **(config or {})}
        return run(self.source if source is None else source, merged,
                   filename=self.filename, timeout_s=timeout_s)

    def __repr__(self) -> str:
        return f"Case({self.name!r}, config={self.config!r})"


@probe
def diagnosed(answer, name: str, config: dict, runs: list) -> dict:
    """Call ``answer(Case(name, config))`` (``config["workdir"]`` set to a fresh folder), then
    make each run of ``runs``: ``[which, overrides, timeout_s]`` with ``which`` ``"fixed"`` (the
    script the answer returned) or ``"original"`` (the case's own), its settings ``config``
    with ``overrides`` laid over them (settings the answer never saw, where a check tests that
    the fix holds beyond the case it was given). The runs are the probe's own, made afresh from
    the case's file and the script's text, not through the ``Case`` the answer was given (which
    the answer may have changed). Returns ``{"diagnosis": what the answer gave, "runs":
    [Run.plain(), ...]}``; ``{"reply": why}`` when the answer did not return a dict with a
    ``"script"`` string; ``{"compile": message}`` when that script does not compile; ``{"raised":
    record}`` when the answer raised."""
    import shutil

    from grader.checks import raised

    workdir = tempfile.mkdtemp(prefix=f"{name}-")
    original, filename = case_source(name), f"{name.replace('-', '_')}.py"
    try:
        case = Case(name, {**config, "workdir": workdir})
        try:
            reply = answer(case)
        except Exception as exc:  # noqa: BLE001  (the judge reports it)
            return {"raised": raised(exc)}
        if type(reply) is not dict or type(reply.get("script")) is not str:
            return {"reply": f"a {type(reply).__name__}"
                    + ("" if type(reply) is not dict else f" with keys {sorted(map(str, reply))}")}
        try:
            compile(reply["script"], filename, "exec")
        except SyntaxError as exc:
            return {"compile": f"SyntaxError: {exc.msg} (line {exc.lineno})"}
        out, settings = [], {**config, "workdir": workdir}
        for which, overrides, timeout_s in runs:  # (not through the answer's Case object)
            source = reply["script"] if which == "fixed" else original
            out.append(run(source, {**settings, **overrides}, filename=filename,
                           timeout_s=timeout_s).plain())
        return {"diagnosis": reply.get("diagnosis"), "runs": out}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
