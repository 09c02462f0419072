"""Ranks from a notebook: run a function on several real processes joined in a process group.

:func:`run` forks ``world_size`` processes from the notebook's kernel (or any process), joins
them in a default process group (gloo on CPU) through a ``FileStore`` in a fresh temporary
folder, calls ``fn(*args)`` on every rank and returns what each rank returned. Forking (not
``torch.multiprocessing.spawn``) is what lets a function defined in a notebook cell run on the
ranks: a spawned process starts a new interpreter that would have to import the function by
name. A world of 4 starts in about 0.1 s here; ``spawn`` takes seconds, importing torch again.

What it guarantees, so that a learner's rank that hangs or dies costs one call, not a kernel:

- Every rank ends with the call. On a rank's error the others get a moment to report theirs and
  are then killed; past ``timeout`` seconds each rank still running dumps its Python stack
  (``faulthandler``) and is killed; the error names each rank and the line it was at. An
  interrupt (the grader's time limit, the notebook's stop button) kills them too. Ranks die with
  the process that started them (``PR_SET_PDEATHSIG``).
- No port and no file is shared between calls: the store is a file in a new temporary folder
  (deleted afterwards), and gloo's own connections bind ports the OS picks.
- A rank's output (``print``, C++ warnings) goes to a file that :func:`run` prints afterwards,
  each line prefixed ``[rank r]`` (a warning every rank gave alike once, :func:`echoed`); the
  kernel's own output channel is never touched by a fork.

Each rank sees the environment torchrun would set for it (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) and runs torch with one intra-op thread. The variables that
choose the network (:data:`NETWORK_ENV`) are those the calling process was started with: a
``GLOO_SOCKET_IFNAME`` a notebook set for another machine does not reach the ranks.
(torch/distributed/run.py: torchrun; torch/distributed/distributed_c10d.py:
init_process_group; torch/csrc/distributed/c10d/FileStore.hpp: FileStore.)
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import faulthandler
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

from grader.checks import (AnswerError, CheckFailure, explain, learner_line, out_of_memory,
                           started_environ)

#: seconds the other ranks get to report their own errors after the first one fails
GRACE = 1.0
#: seconds a call may take by default, every rank included (the checks' calls take 0.1-2 s),
#: on a machine with a CPU free for each process that wants one (see :func:`allowed`)
TIMEOUT = 15.0
#: the most a busy machine stretches a time limit (:func:`allowed`)
MOST_STRETCH = 4.0
#: seconds (stretched by :func:`allowed`) every rank has to join the process group after the
#: fork (about 0.1 s here) before the world is started again
JOIN = 5.0
PR_SET_PDEATHSIG = 1  # (linux/prctl.h)
#: held while a world runs: one at a time per process. A judge's oracle worlds run in a thread
#: of the grader's own, beside the kernel's worlds (another process); where both are one process
#: (the tests, which call the answer in-process) they would otherwise fork at the same time
_ONE_WORLD = threading.Lock()
#: new worlds started when a rank fails before it has joined the process group (gloo's
#: connectFullMesh, on a busy machine: "Connection closed by peer"); its output is not echoed
RENDEZVOUS_RETRIES = 2
#: torch.distributed's functions that create a process group, where gloo connects its ranks
#: (``new_group``, which ``init_device_mesh`` calls): a lost peer there is a connection that
#: failed (on a busy machine), not the answer's doing (torch/distributed/distributed_c10d.py)
_GROUP_CREATION = frozenset({"_new_process_group_helper", "_new_group_with_tag", "new_group",
                             "split_group", "new_subgroups", "new_subgroups_by_enumeration"})
#: how gloo says that the rank at the other end of a connection has gone
_LOST_PEER = re.compile(r"(Read|Write) error \[[^\]]*\]:\d+: Connection (reset|closed) by peer"
                        r"|Connection closed by peer \[[^\]]*\]:\d+")


class RankFailure(AnswerError):
    """A rank raised, exited early, or did not finish in time. ``rank`` is the first rank that
    failed, ``exception`` the class name of what it raised (``""`` when it exited or hung), and
    the message says what each failed rank did and where."""

    def __init__(self, message: str, rank: int, exception: str = ""):
        super().__init__(message)
        self.rank, self.exception = rank, exception


def run(fn, world_size: int, *args, timeout: float = TIMEOUT, backend: str = "gloo",
        echo: bool = True, clean: bool = False) -> list:
    """Call ``fn(*args)`` on ``world_size`` forked ranks in a default process group; return the
    values the ranks returned, by rank (they travel back pickled, so return plain data: tensors,
    numbers, lists, dicts).

    ``timeout`` (seconds, stretched on a busy machine: :func:`allowed`) bounds the whole call;
    the process group's own timeout is longer, so a rank that waits for a message no one sends
    is reported with the line it waits at, not with gloo's timeout error. ``echo`` prints what
    the ranks printed, ``[rank r]`` before each line. A world in which a rank fails before it
    has joined the process group is started again (up to ``RENDEZVOUS_RETRIES`` times), as is one
    in which gloo lost a connection while the ranks created a new group (``new_group``,
    ``init_device_mesh``; seen under load) and no rank failed otherwise, and one in which a
    rank has not joined the process group :data:`JOIN` seconds (stretched) after the fork: a fork
    made while another thread of this process held a lock inside torch (its thread pools, MKL)
    leaves the rank waiting on that lock forever, before it has run anything of the answer
    (seen under load). With ``clean``, the ranks are forked from a server process that runs
    nothing else (multiprocessing's ``forkserver``, torch preloaded) instead of from this one,
    so that no lock another thread of this process holds can come along: for a process whose
    other threads run torch (the judges'), and an ``fn`` importable by name with picklable
    ``args``. A process group already initialized in this process (a
    ``dist.init_process_group`` outside a rank, which forked ranks would inherit) is destroyed
    first, with a note on stderr: wherever the notebook made it, it costs nothing. Raises
    :class:`RankFailure` (naming the rank) when a rank raises, exits before returning, or is
    still running after ``timeout``. Linux and macOS (fork) only.
    """
    with _ONE_WORLD:
        return _run(fn, world_size, args, timeout, backend, echo, clean)


def allowed(timeout: float) -> float:
    """``timeout`` (seconds) stretched by how busy this machine is now: times the 1-minute load
    average per CPU (``os.getloadavg``) when that is over 1, at most :data:`MOST_STRETCH` times.
    A correct world on a machine shared with other work (a batch's other kernels, a test run's
    other worker) then gets the CPU time it needs; a rank that waits forever is still stopped."""
    per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    return timeout * min(MOST_STRETCH, max(1.0, per_cpu))


def _context(clean: bool, fn):
    """multiprocessing's fork context, or with ``clean`` its forkserver, with torch and the
    module of ``fn`` preloaded (the server starts at the first clean world: its ranks then
    import nothing)."""
    if not clean:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", __name__, fn.__module__])
    return context


def _run(fn, world_size: int, args: tuple, timeout: float, backend: str, echo: bool,
         clean: bool) -> list:
    import torch.distributed as dist

    timeout = allowed(timeout)

    if dist.is_initialized():  # (ranks forked from it would inherit it: it goes first)
        dist.destroy_process_group()
        print("note: a process group was initialized in the notebook's own process (a "
              "dist.init_process_group call outside a rank) and never destroyed; it has been "
              "destroyed before starting the ranks. Initialize process groups only inside the "
              "function the ranks run.", file=sys.stderr)
    if "torch.distributed.tensor" in sys.modules:  # DTensor's first op imports Dynamo (~1.5 s):
        import torch._dynamo  # noqa: F401  (once here, not once in every rank)
    for attempt in range(1 + RENDEZVOUS_RETRIES):
        folder = Path(tempfile.mkdtemp(prefix="ranks-"))
        ranks: list[_Rank] = []
        again = False
        try:
            context = _context(clean, fn)
            with warnings.catch_warnings():  # (Python 3.12 warns on fork in a threaded process)
                warnings.simplefilter("ignore", DeprecationWarning)
                for rank in range(world_size):
                    ranks.append(_Rank(context, rank, world_size, folder, backend, timeout,
                                       fn, args))
            _wait(ranks, time.monotonic() + timeout, time.monotonic() + allowed(JOIN))
            failed = [r for r in ranks if r.failure]
            # gloo could not connect the ranks (seen on a machine busy with other work): not
            # the answer's doing, as no rank had joined to run it; start a new world instead
            again = attempt < RENDEZVOUS_RETRIES and _unconnected(failed)
            if failed and not again:
                raise _failure(failed, timeout)
            if not failed:
                return [r.value for r in ranks]
        finally:
            for r in ranks:  # (all at once: a rank that outlives a peer reports the lost peer)
                r.kill()
            for r in ranks:
                r.reap()
            if echo and not again:
                print(echoed([r.output() for r in ranks]), end="")
            shutil.rmtree(folder, ignore_errors=True)


def _unconnected(failed: list[_Rank]) -> bool:
    """Whether the ranks ``failed`` for want of a connection, not for what the answer did: one
    failed before it joined the process group, or one lost a peer while gloo connected a new
    group and each other failed rank lost a peer too or was stopped after it (hung)."""
    if any(r.failure.get("rendezvous") for r in failed):
        return True
    return any(r.failure.get("connecting") for r in failed) and all(
        r.failure.get("lost_peer") or r.failure.get("what") == "hung" for r in failed)


class _Rank:
    """One forked rank: its process, the pipe its result comes back through, its files."""

    def __init__(self, context, rank, world_size, folder, backend, timeout, fn, args):
        self.rank, self.value, self.failure, self.done, self.order = rank, None, None, False, 0
        self.log, self.stack = folder / f"rank{rank}.log", folder / f"rank{rank}.stack"
        self.joined = folder / f"rank{rank}.joined"  # (written once it has joined the group)
        self.conn, child_end = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_rank_main, name=f"rank {rank}", daemon=True,
            args=(rank, world_size, folder, backend, timeout, fn, args, child_end,
                  started_network_env()))
        self.process.start()
        child_end.close()

    def receive(self) -> None:
        """Read the rank's report, or note that it ended without one."""
        try:
            kind, payload = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            self.process.join(1)
            code = self.process.exitcode
            how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"exited (exit code {code})")
            last = next((line.strip() for line in reversed(self.output().splitlines())
                         if line.strip()), "")
            said = f"; the last thing it printed: {last[-300:]}" if last else ""
            why = _gloo_why(last)
            self.failure = {"what": f"{how} before returning a result{said}"
                                    + (f" ({why})" if why else "")}
        else:
            if kind == "ok":
                self.value = payload
            else:
                self.failure = payload
        self.done = True

    def kill(self) -> None:
        """Kill the rank's process and everything it started (its own process group)."""
        if self.process.pid is not None and self.process.exitcode is None:
            for kill in (lambda: os.killpg(self.process.pid, signal.SIGKILL),
                         lambda: os.kill(self.process.pid, signal.SIGKILL)):
                with contextlib.suppress(OSError):
                    kill()

    def reap(self) -> None:
        """Wait for the killed process (no zombie is left) and close the pipe."""
        self.process.join(5)
        self.conn.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def where(self) -> str:
        """Where the rank was when it was stopped: the innermost frame of its stack dump that
        is not an installed library's, or ``""``."""
        text = self.stack.read_text(errors="replace") if self.stack.exists() else ""
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', text)
        for file, line, func in frames:  # (innermost first)
            if "/lib/python" not in file:
                return f" in {func} (line {line})"
        return ""


def _wait(ranks: list[_Rank], deadline: float, join_by: float) -> None:
    """Collect the ranks' reports until all are in, one failed (then GRACE more seconds), the
    deadline passed, or ``join_by`` passed with a rank that has not joined the process group
    (then the ranks still running dump their stacks; one that never joined is marked
    ``rendezvous``, so that the world is started again)."""
    def unjoined() -> list[_Rank]:
        return [r for r in ranks if not r.done and not r.joined.exists()]

    while not all(r.done for r in ranks):
        now = time.monotonic()
        if now >= deadline or (now >= join_by and unjoined()):
            break
        wake = deadline if now >= join_by else min(deadline, join_by)
        ready = multiprocessing.connection.wait([r.conn for r in ranks if not r.done],
                                                wake - now)
        for r in ranks:
            if r.conn in ready:
                r.receive()
                r.order = sum(s.done for s in ranks)
        if any(r.failure for r in ranks):
            deadline = min(deadline, time.monotonic() + GRACE)
    never_joined = unjoined()
    hung = [r for r in ranks if not r.done and r.process.exitcode is None]
    for r in hung:
        with contextlib.suppress(OSError):
            os.kill(r.process.pid, signal.SIGUSR1)
    until = time.monotonic() + 2  # (each dumps its stack from a signal handler: wait for it)
    while time.monotonic() < until and not all(r.where() for r in hung):
        time.sleep(0.05)
    for r in ranks:
        if not r.done:
            r.failure = {"what": "hung", "where": r.where(), "rendezvous": r in never_joined}


#: gloo's abort when a message does not fit its receive buffer (``gloo/transport/tcp/pair.cc``)
_SIZE_MISMATCH = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")


#: a log record torch's C++ or Python logging writes on a rank: its ``[rankN]:`` tag, then
#: glog's level letter, date, time and thread id (c10/util/Logging.cpp; torch/_logging)
_LOG_PREFIX = re.compile(r"^(\[rank\d+\]:)?([IWE])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
#: a Python warning as ``warnings.showwarning`` prints it: ``path:line: Category: message``
_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")


def echoed(outputs: list[str]) -> str:
    """What the ranks printed (``outputs[r]``: rank r's), each line prefixed ``[rank r]``,
    except a warning or log record that several ranks printed alike (with their own rank tag,
    time and thread id; a Python warning with the source line under it): that one is printed
    once, where it first appears, prefixed with the ranks that printed it (``[ranks 0-3]``), as
    ``W path:line] message`` for a log record. Each rank says the same thing, which the
    learner needs to read once."""

    def entries(text: str) -> list[tuple[str, str]]:  # (key, lines as printed)
        found, lines = [], text.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if m := _LOG_PREFIX.match(line):
                found.append((f"{m.group(2)} {line[m.end():]}", line))
            elif _WARNING.match(line):
                block = [line]
                while i + 1 < len(lines) and lines[i + 1].startswith("  "):
                    i += 1
                    block.append(lines[i])
                found.append(("\n".join(block), "\n".join(block)))
            else:
                found.append(("", line))
            i += 1
        return found

    per_rank = [entries(text) for text in outputs]
    said: dict[str, list[int]] = {}
    for rank, found in enumerate(per_rank):
        for key, _ in found:
            if key and rank not in said.setdefault(key, []):
                said[key].append(rank)
    out, shown = [], set()
    for rank, found in enumerate(per_rank):
        for key, printed in found:
            if key and len(said[key]) > 1:
                if key not in shown:
                    shown.add(key)
                    who = said[key]
                    tag = (f"ranks {who[0]}-{who[-1]}" if who == list(range(who[0], who[-1] + 1))
                           else "ranks " + ", ".join(map(str, who)))
                    out += [f"[{tag}] {line}" for line in key.splitlines()]
                continue
            out += [f"[rank {rank}] {line}" for line in printed.splitlines()]
    return "".join(line + "\n" for line in out)


def _gloo_why(printed: str) -> str:
    """What a gloo abort a rank printed means, in the learner's terms ("" for any other)."""
    if m := _SIZE_MISMATCH.search(printed):
        sent, room = m.groups()
        return (f"gloo aborts a rank when a message of {sent} bytes arrives for a receive "
                f"buffer of {room}: a recv's tensor must have as many elements, of the same dtype "
                "(bytes per element), as the tensor sent to it (a float64 sent into a float32 "
                "buffer is twice its bytes). It cannot be caught, so the rank dies")
    return ""


def _failure(failed: list[_Rank], timeout: float) -> Exception:
    """The error for the failed ranks: the first one that raised (others often fail only
    because it did), or the ranks that hung."""
    raised = sorted((r for r in failed if r.failure["what"] != "hung"),
                    key=lambda r: (r.failure.get("lost_peer", False), r.order))
    if raised:  # (a rank whose peer died or raised fails with a lost connection: not the cause)
        first = raised[0]
        f = first.failure
        if f.get("stub"):  # (the grader reports it as the stub: re-raise it as such)
            return NotImplementedError(f["stub"])
        if f.get("oom"):
            return MemoryError(f"rank {first.rank}: {f['what']}")
        others = [r for r in failed if r is not first]
        names = ", ".join(str(r.rank) for r in others)
        waited = all(r.failure.get("lost_peer") or r.failure["what"] == "hung" for r in others)
        also = (f" (then rank{'s' * (len(others) > 1)} {names} failed too, waiting for it)"
                if waited else f" (rank{'s' * (len(others) > 1)} {names} failed too)")
        also = also if others else ""
        if f.get("check"):
            return CheckFailure(f"rank {first.rank}: {f['what']}{also}")
        return RankFailure(f"rank {first.rank} {f['what']}{also}", first.rank,
                           f.get("exception", ""))
    names = ", ".join(f"rank {r.rank}{r.failure['where']}" for r in failed)
    return RankFailure(
        f"{'these ranks' if len(failed) > 1 else 'a rank'} did not finish within {timeout:.3g} s "
        f"and were stopped: {names}. A rank that waits for a message no other rank sends (a "
        "recv without its send, two blocking sends facing each other, a collective that not "
        "every rank calls) waits forever.",
        failed[0].rank)


#: the variables that steer how ranks find each other (gloo's, TensorPipe's and NCCL's network
#: interface, gloo's transport, torchrun's rendezvous address): a value a notebook set for
#: another machine (a laptop's "en0") must not cost a world here
NETWORK_ENV = ("GLOO_SOCKET_IFNAME", "GLOO_DEVICE_TRANSPORT", "TP_SOCKET_IFNAME",
               "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT")


def started_network_env() -> dict[str, str | None]:
    """:data:`NETWORK_ENV` as this process was started with (``/proc/self/environ``: what its
    parent gave it, whatever ``os.environ`` says since), None for those it was not given; where
    there is no ``/proc``, as ``os.environ`` has them."""
    started = started_environ()
    return {name: started.get(name) for name in NETWORK_ENV}


def _rank_main(rank, world_size, folder, backend, timeout, fn, args, conn, network) -> None:
    """The body of a forked rank; never returns (``os._exit``: the parent's exit handlers, the
    kernel's among them, must not run in a copy of it). ``network``: the values of
    :data:`NETWORK_ENV` the rank joins the group with (those the calling process was started
    with)."""
    code, joined = 0, False
    try:
        os.setpgid(0, 0)
        if sys.platform == "linux":
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        log = open(folder / f"rank{rank}.log", "w", buffering=1)  # noqa: SIM115 (the rank's life)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        _redirect_logging((sys.stdout, sys.stderr), log)
        sys.stdout = sys.stderr = log
        stack = open(folder / f"rank{rank}.stack", "w")  # noqa: SIM115 (kept by faulthandler)
        faulthandler.register(signal.SIGUSR1, file=stack)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size))
        for name, value in network.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(backend, store=dist.FileStore(str(folder / "store"), world_size),
                                rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout + 60))
        joined = True
        (folder / f"rank{rank}.joined").touch()
        try:
            value = fn(*args)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        try:  # (plain pickle copies tensors; multiprocessing's would share them through
            report = pickle.dumps(("ok", value))  # a thread that dies with this process)
        except Exception as exc:  # noqa: BLE001 (whatever pickle raises, the rank reports it)
            report = pickle.dumps(("failed", {
                "what": f"returned a value that cannot be sent back to the notebook "
                        f"({explain(type(exc).__name__, str(exc))}); return plain data: "
                        "tensors, numbers, lists, dicts"}))
        conn.send_bytes(report)
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which judges it)
        code = 1
        with contextlib.suppress(Exception):  # (the parent reports a rank that sends nothing)
            conn.send_bytes(pickle.dumps(("failed", _describe(exc) | {"rendezvous": not joined})))
    finally:
        try:
            sys.stdout.flush()
        finally:
            os._exit(code)


