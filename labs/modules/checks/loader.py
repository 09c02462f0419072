"""Checks of ``modules.loader``: ``MiniLoader(dataset, batch_size=1, shuffle=False,
num_workers=0, generator=None, worker_init_fn=None, drop_last=False, prefetch_factor=2)``, whose
``len()`` and ``iter()`` (each a new epoch) give what ``torch.utils.data.DataLoader`` with the
same arguments gives: the same batches (default_collate) in the same order, including the
random numbers the dataset draws in the workers, which only match when each worker is seeded as
DataLoader seeds it (torch and random with base_seed + worker_id, the base seed drawn from the
loader's generator when the epoch starts, before the sampler draws:
torch/utils/data/dataloader.py: _BaseDataLoaderIter.__init__; _utils/worker.py: _worker_loop),
``worker_init_fn(worker_id)`` runs after the seeding, and batch k goes to worker
k % num_workers (_MultiProcessingDataLoaderIter._try_put_index); batches come back in order
although workers finish out of order (_rcvd_idx, _task_info); an exception raised by the
dataset in a worker is raised again in the main process, of the same type and with the original
message, at that batch's turn; and no process the loader started outlives its iterator (run out,
raised, or dropped early and garbage-collected).

Oracle: the same cases (:func:`labs.modules.probes.run_loader_case`: the dataset, keywords and
seeds built from plain data) run here on DataLoader. The probe reports ``len()``, each epoch's
batches and what it raised, how many processes were left alive (which it killed) and whether the
case ran past its deadline. Public: batches with no workers and shuffled with two; in order
although a worker finishes late; an error in a worker, and an iterator dropped early. Hidden:
seeded sizes, batch sizes, drop_last, shuffle with and without a generator, 0 to 3 workers,
prefetch 1 to 3, two epochs; errors of several types at seeded items and iterators dropped at
seeded points."""

from __future__ import annotations

import functools
import json
import multiprocessing
import random

import torch
from torch.utils.data import DataLoader

from grader.checks import CheckFailure, check, exact, paired, plain_tensor
from labs.modules import probes

EXERCISE = "modules.loader"
FIELDS = ("index", "torch", "random", "worker")
SEEDING = (
    "Seed each worker as DataLoader does (torch/utils/data/_utils/worker.py: _worker_loop): "
    "random.seed and torch.manual_seed with base_seed + worker_id, then worker_init_fn(worker_id) "
    "if given; base_seed is drawn once per epoch from the loader's generator (or torch's global "
    "one) when the epoch starts, before the sampler draws its permutation "
    "(dataloader.py: _BaseDataLoaderIter.__init__), also with no workers; and hand batch k to "
    "worker k % num_workers (_try_put_index), each worker fetching its batches in the order it "
    "gets them."
)


def torch_loader(dataset, **kwargs):
    """The oracle: DataLoader with the same arguments, its workers forked (as the learner's
    kernel forks them) where fork exists: a batch grading's judges run in processes started by
    spawn, whose default would start each worker as a new interpreter importing torch (seconds
    each)."""
    if kwargs.get("num_workers") and "fork" in multiprocessing.get_all_start_methods():
        kwargs["multiprocessing_context"] = "fork"
    return DataLoader(dataset, **kwargs)


@functools.lru_cache(maxsize=64)
def _expected(text: str) -> dict:
    found = probes.run_loader_case(torch_loader, json.loads(text))
    if found["stuck"] or found["leftover"]:  # (the grader's fault, never the learner's)
        raise RuntimeError(
            f"the grader's own DataLoader did not finish {text} within "
            f"{probes.LOADER_DEADLINE:.0f} s or left workers behind, on an overloaded machine: "
            "this says nothing of your answer; grade again with fewer jobs")
    return found


def expected(case: dict) -> dict:
    """What DataLoader gives for ``case`` (cached: the same cases come back across runs)."""
    return _expected(json.dumps(case, sort_keys=True))


def args(case: dict) -> str:
    """The case's loader as a call, in words."""
    kw = probes.loader_kwargs(case)
    shown = [f"{k}={v}" for k, v in kw.items() if k not in ("generator", "worker_init_fn")]
    if "generator" in kw:
        shown.append("generator=<seeded>")
    if "worker_init_fn" in kw:
        shown.append("worker_init_fn=<set>")
    return f"MiniLoader(<{case['n']} items>, {', '.join(shown)})"


def _batch(mine, want: dict, what: str) -> dict:
    if type(mine) is not dict or set(mine) != set(want):
        kind = (f"a dict with keys {sorted(mine)}" if type(mine) is dict
                else f"a {type(mine).__name__}")
        raise CheckFailure(f"{what} is {kind}; DataLoader's is a dict of tensors with keys "
                           f"{sorted(want)}: collate each batch with default_collate.")
    return {k: plain_tensor(mine[k], f"{what}['{k}']") for k in want}


