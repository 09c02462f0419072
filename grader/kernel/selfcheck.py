"""What the learner calls in the notebook: the self-check, progress and hints.

The self-check (:func:`check`) looks up the exercise's answer by the name in the lab's table, in
the notebook's namespace (``__main__``), and calls :func:`grader.checks.run_checks` on its public
checks, in this process, through the same probes and judges a grading run uses (there the judges
run in the grader's own process, and the hidden checks too). :func:`progress` shows every
exercise's last self-check, and each
:func:`check` updates that display; :func:`hint` shows an exercise's next hint
(``labs/<lab>/hints.toml``), as does the button under a failing verdict.
:func:`require_torch`, called by every lab's setup cell, applies the torch-version policy.
"""
from __future__ import annotations

import functools
import re
import sys

from grader.checks import Verdict, run_checks
from grader.kernel import display as rich
from grader.labs import lab_ids, load_hints, load_lab
from grader.results import PINNED_TORCH, installed_torch, is_pinned_torch

#: what the notebook's ``torch_policy`` parameter may say (see :func:`require_torch`)
TORCH_POLICIES = ("warn", "refuse", "allow")
#: exercise id -> the status of its last self-check in this kernel
_LAST: dict[str, str] = {}
#: exercise id -> how many of its hints have been shown in this kernel
_SHOWN: dict[str, int] = {}
#: answer name -> what the last run of a cell that defines it raised, while that run left the
#: name as an earlier run bound it (see :func:`watch_answer_cells`)
_STALE: dict[str, str] = {}
#: answer name -> id() of what it was bound to when the running cell started
_BEFORE: dict[str, int | None] = {}


@functools.lru_cache(maxsize=None)
def _answer_names() -> tuple[str, ...]:
    return tuple(sorted({e.answer for lab in lab_ids() for e in load_lab(lab).exercises}))


def _defines(source: str, name: str) -> bool:
    """Whether the cell ``source`` defines ``name`` at the start of a line (``def``, ``class``,
    an assignment): read as text, since a cell that failed to compile has no syntax tree."""
    n = re.escape(name)
    return re.search(rf"^[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+{n}\b"
                     rf"|^[ \t]*{n}[ \t]*(?::[^=\n]*)?=(?!=)", source, re.M) is not None


def _bound() -> dict[str, int | None]:
    main = vars(sys.modules["__main__"])
    return {name: id(main[name]) if name in main else None for name in _answer_names()}


def _before_cell(info) -> None:
    _BEFORE.clear()
    _BEFORE.update(_bound())


def _after_cell(result) -> None:
    source = getattr(result.info, "raw_cell", "") or ""
    error = result.error_before_exec or result.error_in_exec
    after = _bound()
    for name in _answer_names():
        if not _defines(source, name):
            continue
        if error is not None and after[name] == _BEFORE.get(name):
            first = str(error).strip().splitlines()
            _STALE[name] = type(error).__name__ + (f": {first[0]}" if first else "")
        else:
            _STALE.pop(name, None)


def watch_answer_cells() -> None:
    """Note, after each cell that defines an answer's name, whether it left that name as an
    earlier run bound it because it raised (an IndentationError, or an error before the
    definition): :func:`check` then refuses to grade the stale definition, and says why.
    IPython's ``pre_run_cell`` and ``post_run_cell`` events; once per kernel; nothing outside
    IPython. (A cell that raised after binding the name leaves the new definition: it is
    checked.)"""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or _after_cell in shell.events.callbacks["post_run_cell"]:
        return
    shell.events.register("pre_run_cell", _before_cell)
    shell.events.register("post_run_cell", _after_cell)


def _answer(exercise_id: str):
    """(answer object or None, Verdict or None when the name is not bound)."""
    lab = load_lab(exercise_id.split(".", 1)[0])
    name = lab.exercise(exercise_id).answer
    namespace = vars(sys.modules["__main__"])
    if name in _STALE and name in namespace:
        return None, (f"the last run of the answer cell of {exercise_id} raised {_STALE[name]}, "
                      f"so `{name}` is still what an earlier run defined: it is not checked. "
                      "Fix the cell and run it again.")
    if name not in namespace:
        msg = (f"`{name}` is not defined: the answer cell of {exercise_id} is missing or raised "
               f"before defining it. Run that cell (or restore it from the released notebook).")
        return None, msg
    return namespace[name], None


