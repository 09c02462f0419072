"""Run a function in a forked child process: for what must not happen in the notebook's own
process because it can happen only once per process, such as naming the PrivateUse1 backend
(``torch.utils.rename_privateuse1_backend``; c10/core/DeviceType.cpp:
``register_privateuse1_backend`` refuses a second name).

The child is a copy of the caller made by ``os.fork``, so it has every object the caller has
(functions defined in notebook cells included) and changes nothing in the caller. What it prints
is discarded; what ``fn`` returns travels back pickled, so return plain data (strings, numbers,
tuples). Linux and macOS only (fork).
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time

#: seconds a child may take by default
TIMEOUT = 30.0


class ChildError(RuntimeError):
    """``fn`` raised in the child (the message is ``"<exception type>: <first line>"``), the child
    died before answering, or it did not answer within the time limit."""


def run_forked(fn, *args, timeout: float = TIMEOUT):
    """Call ``fn(*args)`` in a forked child and return what it returned. Raises ChildError when
    ``fn`` raised there, when the child died, or after ``timeout`` seconds (the child is then
    killed). The child is always waited for: none is left behind."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run fn, send the outcome, leave without running any cleanup
        try:
            os.close(read_end)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            sys.stdout = sys.stderr = open(os.devnull, "w")
            try:
                outcome = ("returned", fn(*args))
            except BaseException as exc:  # noqa: BLE001  (reported to the caller)
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                outcome = ("raised", f"{type(exc).__name__}: {first}")
            data = pickle.dumps(outcome)
            while data:
                data = data[os.write(write_end, data):]
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = _read_all(read_end, time.monotonic() + timeout)
    finally:
        os.close(read_end)
        if data is None:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if data is None:
        raise ChildError(f"the child process did not finish within {timeout:g} s")
    if not data:
        raise ChildError("the child process died before it answered")
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise ChildError(value)
    return value


def _read_all(fd: int, deadline: float) -> bytes | None:
    """Everything written to ``fd`` until its other end closes, or None past ``deadline``."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
