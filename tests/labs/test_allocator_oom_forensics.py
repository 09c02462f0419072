"""allocator.oom-forensics: plausible wrong readings of a snapshot fail, called directly through
run_checks. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import copy

import pytest

from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import LyingDict

EX = "allocator.oom-forensics"


@pytest.fixture(scope="module")
def ref():
    return load_answer(EX)


def _blocks(snapshot):
    return [b for s in snapshot["segments"] for b in s["blocks"]]


def changed(ref, key, how):
    """The reference answer with ``key`` computed another way: ``how(snapshot, right_value)``."""

    def answer(snapshot):
        out = ref(snapshot)
        out[key] = how(snapshot, out[key])
        return out

    return answer


def _peak_at_last(snapshot, _):
    events = snapshot["device_traces"][0]
    live, total, peak, at = {}, 0, 0, 0
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
            if total >= peak:
                peak, at = total, i
        elif e["action"] == "free_requested":
            total -= live.pop(e["addr"])
    return at


def _largest_allocated(snapshot, _):
    sizes = [(b["size"], b["address"]) for b in _blocks(snapshot) if b["state"] == "active_allocated"]
    return max(sizes)[1]


def _culprit_without_neighbours(snapshot, right):
    oom = [e for e in snapshot["device_traces"][0] if e["action"] == "oom"][-1]
    fits = [(b["size"], b["address"]) for b in _blocks(snapshot)
            if b["state"] == "active_allocated" and b["size"] >= oom["size"]]
    return min(fits)[1] if fits else None


def _culprit_any_pool(snapshot, right):
    oom = [e for e in snapshot["device_traces"][0] if e["action"] == "oom"][-1]
    found = []
    for s in snapshot["segments"]:
        bs = s["blocks"]
        for j, b in enumerate(bs):
            room = b["size"] + sum(bs[k]["size"] for k in (j - 1, j + 1)
                                   if 0 <= k < len(bs) and bs[k]["state"] == "inactive")
            if b["state"] == "active_allocated" and room >= oom["size"]:
                found.append((b["size"], b["address"]))
    return min(found)[1] if found else None


WRONG = {
    "reserved minus active, plus one": changed(
        load_answer(EX), "reserved_unallocated", lambda s, v: v + 512),
    "peak counted with requested sizes doubled": changed(
        load_answer(EX), "peak_requested", lambda s, v: 2 * v),
    "peak_at the last time the peak is reached": changed(load_answer(EX), "peak_at",
                                                         _peak_at_last),
    "largest block of any state": changed(
        load_answer(EX), "largest_free_block", lambda s, v: max(b["size"] for b in _blocks(s))),
    "culprit = the largest allocation": changed(load_answer(EX), "culprit", _largest_allocated),
    "culprit without its free neighbours": changed(load_answer(EX), "culprit",
                                                   _culprit_without_neighbours),
    "culprit from any pool": changed(load_answer(EX), "culprit", _culprit_any_pool),
    "oom_request in MiB": changed(load_answer(EX), "oom_request", lambda s, v: v // 2**20),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_readings_fail(name):
    assert_rejected(EX, WRONG[name], "should be")


def test_a_lying_dict_is_refused(ref):
    assert_rejected(EX, lambda snapshot: LyingDict(ref(snapshot)), "subclass of dict")


def test_float_values_are_refused(ref):
    assert_rejected(EX, lambda s: {k: float(v or 0) for k, v in ref(s).items()}, "float")


def test_modifying_the_snapshot_is_refused(ref):
    def destructive(snapshot):
        out = ref(snapshot)
        snapshot["device_traces"][0].clear()
        return out

    assert_rejected(EX, destructive, "modified the snapshot")


def _events_renamed(snapshot, rename):
    """A copy of ``snapshot`` whose trace events are renamed by ``rename(index, event)`` (an
    action, or None to keep it): the events keep their indices."""
    out = copy.deepcopy(snapshot)
    for i, e in enumerate(out["device_traces"][0]):
        e["action"] = rename(i, e) or e["action"]
    return out


def test_a_block_is_live_until_free_requested_not_free_completed(ref):
    """An answer that counts a block live until its free_completed event (the reference reading
    free_completed where it reads free_requested) gets the peak wrong when an allocation comes
    between the two (a block pending on another stream's event): the hidden edge case holds one,
    whatever the seed."""
    swap = {"free_requested": "free_requested (ignored)", "free_completed": "free_requested"}

    def until_completed(snapshot):
        return ref(_events_renamed(snapshot, lambda i, e: swap.get(e["action"])))

    for seed in (0, 1):
        v = assert_rejected(EX, until_completed, "not to its 'free_completed'", seed=seed)
        assert "'peak_requested' is 50 MiB; it should be 30 MiB" in v.message


def test_the_failure_is_the_last_oom_not_the_first(ref):
    """An answer that takes the trace's first 'oom' entry for the failure (the reference with
    every later 'oom' entry hidden from it) fails: the hidden edge case TWO_OOMS is a snapshot
    taken at a second OOM, whatever the seed (the public random OOM happens to be one too)."""
    from labs.allocator import model
    from labs.allocator.checks.oom_forensics import TWO_OOMS

    def first_oom(snapshot):
        events = snapshot["device_traces"][0]
        first = next(i for i, e in enumerate(events) if e["action"] == "oom")
        return ref(_events_renamed(snapshot, lambda i, e: (
            "oom (hidden)" if e["action"] == "oom" and i != first else None)))

    snapshot, want = model.oom_case(TWO_OOMS, 64 * 1024**2, ooms=2)
    assert ref(snapshot) == want and first_oom(snapshot)["oom_request"] != want["oom_request"]
    for seed in (0, 1):
        assert_rejected(EX, first_oom, "the trace's last 'oom' entry", seed=seed)


def test_the_message_names_the_key_and_its_definition(ref):
    v = assert_rejected(EX, changed(ref, "largest_free_block", lambda s, v: v + 1))
    assert "'largest_free_block'" in v.message and "the largest inactive block" in v.message


def test_the_models_answer_agrees_with_the_definitions_on_the_snapshot(ref):
    """The checks read the answer from the model as it replays (so no copy of the course holds
    the answer's code); the reference answer applies the exercise's definitions to the snapshot.
    They agree on 300 seeded OOMs (on one stream or two, at a first or second OOM) and on the
    hidden edge cases."""
    from labs.allocator import model
    from labs.allocator.checks import oom_forensics as checks
    from labs.allocator.traces import FRAGMENTED

    MiB = 1024**2
    cases = model.random_oom_cases(123, 300)
    cases += [model.oom_case(checks.REPEATED_PEAK, 64 * MiB),
              model.oom_case(checks.OTHER_POOL, 24 * MiB), model.oom_case(FRAGMENTED, 100 * MiB),
              model.oom_case(checks.PENDING_PEAK, 64 * MiB),
              model.oom_case(checks.TWO_OOMS, 64 * MiB, ooms=2)]
    culprits = 0
    for snapshot, want in cases:
        assert ref(snapshot) == want
        culprits += want["culprit"] is not None
    assert 0 < culprits < len(cases)  # both kinds of answer occur
