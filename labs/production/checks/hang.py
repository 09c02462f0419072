"""Checks of ``production.hang``: ``fix_hang(case) -> {"diagnosis": {"rank", "step",
"collective"}, "script"}``. The case (``labs/production/cases/hang.py``) trains on two gloo
ranks that average their gradients with ``all_reduce``; a rank whose batch holds a corrupted
(NaN) label skips that step on its own, so the ranks' collectives stop pairing up and the job
hangs until gloo's timeout. The diagnosis: ``rank``, the rank that skipped; ``step``, the step
it skipped (counted from 0); ``collective``, the call it skipped (``"all_reduce"``). The script:
the fixed job, which keeps the script's rule (a corrupted batch's step is not trained on) but
keeps the ranks in step: every rank skips a step any rank skips.

Oracle: the case's own ``shard`` (executed here) says which rank reads a NaN label at which
step; the ORIGINAL script, run here under the same settings with ``skip`` (its list of steps
every rank skips, told in advance) set to that step, never meets the corrupted batch and trains
as a correct fix must: every rank skips that step, and only that one. It gives the losses and
final parameters of every rank (no fixed script is kept here). The fixed run must end with both
ranks ``ok``, in sync, with the oracle's losses and parameters (rtol 1e-5): a bigger timeout
still hangs, and dropping the ``all_reduce`` on every rank (or joining it with zero gradients)
trains something else. Public: the case's defaults with ``seed`` 11. Hidden: a seed drawn from the
run's seed, whose corrupted label is on the other rank, at another step."""

from __future__ import annotations

import math
import random
import shutil
import tempfile

from grader.checks import CheckFailure, check
from labs.production import probes
from labs.production.checks._replies import diagnosis_dict, ended, oracle, probed

EXERCISE = "production.hang"
NAME = "hang"
FILENAME = "hang.py"
#: seconds the fixed run may take (a job in step ends in well under a second here)
FIXED_TIMEOUT_S = 15.0
PUBLIC = {"seed": 11}
KEYS = ("rank", "step", "collective")



def corrupted(config: dict) -> list[tuple[int, int]]:
    """(rank, step) of every batch with a NaN label, from the case's own ``shard``."""
    namespace = {"__name__": "hang_case"}
    exec(compile(probes.case_source(NAME), FILENAME, "exec"), namespace)  # noqa: S102
    settings = {**namespace["DEFAULTS"], **config}
    return [(rank, step) for rank in range(namespace["WORLD"])
            for step in range(settings["steps"])
            if bool(namespace["shard"](rank, settings)[1][step].isnan().any())]


def drawn_config(seed: int | str, not_rank: int, not_step: int) -> dict:
    """A seed whose data has exactly one corrupted batch, on a rank other than ``not_rank``,
    at a step other than ``not_step`` (a step typed in from the public case fails), neither
    first nor last."""
    rng = random.Random(seed)
    while True:
        config = {"seed": rng.randrange(10_000, 1_000_000)}
        bad = corrupted(config)
        if len(bad) == 1 and bad[0][0] != not_rank and bad[0][1] != not_step and (
                0 < bad[0][1] < 7):
            return config