def _compare_epoch(case: dict, e: int, mine: dict, want: dict) -> None:
    call = args(case)
    mine = exact(mine, dict, f"epoch {e}")
    got = mine.get("batches")
    want_r, got_r = want["raised"], mine.get("raised")
    if want_r and not got_r and type(got) is list and len(got) >= len(want["batches"]):
        raise CheckFailure(f"after its first {len(want['batches'])} batches, epoch {e} of {call} "
                           f"should raise the {want_r['ename']} the dataset raised in a worker "
                           f"(\"item {case.get('fail')} of the dataset is unreadable\"); yours "
                           f"gave {len(got)} batches and no error. Send what a worker's fetch "
                           "raised back in the batch's place, and raise it again in the main "
                           "process at that batch's turn.")
    if type(got) is list and len(got) != len(want["batches"]):
        n, m = len(got), len(want["batches"])
        r = mine.get("raised")
        if r and not want["raised"]:
            raise CheckFailure(f"iterating {call}, epoch {e} raised {r.get('ename')}: "
                               f"{str(r.get('evalue'))[:300]}{r.get('where', '')} after {n} "
                               f"batches; DataLoader gives {m} batches.")
        raise CheckFailure(f"epoch {e} of {call} gave {n} batches before it "
                           f"{'raised' if r else 'ended'}; DataLoader's gives {m}"
                           + (" (drop_last drops a short last batch)" if case.get("drop_last")
                              else "") + ".")
    batches = paired(want["batches"], got, "batches")
    for k, (want_b, got_b) in enumerate(batches):
        what = f"batch {k} of epoch {e} of {call}"
        got_b = _batch(got_b, want_b, what)
        if not torch.equal(got_b["index"], want_b["index"]):
            got_i, want_i = got_b["index"].tolist(), want_b["index"].tolist()
            later = [b[0]["index"].tolist() for b in batches[k + 1:]]
            if got_i in later:
                why = (" It is a later batch: yield the batches in the order they were sent, "
                       "whatever order the workers finish them in (DataLoader keeps a batch "
                       "that comes early in _task_info until _rcvd_idx reaches it).")
            elif case.get("shuffle"):
                why = (" With shuffle=True the batches follow the sampler's permutation; "
                       "DataLoader draws its base seed from the same generator first, when "
                       "the epoch starts (_BaseDataLoaderIter.__init__), also with no workers.")
            else:
                why = ""
            raise CheckFailure(f"{what} holds the items {got_i}; DataLoader's holds "
                               f"{want_i}.{why}")
        for field in FIELDS[1:]:
            g, w = got_b[field], want_b[field]
            if g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w):
                continue
            if field == "worker":
                how = ("call worker_init_fn(worker_id) in each worker, with its id, after "
                       "seeding it" if case.get("num_workers") else "DataLoader calls "
                       "worker_init_fn only in workers, never in the main process")
                raise CheckFailure(f"in {what}, worker_init_fn recorded the worker ids "
                                   f"{g.tolist()} (-1: none ran there); under DataLoader "
                                   f"{w.tolist()}: {how}.")
            source = "torch's generator" if field == "torch" else "Python's random"
            why = SEEDING if case.get("num_workers") else (
                "With no workers the dataset draws from this process's generators, which "
                "nothing reseeds: only what the loader itself draws in between can differ. "
                "DataLoader draws a base seed (one int64 from the loader's generator, or "
                "torch's global one) at every iter(), workers or not "
                "(dataloader.py: _BaseDataLoaderIter.__init__).")
            raise CheckFailure(f"in {what}, the numbers the items drew from {source} differ "
                               f"from those they draw under DataLoader. {why}")
    if got_r and not want_r:
        got_r = exact(got_r, dict, "what your loader raised")
        raise CheckFailure(f"after its {len(batches)} batches, epoch {e} of {call} raised "
                           f"{got_r.get('ename')}: {str(got_r.get('evalue'))[:300]}"
                           f"{got_r.get('where', '')}; DataLoader's epoch ends there.")
    if want_r:
        got_r = exact(got_r, dict, "what your loader raised")
        text = f"item {case.get('fail')} of the dataset is unreadable"
        if got_r.get("ename") != want_r["ename"] or text not in str(got_r.get("evalue")):
            raise CheckFailure(
                f"epoch {e} of {call} raised {got_r.get('ename')}: "
                f"{str(got_r.get('evalue'))[:300]}{got_r.get('where', '')}; DataLoader raises "
                f"the dataset's {want_r['ename']} again in the main process, with the original "
                f"message (\"{text}\") in its own: raise the same type, the message in it.")


