"""Checks of ``production.nan``: ``fix_nan(case)`` returns ``{"diagnosis": {"step", "node",
"line"}, "script"}`` for the case ``labs/production/cases/nan.py`` (an MLP classifier trained
with SGD whose cross entropy is written as ``log(softmax(logits))``): ``step`` is the first step
(counted from 0, the index in the returned ``losses``) whose loss is not finite; ``node`` the
autograd Node that anomaly mode names when that step's backward produces NaN (e.g.
``"MulBackward0"``); ``line`` the line of ``nan.py`` that anomaly mode's traceback of the
forward call points at (the innermost frame in the script). ``script`` is the fixed script.

Oracle: the judge runs the case itself (labs/production/probes.py: run): as it is, for the
step; under ``torch.autograd.detect_anomaly()`` (torch/autograd/anomaly_mode.py:
detect_anomaly), reading the Node from the RuntimeError the engine raises and the line from the
forward traceback anomaly mode prints. The fixed script's losses must all be finite and, within
a tight tolerance, equal: in the public check, the original's until its first non-finite loss;
in the hidden checks, over every step, the case trained with a loss computed in log space
(torch's own, which the learners' copy of this module does not hold), so that a fix that hides
the NaN (nan_to_num, clamping the probabilities, skipping steps, a smaller learning rate) fails.
Public: the case's default settings. Hidden: two settings drawn from the run's seed (data seed,
learning rate, width, classes), each one whose original run turns non-finite."""

from __future__ import annotations

import functools
import json
import math
import random
import re

from grader.checks import CheckFailure, check, exact
from labs.production import probes
from labs.production.checks._replies import finished, probed

EXERCISE = "production.nan"
NAME = "nan"
FILENAME = "nan.py"
#: seconds one run of the case may take (a run takes about 0.1 s)
TIMEOUT_S = 30.0
#: the loss curve of the fix against the oracle's: |yours - ref| <= ATOL + RTOL * |ref|
RTOL, ATOL = 1e-4, 1e-5
#: the oracle: the case's own training with torch's cross entropy (log_softmax, then nll_loss:
#: in log space) bound to the name its main calls, in place of the one written by hand
TORCH_LOSS = "\n\ncross_entropy = F.cross_entropy  # (the oracle: torch's own)\n"
#: the case's main run under anomaly mode, its warnings (the forward traceback is one) printed
#: to the run's stderr whatever the forking process did with warnings (pytest records them)
ANOMALY = """


import sys as _sys
import warnings as _warnings

_case_main = main


def main(config):
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly():
                return _case_main(config)
        finally:
            for w in caught:
                print(f"{w.category.__name__}: {w.message}", file=_sys.stderr)
"""
NODE = re.compile(r"Function '(\w+)' returned nan values")
FORWARD = re.compile(r"Traceback of forward call that caused the error:\n(.*?)\(Triggered",
                     re.DOTALL)
FRAME = re.compile(rf'File "{re.escape(FILENAME)}", line (\d+)')


def with_torchs_loss(source: str) -> str:
    """The case's script, its ``cross_entropy`` replaced by torch's (the oracle)."""
    if "def cross_entropy(" not in source:
        raise RuntimeError("the nan case no longer defines the cross_entropy the oracle replaces")
    return source + TORCH_LOSS


def first_nonfinite(losses: list) -> int | None:
    return next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)


def _ok(run: probes.Run, what: str) -> dict:
    if run.status != "ok":
        raise RuntimeError(f"{what} ended {run.status}: {run.error}\n{run.stderr[-2000:]}")
    return run.result


@functools.lru_cache(maxsize=8)
def truth(config_json: str) -> dict:
    """What torch says about the case under ``config``: the first non-finite step, anomaly
    mode's Node and forward line, and the original's losses (``"reference"``: up to that
    step, the curve a fix must keep; the hidden checks replace it with the whole curve of
    torch's own cross entropy, :func:`with_torchs_loss`)."""
    config = json.loads(config_json)
    source = probes.case_source(NAME)
    losses = _ok(probes.run(source, config, filename=FILENAME, timeout_s=TIMEOUT_S),
                 "the original")["losses"]
    out = {"step": first_nonfinite(losses), "steps": len(losses)}
    if out["step"] is None:
        return out
    anomaly = probes.run(source + ANOMALY, config, filename=FILENAME, timeout_s=TIMEOUT_S)
    node, forward = NODE.search(anomaly.error), FORWARD.search(anomaly.stderr)
    frames = FRAME.findall(forward.group(1)) if forward else []
    if anomaly.status != "raised" or not node or not frames:
        raise RuntimeError(f"anomaly mode did not report as expected: {anomaly.error}\n"
                           f"{anomaly.stderr[-3000:]}")
    out.update(node=node.group(1), line=int(frames[-1]), reference=losses[:out["step"]])
    return out


def torchs_curve(config: dict, want: dict) -> dict:
    """``want`` with the whole loss curve of the case trained with torch's cross entropy."""
    reference = _ok(probes.run(with_torchs_loss(probes.case_source(NAME)), config,
                               filename=FILENAME, timeout_s=TIMEOUT_S), "the oracle")["losses"]
    if first_nonfinite(reference) is not None:
        raise RuntimeError(f"torch's cross entropy is not finite under {config}")
    return {**want, "reference": reference}