def _verdict(exercise_id: str, *, seed: int, device: str) -> Verdict:
    answer, missing = _answer(exercise_id)
    if missing:
        return Verdict(exercise_id, "error", missing, 0, 0, seed)
    return run_checks(exercise_id, answer, seed=seed, device=device, hidden=False)


def check(exercise_id: str) -> None:
    """Run the public checks of ``exercise_id``, show the verdict (a rich display with a text
    fallback), update the lab's :func:`progress` display, and under a verdict that is not a
    pass offer the exercise's hints (a button, where widgets work).

    Uses the notebook's ``seed`` and ``device`` parameters when defined (0 and ``cpu`` otherwise).
    An exercise id no lab has is shown as an error naming the lab's ids (nothing is raised).
    """
    from IPython.display import display

    if unknown := _unknown(exercise_id):
        display(unknown, raw=True)
        return
    lab = load_lab(exercise_id.split(".", 1)[0])
    exercise = lab.exercise(exercise_id)
    main = vars(sys.modules["__main__"])
    seed, device = int(main.get("seed", 0)), str(main.get("device", "cpu"))
    if reason := exercise.unmet(device):
        status, message = "skipped", reason
    else:
        v = _verdict(exercise_id, seed=seed, device=device)
        status, message = v.status, v.message
    _LAST[exercise_id] = status
    display(rich.verdict(exercise_id, exercise.title, status, message), raw=True)
    if status not in ("passed", "skipped") and (hints := _hints(exercise_id)):
        bundle = _hint_panel(exercise_id)._repr_mimebundle_()
        bundle["text/plain"] = (f'Stuck? {len(hints)} hints: run hint("{exercise_id}") to see '
                                "the next one.")
        display(bundle, raw=True)
    display(_progress(lab.id), raw=True, update=True, display_id=_progress_id(lab.id))


def require_torch(lab_id: str) -> None:
    """The setup cell's torch-version check for lab ``lab_id``, by the notebook's
    ``torch_policy`` parameter: ``warn`` (its default, and when undefined: a learner's own
    JupyterLab), ``refuse`` (the grader's default) or ``allow`` (the grader's, with
    ``--allow-torch-mismatch``). On the pinned release it does nothing. Under another one,
    ``warn`` shows a warning (a rich display with a text fallback) naming both versions and the
    lab's exercises whose checks depend on the pinned release, and the notebook goes on;
    ``allow`` shows a one-line note; ``refuse`` raises RuntimeError saying what to do.

    Raises ValueError for a policy not in :data:`TORCH_POLICIES`."""
    from IPython.display import display

    policy = vars(sys.modules["__main__"]).get("torch_policy", "warn")
    if policy not in TORCH_POLICIES:
        raise ValueError(f"torch_policy = {policy!r}: use one of {', '.join(TORCH_POLICIES)}")
    if is_pinned_torch(installed := installed_torch()):
        return
    versions = f"torch {installed} is installed; this lab is written for torch {PINNED_TORCH}"
    if policy == "refuse":
        raise RuntimeError(f"{versions}. Install torch=={PINNED_TORCH} (README: Why torch is "
                           "pinned), or grade with --allow-torch-mismatch.")
    if policy == "allow":
        display({"text/plain": f"note: {versions}; graded anyway (--allow-torch-mismatch)."},
                raw=True)
        return
    lab = load_lab(lab_id)
    marked = [f"`{e.id}`" for e in lab.exercises if e.pinned_behaviour]
    which = (f"The checks of {', '.join(marked)} depend on behaviour of torch {PINNED_TORCH}: "
             "under this torch they may fail a right answer or pass a wrong one."
             if marked else "Every exercise's checks use the installed torch as their oracle.")
    display(rich.warning(f"{lab.title}: torch {installed}",
                         f"{versions}. The notebook goes on, but what it shows may differ from "
                         f"what the lab describes. {which} For the lab as written, install "
                         f"`torch=={PINNED_TORCH}` (README: Why torch is pinned)."), raw=True)