def judge(reply, cases: list[dict]) -> None:
    """Compare what the answer's loader gave with DataLoader's, case by case."""
    for case, mine in paired(cases, reply, "cases"):
        want = expected(case)
        mine = exact(mine, dict, "a case's result")
        call = args(case)
        if mine.get("stuck"):
            why = ("does the main process wait for a batch no worker will send?"
                   if case.get("num_workers") else "with no workers, every batch is fetched "
                   "in this process: is there a loop that never ends?")
            raise CheckFailure(f"{call} was still running after {probes.LOADER_DEADLINE:.0f} s "
                               "(DataLoader takes a fraction of a second), and the check "
                               f"stopped it: {why}")
        if mine.get("len") != want["len"]:
            raise CheckFailure(f"len({call}) is {mine.get('len')}; DataLoader's is "
                               f"{want['len']}: the number of batches"
                               + (", without a short last one (drop_last)"
                                  if case.get("drop_last") else ", a short last one included")
                               + ".")
        epochs = paired(want["epochs"], mine.get("epochs"), "epochs")
        for e, (want_e, mine_e) in enumerate(epochs):
            _compare_epoch(case, e, mine_e, want_e)
        if mine.get("leftover"):
            after = ("it raised" if want["epochs"][-1]["raised"] else
                     f"{case['abandon']} batches" if case.get("abandon") else "its epochs")
            raise CheckFailure(
                f"{mine['leftover']} process(es) that {call} started were still alive "
                f"{probes.LOADER_GRACE:g} s after its iterator was dropped (after {after}) "
                "and garbage-collected; the check killed them. Stop the workers when an epoch "
                "runs out, and when its iterator is dropped early or after an error (a __del__ "
                "that shuts them down, as _MultiProcessingDataLoaderIter._shutdown_workers "
                "does).")


def _seeded_case(rng: random.Random, seed: int, workers: int) -> dict:
    n = rng.randint(5, 11)
    case = {"seed": seed, "n": n, "batch_size": rng.randint(1, 4), "shuffle": rng.random() < 0.7,
            "num_workers": workers, "drop_last": rng.random() < 0.4,
            "generator": rng.randint(0, 10**6) if rng.random() < 0.5 else None,
            "init": workers > 0 and rng.random() < 0.6,
            "sleep": {str(i): rng.choice([5, 15, 30]) for i in rng.sample(range(n), 2)}}
    if workers:
        case["prefetch_factor"] = rng.randint(1, 3)
    return case


@check(EXERCISE)
def batches(MiniLoader, ctx):
    """batches as DataLoader's: in order with no workers, shuffled with two"""
    cases = [
        {"seed": ctx.seed, "n": 7, "batch_size": 3, "num_workers": 0},
        {"seed": ctx.seed + 1, "n": 10, "batch_size": 3, "shuffle": True, "num_workers": 2,
         "generator": ctx.seed, "drop_last": True, "init": True, "prefetch_factor": 2},
    ]
    judge(MiniLoader.probe(probes.loader_runs, cases), cases)


@check(EXERCISE)
def in_order(MiniLoader, ctx):
    """in order although the first batch's worker finishes last"""
    cases = [{"seed": ctx.seed, "n": 8, "batch_size": 2, "num_workers": 2, "prefetch_factor": 2,
              "sleep": {"0": 80}}]
    judge(MiniLoader.probe(probes.loader_runs, cases), cases)


@check(EXERCISE)
def errors_and_exits(MiniLoader, ctx):
    """an error in a worker is raised again, and no worker outlives its iterator"""
    cases = [
        {"seed": ctx.seed, "n": 8, "batch_size": 2, "num_workers": 2, "fail": 5,
         "error": "UnreadableItem"},
        {"seed": ctx.seed + 1, "n": 12, "batch_size": 2, "num_workers": 2, "abandon": 2},
    ]
    judge(MiniLoader.probe(probes.loader_runs, cases), cases)


@check(EXERCISE, hidden=True)
def seeded_loaders(MiniLoader, ctx):
    """seeded sizes, batch sizes, drop_last, shuffle, 0 to 3 workers, prefetch 1 to 3"""
    rng = random.Random(ctx.seed)
    cases = [_seeded_case(rng, ctx.seed * 10 + w, w) for w in (0, 1, 3)]
    cases.append({**_seeded_case(rng, ctx.seed * 10 + 5, 2), "shuffle": True, "epochs": 2})
    judge(MiniLoader.probe(probes.loader_runs, cases), cases)


@check(EXERCISE, hidden=True)
def seeded_errors(MiniLoader, ctx):
    """errors of several types at seeded items; iterators dropped at seeded points"""
    rng = random.Random(ctx.seed + 1)
    cases = []
    for workers in (0, 2):
        case = _seeded_case(rng, ctx.seed * 10 + 7 + workers, workers)
        case.update(drop_last=False, fail=rng.randrange(case["n"]),
                    error=rng.choice(sorted(probes.LOADER_ERRORS)))
        cases.append(case)
    case = _seeded_case(rng, ctx.seed * 10 + 9, 2)
    case["abandon"] = rng.randint(1, max(1, case["n"] // case["batch_size"] - 1))
    cases.append(case)
    judge(MiniLoader.probe(probes.loader_runs, cases), cases)
