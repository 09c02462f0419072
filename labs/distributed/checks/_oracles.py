"""The judges' own rank worlds (their oracles), run one at a time in a thread of the grader's
process, each case once: started ahead by the lab's ``@ahead`` functions while the kernel still
runs the notebook (:func:`grader.checks.ahead`), or by the check that needs it first. A world
is :func:`labs.distributed.launch.run`, with ``echo=False`` and ``clean=True`` (forked from a
server process, not from this one, whose other threads run torch while a world starts); its ranks
die with the process. A world gets copies of the tensors it is given: multiprocessing pickles a
forkserver process's arguments with torch's reductions, which move a tensor's storage into shared
memory in place (``share_memory_``), and the caller's tensor may be in use in its own thread at
that moment (encoded for the probe: it would read memory freed under it)."""
from __future__ import annotations

import concurrent.futures
import hashlib
import queue
import threading

import torch

from labs.distributed.launch import run

_QUEUE: queue.Queue = queue.Queue()
_STARTED: dict[str, concurrent.futures.Future] = {}
_LOCK = threading.Lock()
_SERVER: list[threading.Thread] = []


def _key(value) -> str:
    """A text that equal arguments share (a tensor by its dtype, shape and a digest of its
    bytes)."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        return f"tensor({value.dtype}, {tuple(value.shape)}, {hashlib.sha256(data).hexdigest()})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)}: {_key(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return type(value).__name__ + "(" + ", ".join(map(_key, value)) + ")"
    return repr(value)


def _copies(value):
    """``value`` with every tensor in it (in dicts, lists and tuples) replaced by a copy."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copies(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map(_copies, value))
    return value


def _serve() -> None:
    while True:
        future, fn, world_size, args = _QUEUE.get()
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(run(fn, world_size, *args, echo=False, clean=True))
            except BaseException as exc:  # (the check that asks for it raises it)
                future.set_exception(exc)


def oracle(fn, world_size: int, *args) -> concurrent.futures.Future:
    """The ranks' values of ``fn(*args)`` on ``world_size`` ranks of the judge's own, as a
    future (``.result()`` waits for them, or raises what :func:`~labs.distributed.launch.run`
    raised): the one already started for equal arguments, or a new one, queued behind those
    before it. One that failed is started again when asked for again."""
    key = f"{fn.__module__}.{fn.__qualname__}/{world_size}/{_key(args)}"
    with _LOCK:
        if not (_SERVER and _SERVER[0].is_alive()):  # (none yet, or this is a forked child:
            for stale in [k for k, f in _STARTED.items() if not f.done()]:  # whose parent's
                del _STARTED[stale]  # thread, and what it was to run, did not come along)
            while not _QUEUE.empty():
                _QUEUE.get_nowait()
            _SERVER[:] = [threading.Thread(target=_serve, daemon=True, name="oracle-ranks")]
            _SERVER[0].start()
        found = _STARTED.get(key)
        if found is None or (found.done() and found.exception() is not None):
            found = _STARTED[key] = concurrent.futures.Future()
            _QUEUE.put((found, fn, world_size, _copies(args)))
        return found
