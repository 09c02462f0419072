"""Checks of ``production.recompiles``: ``fix_recompiles(case)`` returns ``{"diagnosis":
{"guard", "recompiles", "eager_from"}, "script"}`` for the case
``labs/production/cases/recompiles.py`` (a classifier whose loss, cross entropy with a label
smoothing that decays in steps, is computed by a function compiled with ``torch.compile(...,
backend="eager")``): ``guard`` is the name of the compiled function's argument whose guard
fails at each recompile; ``recompiles`` how many graphs Dynamo compiled for that function after
its first one (an attempt refused by the recompile limit compiles nothing and is not counted);
``eager_from`` the first step whose loss the function computed eagerly because Dynamo hit
``torch._dynamo.config.recompile_limit``, or None when it never did. ``script`` is the fixed
script: still compiled, compiling no more graphs than the case does when its smoothing never
changes, and training as the uncompiled script does.

Oracle: the judge runs the case itself (labs/production/probes.py: run) with Dynamo's
``recompiles`` log on (torch/_dynamo/guards.py: the guard failures of each recompile) and a
logging handler that records, with the number of calls made so far, each recompile and the
warning of torch/_dynamo/convert_frame.py when the limit is hit; the graphs of every run (the
original's and the fixed script's) are the runner's count (probes.Run.graphs: ``torch._dynamo.
utils.counters["stats"]["unique_graphs"]`` in the run's process), never a number a script
returns. Every oracle is the ORIGINAL script (no fixed script is kept here): the loss curve to
reproduce is its own with ``compile=False`` (eager), and the bound on graphs is what it compiles
with ``decay=1.0``, a smoothing that never changes (one graph: nothing its guards test changes
between steps, which is what a fix must achieve with a smoothing that does). Public: the
default settings. Hidden: one setting drawn from the run's seed (schedule, steps, data seed)."""

from __future__ import annotations

import functools
import json
import random
import re

from grader.checks import CheckFailure, check, exact
from labs.production import probes
from labs.production.checks._replies import finished, probed

EXERCISE = "production.recompiles"
NAME = "recompiles"
FILENAME = "recompiles.py"
#: the case's function whose graphs are counted: the entries its code holds in Dynamo's cache
#: after the run (labs/production/probes.py: Run.compiled), so a graph compiled for anything
#: else does not count
COMPILED = "compute_loss"
TIMEOUT_S = 60.0
#: the fix's losses against the eager run's: |yours - eager| <= ATOL + RTOL * |eager|
RTOL, ATOL = 1e-5, 1e-6
#: the case's main run with the recompile log kept, each record with the calls made before it
RECORDED = """


import logging as _logging

_calls, _records, _compile = [0], [], torch.compile


class _Keep(_logging.Handler):
    def emit(self, record):
        _records.append([_calls[0], record.getMessage()])


def _counted(fn, *args, **kwargs):
    compiled = _compile(fn, *args, **kwargs)

    def call(*a, **k):
        try:
            return compiled(*a, **k)
        finally:
            _calls[0] += 1

    return call


_case_main = main


def main(config):
    torch._logging.set_logs(recompiles=True)
    _logging.getLogger("torch._dynamo").addHandler(_Keep())
    torch.compile = _counted
    try:
        out = _case_main(config)
    finally:
        torch.compile = _compile
    return {**out, "records": _records}
"""
GUARD = re.compile(r"^\s*- \d+/\d+: (?:L\[')?([A-Za-z_]\w*)", re.MULTILINE)


def _ok(run: probes.Run, what: str) -> probes.Run:
    if run.status != "ok":
        raise RuntimeError(f"{what} ended {run.status}: {run.error}\n{run.stderr[-2000:]}")
    return run


@functools.cache
def warm_up() -> None:
    """Compile a small function once here, so that the modules Dynamo imports on its first
    compile are this process's and every forked run starts with them (a second or so less
    per run); then forget what was compiled."""
    import torch

    fn = torch.compile(lambda x, s: torch.nn.functional.cross_entropy(
        torch.nn.functional.linear(x, x), x.argmax(-1), label_smoothing=s), backend="eager")
    fn(torch.ones(2, 2), 0.1)
    fn(torch.ones(2, 2), 0.2)
    torch._dynamo.reset()


@functools.lru_cache(maxsize=8)
def truth(config_json: str) -> dict:
    warm_up()
    config = json.loads(config_json)
    source = probes.case_source(NAME)
    seen = _ok(probes.run(source + RECORDED, config, filename=FILENAME, timeout_s=TIMEOUT_S),
               "the original")
    records = seen.result["records"]
    guards = {m.group(1) for _, text in records if "Recompiling function" in text
              for m in GUARD.finditer(text)}
    limit = [calls for calls, text in records if "recompile_limit" in text]
    if len(guards) != 1:
        raise RuntimeError(f"expected one guarded argument in the recompile log, got {guards}")
    eager = _ok(probes.run(source, {**config, "compile": False}, filename=FILENAME,
                           timeout_s=TIMEOUT_S), "the eager run").result["losses"]
    constant = _ok(probes.run(source, {**config, "decay": 1.0}, filename=FILENAME,
                              timeout_s=TIMEOUT_S), "the run with a constant smoothing")
    bound = constant.compiled.get(COMPILED, 0)
    if bound < 1:
        raise RuntimeError("the run with a constant smoothing compiled no graph")
    return {"guard": guards.pop(), "recompiles": seen.graphs - 1,
            "eager_from": limit[0] if limit else None, "eager": eager,
            "bound": bound, "steps": len(eager)}


PUBLIC = {"compile": True}


