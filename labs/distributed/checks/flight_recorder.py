"""Checks of ``distributed.flight-recorder``: ``diagnose(dumps, groups)`` reads the flight
recorder dumps of a job that hung and must say, for each process group, the collective it hung
in. ``dumps[r]`` is rank r's dump, the JSON of ``torch._C._distributed_c10d._dump_fr_trace_json``
decoded (a dict whose ``"entries"`` record each collective the rank enqueued: its
``collective_seq_id``, counted per process group from 1, its ``profiling_name`` such as
``"gloo:all_reduce"``, ``process_group`` as ``[name, description]``, sizes, state); ``groups``
maps each process group's name to its global ranks. The answer is ``{group name: {"seq": the
first collective_seq_id of that group that some member never enqueued, "op": its
profiling_name, "waiting": [the members that enqueued it, sorted], "missing": [the members that
did not, sorted]}}`` for every group with such a collective that some member did enqueue; ``{}``
when none has.

The oracle is the flight recorder itself: the judge runs the job on gloo ranks of its own, each
rank running one seeded program of collectives (all_reduce, broadcast, all_gather_single) on a
group of all ranks and on subgroups; one rank stops after a seeded step (stuck elsewhere, as a
rank in a data loader or a slow checkpoint is), and every rank that then reaches a collective
that rank belongs to waits in it (enqueued, never completed) and enqueues nothing after. Each
rank dumps its recorder; what the answer must find follows from the program the judge chose.
A dump's ``pg_status`` gives each group's ``last_enqueued_collective`` (exact: set as the rank
enqueues); whether an entry is ``retired`` and ``last_completed_collective`` are set by the
work's completion, a moment after the call returns, so a dump taken then can still show a
finished collective as pending: the answer is about what was enqueued. Public: 3 ranks, one
group, its dumps whole and cut to each rank's last 2 entries. Hidden (seeded): 4 ranks with two subgroups, a rank stuck before a subgroup's
collective, and dumps of a recorder whose ring buffer kept only the last entries (entries do
not start at seq 1, and a rank's older entries of a group may be gone while ``pg_status`` still
counts them: the judge keeps each rank's last ones, as a small ``TORCH_FR_BUFFER_SIZE`` would).
(torch/csrc/distributed/c10d/FlightRecorder.hpp: FlightRecorder::Entry, dump_json;
torch/distributed/flight_recorder/components/builder.py: build_collectives, which matches the
ranks' entries the same way; ``models`` in the lab table: an answer that runs that analyzer
fails.)"""

from __future__ import annotations

import json
import time

import torch

from grader.checks import CheckFailure, ahead, check
from labs.distributed.checks._oracles import oracle

EXERCISE = "distributed.flight-recorder"
KINDS = ("all_reduce", "broadcast", "all_gather")


def plan(spec: dict) -> dict[int, list[int]]:
    """rank -> the indices of ``spec["ops"]`` it enqueues: each rank runs the program in order,
    skipping ops of groups it is not in; ``spec["stuck"]`` stops before op ``spec["stop"]``; a
    rank that enqueues an op some member never enqueues waits in it and enqueues nothing after.
    (A rank's collectives run in one global order here, so this single pass is exact.)"""
    running = set(range(spec["world"]))
    issued: dict[int, list[int]] = {r: [] for r in running}
    for i, (group, _, _) in enumerate(spec["ops"]):
        if i == spec["stop"]:
            running.discard(spec["stuck"])
        members = spec["groups"][group]
        doers = [r for r in members if r in running]
        for r in doers:
            issued[r].append(i)
        if len(doers) < len(members):
            running -= set(doers)
    return issued