def judge(answer, config: dict, what: str) -> None:
    """The diagnosis against ``config``'s corrupted batch; the fix run on data the answer never
    saw (another seed, its corrupted batch on the other rank at another step), so that a fix
    written for the one case it was shown (a step typed into ``skip``) fails."""
    (rank, step), = corrupted(config)
    unseen = drawn_config(f"{config['seed']}-unseen", rank, step)
    runs = [["fixed", unseen, FIXED_TIMEOUT_S]]
    diagnosis, (fixed,) = probed(answer, NAME, config, runs, EXERCISE)
    diagnosis = diagnosis_dict(diagnosis, KEYS, EXERCISE)
    if diagnosis["collective"] != "all_reduce":
        raise CheckFailure(f"{what}: the diagnosis names the collective "
                           f"{diagnosis['collective']!r}; which call did one rank skip that the "
                           "other made (its name as torch.distributed spells it)?")
    if diagnosis["rank"] != rank:
        raise CheckFailure(
            f"{what}: the diagnosis names rank {diagnosis['rank']!r}, not the rank that "
            "skipped a collective. Both ranks end with a timeout: the one that raised first, "
            "or whose error you read, is not the culprit. Compare what each rank called, step "
            "by step (a log of each rank's collectives, or the flight recorder's dump).")
    if diagnosis["step"] != step:
        raise CheckFailure(
            f"{what}: the diagnosis names step {diagnosis['step']!r}; rank {rank} skipped its "
            "all_reduce at another step. The step where a rank waits is not where the other "
            "skipped: after a skip, the ranks' collectives pair up one step apart and the job "
            "only hangs at the end.")
    (_, unseen_step), = corrupted(unseen)
    want = skipped_together(unseen, unseen_step)
    what = f"{what} (your fix run on data it was not shown: seed {unseen['seed']})"
    if fixed["status"] != "ok":
        raise CheckFailure(f"{what}: " + ended(fixed, "your fixed job") + (
            " A job whose ranks make different collectives hangs whatever its timeout: make "
            "every rank call the same collectives in the same order."
            if fixed["status"] == "timeout" else ""))
    ranks = fixed["result"].get("ranks") if type(fixed["result"]) is dict else None
    if type(ranks) is not list or len(ranks) != len(want):
        raise CheckFailure(f"{what}: your fixed script's main must return {{\"ranks\": [one "
                           f"result per rank]}} for its {len(want)} ranks, as the case's does.")
    for r, (got, ref) in enumerate(zip(ranks, want)):
        if type(got) is not dict or got.get("status") != "ok":
            error = got.get("error", got.get("status")) if type(got) is dict else got
            raise CheckFailure(f"{what}: rank {r} of your fixed job did not finish: {error}. "
                               "Every rank must finish, with no timeout.")
        compare(got, ref, r, what)
    if ranks[0].get("params") != ranks[1].get("params"):
        raise CheckFailure(f"{what}: the two ranks of your fixed job end with different models: "
                           "the gradients were not averaged at every step.")


def skipped_together(config: dict, step: int) -> list[dict]:
    """Each rank's result from the original script run with ``config`` and ``step`` in its
    ``skip`` list: every rank skips the corrupted step, so the job trains as a fix must."""
    folder = tempfile.mkdtemp(prefix="hang-judge-")
    try:
        ranks = oracle(probes.case_source(NAME), {**config, "skip": [step], "workdir": folder},
                       FIXED_TIMEOUT_S, FILENAME).result["ranks"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if any(r.get("status") != "ok" for r in ranks):
        raise RuntimeError(f"the original with step {step} skipped did not finish: {ranks}")
    return ranks


def close(a, b) -> bool:
    return (type(a) in (int, float) and type(b) in (int, float) and math.isfinite(a)
            and abs(a - b) <= 1e-5 * max(1.0, abs(b)))


def flat(value) -> list:
    return [x for row in value for x in row] if type(value) is list and all(
        type(row) is list for row in value) else [value]


def compare(got: dict, ref: dict, rank: int, what: str) -> None:
    losses, want = got.get("losses"), ref["losses"]
    if type(losses) is not list or len(losses) != len(want):
        n = len(losses) if type(losses) is list else "?"
        raise CheckFailure(
            f"{what}: rank {rank} of your fixed job trained {n} steps, a correct fix "
            f"{len(want)}: a step some rank's corrupted batch rules out is skipped by every "
            "rank, and only that step.")
    bad = next((i for i, (a, b) in enumerate(zip(losses, want)) if not close(a, b)), None)
    params = flat(got.get("params"))
    if bad is not None or len(params) != len(flat(ref["params"])) or not all(
            close(a, b) for a, b in zip(params, flat(ref["params"]))):
        at = f"from its trained step {bad}" if bad is not None else "in its final parameters"
        raise CheckFailure(
            f"{what}: rank {rank} of your fixed job trains differently from a correct fix "
            f"{at} (the original script with the corrupted step in config['skip'], skipped "
            "by every rank). Keep the script's training: gradients averaged over both ranks at every "
            "step trained, and a step skipped by every rank when any rank's batch is "
            "corrupted (not trained with zero gradients, not dropped on one rank only).")


@check(EXERCISE)
def public_seed(fix_hang, ctx):
    """the case's defaults: which rank skipped which step, and a fixed job in step"""
    judge(fix_hang, PUBLIC, "the public case")


@check(EXERCISE, hidden=True)
def drawn_seed(fix_hang, ctx):
    """a seed drawn from the run's seed, its corrupted batch on the other rank, at another step"""
    (public_rank, public_step), = corrupted(PUBLIC)
    judge(fix_hang, drawn_config(ctx.seed, public_rank, public_step), "a hidden case")