def drawn_config(rng: random.Random) -> dict:
    return {"compile": True, "seed": rng.randrange(1, 10**6), "every": rng.choice([3, 4, 5, 6]),
            "steps": rng.randint(18, 30), "smoothing": round(rng.uniform(0.1, 0.3), 3),
            "decay": round(rng.uniform(0.6, 0.85), 3)}


def judge_diagnosis(diagnosis, want: dict, what: str) -> None:
    diagnosis = exact(diagnosis, dict, f"{what}: the diagnosis")
    missing = [k for k in ("guard", "recompiles", "eager_from") if k not in diagnosis]
    if missing:
        raise CheckFailure(f"{what}: the diagnosis has no {', '.join(map(repr, missing))}: it "
                           "is {'guard': str, 'recompiles': int, 'eager_from': int or None}.")
    guard = exact(diagnosis["guard"], str, f"{what}: diagnosis['guard']")
    if guard != want["guard"]:
        raise CheckFailure(
            f"{what}: diagnosis['guard'] is {guard!r}, not the argument whose guard fails. "
            "Turn on Dynamo's recompile log in the script (torch._logging.set_logs("
            "recompiles=True)): each recompile lists the guard failure(s) that triggered it, "
            "as an expression on the compiled function's argument.")
    recompiles = exact(diagnosis["recompiles"], int, f"{what}: diagnosis['recompiles']")
    if recompiles != want["recompiles"]:
        raise CheckFailure(
            f"{what}: diagnosis['recompiles'] is {recompiles}, not the number of graphs Dynamo "
            "compiled for the function after its first one in a run with this check's "
            "settings (case.config). An attempt refused by the recompile limit compiles "
            "nothing and is not a recompile.")
    eager_from = diagnosis["eager_from"]
    if eager_from is not None:
        eager_from = exact(eager_from, int, f"{what}: diagnosis['eager_from']")
    if eager_from != want["eager_from"]:
        told = ("None, but Dynamo does hit its recompile limit in this run"
                if eager_from is None else
                f"{eager_from}, not the step where Dynamo gave up on the function"
                + (" (in this run it never does: say None)" if want["eager_from"] is None
                   else ""))
        raise CheckFailure(
            f"{what}: diagnosis['eager_from'] is {told}. When a function has "
            "torch._dynamo.config.recompile_limit graphs and its guards fail again, Dynamo "
            "warns 'hit config.recompile_limit' (torch/_dynamo/convert_frame.py) and runs it "
            "eagerly from that call on; steps count from 0.")


def judge_fix(runs, want: dict, what: str) -> None:
    run = runs[0]
    losses = finished(run, what, "your fixed script", ("losses",))["losses"]
    compiled = run.get("compiled")  # the runner's reading of Dynamo's cache (probes.Run.compiled)
    if type(compiled) is not dict:
        raise CheckFailure(f"{what}: the probe's run of your fixed script does not say what "
                           "Dynamo compiled ('compiled', a dict).")
    graphs = compiled.get(COMPILED, 0)
    if type(graphs) is not int:
        raise CheckFailure(f"{what}: the probe's count of {COMPILED}'s graphs is not an int.")
    if graphs < 1:
        raise CheckFailure(f"{what}: Dynamo holds no graph of {COMPILED} after your fixed "
                           f"script ran: the loss must still be computed by the compiled "
                           f"{COMPILED} (running it eagerly, or compiling something else, is "
                           "not a fix of its recompiles).")
    total = run.get("graphs")  # every graph Dynamo compiled in the run (probes.Run.graphs)
    if type(total) is not int:
        raise CheckFailure(f"{what}: the probe's run does not count the graphs Dynamo compiled.")
    graphs = max(graphs, total)  # (a cache emptied before the end still compiled them all)
    if graphs > want["bound"] or "recompile_limit" in str(run.get("stderr")):
        raise CheckFailure(
            f"{what}: Dynamo holds {graphs} graphs of {COMPILED} after your fixed script ran, "
            f"more than the {want['bound']} a fix needs (what the case compiles when its "
            "smoothing never changes). Whatever its guards test still changes between steps: "
            "a larger recompile limit or dynamic=True does not help when an op needs "
            "the value as a Python constant; make the changing value an input Dynamo need "
            "not specialize on.")
    if len(losses) != want["steps"]:
        raise CheckFailure(f"{what}: your fixed script returned {len(losses)} losses for the "
                           f"{want['steps']} steps of this run.")
    for i, (got, exp) in enumerate(zip(losses, want["eager"])):
        if not abs(got - exp) <= ATOL + RTOL * abs(exp):
            raise CheckFailure(
                f"{what}: your fixed script's loss departs from the eager run's at step {i}: "
                f"{got:.7g} where the script run without torch.compile gives {exp:.7g}. A "
                "fix must compute the same loss with the same schedule (a constant or "
                "rounded smoothing trains another model).")


def judge(answer, config: dict, what: str) -> None:
    want = truth(json.dumps(config, sort_keys=True))
    runs = [["fixed", {}, TIMEOUT_S]]
    diagnosis, runs = probed(answer, NAME, config, runs, what)
    judge_diagnosis(diagnosis, want, what)
    judge_fix(runs, want, what)


@check(EXERCISE)
def default_settings(answer, ctx):
    """the case with its default settings: the guard, the recompiles, the fall back to eager"""
    judge(answer, PUBLIC, "the case's default settings")


@check(EXERCISE, hidden=True)
def drawn_settings(answer, ctx):
    """a setting drawn from the run's seed (schedule, steps, data)"""
    judge(answer, drawn_config(random.Random(f"{EXERCISE}:{ctx.seed}")), "a hidden setting")
