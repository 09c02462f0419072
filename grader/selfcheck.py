"""What runs inside the notebook's kernel: the learner's self-check and the grader's check cell.

Both look up the exercise's answer by the name in the lab's table, in the notebook's namespace
(``__main__``), and call :func:`grader.checks.run_checks`: the self-check runs the public
checks, the grader's cell runs public then hidden ones and emits the verdict as one output of
mimetype :data:`VERDICT_MIME` that the grader reads back.
"""
from __future__ import annotations

import html
import sys
import time

from grader import guard
from grader.checks import Verdict, run_checks, torch_defaults
from grader.labs import load_lab

VERDICT_MIME = "application/vnd.pytorch-internals.verdict+json"


def _answer(exercise_id: str):
    """(answer object or None, Verdict or None when the name is not bound)."""
    lab = load_lab(exercise_id.split(".", 1)[0])
    name = lab.exercise(exercise_id).answer
    namespace = vars(sys.modules["__main__"])
    if name not in namespace:
        msg = (f"`{name}` is not defined: the answer cell of {exercise_id} is missing or raised "
               f"before defining it. Run that cell (or restore it from the released notebook).")
        return None, msg
    return namespace[name], None


def _verdict(exercise_id: str, *, seed: int, device: str, hidden: bool) -> Verdict:
    answer, missing = _answer(exercise_id)
    if missing:
        return Verdict(exercise_id, "error", missing, 0, 0, seed)
    return run_checks(exercise_id, answer, seed=seed, device=device, hidden=hidden)


def check(exercise_id: str) -> None:
    """Run the public checks of ``exercise_id`` and show pass/fail with the message.

    Uses the notebook's ``seed`` and ``device`` parameters when defined (0 and ``cpu`` otherwise).
    """
    from IPython.display import display

    main = vars(sys.modules["__main__"])
    seed, device = int(main.get("seed", 0)), str(main.get("device", "cpu"))
    reason = load_lab(exercise_id.split(".", 1)[0]).exercise(exercise_id).unmet(device)
    if reason:
        status, message = "skipped", reason
    else:
        v = _verdict(exercise_id, seed=seed, device=device, hidden=False)
        status, message = v.status, v.message
    mark, colour = {"passed": ("✓", "#1a7f37"), "skipped": ("–", "#6e7781")}.get(
        status, ("✗", "#cf222e"))
    text = f"{mark} {exercise_id}: {status} — {message}"
    display({"text/plain": text,
             "text/html": f'<pre style="color:{colour};white-space:pre-wrap">{html.escape(text)}</pre>'},
            raw=True)


def _guarded(exercise_id: str, *, seed: int, device: str) -> Verdict:
    """The verdict, unless the answer left threads or processes running (before or during the
    checks): then ``error`` saying so."""
    if message := _strays("after its answer cells ran"):
        return Verdict(exercise_id, "error", message + " The checks did not run.", 0, 0, seed)
    v = _verdict(exercise_id, seed=seed, device=device, hidden=True)
    if message := _strays("while the checks called it"):
        return Verdict(exercise_id, "error", message, 0, 0, seed)
    return v


def _strays(when: str) -> str:
    threads, procs = guard.strays()
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


def grade(exercise_id: str, *, seed: int, device: str,
          _guard=(guard.armed, guard.tampering, guard.seal, guard.key, Verdict,
                  torch_defaults)) -> None:
    """The grader's check cell: run every check and emit the verdict as a VERDICT_MIME output,
    sealed with the run's key (in a kernel the grader armed; see :mod:`grader.guard`).

    ``_guard`` holds the guard's functions as they were when this module was imported, before
    any learner code; they run first, so a notebook that replaced ``grader.guard.tampering`` or
    any other global of the grader's (each of which the guard watches) gets ``error``. The
    guard compares under torch's default global state (:func:`grader.checks.torch_defaults`),
    as the checks run: a notebook that changed the default dtype is not tampering."""
    from IPython.display import display

    armed, tampering, seal, key, verdict, defaults = _guard
    start = time.perf_counter()
    with defaults():  # (torch rebinds some of its own names under other defaults)
        changed = tampering(exercise_id) if armed() else []
    if not armed():
        v = _verdict(exercise_id, seed=seed, device=device, hidden=True)
    elif changed:
        shown = ", ".join(f"`{n}`" for n in changed[:3]) + (
            f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        v = verdict(exercise_id, "error", f"the notebook replaced {shown}, which the checks rely "
                    "on; answers must not modify torch, Python's builtins or the grader. The "
                    "checks did not run.", 0, 0, seed)
    else:
        v = _guarded(exercise_id, seed=seed, device=device)
    payload = v.to_dict() | {"duration_s": round(time.perf_counter() - start, 3)}
    if armed():
        payload["seal"] = seal(payload, key())
    display({VERDICT_MIME: payload, "text/plain": f"{v.exercise}: {v.status}"}, raw=True)