def _redirect_logging(streams: tuple, log) -> None:
    """Point the logging handlers that write to ``streams`` (the parent's ``sys.stdout`` and
    ``sys.stderr``, in a kernel its channels to the notebook) at the rank's ``log``."""
    loggers = [logging.getLogger()] + [v for v in logging.Logger.manager.loggerDict.values()
                                       if isinstance(v, logging.Logger)]
    for handler in (h for lg in loggers for h in lg.handlers):
        if isinstance(handler, logging.StreamHandler) and handler.stream in streams:
            handler.setStream(log)


def _describe(exc: BaseException) -> dict:
    """A rank's exception as the parent reports it."""
    ename, evalue = type(exc).__name__, str(exc)
    if isinstance(exc, (CheckFailure, AssertionError)):
        return {"what": evalue or ename, "check": True}
    if (isinstance(exc, NotImplementedError) and len(exc.args) == 1
            and isinstance(exc.args[0], str) and re.fullmatch(r"\w+\.[\w-]+", exc.args[0])):
        return {"what": f"raised {explain(ename, evalue)}", "stub": exc.args[0]}
    lost_peer = bool(_LOST_PEER.search(evalue))
    if lost_peer:  # (gloo's message starts with its source path and ends with a pun)
        evalue = _LOST_PEER.search(evalue).group(0)
    what = f"raised {explain(ename, evalue)}{learner_line(exc)}"
    what += "".join(f" ({note})" for note in getattr(exc, "__notes__", []))
    if not lost_peer:  # (into the rank's log; a lost peer's traceback only repeats the cause's)
        traceback.print_exception(exc)
    connecting = lost_peer and any(
        f.name in _GROUP_CREATION and "torch/distributed/" in f.filename.replace(os.sep, "/")
        for f in traceback.extract_tb(exc.__traceback__))
    return {"what": what, "exception": ename, "oom": out_of_memory(ename, evalue),
            "lost_peer": lost_peer, "connecting": connecting}
