"""Checks of ``distributed.comm-hook``: ``fp16_hook(process_group, bucket)`` is a DDP
communication hook (``ddp.register_comm_hook(state, fp16_hook)``; ``process_group`` is that
state, None meaning the default group): it compresses the bucket's flat float32 gradients
(``bucket.buffer()``) to float16, divided by the group's size, all-reduces them without waiting
(``async_op=True``) and returns a ``torch.futures.Future`` whose value is the averaged gradients
back in the buffer's dtype and shape. DDP calls it from ``Reducer::run_comm_hook`` once per
bucket of a synced backward and copies the future's value into the ``.grad`` s
(``Reducer::finalize_backward``). torch's own is
torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py: fp16_compress_hook (_compress_hook).

The probe (:func:`labs.distributed.probes.comm_hook`) trains real ``DistributedDataParallel``
on gloo ranks with the answer registered (wrapped, to count and time its calls and keep its
futures), with gradient accumulation: each optimizer step runs ``k`` micro-batches, the first
``k - 1`` backwards under ``ddp.no_sync()``. The judge runs the same on ranks of its own with
torch's ``fp16_compress_hook`` (the oracle) and with no hook (DDP's float32 all-reduce) and
compares, backward by backward: the hook's calls (none under no_sync, one per bucket when
synced), the all-reduces they issued and their bytes (fp16_compress_hook's: half of the
default's), the futures' values (the buffer's dtype and shape), whether a call waited for its
all-reduce (one rank starts backward late: a hook that blocks holds its backward up that long),
and the gradients after each synced backward: equal on every rank and as close to
fp16_compress_hook's as fp16 allows (their root-mean-square difference at most 3 times that of
fp16_compress_hook's from the default's; a correct hook that divides before or after the
all-reduce, in float32 or float16, stays under 1.5, bfloat16 goes over 7)."""

from __future__ import annotations

import torch

from grader.checks import CheckFailure, ahead, check
from labs.distributed import probes
from labs.distributed.checks._oracles import oracle
from labs.distributed.models import mlp
from labs.distributed.probes import describe

EXERCISE = "distributed.comm-hook"
LR = 0.1
#: rows of each micro-batch per rank
ROWS = 4
#: seconds the last rank starts its first synced backward late in the public case: a hook that
#: waits for its all-reduce holds rank 0's hook call up that long
LATE = 0.5
#: how much more than fp16_compress_hook's own rounding error the answer's gradients may differ
#: from fp16_compress_hook's (root mean square; see the module's docstring)
SLACK = 3.0


def _rms(t: torch.Tensor) -> float:
    return float(t.double().square().mean().sqrt())


def _case(widths: list[int], g: torch.Generator, p: int, cap: float, steps: int, k: int,
          state: str, as_view: bool, late: float, frozen: list[int], what: str) -> dict:
    model = mlp(widths, g)
    spec = {"kind": "mlp", "widths": widths, "state": dict(model.state_dict()),
            "frozen": frozen}
    x = torch.randn(steps, k, p * ROWS, widths[0], generator=g)
    y = torch.randn(steps, k, p * ROWS, widths[-1], generator=g)
    return {"spec": spec, "p": p, "cap": cap, "x": x, "y": y, "state": state,
            "as_view": as_view, "late": late, "what": what}


