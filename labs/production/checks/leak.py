"""Checks of ``production.leak``: ``fix_leak(case)`` returns ``{"diagnosis": {"line",
"bytes_per_step"}, "script"}`` for the case ``labs/production/cases/leak.py`` (an MLP trained
with SGD that logs a validation loss every step, and reads the bytes malloc has handed out after
each step): ``line`` is the line of ``leak.py`` that stores, every step, the reference keeping
that step's memory alive; ``bytes_per_step`` how many bytes the process keeps per step (the
slope of the memory readings, within 15%). ``script`` is the fixed script: it must return the
same losses (train and validation) while its memory no longer grows.

Oracle: the judge runs the original itself (labs/production/probes.py: run) and measures the
slope of its readings (glibc's ``mallinfo2``: the heap bytes in use plus the mmapped blocks,
which is where torch's CPU allocator puts tensors: c10/core/impl/alloc_cpu.cpp: alloc_cpu); the
line is the statement that appends each step's validation loss, a tensor whose autograd graph
holds the activations its backward would need (torch/csrc/autograd/saved_variable.h:
SavedVariable), to a list that lives as long as the run. The fix is judged by outcome: the fixed
run and the original run in the same probe (same process, same settings), the fix's growth per
step under 5% of the original's, and its losses equal to the original's. Public: the default
settings. Hidden: two settings drawn from the run's seed (widths, validation batch, steps)."""

from __future__ import annotations

import ast
import functools
import json
import random

from grader.checks import CheckFailure, check, exact
from labs.production import probes
from labs.production.checks._replies import finished, probed

EXERCISE = "production.leak"
NAME = "leak"
FILENAME = "leak.py"
TIMEOUT_S = 30.0
#: bytes_per_step may be off by this fraction of the judge's measurement
BYTES_TOLERANCE = 0.15
#: the fix's growth per step may be at most this fraction of the original's
GROWTH_FRACTION = 0.05
#: the heap's highest rise during the fix's run, over what one step of the original needs, as
#: a share of the original's rise over that same level (all three runs' peaks taken by the
#: runner, not reported by the scripts: labs/production/probes.py: Run.heap_growth_bytes)
PEAK_FRACTION = 0.25
#: the settings of the original's short run: its peak is what training needs without a leak
SHORT = {"steps": 2}
#: the fix's losses against the original's: |yours - original| <= ATOL + RTOL * |original|
RTOL, ATOL = 1e-5, 1e-7


def slope(readings: list) -> float:
    """Bytes per step: the least-squares slope of the readings over the steps."""
    n = len(readings)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(readings) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(readings))
    return num / sum((x - mean_x) ** 2 for x in range(n))


