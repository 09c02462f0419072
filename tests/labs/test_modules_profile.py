"""modules.profile: plausible wrong readings of a profiler trace fail, called directly through
run_checks (each is the reference rewritten with one method per rule, one rule changed), and the
reference's counting agrees with key_averages group by group on the checks' programs (what the
judge relies on). The reference and the stub are tested for every exercise in
test_exercise_contract.py. The programs are profiled once per process and seed (the judge keeps
them), so the wrong answers below cost milliseconds each."""
import collections
import json

import pytest

from labs.modules.checks import profile
from tests.conftest import assert_rejected

EX = "modules.profile"


class HotOp:
    """The reference answer, one method per rule."""

    categories = ("cpu_op", "user_annotation")

    def events(self, trace):
        return [e for e in json.loads(trace)["traceEvents"]
                if e.get("ph") == "X" and e.get("cat") in self.categories]

    def threads(self, events):
        by = collections.defaultdict(list)
        for e in events:
            by[e["tid"]].append(e)
        return by.values()

    def merge(self, evs, parent, children, alive):
        merged = True
        while merged:
            merged = False
            for i in sorted(alive):
                p = parent.get(i)
                if p is not None and evs[p]["name"] == evs[i]["name"] and len(children[p]) == 1:
                    children[p] = children.pop(i, [])
                    for c in children[p]:
                        parent[c] = p
                    del parent[i]
                    alive.discard(i)
                    merged = True

    def self_time(self, e, kids):
        return e["dur"] - sum(k["dur"] for k in kids)

    def key(self, e):
        return e["name"], json.dumps(e.get("args", {}).get("Input Dims", []))

    def groups(self, trace):
        groups, total = collections.defaultdict(lambda: [0, 0.0]), 0.0
        for evs in self.threads(self.events(trace)):
            evs.sort(key=lambda e: (e["ts"], -e["dur"]))
            parent, children, stack = {}, collections.defaultdict(list), []
            for i, e in enumerate(evs):
                while stack:
                    p = evs[stack[-1]]
                    if e["ts"] >= p["ts"] + p["dur"] or e["ts"] + e["dur"] > p["ts"] + p["dur"]:
                        stack.pop()
                    else:
                        parent[i] = stack[-1]
                        children[stack[-1]].append(i)
                        break
                stack.append(i)
            alive = set(range(len(evs)))
            self.merge(evs, parent, children, alive)
            for i in alive:
                s = self.self_time(evs[i], [evs[c] for c in children[i]])
                g = groups[self.key(evs[i])]
                g[0] += 1
                g[1] += s
                total += s
        return groups, total

    def __call__(self, trace):
        groups, total = self.groups(trace)
        (name, shapes), (calls, self_us) = max(groups.items(), key=lambda kv: kv[1][1])
        return {"name": name, "input_shapes": json.loads(shapes), "calls": calls,
                "self_us": self_us, "share": self_us / total}


class TotalTime(HotOp):
    def self_time(self, e, kids):
        return e["dur"]


class ByNameOnly(HotOp):
    def key(self, e):
        return e["name"], "[]"


class OperatorsOnly(HotOp):
    categories = ("cpu_op",)


class EveryCompleteEvent(HotOp):
    """Counts the profile's own span ("cat": "Trace") as an event too."""

    def events(self, trace):
        return [e for e in json.loads(trace)["traceEvents"] if e.get("ph") == "X"]

    def threads(self, events):
        by = collections.defaultdict(list)
        for e in events:
            by[str(e["tid"])].append(e)
        return by.values()


class ThreadsMixed(HotOp):
    def threads(self, events):
        return [events]


class NoMerge(HotOp):
    def merge(self, evs, parent, children, alive):
        pass


@pytest.mark.parametrize("answer, phrase", [
    (TotalTime(), "hot_op names step with input shapes [], whose self time key_averages counts "
                  "as"),
    (ByNameOnly(), "hot_op names aten::mm with input shapes [], a group key_averages does not "
                   "have"),
    (OperatorsOnly(), "over the"),
    (EveryCompleteEvent(), "hot_op names PyTorch Profiler (0) with input shapes [], a group "
                           "key_averages does not have"),
])
def test_wrong_answers_fail_the_public_check(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_a_share_without_the_ranges_fails():
    v = assert_rejected(EX, OperatorsOnly(), "of self time of all its events (every cpu_op and "
                                             "user_annotation event, on every thread)")
    assert "hot_op's share is" in v.message


def test_nesting_across_threads_fails_on_the_waiting_trace():
    v = assert_rejected(EX, ThreadsMixed(), "on the trace of the waiting program")
    assert v.message.startswith("hidden check 2/2"), v.message


def test_leaving_same_named_children_unmerged_fails_the_public_reduction_trace():
    v = assert_rejected(EX, NoMerge(), "on the trace of the reduction program, hot_op names "
                                       "aten::sum with input shapes [[1500,1500],[],[],[]], a "
                                       "group key_averages does not have")
    assert v.message.startswith("check 1/2"), v.message


@pytest.mark.parametrize("name", sorted(profile.PROGRAMS))
def test_the_reference_counts_every_group_as_key_averages_does(name):
    """Not only the hottest group: every (name, input shapes) group's calls and self time, and
    the total. (A tensor-list operator such as aten::cat would differ: key_averages gives its
    shapes as [[], []] where the trace lists each tensor's; no program calls one.)"""
    text, rows, total = profile.profiled(name, 0)
    groups, mine_total = HotOp().groups(text)
    assert abs(mine_total - total) < 1e-3 * total
    averages = {(r[0], json.dumps(r[1])): (r[3], r[4]) for r in rows}
    assert set(groups) == set(averages)
    for key, (calls, self_us) in groups.items():
        assert calls == averages[key][0], key
        assert abs(self_us - averages[key][1]) < 0.01 + 1e-6 * total, key