def _public(seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [_case([16, 32, 32, 4], g, 2, 0.004, 3, 3, "none", False, LATE, [],
                  "Sequential(16 -> 32 -> 32 -> 4) on 2 ranks, bucket_cap_mb=0.004, 3 "
                  "micro-batches per step")]


def _hidden(seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    widths = [int(w) for w in torch.randint(12, 40, (5,), generator=g)]
    cap = float(torch.empty(()).uniform_(0.0008, 0.0016, generator=g))
    return [
        _case(widths, g, 3, cap, 3, 4, "world", False, 0.0, [1],
              f"a seeded MLP {widths} with layer 1 frozen on 3 ranks, bucket_cap_mb={cap:.4f}, "
              "4 micro-batches per step, registered with state=dist.group.WORLD"),
        _case(widths, g, 3, cap, 2, 2, "none", True, 0.0, [],
              f"the MLP {widths} on 3 ranks, bucket_cap_mb={cap:.4f}, "
              "gradient_as_bucket_view=True, 2 micro-batches per step"),
    ]


def _oracle_rank(spec: dict, cap: float, x: torch.Tensor, y: torch.Tensor, state: str,
                 as_view: bool) -> dict:
    """On every rank: the run :func:`~labs.distributed.probes.accumulate` makes with torch's
    fp16_compress_hook, and with no hook (DDP's own float32 all-reduce)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {"fp16": probes.accumulate(default_hooks.fp16_compress_hook, spec, cap, x, y, LR,
                                      state, as_view, 0.0),
            "default": probes.accumulate(None, spec, cap, x, y, LR, state, as_view, 0.0)}


def _oracle(case: dict):
    return oracle(_oracle_rank, case["p"], case["spec"], case["cap"], case["x"], case["y"],
                  case["state"], case["as_view"])


@ahead("distributed")
def _accumulated_ahead(seed: int) -> None:
    for case in _public(seed) + _hidden(seed):
        _oracle(case)


_KEYS = {"synced", "calls", "seconds", "values", "comms", "dtypes", "grads"}


def _backwards(ranks, p: int, n: int) -> list[list[dict]]:
    """Each rank's list of ``n`` backwards, from the probe's reply (a kernel can send back
    anything: one that is not what the shipped probe returns fails)."""
    shaped = (type(ranks) is list and len(ranks) == p
              and all(type(r) is dict and type(r.get("backwards")) is list
                      and len(r["backwards"]) == n for r in ranks)
              and all(type(b) is dict and set(b) == _KEYS
                      and all(type(b[key]) is list for key in ("calls", "seconds", "values"))
                      and len(b["calls"]) == len(b["seconds"]) == len(b["values"])
                      for r in ranks for b in r["backwards"]))
    if not shaped:
        raise CheckFailure("what came back from your answer is not what the grader's probe "
                           "returns (answers must not modify the grader).")
    return [r["backwards"] for r in ranks]


def _compare(fp16_hook, case: dict) -> None:
    real_run = _oracle(case)
    p, what, late = case["p"], case["what"], case["late"]
    steps, k = case["x"].shape[:2]
    seen = fp16_hook.probe(probes.comm_hook, case["spec"], case["cap"], p, case["x"],
                           case["y"], LR, case["state"], case["as_view"], late)
    mine = _backwards(probes.ranks_of(seen), p, steps * k)
    real = real_run.result()
    want, default = real[0]["fp16"]["backwards"], real[0]["default"]["backwards"]
    for i in range(steps * k):
        s, m = divmod(i, k)
        synced = m == k - 1
        label = (f"backward {i + 1} (step {s + 1}, micro-batch {m + 1} of {k}, "
                 f"{'synced' if synced else 'under ddp.no_sync()'})")
        got, fp16, plain = mine[0][i], want[i], default[i]
        calls = len(fp16["calls"])
        if got["calls"] != fp16["calls"]:
            raise CheckFailure(
                f"for {what}, in {label} DDP called your hook {len(got['calls'])} time(s) "
                f"(buckets {got['calls']}); with fp16_compress_hook it called it {calls} "
                f"time(s) (buckets {fp16['calls']}): once per bucket in a synced backward, "
                "never under no_sync.")
        counts: dict[str, int] = {}
        for kind, _ in got["comms"]:
            counts[kind] = counts.get(kind, 0) + 1
        if counts != ({"all_reduce": calls} if calls else {}):
            raise CheckFailure(
                f"for {what}, in {label} your hook's {calls} call(s) issued "
                f"{describe(counts)}: issue one all_reduce per call, of the whole bucket "
                "(bucket.buffer() compressed), as fp16_compress_hook does.")
        sent = sum(b for _, b in got["comms"])
        want_bytes = sum(b for _, b in fp16["comms"])
        if sent != want_bytes:
            full = sum(b for _, b in plain["comms"])
            dtypes = sorted(set(got["dtypes"]))
            why = (" That is what DDP's default float32 all-reduce moves: nothing was "
                   "compressed. All-reduce a float16 copy of the buffer (2 bytes an element), "
                   "not the buffer." if sent == full else
                   " The all-reduce must carry every element of the bucket, as float16.")
            raise CheckFailure(
                f"for {what}, in {label} your hook's all-reduces moved {sent} bytes "
                f"(tensors of {', '.join(dtypes) or 'no dtype'}); fp16_compress_hook's moved "
                f"{want_bytes}, half of the {full} bytes DDP's default all-reduce moves.{why}")
        if late and synced and s == 0 and max(got["seconds"], default=0.0) > LATE / 2:
            raise CheckFailure(
                f"for {what}, in {label} one call of your hook took "
                f"{max(got['seconds']):.2f} s on rank 0 while rank {p - 1} started its "
                f"backward {LATE} s late: the hook waited for its all-reduce (wait(), a "
                "blocking all_reduce, or a future's value read in the hook), which holds "
                "backward up until every rank has sent. Return at once: all-reduce with "
                "async_op=True and return work.get_future().then(...).")
        for value, right in zip(got["values"], fp16["values"]):
            if value != right:
                dtype, shape = value
                left16 = dtype in ("torch.float16", "torch.bfloat16") and shape == right[1]
                raise CheckFailure(
                    f"for {what}, in {label} your hook's future holds a {dtype} of shape "
                    f"{shape}; the bucket's buffer is a {right[0]} of shape {right[1]}, and "
                    "the future must hold the averaged buffer in that dtype and shape."
                    + (" DDP would cast it while copying it into the .grads "
                       "(Reducer::populate_bucket_views_out views the value, and each "
                       "grad.copy_(view) casts), so the gradients come out alike here; but "
                       "torch's hooks decompress into the bucket, and code run after a hook "
                       "relies on it (optimizer_overlap_hooks.py: _hook_then_optimizer steps "
                       "on bucket.gradients(), views into the buffer). Decompress in the "
                       ".then callback: copy the result into bucket.buffer() and return that."
                       if left16 else ""))
        if not synced:
            continue
        for r, rank in enumerate(mine):
            if rank[i]["grads"] is None:
                raise CheckFailure(f"for {what}, after {label} rank {r} has a parameter that "
                                   "requires grad with .grad None.")
        grads, oracle_grads, default_grads = got["grads"], fp16["grads"], plain["grads"]
        if not (isinstance(grads, torch.Tensor) and grads.shape == oracle_grads.shape):
            raise CheckFailure("what came back from your answer is not what the grader's "
                               "probe returns (answers must not modify the grader).")
        differ = [r for r, rank in enumerate(mine)
                  if not torch.allclose(rank[i]["grads"], grads)]
        if differ:
            raise CheckFailure(
                f"for {what}, after {label} rank {differ[0]} holds other gradients than rank "
                "0: every rank must end a synced backward with the same averaged gradients. "
                "Return the all-reduced values (fut.value()[0] in the .then callback), not "
                "the rank's own bucket.")
        unit = _rms(oracle_grads - default_grads)  # fp16's rounding, as fp16_compress_hook has it
        off = _rms(grads - oracle_grads)
        if off > SLACK * unit + 1e-12:
            summed = _rms(grads - p * oracle_grads) <= SLACK * p * unit + 1e-12
            why = (f" They are {p} times the average: the all-reduce sums, so divide by the "
                   "group's size (process_group.size(), dist.group.WORLD's when process_group "
                   "is None) before or after it." if summed else
                   f" Your hook all-reduced {', '.join(sorted(set(got['dtypes'])))}: compress "
                   "to torch.float16 (10 mantissa bits; bfloat16 keeps 7)."
                   if set(got["dtypes"]) != {"torch.float16"} else
                   " Average the bucket over the ranks: cast to float16, divide by the "
                   "group's size, all-reduce, and cast the result back.")
            raise CheckFailure(
                f"for {what}, after {label} your gradients differ from fp16_compress_hook's "
                f"by {off:.3g} (root mean square), {off / unit:.1f} times as much as "
                f"fp16_compress_hook's own differ from DDP's float32 all-reduce ({unit:.3g}: "
                f"fp16's rounding); at most {SLACK:g} times is fp16 precision.{why}")


@check(EXERCISE)
def two_ranks(fp16_hook, ctx):
    """real DDP on 2 ranks with your hook, gradient accumulation under no_sync, one rank late"""
    for case in _public(ctx.seed):
        _compare(fp16_hook, case)


@check(EXERCISE, hidden=True)
def three_ranks_more_buckets(fp16_hook, ctx):
    """3 ranks (1/3 is inexact in fp16), more buckets, a frozen layer, gradient_as_bucket_view"""
    for case in _hidden(ctx.seed):
        _compare(fp16_hook, case)