def keeping_line(source: str) -> int:
    """The line of the statement appending each step's validation loss (a tensor with its
    graph) to the list the run returns at its end."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "append" and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "val_losses"):
            return node.lineno
    raise RuntimeError("the leak case no longer appends to val_losses")


@functools.lru_cache(maxsize=8)
def truth(config_json: str) -> dict:
    config = json.loads(config_json)
    source = probes.case_source(NAME)
    run = probes.run(source, config, filename=FILENAME, timeout_s=TIMEOUT_S)
    if run.status != "ok":
        raise RuntimeError(f"the leak case ended {run.status}: {run.error}\n{run.stderr}")
    result = run.result
    return {"line": keeping_line(source), "bytes_per_step": slope(result["memory"]),
            "train_losses": result["train_losses"], "val_losses": result["val_losses"],
            "steps": len(result["memory"])}


def drawn_config(rng: random.Random) -> dict:
    return {"seed": rng.randrange(1, 10**6), "hidden": rng.choice([128, 192, 256, 320]),
            "val_batch": rng.choice([256, 384, 512, 640]), "steps": rng.randint(20, 32)}


def judge_diagnosis(diagnosis, want: dict, what: str) -> None:
    diagnosis = exact(diagnosis, dict, f"{what}: the diagnosis")
    missing = [k for k in ("line", "bytes_per_step") if k not in diagnosis]
    if missing:
        raise CheckFailure(f"{what}: the diagnosis has no {', '.join(map(repr, missing))}: it "
                           "is {'line': int, 'bytes_per_step': number}.")
    line = exact(diagnosis["line"], int, f"{what}: diagnosis['line']")
    if line != want["line"]:
        lines = probes.case_source(NAME).splitlines()
        quoted = lines[line - 1].strip() if 1 <= line <= len(lines) else ""
        raise CheckFailure(
            f"{what}: diagnosis['line'] is {line}" + (f" (`{quoted}`)" if quoted else "")
            + f" of {FILENAME}, not the line that keeps each step's memory alive. Memory "
            "stays allocated while something still refers to it: find what the run creates "
            "every step and never lets go of (a tensor with a grad_fn holds its whole graph, "
            "and the graph holds the tensors its backward would need), and the line that "
            "stores the reference.")
    got = exact(diagnosis["bytes_per_step"], (int, float), f"{what}: diagnosis['bytes_per_step']")
    exp = want["bytes_per_step"]
    if not abs(got - exp) <= BYTES_TOLERANCE * exp:
        raise CheckFailure(
            f"{what}: diagnosis['bytes_per_step'] is {got:.6g}, more than "
            f"{BYTES_TOLERANCE:.0%} away from the growth per step of the memory readings of "
            "a run with this check's settings (case.config). Measure it on such a run: the "
            "change of the readings per step, in bytes.")


def _run_of(run, what: str, which: str) -> dict:
    return finished(run, what, f"the {which} script", ("train_losses", "val_losses", "memory"))


def judge_fix(runs, want: dict, what: str) -> None:
    fixed, original = _run_of(runs[0], what, "fixed"), _run_of(runs[1], what, "original")
    _run_of(runs[2], what, "short original")
    peaks = [r.get("heap_growth_bytes") for r in runs]
    if any(type(p) is not int for p in peaks):
        raise CheckFailure(f"{what}: the probe's runs do not say how far the heap rose.")
    steps = want["steps"]
    for which, result in (("fixed", fixed), ("original", original)):
        if any(len(result[k]) != steps for k in ("train_losses", "val_losses", "memory")):
            raise CheckFailure(f"{what}: the {which} run returned lists of "
                               f"{[len(result[k]) for k in result if type(result[k]) is list]}"
                               f" items for the {steps} steps of this run: one per step.")
    base = slope(original["memory"])
    if base < 0.5 * want["bytes_per_step"]:
        raise CheckFailure(f"{what}: the original script, run beside your fix, grew by "
                           f"{base:.0f} bytes per step, far less than it does in the "
                           "check's own run: the two runs cannot be compared.")
    grown = slope(fixed["memory"])
    if grown > GROWTH_FRACTION * base:
        raise CheckFailure(
            f"{what}: your fixed script's memory still grows by {grown:.0f} bytes per step "
            f"({grown / base:.0%} of the original's {base:.0f}, measured in the same probe; "
            f"at most {GROWTH_FRACTION:.0%} passes). Whatever keeps each step's graph alive "
            "is still there: deleting a name, calling .item() only to print, or detaching "
            "another tensor leaves the reference in place.")
    fix_peak, leak_peak, short_peak = peaks
    if fix_peak - short_peak > PEAK_FRACTION * max(leak_peak - short_peak, 1):
        raise CheckFailure(
            f"{what}: while your fixed script ran, the heap rose {fix_peak / 2**20:.1f} MiB "
            f"at its highest (the runner's samples), against {short_peak / 2**20:.1f} MiB for "
            f"two steps of the original and {leak_peak / 2**20:.1f} MiB for all of its steps: "
            "each step's memory is still kept until the end, whatever the script reports.")
    for key in ("train_losses", "val_losses"):
        for i, (got, exp) in enumerate(zip(fixed[key], want[key])):
            if not abs(got - exp) <= ATOL + RTOL * abs(exp):
                raise CheckFailure(
                    f"{what}: your fixed script's {key} departs from the original's at step "
                    f"{i}: {got:.7g} where the original logs {exp:.7g}. A fix of a leak must "
                    "not change what is trained or logged (the data, the model, the steps, "
                    "the validation batch): only what is kept.")


def judge(answer, config: dict, what: str) -> None:
    want = truth(json.dumps(config, sort_keys=True))
    runs = [["fixed", {}, TIMEOUT_S], ["original", {}, TIMEOUT_S],
            ["original", SHORT, TIMEOUT_S]]
    diagnosis, runs = probed(answer, NAME, config, runs, what)
    judge_diagnosis(diagnosis, want, what)
    judge_fix(runs, want, what)


@check(EXERCISE)
def default_settings(answer, ctx):
    """the case with its default settings: the line, the bytes per step, a fix that keeps none"""
    judge(answer, {}, "the case's default settings")


@check(EXERCISE, hidden=True)
def drawn_settings(answer, ctx):
    """two settings drawn from the run's seed (widths, validation batch, steps)"""
    rng = random.Random(f"{EXERCISE}:{ctx.seed}")
    for i in range(2):
        judge(answer, drawn_config(rng), f"hidden setting {i + 1}")
