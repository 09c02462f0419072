"""Checks of ``production.input-bound``: ``fix_input_bound(case) -> {"diagnosis": {"data_s",
"data_fraction"}, "script"}``. The case (``labs/production/cases/input_bound.py``) trains on a
Dataset whose items each wait for slow storage (a ``time.sleep`` that needs no CPU), read by a
DataLoader in the training process (``num_workers=0``). The diagnosis: ``data_s``, the seconds
the training loop spends waiting for its batches in all, and ``data_fraction``, that time's
share of the loop's wall time (the case's ``seconds``), a float in [0, 1]. The script: the
fixed script, which hides that wait behind the compute (worker processes, prefetching) and
trains exactly as before.

Oracle: a copy of the case timing each ``next()`` of its loader (``time.perf_counter``), run
here under the same settings, gives the wait (the answer's data_s must be within 20 %: the
waits are sleeps) and its fraction (within 0.15: the compute's share varies with the
machine's load), and the loss curve (the fixed run's must be equal, to 1e-6: the same batches
in the same order). In the same probe the original and the fixed script run one after the
other: the fixed run's wall time must save at least a third of the time the original waited
for data (worker processes take a moment to start). A third run of the fixed script, on a tiny
model over slow storage, must still wait for storage (storage serves at most 4 reads at a
time, so its loop cannot take less than items * read_s / 4): a fix that drops the wait hides
the symptom. Public: the case's defaults (about 90 % data). Hidden: a setting drawn with the
run's seed, waiting longer or shorter than the public one."""

from __future__ import annotations

import math
import random

from grader.checks import CheckFailure, check
from labs.production import probes
from labs.production.checks._replies import diagnosis_dict, ended, oracle, probed

EXERCISE = "production.input-bound"
NAME = "input-bound"
FILENAME = "input_bound.py"
RUN_TIMEOUT_S = 30.0
PUBLIC: dict = {}
#: hidden settings: loops that wait longer (~0.8 s) or shorter (~0.5 s) than the public one
#: (~0.65 s), for ~95 % and ~85 % of their time (public: ~90 %)
HIDDEN = ({"read_s": 0.02, "items": 40, "width": 256},
          {"read_s": 0.005, "items": 96, "batch": 16, "width": 512})
#: the run that must still wait for storage: a tiny model, slow reads
STORAGE = {"width": 8, "items": 32, "batch": 16, "read_s": 0.03}
#: reads storage serves at once
MAX_READS = 4
#: how far the answer's data_fraction may be from the judge's (absolute), and its data_s
#: (relative): the waits are sleeps, the compute varies with the machine's load
TOLERANCE = 0.15
DATA_S_TOLERANCE = 0.2

LOOP = "    for images, labels in loader:\n"
TIMED_LOOP = """    waited, batches = 0.0, iter(loader)
    while True:
        t = time.perf_counter()
        try:
            images, labels = next(batches)
        except StopIteration:
            break
        waited += time.perf_counter() - t
"""


def timed_source() -> str:
    """The case with each ``next()`` of its loader timed; it returns ``waited`` too."""
    source = probes.case_source(NAME)
    assert LOOP in source and '    return {"losses"' in source, "the case's loop moved"
    return source.replace(LOOP, TIMED_LOOP).replace(
        '    return {"losses"', '    return {"waited": waited, "losses"')


