"""What the production judges share: reading :func:`labs.production.probes.diagnosed`'s reply
(the answer raised, returned no script, a script that does not compile, runs missing) and
running the case scripts in the grader's own process."""

from __future__ import annotations

from grader.checks import AnswerRaised, CheckFailure
from labs.production import probes


def probed(answer, name: str, config: dict, runs: list, what: str) -> tuple[object, list[dict]]:
    """``(diagnosis, runs)``: the answer's reply to :func:`probes.diagnosed` on the case
    ``name`` with ``config``, asked for ``runs``; raises AnswerRaised when the answer raised, CheckFailure when it returned no
    script, one that does not compile, or a reply that does not hold one run per run asked
    for (each a dict with a ``status``). Messages start with ``what`` (the exercise, or the
    setting the check ran)."""
    reply = answer.probe(probes.diagnosed, name, config, runs)
    if type(reply) is not dict:
        raise CheckFailure("what came back from the probe is not a dict.")
    if "raised" in reply and type(reply["raised"]) is dict:
        raise AnswerRaised(reply["raised"])
    if "reply" in reply:
        raise CheckFailure(f"{what}: your answer returned {reply['reply']}; it must return "
                           "{\"diagnosis\": {...}, \"script\": <the fixed script's text>}.")
    if "compile" in reply:
        raise CheckFailure(f"{what}: the script your answer returned does not compile: "
                           f"{reply['compile']}.")
    got = reply.get("runs")
    if (type(got) is not list or len(got) != len(runs)
            or any(type(r) is not dict or type(r.get("status")) is not str for r in got)):
        raise CheckFailure(f"{what}: the reply does not hold the {len(runs)} run(s) the "
                           "check asked for.")
    return reply.get("diagnosis"), got


def ended(run: dict, what: str) -> str:
    """How a run that did not return ended, in words, with the last lines of its stderr."""
    err = str(run.get("stderr", ""))[-600:].strip()
    tail = f" Its stderr ends with:\n{err}" if err else ""
    if run["status"] == "raised":
        return f"{what} raised {run.get('error')} (line {run.get('line')}).{tail}"
    if run["status"] == "timeout":
        return f"{what} was still running after its time limit and was killed.{tail}"
    return f"{what} ended without a result ({run.get('error')}).{tail}"


def finished(run: dict, what: str, which: str, keys: tuple[str, ...]) -> dict:
    """The result of ``run`` (``which``: "your fixed script", ...), which returned a dict with
    a list of numbers under each of ``keys``; CheckFailure saying how it ended otherwise."""
    if run.get("status") != "ok":
        raise CheckFailure(f"{what}: " + ended(run, which))
    result = run.get("result")
    if type(result) is not dict or any(
            type(result.get(k)) is not list
            or not all(type(v) in (int, float) for v in result[k]) for k in keys):
        shape = ", ".join(f"{k!r}: [...]" for k in keys)
        raise CheckFailure(f"{what}: {which}'s main() must still return {{{shape}}}, lists of "
                           "numbers, one per step, as the case's does.")
    return result


def oracle(source: str, config: dict, timeout_s: float, filename: str) -> probes.Run:
    """Run a case script (the original, under the check's settings) here, in the grader's process;
    raises RuntimeError when it did not return (the judge's own failure, never the answer's)."""
    run = probes.run(source, config, filename=filename, timeout_s=timeout_s)
    if run.status != "ok":
        raise RuntimeError(f"the reference run of {filename} did not return: {run.status} "
                           f"{run.error}\n{run.stderr[-2000:]}")
    return run


def diagnosis_dict(diagnosis, keys: tuple[str, ...], exercise: str) -> dict:
    """The answer's diagnosis, checked to be a dict with ``keys``."""
    if type(diagnosis) is not dict or any(k not in diagnosis for k in keys):
        have = sorted(map(str, diagnosis)) if type(diagnosis) is dict else type(diagnosis).__name__
        raise CheckFailure(f"{exercise}: the diagnosis must be a dict with the keys "
                           f"{list(keys)}; yours is {have}.")
    return diagnosis