def _rank_program(spec: dict) -> dict:
    """On every rank of the judge's world: create the groups, run this rank's part of
    :func:`plan` (an op every member enqueues is waited for; the one this rank then waits in
    is left pending), and return ``{"dump": the flight recorder's dump, decoded, "names":
    {group index: its name} for the groups this rank is in}``."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace_json

    rank = dist.get_rank()
    groups = [dist.new_group(members) for members in spec["groups"]]
    issued = plan(spec)
    for n, i in enumerate(issued[rank]):
        group, kind, numel = spec["ops"][i]
        g, members = groups[group], spec["groups"][group]
        t = torch.full((numel,), float(rank))
        if kind == "all_reduce":
            work = dist.all_reduce(t, group=g, async_op=True)
        elif kind == "broadcast":
            work = dist.broadcast(t, min(members), group=g, async_op=True)
        else:
            out = t.new_empty(numel * len(members))
            work = dist.all_gather_single(out, t, group=g, async_op=True)
        if all(i in issued[r] for r in members):
            work.wait()
    time.sleep(0.2)
    names = {k: g.group_name for k, g in enumerate(groups) if rank in spec["groups"][k]}
    return {"dump": json.loads(_dump_fr_trace_json(True, True)), "names": names}


def _spec(seed: int, world: int, n_groups: int, window: int | None) -> dict:
    """A seeded program: ``world`` ranks, a group of all of them and ``n_groups - 1`` subgroups
    of two or three ranks, 8 to 14 ops, one rank stuck before a seeded op past the fourth."""
    g = torch.Generator().manual_seed(seed)

    def pick(n: int) -> int:
        return int(torch.randint(n, (), generator=g))

    groups = [list(range(world))]
    while len(groups) < n_groups:
        size = 2 + pick(world - 2) if world > 2 else 2
        members = sorted(int(r) for r in torch.randperm(world, generator=g)[:size])
        if members not in groups:
            groups.append(members)
    n_ops = 8 + pick(7)
    ops = [[pick(n_groups) if i % 3 else 0, KINDS[pick(3)], 2 + pick(6)] for i in range(n_ops)]
    ops[-1][0] = 0  # (a collective of every rank after the stop: the job hangs)
    stuck = pick(world)
    spec = {"world": world, "groups": groups, "ops": ops, "stuck": stuck,
            "stop": 4 + pick(n_ops - 5), "window": window}
    return spec


def _shaped(seed: int, groups: list, ops: list[int], stuck: int, stop: int,
            window: int | None) -> dict:
    """A program of a fixed shape (``ops``: the group of each op) with seeded kinds and sizes."""
    g = torch.Generator().manual_seed(seed)
    kinds = [KINDS[int(k)] for k in torch.randint(3, (len(ops),), generator=g)]
    sizes = [2 + int(n) for n in torch.randint(6, (len(ops),), generator=g)]
    return {"world": 1 + max(groups[0]), "groups": groups,
            "ops": [[k, kind, n] for k, kind, n in zip(ops, kinds, sizes)], "stuck": stuck,
            "stop": stop, "window": window}


def cases(seed: int, hidden: bool) -> list[tuple[dict, str]]:
    """(spec, what) of the public or the hidden check's jobs."""
    if not hidden:
        return [(_spec(seed, 3, 1, None), "3 ranks, one group"),
                (_spec(seed, 3, 1, 2), "the same job, dumps of a recorder that kept only the "
                                       "last 2 entries of each rank")]
    return [
        (_spec(seed + 1, 4, 3, None), "4 ranks, a group of all and two subgroups"),
        # rank 2 stops before a collective of its subgroup [1, 2]: rank 1 waits there, the
        # others in the next collective of all ranks
        (_shaped(seed, [[0, 1, 2, 3], [1, 2]], [0, 1, 0, 1, 0, 0], 2, 3, None),
         "4 ranks, a rank stuck before a collective of its subgroup"),
        # rank 0 enqueued subgroup [0, 1]'s one collective long before it hung: its last 3
        # entries no longer hold it, rank 1's do (pg_status still counts it)
        (_shaped(seed + 2, [[0, 1, 2, 3], [0, 1], [0, 2]], [0, 1, 2, 2, 2, 0, 0], 3, 6, 3),
         "4 ranks, three groups, a recorder that kept only the last 3 entries of each rank"),
    ]


def truth(spec: dict, dumps: list[dict], names: dict[int, str]) -> dict:
    """What ``diagnose`` must return for ``spec``, from :func:`plan`, with each stalled
    collective's ``op`` read from the dump of a rank that enqueued it."""
    issued = plan(spec)
    found = {}
    for k, members in enumerate(spec["groups"]):
        mine = [i for i, op in enumerate(spec["ops"]) if op[0] == k]
        for seq, i in enumerate(mine, start=1):
            waiting = [r for r in members if i in issued[r]]
            if waiting and len(waiting) < len(members):
                entry = next(e for e in dumps[waiting[0]]["entries"]
                             if e["process_group"][0] == names[k]
                             and e["collective_seq_id"] == seq)
                found[names[k]] = {"seq": seq, "op": entry["profiling_name"],
                                   "waiting": waiting,
                                   "missing": [r for r in members if r not in waiting]}
                break
    return found


