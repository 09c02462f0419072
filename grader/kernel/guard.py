"""The grader's guard inside the kernel: what a grading run checks before it trusts a verdict.

The grader runs the learner's code and its own checks in one kernel, so the checks can call the
answer; the learner's code could therefore try to change how the checks run. The guard makes
the plain ways of doing so fail loudly instead of scoring:

- :func:`arm` runs first in every grading kernel (the grader's *prologue* cell, before any
  learner cell). It reads the run's secret key from the file the grader left in the working
  folder (and deletes it), imports the lab's checks, and takes a :class:`Snapshot` of the
  grader's modules, the lab's checks, and the parts of Python and torch the checks rely on.
- Before each exercise's checks, :func:`tampering` compares the live objects with the snapshot:
  a replaced ``torch.allclose``, ``grader.checks.run_checks``, check function or registry entry
  is named, and the exercise gets ``error`` instead of a verdict.
- :func:`strays` finds threads running the notebook's code and child processes that the answer
  left running (processes are killed; either way the exercise gets ``error``).
- :func:`seal` signs each verdict with the key (HMAC-SHA256); the grader accepts only verdicts
  whose seal it can verify, so a verdict displayed by learner code, or by a replaced
  ``grade()``, does not count.

All of this lives in the same process as the learner's code: someone who reads this file can
still find the key in memory and forge a verdict. The README's instructor section says what
that means in practice.
"""
from __future__ import annotations

import gc
import hashlib
import hmac
import importlib.util
import json
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from pathlib import Path

#: the file (in the kernel's working folder) through which the grader hands over the run's key
KEY_FILE = ".grader-key"
#: library modules whose names the checks rely on (public ones, all in ``WATCHED_WHOLE``), and
#: the attributes of the classes they define; a learner may add names, not replace them
WATCHED_MODULES = ("builtins", "math", "operator", "functools", "itertools", "collections",
                   "hmac", "json", "torch", "torch.testing", "torch.testing._comparison",
                   "torch.autograd", "torch.autograd.graph", "torch.autograd.variable",
                   "torch.autograd.forward_ad",
                   "torch.nn.functional", "torch.func", "torch.library", "torch.utils", "numpy",
                   "IPython.display", "weakref", "gc", "concurrent.futures",
                   # what the export lab's checks use as oracles and runtimes
                   "torch.export", "torch.export.exported_program", "torch.fx.graph_module",
                   "torch._inductor", "onnx", "onnxruntime",
                   "onnxruntime.capi.onnxruntime_inference_collection",
                   # what the autograd lab's derivatives check reads derivatives.yaml with
                   "yaml",
                   # the dispatcher lab's functionalize oracle (torch.func.functionalize's
                   # helpers) and the modes its recorder is built on
                   "torch._functorch.eager_transforms", "torch.utils._python_dispatch",
                   "torch._subclasses.functional_tensor")
#: watched private names too: what assert_close runs, the path from torch.autograd.backward /
#: grad to the engine (_engine_run_backward, _make_grads), and torch.func.functionalize's helpers
#: (_wrap_functional_tensor, _propagate_functional_input_mutation), which checks use as oracles
WATCHED_WHOLE = ("builtins", "torch.testing._comparison", "torch.autograd",
                 "torch._functorch.eager_transforms")
#: names the kernel itself rebinds as it runs (ipykernel's ``input`` per request, ``_`` results)
KERNEL_OWNED = {"builtins._", "builtins.input", "builtins.__", "builtins.___"}


def seal(payload: dict, key: bytes) -> str:
    """The HMAC-SHA256 (hex) of ``payload``'s canonical JSON under ``key``."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sealed(data: dict, key: bytes) -> dict | None:
    """``data`` without its ``seal`` when the seal is valid for ``key``, else None."""
    data = dict(data)
    mark = data.pop("seal", None)
    if not isinstance(mark, str) or not hmac.compare_digest(mark, seal(data, key)):
        return None
    return data


@dataclass
class Snapshot:
    """Objects as they were when the kernel was armed: ``names`` maps ``module.name`` to
    ``(object, its __code__ or None)``; ``registry`` maps exercise id to its registered checks;
    ``threads`` and ``pids`` are those alive after the last exercise was graded."""

    names: dict[str, tuple[object, object]] = field(default_factory=dict)
    registry: dict[str, tuple] = field(default_factory=dict)
    threads: set = field(default_factory=set)
    pids: set = field(default_factory=set)


_STATE: dict = {}


def _course_modules(lab_id: str) -> list[tuple[str, object]]:
    return [(name, m) for name, m in list(sys.modules.items())
            if m is not None and (name == "grader" or name.startswith("grader.")
                                  or name == f"labs.{lab_id}"
                                  or name.startswith(f"labs.{lab_id}."))]


def _entries(lab_id: str, _course_modules=_course_modules) -> dict[str, tuple[object, object]]:
    """What is watched: every global of the course's modules, the names of the library modules
    (public ones, or all in WATCHED_WHOLE) and the attributes of the classes they define, and
    torch.Tensor's own attributes (plus its comparison and truth dunders)."""
    out: dict[str, tuple[object, object]] = {}
    for name, module in _course_modules(lab_id):
        for attr, value in list(vars(module).items()):
            out[f"{name}.{attr}"] = (value, getattr(value, "__code__", None))
    for name in WATCHED_MODULES:
        module = sys.modules.get(name)
        for attr, value in list(vars(module).items()) if module else ():
            if (attr.startswith("_") and name not in WATCHED_WHOLE) or \
                    f"{name}.{attr}" in KERNEL_OWNED:
                continue
            out[f"{name}.{attr}"] = (value, getattr(value, "__code__", None))
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                for cattr, cvalue in list(vars(value).items()):
                    out[f"{name}.{attr}.{cattr}"] = (cvalue, getattr(cvalue, "__code__", None))
    torch = sys.modules.get("torch")
    if torch is not None:
        for attr, value in list(vars(torch.Tensor).items()):
            out[f"torch.Tensor.{attr}"] = (value, getattr(value, "__code__", None))
    return out