def judge(answer, config: dict, what: str) -> None:
    runs = [["original", {}, RUN_TIMEOUT_S], ["fixed", {}, RUN_TIMEOUT_S],
            ["fixed", STORAGE, RUN_TIMEOUT_S]]
    diagnosis, (original, fixed, storage) = probed(answer, NAME, config, runs, EXERCISE)
    diagnosis = diagnosis_dict(diagnosis, ("data_s", "data_fraction"), EXERCISE)
    truth = oracle(timed_source(), {**config, "workdir": "."}, RUN_TIMEOUT_S, FILENAME).result
    want = truth["waited"] / truth["seconds"]
    for key in ("data_s", "data_fraction"):
        if type(diagnosis[key]) not in (int, float) or not math.isfinite(diagnosis[key]):
            raise CheckFailure(f"{what}: {key} must be a number, not {diagnosis[key]!r}.")
    data_s, fraction = diagnosis["data_s"], diagnosis["data_fraction"]
    if abs(data_s - truth["waited"]) > DATA_S_TOLERANCE * truth["waited"]:
        low = "low" if data_s < truth["waited"] else "high"
        raise CheckFailure(
            f"{what}: data_s {data_s:.3f} is too {low}: the loop waits another time for its "
            f"batches in all (within {DATA_S_TOLERANCE:.0%} of it passes). Sum the time of "
            "every fetch of a batch (the loader's next()): the profiler marks each with a "
            "region of the DataLoader's own.")
    if abs(fraction - want) > TOLERANCE:
        low = "low" if fraction < want else "high"
        raise CheckFailure(
            f"{what}: data_fraction {fraction:.3f} is too {low}: the loop spends another share "
            f"of its time waiting for batches (within {TOLERANCE} of it passes): the time of "
            "every fetch of a batch over the loop's whole time (the case's seconds).")
    for run, which in ((original, "the original script"), (fixed, "your fixed script"),
                       (storage, "your fixed script (on slow storage)")):
        if run["status"] != "ok" or type(run["result"]) is not dict:
            raise CheckFailure(f"{what}: " + ended(run, which))
    losses, ref = fixed["result"].get("losses"), truth["losses"]
    if type(losses) is not list or len(losses) != len(ref):
        n = len(losses) if type(losses) is list else "?"
        raise CheckFailure(f"{what}: your fixed script trained {n} steps, the case "
                           f"{len(ref)}: keep every batch.")
    bad = next((i for i, (a, b) in enumerate(zip(losses, ref))
                if type(a) not in (int, float) or not abs(a - b) <= 1e-6 * max(1, abs(b))), None)
    if bad is not None:
        raise CheckFailure(
            f"{what}: your fixed script's loss at step {bad} differs from the case's: faster "
            "input must not change what is trained (the same batches in the same order, from "
            "the loader's generator; the same model and optimizer).")
    saved, waited = original["seconds"] - fixed["seconds"], want * original["seconds"]
    if saved < waited / 3:
        raise CheckFailure(
            f"{what}: your fixed script took {fixed['seconds']:.2f} s against the original's "
            f"{original['seconds']:.2f} s in the same probe, while the original waited about "
            f"{waited:.2f} s for data: a fix must hide at least a third of that wait behind the "
            "compute (the loop's next batch read while it trains on this one).")
    floor = STORAGE["items"] * STORAGE["read_s"] / MAX_READS
    took = storage["seconds"]  # (the runner's clock: what the script reports can be anything)
    if type(took) not in (int, float) or took < floor:
        raise CheckFailure(
            f"{what}: on slow storage (read_s={STORAGE['read_s']}, {STORAGE['items']} items) "
            f"your fixed script's run took {took} s, less than storage allows ({floor:.2f} s "
            f"at {MAX_READS} reads at once): the time.sleep in __getitem__ stands for the "
            "storage, which a fix cannot remove; hide the wait, do not skip it (and use at "
            f"most {MAX_READS} workers).")


@check(EXERCISE)
def public_setting(fix_input_bound, ctx):
    """the case's defaults: the share of time spent waiting for data, a faster loop"""
    judge(fix_input_bound, PUBLIC, "the public case")


@check(EXERCISE, hidden=True)
def drawn_setting(fix_input_bound, ctx):
    """a setting drawn from the run's seed, more or less data-bound than the public one"""
    rng = random.Random(ctx.seed)
    config = {**rng.choice(HIDDEN), "seed": rng.randrange(1, 1000)}
    judge(fix_input_bound, config, "a hidden case")
