"""Threads and child processes an answer leaves running, seen from inside the kernel.

The grader's first cell (its *prologue*, before any learner cell) calls :func:`begin`, which
notes the threads and child processes the kernel already has. Before and after it judges each
exercise, the grader runs :func:`report`, which writes what has started since the last look
and is still running, in words, and kills those processes. Like a probe's, this is an
observation made in the kernel: data for the judge (an exercise whose answer left work running
gets ``error``), never a verdict.
"""
from __future__ import annotations

import sysconfig
import threading

#: the threads and child process ids of the last look (set by :func:`begin`)
_SEEN: dict[str, set] = {}
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                          "platlib")})


def _learners(thread: threading.Thread) -> bool:
    """Whether ``thread`` runs the notebook's code: its target (or overridden ``run``) is not
    defined in an installed library or the standard library (torch, tqdm and ipykernel start
    threads of their own). A built-in target (``time.sleep``) counts as the notebook's."""
    target = (getattr(thread, "_target", None) or getattr(thread, "function", None)  # Timer
              or type(thread).run)
    code = getattr(target, "__code__", None)
    if code is None:
        return True
    return not code.co_filename.startswith(_LIBRARY_DIRS)


def _alive_children() -> list:
    import psutil

    try:
        return [p for p in psutil.Process().children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def begin() -> None:
    """Note the threads and child processes running now (the grader's prologue)."""
    _SEEN.update(threads=set(threading.enumerate()), pids={p.pid for p in _alive_children()})


def strays() -> tuple[list[str], list[str]]:
    """(threads, processes) started since the last look (:func:`begin` or this) and still
    running, as learner-readable descriptions. The processes are killed (SIGKILL)."""
    threads = [repr(t.name) for t in threading.enumerate()
               if t not in _SEEN.get("threads", ()) and t.is_alive() and _learners(t)]
    described = []
    for p in _alive_children():
        if p.pid in _SEEN.get("pids", ()):
            continue
        try:
            described.append(f"pid {p.pid} ({' '.join(p.cmdline())[:60] or p.name()})")
            p.kill()
        except Exception:  # psutil.Error: it ended meanwhile
            described.append(f"pid {p.pid}")
    begin()
    return threads, described


def describe(when: str) -> str:
    """What :func:`strays` finds, as a sentence for the learner (``when``: "after its answer
    cells ran"), or "" when nothing was left running."""
    threads, procs = strays()
    if not threads and not procs:
        return ""
    what = []
    if threads:
        what.append(f"{len(threads)} thread(s) running ({', '.join(threads[:3])})")
    if procs:
        what.append(f"{len(procs)} child process(es) running ({', '.join(procs[:3])}; the "
                    "grader killed them)")
    return (f"your answer left {' and '.join(what)} {when}. An answer must finish its work "
            "before it returns: join the threads, wait for the processes.")


def report(path: str, when: str) -> None:
    """The grader's stray cell: write :func:`describe` to ``path`` (nothing when nothing was
    left running)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(describe(when))