def _libraries() -> tuple[str, ...]:
    """Folders of the installed libraries that may wrap their own functions (torch does: its
    lazily imported Dynamo wraps ``torch.manual_seed``)."""
    return tuple(str(Path(m.__file__).parent) + "/" for name in ("torch",)
                 if (m := sys.modules.get(name)) is not None and getattr(m, "__file__", None))


def _same(old: tuple[object, object], new: tuple[object, object] | None, libs) -> bool:
    """Whether ``new`` is still ``old``: the same object and code, or a wrapper of it
    (``__wrapped__``) whose own code is in an installed library (``libs``), not the notebook."""
    if new is None:
        return False
    if new[0] is old[0] and new[1] is old[1]:
        return True
    code = getattr(new[0], "__code__", None)
    inner = new[0]
    while (inner := getattr(inner, "__wrapped__", None)) is not None:
        if inner is old[0]:
            return code is not None and code.co_filename.startswith(libs)
    return False


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


_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                          "platlib")})


def _alive_children() -> list:
    import psutil

    try:
        return [p for p in psutil.Process().children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def arm(lab_id: str) -> None:
    """Start guarding a grading kernel for ``lab_id``: take the key, load the checks of its
    exercises still ``judged_in_kernel`` and snapshot what they rely on. Raises RuntimeError
    when the key file is missing."""
    from grader import checks  # noqa: F401  (snapshot every module the checks run)
    from grader.kernel import selfcheck  # noqa: F401
    from grader.labs import load_lab

    path = Path(KEY_FILE)
    if not path.is_file():
        raise RuntimeError(f"{KEY_FILE} not found: arm() runs only in a grading kernel")
    key = path.read_bytes()
    path.unlink()
    lab = load_lab(lab_id)
    if lab.torch and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401  (snapshot torch before any learner code could patch it)
        import torch.testing._comparison  # noqa: F401
    # only the exercises still judged in the kernel: the others' checks are not in it
    guarded = [e for e in lab.exercises if e.judged_in_kernel]
    for e in guarded:
        checks.checks_for(e.id)  # imports the lab's checks
    # in registration order, as tampering() reads the registry (checks_for puts public first)
    registry = {e.id: tuple(checks._REGISTRY[e.id]) for e in guarded}
    snap = Snapshot(_entries(lab_id), registry, set(threading.enumerate()),
                    {p.pid for p in _alive_children()})
    _STATE.clear()
    _STATE.update(key=key, lab=lab_id, snapshot=snap)


def armed() -> bool:
    """Whether this kernel is a grading kernel (``arm`` ran)."""
    return "key" in _STATE


def key() -> bytes:
    """The run's key (only after :func:`arm`)."""
    return _STATE["key"]


def tampering(exercise_id: str, *, _state=_STATE, _entries=_entries, _same=_same,
              _libraries=_libraries, _gc=(gc.isenabled, gc.disable, gc.enable)) -> list[str]:
    """The watched names the notebook replaced or removed since :func:`arm`, and the exercise's
    checks if their registration changed (empty when nothing was touched).

    The keyword defaults are this module's own objects, bound when it was imported (before any
    learner code): replacing ``grader.kernel.guard._same`` from a notebook does not change what
    runs here (and is itself reported, as every global of the grader's modules is watched).

    The garbage collector is paused meanwhile (and left as it was found): the ~16,000 entries
    compared are freed by reference counting, but allocating them set off full collections of
    the kernel's heap, 0.17 s each, two of six exercises of lab 5 on a 2-core machine."""
    from grader import checks

    isenabled, disable, enable = _gc
    was_on = isenabled()
    disable()
    try:
        snap: Snapshot = _state["snapshot"]
        now = _entries(_state["lab"])
        libs = _libraries()
        changed = [name for name, old in snap.names.items()
                   if not _same(old, now.get(name), libs)]
        changed += [f"torch.Tensor.{attr}" for attr in
                    ("__eq__", "__ne__", "__bool__", "__lt__", "__le__", "__gt__", "__ge__",
                     "__len__", "__float__", "__int__", "__index__", "__hash__",
                     "__torch_function__")
                    if f"torch.Tensor.{attr}" in now and f"torch.Tensor.{attr}" not in snap.names]
        del now  # (freed before the collector resumes)
    finally:
        if was_on:
            enable()
    live = tuple(checks._REGISTRY.get(exercise_id, ()))
    if len(live) != len(snap.registry.get(exercise_id, ())) or any(
            a is not b or a.fn is not b.fn for a, b in zip(live, snap.registry[exercise_id])):
        changed.append(f"the registered checks of {exercise_id}")
    return changed


def strays() -> tuple[list[str], list[str]]:
    """(threads, processes) started since the last call (or :func:`arm`) and still running, as
    learner-readable descriptions. The processes are killed (SIGKILL)."""
    snap: Snapshot = _STATE["snapshot"]
    threads = [t for t in threading.enumerate()
               if t not in snap.threads and t.is_alive() and _learners(t)]
    procs = [p for p in _alive_children() if p.pid not in snap.pids]
    described = []
    for p in procs:
        try:
            described.append(f"pid {p.pid} ({' '.join(p.cmdline())[:60] or p.name()})")
            p.kill()
        except Exception:  # psutil.Error: it ended meanwhile
            described.append(f"pid {p.pid}")
    snap.threads = set(threading.enumerate())
    snap.pids = {p.pid for p in _alive_children()}
    return [f"{t.name!r}" for t in threads], described
