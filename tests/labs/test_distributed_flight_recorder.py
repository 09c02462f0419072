"""distributed.flight-recorder: plausible wrong readings of flight recorder dumps fail, called
directly through run_checks. Each is the reference answer with one rule changed. The reference
and the stub are tested for every exercise in test_exercise_contract.py; here also that the
judge's own runs record what its plan says."""
import pytest

from labs.distributed.checks import flight_recorder as fr
from tests.conftest import assert_rejected

EX = "distributed.flight-recorder"


def flawed(flaw):
    """The reference answer with one flaw."""

    def diagnose(dumps, groups):
        enqueued, ops = {}, {}  # group -> {rank: last seq}; (group, seq) -> profiling_name
        for rank, dump in enumerate(dumps):
            for e in dump["entries"]:
                name, seq = e["process_group"][0], e["collective_seq_id"]
                last = enqueued.setdefault(name, {})
                last[rank] = max(last.get(rank, 0), seq)
                ops[name, seq] = e["profiling_name"]
            if flaw != "entries only":
                for name, status in dump["pg_status"].items():
                    last = enqueued.setdefault(name, {})
                    last[rank] = max(last.get(rank, 0),
                                     int(status["last_enqueued_collective"]))
        found = {}
        for name, members in groups.items():
            progress = {r: enqueued.get(name, {}).get(r, 0) for r in members}
            if flaw == "every rank a member":
                progress = {r: enqueued.get(name, {}).get(r, 0) for r in range(len(dumps))}
            seq = min(progress.values()) + 1
            if flaw == "the last seq every member enqueued":
                seq = min(progress.values())
            waiting = sorted(r for r, last in progress.items() if last >= seq)
            if not waiting:
                continue
            missing = sorted(r for r in progress if r not in waiting)
            if flaw == "missing and waiting swapped":
                waiting, missing = missing, waiting
            found[name] = {"seq": seq, "op": ops.get((name, seq), "?"), "waiting": waiting,
                           "missing": missing}
        return found

    return diagnose


def by_position(dumps, groups):
    """Counts a group's collectives by their position among the rank's entries."""
    found = {}
    for name, members in groups.items():
        counts = {r: sum(e["process_group"][0] == name for e in dumps[r]["entries"])
                  for r in members}
        seq = min(counts.values()) + 1
        waiting = sorted(r for r, n in counts.items() if n >= seq)
        if waiting:
            entries = [e for e in dumps[waiting[0]]["entries"] if e["process_group"][0] == name]
            found[name] = {"seq": seq, "op": entries[seq - 1]["profiling_name"],
                           "waiting": waiting,
                           "missing": sorted(r for r in members if r not in waiting)}
    return found


def analyzed_by_torch(dumps, groups):
    """Hands the dumps to torch's own flight recorder analyzer, then answers as the reference
    does."""
    from torch.distributed.flight_recorder.components import builder

    try:
        builder.build_groups_memberships({})
    except Exception:  # noqa: BLE001  (a call that fails is still a call)
        pass
    return flawed("")(dumps, groups)


def test_the_judges_runs_record_what_its_plan_says():
    for spec, what in fr.cases(0, False) + fr.cases(0, True):
        dumps, groups, names = fr._job(spec)
        want = fr.truth(spec, dumps, names)
        assert want, what  # (every job hangs)
        assert flawed("")(dumps, groups) == want, what


@pytest.mark.parametrize("answer, phrase, where", [
    (flawed("the last seq every member enqueued"), "the first one some member never enqueued",
     "check 1/2"),
    (flawed("missing and waiting swapped"), "your 'waiting' is", "check 1/2"),
    (by_position, "also when its ring buffer has dropped", "check 1/2"),
    (flawed("entries only"), "you report a hang, but every member enqueued", "hidden check 2/2"),
    (flawed("every rank a member"), "only the group's members count", "hidden check 2/2"),
    (analyzed_by_torch, "your answer ran torch/distributed/flight_recorder/", "check 1/2"),
])
def test_wrong_readings_fail(answer, phrase, where):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith(where), v.message
