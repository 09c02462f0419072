"""Gradescope's autograder ``results.json`` for one submission."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from grader.files import atomic_write
from grader.reports.graded import num
from grader.results import CAVEAT_MARK, LabResult, mismatch_note


def _run_line(r: LabResult) -> str:
    env = r.environment
    return (f"{r.lab}: {num(r.score)}/{num(r.max_score)} points over the whole lab, "
            f"{num(r.score)}/{num(r.runnable_max_score)} over what could run here "
            f"(device {env.device}) · seed {env.seed} · torch {env.torch_version} · "
            f"grader {env.grader_version} · started {env.started_at}")


def gradescope_results(result: LabResult) -> dict:
    """The submission as Gradescope's autograder ``results.json`` (the subset described by
    ``grader/gradescope.schema.json``): ``score`` in points (its specification has no
    top-level maximum: Gradescope scores out of the assignment's own total; the lab's is
    ``extra_data.max_score``),
    ``execution_time`` in whole seconds (rounded up), ``output`` (the run: score over the
    whole lab and over what could run, seed, device, notes, grading error), one test per
    exercise and the run's environment in ``extra_data``.

    Skipped exercises (e.g. needing CUDA on a CPU runner) count toward ``max_score`` exactly as
    in the lab: Gradescope scores the assignment out of the total set in its own settings (the
    lab's full points), not out of what one runner could run. Such a test shows as ``failed``
    with 0 points and ``skipped: <reason>`` as its output; grade labs that need a GPU on a GPU
    runner. ``output`` and ``extra_data.runnable_max_score`` still give the score over what
    could run. A test's own finer status (error, timeout, crashed, skipped) is in its
    ``extra_data``. Under a torch other than the pinned release ``output`` says so (both
    versions, :func:`grader.results.mismatch_note`) and the output of each test marked
    ``version_caveat`` starts with the mark."""
    env = result.environment
    lines = [_run_line(result)]
    if skipped := [e for e in result.exercises if e.status == "skipped"]:
        lines.append(f"{len(skipped)} exercise(s) could not run on this machine and score 0: "
                     + ", ".join(e.id for e in skipped) + ".")
    lines += [f"note: {n}" for n in result.notes]
    if result.error:
        lines.append(f"grading error: {result.error}")
    if env.torch_mismatch:
        lines.append(f"torch: {mismatch_note(env)}.")
    tests = [{"name": f"{e.id}: {e.title}", "score": e.points, "max_score": e.max_points,
              "status": "passed" if e.status == "passed" else "failed",
              "output": (f"{CAVEAT_MARK} " if e.version_caveat else "")
              + (e.message if e.status == "passed" else f"{e.status}: {e.message}"),
              "visibility": "visible",
              "extra_data": {"id": e.id, "status": e.status, "duration_s": e.duration_s}}
             for e in result.exercises]
    return {"score": result.score,
            "execution_time": math.ceil(result.duration_s),
            "output": "\n".join(lines), "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests,
            "extra_data": {"lab": result.lab, "notebook": Path(result.notebook).name,
                           "max_score": result.max_score,
                           "runnable_max_score": result.runnable_max_score,
                           "error": result.error, "environment": asdict(env)}}


def write_gradescope_json(result: LabResult, path: Path) -> Path:
    """Write :func:`gradescope_results` as JSON to ``path`` atomically; return ``path``."""
    return atomic_write(path, json.dumps(gradescope_results(result), indent=2) + "\n")