def _job(spec: dict) -> tuple[list[dict], dict[str, list[int]], dict[int, str]]:
    """The ranks' dumps (each kept to its last ``spec["window"]`` entries when set), the groups
    by name, and group index -> name, from the judge's run of ``spec``."""
    ranks = oracle(_rank_program, spec["world"], spec).result()
    names = {}
    for r in ranks:
        names.update({int(k): v for k, v in r["names"].items()})
    dumps = [r["dump"] for r in ranks]
    if spec["window"]:
        dumps = [{**d, "entries": d["entries"][-spec["window"]:]} for d in dumps]
    return dumps, {names[k]: m for k, m in enumerate(spec["groups"])}, names


def _judge(diagnose, seed: int, hidden: bool) -> None:
    for spec, what in cases(seed, hidden):
        dumps, groups, names = _job(spec)
        want = truth(spec, dumps, names)
        got = diagnose(dumps, groups)
        if not isinstance(got, dict):
            raise CheckFailure(f"for {what}, diagnose returned a {type(got).__name__}; return a "
                               "dict: group name -> {'seq', 'op', 'waiting', 'missing'}.")
        for name in sorted(set(want) | set(got)):
            _compare(got.get(name), want.get(name), name, groups[name] if name in groups
                     else None, what)


def _compare(mine, real, name: str, members, what: str) -> None:
    where = f"for {what}, process group {name!r}"
    if real is None:
        raise CheckFailure(
            f"{where} (ranks {members}): you report a hang, but every member enqueued every "
            "collective of it that any member did (only the group's members count: "
            "groups[name]; a member's progress is its pg_status[name]["
            "'last_enqueued_collective'], also when its ring buffer has dropped the entries)."
            if members else
            f"for {what}, you name a process group {name!r}: the job has no group of that name "
            "(key the result by process_group[0], the group's name).")
    if mine is None:
        raise CheckFailure(
            f"{where} (ranks {members}): you report nothing, but rank {real['waiting'][0]} "
            "enqueued a collective of it that not every member did (how far each member got: "
            "its pg_status[name]['last_enqueued_collective'], also when its ring buffer has "
            "dropped the entries).")
    if not isinstance(mine, dict) or sorted(mine) != ["missing", "op", "seq", "waiting"]:
        raise CheckFailure(f"{where}: each value must be a dict with the keys 'seq', 'op', "
                           "'waiting' and 'missing'.")
    if mine["seq"] != real["seq"]:
        raise CheckFailure(
            f"{where} (ranks {members}): you say collective_seq_id {mine['seq']!r}; the first "
            f"one some member never enqueued is {real['seq']} (how far did each member get in "
            "this group? its pg_status[name]['last_enqueued_collective'] says, even when its "
            "ring buffer has dropped the entries; seq ids count per group, not positions in "
            "the entries).")
    for key in ("op", "waiting", "missing"):
        if mine[key] != real[key]:
            raise CheckFailure(
                f"{where}, collective {real['seq']}: your {key!r} is {mine[key]!r}; the dumps say "
                f"{real[key]!r} (waiting: the members that enqueued it; missing: the members "
                "of the group that did not, both sorted; a member has enqueued collective s "
                "when its pg_status[name]['last_enqueued_collective'] >= s, also when its ring "
                "buffer has dropped that entry).")


@ahead("distributed")
def _jobs_ahead(seed: int) -> None:
    for spec, _ in cases(seed, False) + cases(seed, True):
        oracle(_rank_program, spec["world"], spec)


@check(EXERCISE)
def one_group(diagnose, ctx):
    """the collective a 3-rank job hung in, from its ranks' dumps, whole and cut short"""
    _judge(diagnose, ctx.seed, hidden=False)


@check(EXERCISE, hidden=True)
def subgroups_and_a_short_buffer(diagnose, ctx):
    """4 ranks: seeded subgroups, a rank stuck before its subgroup's collective, a short buffer"""
    _judge(diagnose, ctx.seed, hidden=True)