def progress(lab_id: str) -> None:
    """Show every exercise of lab ``lab_id`` with the status of its last self-check in this
    kernel and its points; each later :func:`check` updates this display in place."""
    from IPython.display import display

    if lab_id not in lab_ids():
        display(_unknown(f"{lab_id}."), raw=True)
        return
    display(_progress(lab_id), raw=True, display_id=_progress_id(lab_id))


def _progress_id(lab_id: str) -> str:
    return f"course-progress-{lab_id}"


def _progress(lab_id: str) -> dict[str, str]:
    lab = load_lab(lab_id)
    device = str(vars(sys.modules["__main__"]).get("device", "cpu"))
    rows = []
    for e in lab.exercises:
        status = "skipped" if e.unmet(device) else _LAST.get(e.id, "not run")
        rows.append((e.id, e.title, status, e.points if status == "passed" else 0, e.points))
    return rich.progress(lab.title, rows)


def hint(exercise_id: str) -> None:
    """Show the next hint of ``exercise_id`` (each call one more; after the last, all of them
    again). An exercise id no lab has is shown as an error naming the lab's ids."""
    from IPython.display import display

    if unknown := _unknown(exercise_id):
        display(unknown, raw=True)
        return
    hints = _hints(exercise_id)
    if not hints:
        display({"text/plain": f"{exercise_id} has no hints."}, raw=True)
        return
    before = _SHOWN.get(exercise_id, 0)
    count = _reveal(exercise_id)
    for number in range(1, count + 1) if before == count else [count]:
        display(rich.hint(exercise_id, number, len(hints), hints[number - 1]), raw=True)


def _hints(exercise_id: str) -> tuple[str, ...]:
    return load_hints(exercise_id.split(".", 1)[0]).get(exercise_id, ())


def _reveal(exercise_id: str) -> int:
    """Count one more hint of ``exercise_id`` as shown (up to all of them); return the count."""
    count = min(_SHOWN.get(exercise_id, 0) + 1, len(_hints(exercise_id)))
    _SHOWN[exercise_id] = count
    return count


def _unknown(exercise_id) -> dict[str, str] | None:
    """An error display for an exercise id that names no exercise of a lab (with the lab's ids
    and the closest one), or None when it names one."""
    import difflib

    lab_id = str(exercise_id).split(".", 1)[0]
    if lab_id not in lab_ids():
        why = f"there is no lab {lab_id!r} (the labs: {', '.join(lab_ids())})"
    else:
        ids = [e.id for e in load_lab(lab_id).exercises]
        if exercise_id in ids:
            return None
        near = difflib.get_close_matches(str(exercise_id), ids, n=1)
        why = (f"lab {lab_id!r} has no exercise {exercise_id!r}"
               + (f"; did you mean `{near[0]}`?" if near else ".")
               + f" Its exercises: {', '.join(f'`{i}`' for i in ids)}.")
    return rich.verdict(str(exercise_id), "unknown exercise", "error", why)


def _hint_panel(exercise_id: str):
    """An ``ipywidgets.VBox`` of a 'Show hint' button and the hints it has revealed (the
    :func:`hint` count, shared)."""
    import ipywidgets as widgets

    hints = _hints(exercise_id)
    button = widgets.Button(icon="lightbulb-o", layout=widgets.Layout(width="auto"))
    shown = widgets.HTML()

    def label():
        count = _SHOWN.get(exercise_id, 0)
        button.description = (f"Show hint {count + 1} of {len(hints)}" if count < len(hints)
                              else f"All {len(hints)} hints shown")
        button.disabled = count >= len(hints)

    def reveal(_):
        count = _reveal(exercise_id)
        shown.value = "".join(rich.hint(exercise_id, i + 1, len(hints), hints[i])["text/html"]
                              for i in range(count))
        label()

    label()
    button.on_click(reveal)
    return widgets.VBox([button, shown])


watch_answer_cells()