def drawn_config(rng: random.Random) -> tuple[dict, dict]:
    """Settings drawn with ``rng`` whose original run turns non-finite, and their truth."""
    for _ in range(6):
        config = {"seed": rng.randrange(1, 10**6), "lr": round(rng.uniform(1.1, 1.5), 2),
                  "hidden": rng.choice([48, 64, 96]), "classes": rng.choice([4, 5, 6])}
        want = truth(json.dumps(config, sort_keys=True))
        if want["step"] is not None:
            return config, want
    raise RuntimeError("no drawn setting made the nan case go non-finite")


def _line_text(n) -> str:
    lines = probes.case_source(NAME).splitlines()
    return lines[n - 1].strip() if type(n) is int and 1 <= n <= len(lines) else ""


def judge_diagnosis(diagnosis, want: dict, what: str) -> None:
    diagnosis = exact(diagnosis, dict, f"{what}: the diagnosis")
    missing = [k for k in ("step", "node", "line") if k not in diagnosis]
    if missing:
        raise CheckFailure(f"{what}: the diagnosis has no {', '.join(map(repr, missing))}: it "
                           "is {'step': int, 'node': str, 'line': int}.")
    step = exact(diagnosis["step"], int, f"{what}: diagnosis['step']")
    if step != want["step"]:
        hint = ("that step's loss is still finite: the first non-finite one comes later"
                if step < want["step"] else
                "an earlier step's loss is already not finite")
        raise CheckFailure(
            f"{what}: diagnosis['step'] is {step}, but {hint}. Steps count from 0 (the index "
            "in the losses the run returns), and this check runs the case with its own "
            "settings (case.config): read the step off a run with them.")
    node = exact(diagnosis["node"], str, f"{what}: diagnosis['node']")
    if node != want["node"]:
        raise CheckFailure(
            f"{what}: diagnosis['node'] is {node!r}, not the Node anomaly mode names. Run the "
            "case under torch.autograd.detect_anomaly() (torch/autograd/anomaly_mode.py): the "
            "engine raises \"Function '<Node>' returned nan values in its 0th output\" for the "
            "first Node of the backward pass whose output holds a NaN (the name of a grad_fn "
            "class, e.g. 'MulBackward0').")
    line = exact(diagnosis["line"], int, f"{what}: diagnosis['line']")
    if line != want["line"]:
        quoted = _line_text(line)
        raise CheckFailure(
            f"{what}: diagnosis['line'] is {line}" + (f" (`{quoted}`)" if quoted else "")
            + f" of {FILENAME}, not the line anomaly mode's traceback of the forward call "
            "points at. Anomaly mode records, for each Node, the stack of the forward op that "
            "created it, and prints it as a warning (stderr) when the Node fails: the innermost "
            f"frame in {FILENAME} is the line.")


def judge_fix(runs, want: dict, what: str) -> None:
    losses = finished(runs[0], what, "your fixed script", ("losses",))["losses"]
    ref = want["reference"]
    if len(losses) != want["steps"]:
        raise CheckFailure(f"{what}: your fixed script returned {len(losses)} losses for the "
                           f"{want['steps']} steps of this run: it must train every step "
                           "(a step skipped, or the settings changed, is another training).")
    bad = first_nonfinite(losses)
    if bad is not None:
        raise CheckFailure(f"{what}: your fixed script's loss is not finite from step {bad} "
                           f"({losses[bad]}): the NaN is still there.")
    for i, (got, exp) in enumerate(zip(losses, ref)):
        if not abs(got - exp) <= ATOL + RTOL * abs(exp):
            raise CheckFailure(
                f"{what}: your fixed script's loss departs from {ORACLE[len(ref) < len(losses)]}"
                f" at step {i}: {got:.6g}, where it is {exp:.6g}. A "
                "fix must compute the same loss without underflow, not change the training: "
                "clamping or adding an epsilon to the probabilities, nan_to_num, skipping "
                "steps, clipping or another learning rate all train another model.")


#: what a fix's curve is compared with: the whole curve of torch's cross entropy (hidden checks),
#: or the original's up to its first non-finite step (public: True)
ORACLE = {False: "torch's cross entropy's", True: "the original's (before its NaN)"}


def judge(answer, config: dict, want: dict, what: str) -> None:
    runs = [["fixed", {}, TIMEOUT_S]]
    diagnosis, runs = probed(answer, NAME, config, runs, what)
    judge_diagnosis(diagnosis, want, what)
    judge_fix(runs, want, what)


@check(EXERCISE)
def default_settings(answer, ctx):
    """the case with its default settings: step, Node and line, and a fix that keeps the
    original's curve until its NaN and stays finite after"""
    want = truth(json.dumps({}))
    judge(answer, {}, want, "the case's default settings")


@check(EXERCISE, hidden=True)
def drawn_settings(answer, ctx):
    """two settings drawn from the run's seed (data, learning rate, width, classes)"""
    rng = random.Random(f"{EXERCISE}:{ctx.seed}")
    for i in range(2):
        config, want = drawn_config(rng)
        judge(answer, config, torchs_curve(config, want), f"hidden setting {i + 1}")
