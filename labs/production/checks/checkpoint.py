"""Checks of ``production.checkpoint``: ``fix_checkpoint(case) -> {"diagnosis": {"diverges_at",
"missing"}, "script"}``. The case (``labs/production/cases/checkpoint.py``) trains with
dropout, AdamW, a StepLR schedule and a shuffled DataLoader with a generator of its own; run
with ``stop_at`` it saves a checkpoint after that step and returns, run with ``resume`` it
loads it and trains on. Its checkpoint carries the model, the optimizer, torch's RNG state and
the step, not the scheduler nor the loader's order. The diagnosis: ``diverges_at``, the first
step whose loss differs between an uninterrupted run and the original stopped after
``case.config["stop_at"]`` steps and resumed (steps counted from 0, the resumed run's losses
following the stopped run's); ``missing``, the sorted names, among ``"model"``,
``"optimizer"``, ``"scheduler"``, ``"rng"`` and ``"data_order"``, of the state its checkpoint
does not carry. The script: the fixed script, whose stopped and resumed runs train exactly as
one uninterrupted run.

Oracle: the original, run here uninterrupted and stopped + resumed under the same settings,
gives the uninterrupted curve and where the resumed one first differs. In the probe the fixed
script runs uninterrupted, stopped after ``stop_at`` and resumed (in one folder): the stopped
run's losses followed by the resumed run's must equal the uninterrupted run's bit for bit,
and the resumed run's final parameters the uninterrupted run's; the uninterrupted run must
equal the original's (a fix changes resuming, not training). Public: the defaults, stopped in
the middle of the second epoch. Hidden: a stop in the first epoch (where the data order is
still right and only the schedule shows), and a setting drawn with the run's seed."""

from __future__ import annotations

import random
import shutil
import tempfile

from grader.checks import CheckFailure, check
from labs.production import probes
from labs.production.checks._replies import diagnosis_dict, ended, oracle, probed

EXERCISE = "production.checkpoint"
NAME = "checkpoint"
FILENAME = "checkpoint.py"
RUN_TIMEOUT_S = 30.0
STATES = ("data_order", "model", "optimizer", "rng", "scheduler")
MISSING = ["data_order", "scheduler"]
PUBLIC = {"stop_at": 9, "decay_every": 4}
FIRST_EPOCH = {"stop_at": 5, "decay_every": 4, "seed": 3}


def curve(stopped: dict, resumed: dict) -> list:
    """The stopped run's losses followed by the resumed run's."""
    return list(stopped["losses"]) + list(resumed["losses"])


def first_difference(a: list, b: list):
    """The first index where ``a`` and ``b`` differ (a missing entry counts), or None."""
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


def truth(config: dict) -> tuple[dict, int | None]:
    """The original's uninterrupted result, and where its stopped + resumed curve differs."""
    folder = tempfile.mkdtemp(prefix="checkpoint-judge-")
    try:
        source = probes.case_source(NAME)
        runs = [oracle(source, {**config, "workdir": folder, **over}, RUN_TIMEOUT_S,
                       FILENAME).result for over in
                ({"stop_at": None}, {}, {"stop_at": None, "resume": True})]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return runs[0], first_difference(curve(runs[1], runs[2]), runs[0]["losses"])


def judge(answer, config: dict, what: str) -> None:
    runs = [["fixed", {"stop_at": None}, RUN_TIMEOUT_S], ["fixed", {}, RUN_TIMEOUT_S],
            ["fixed", {"stop_at": None, "resume": True}, RUN_TIMEOUT_S]]
    diagnosis, (whole, stopped, resumed) = probed(answer, NAME, config, runs, EXERCISE)
    diagnosis = diagnosis_dict(diagnosis, ("diverges_at", "missing"), EXERCISE)
    want, diverges_at = truth(config)
    if diagnosis["diverges_at"] != diverges_at:
        raise CheckFailure(
            f"{what}: diverges_at is {diagnosis['diverges_at']!r}, not the first step at which "
            f"the original, stopped after step {config['stop_at']} and resumed, trains "
            "differently from an uninterrupted run. Run both and compare the losses step by "
            "step: state that was not saved need not show at once (a schedule that restarts "
            "only shows when it decays; a shuffle that restarts only in a later epoch).")
    missing = diagnosis["missing"]
    if type(missing) is not list or missing != MISSING:
        raise CheckFailure(
            f"{what}: missing is {missing!r}: list, sorted, the names among {list(STATES)} of "
            "the state the original's checkpoint does not carry (what a resumed run starts "
            "afresh: compare what the checkpoint holds with every object that changes as it "
            "trains).")
    names = ("your fixed script, uninterrupted",
             f"your fixed script, stopped after step {config['stop_at']}",
             "your fixed script, resumed")
    for run, name in zip((whole, stopped, resumed), names):
        if run["status"] != "ok" or type(run["result"]) is not dict or type(
                run["result"].get("losses")) is not list:
            raise CheckFailure(f"{what}: " + ended(run, name) if run["status"] != "ok" else
                               f"{what}: {name} did not return its losses as the case does.")
    if whole["result"]["losses"] != want["losses"] or whole["result"].get(
            "params") != want["params"]:
        raise CheckFailure(
            f"{what}: your fixed script, uninterrupted, trains differently from the original "
            "(from step "
            f"{first_difference(whole['result']['losses'], want['losses'])}): the fix is in "
            "what a checkpoint saves and restores, not in the training.")
    got = curve(stopped["result"], resumed["result"])
    bad = first_difference(got, want["losses"])
    if bad is not None:
        short = len(got) != len(want["losses"])
        raise CheckFailure(
            f"{what}: stopped after step {config['stop_at']} and resumed, your fixed script's "
            f"curve ({len(got)} steps, the uninterrupted {len(want['losses'])}) differs from "
            f"the uninterrupted one from step {bad}" + (
                ": a step is trained twice or skipped; resume at the step after the last one "
                "saved." if short else
                ": some state still starts afresh on resume (the learning rate's schedule, the "
                "shuffle's generator as it was when the epoch began, the RNG dropout draws "
                "from)."))
    if resumed["result"].get("params") != want["params"]:
        raise CheckFailure(f"{what}: the same losses, but the resumed run ends with other "
                           "parameters than the uninterrupted one.")


def drawn_config(seed: int) -> dict:
    rng = random.Random(seed)
    while True:
        config = {"seed": rng.randrange(1, 1000), "items": rng.choice((40, 48, 56)),
                  "decay_every": rng.randrange(3, 7)}
        config["stop_at"] = rng.randrange(2, config["items"] // 8 * 3 - 1)
        if config["stop_at"] % config["decay_every"]:
            return config


@check(EXERCISE)
def stopped_in_the_second_epoch(fix_checkpoint, ctx):
    """stopped mid-epoch and resumed: where the original diverges, an exact resume"""
    judge(fix_checkpoint, PUBLIC, "the public case")


@check(EXERCISE, hidden=True)
def stopped_in_the_first_epoch(fix_checkpoint, ctx):
    """stopped in the first epoch, where only the schedule shows at first"""
    judge(fix_checkpoint, FIRST_EPOCH, "a hidden case stopped in the first epoch")


@check(EXERCISE, hidden=True)
def drawn_setting(fix_checkpoint, ctx):
    """a data size, schedule and stop drawn from the run's seed"""
    judge(fix_checkpoint, drawn_config(ctx.seed), "a hidden case")
