"""Checks of ``modules.foreach-adamw``: ``ForeachAdamW(params, lr=1e-3, betas=(0.9, 0.999),
eps=1e-8, weight_decay=1e-2, amsgrad=False, maximize=False)``, a ``torch.optim.Optimizer``
whose ``step()`` updates each parameter group with ``torch._foreach_*`` ops over the group's
lists of tensors and leaves the parameters and the state bit for bit equal to
``torch.optim.AdamW(foreach=False)``'s after every step (torch/optim/adam.py:
_single_tensor_adam, the order of floating-point operations included), skipping parameters whose
grad is None, with AdamW's state per parameter (``step`` a 0-d float32 tensor, ``exp_avg``,
``exp_avg_sq``, ``max_exp_avg_sq`` with amsgrad), so that ``load_state_dict`` of a real AdamW's
``state_dict`` continues bit for bit.

Oracle: the same cases (:func:`labs.modules.probes.adamw_steps`: parameters, groups and
gradients built from the case's seed) run here on ``torch.optim.AdamW(foreach=False)``; the
probe returns the answer's parameters and state after each step. Public: one group, a few steps.
Hidden: seeded cases with several groups (their own lr, betas, eps, weight_decay), float32 and
float64 parameters, amsgrad and maximize, grads None on some steps; cases that continue from a
real AdamW's state_dict; and that the answer is foreach: the operators one step() runs
(:func:`labs.modules.probes.foreach_adamw_ops`, a TorchDispatchMode's count, reading a step with
``.item()`` not counted) must not grow with the number of parameters in a group, as a Python
loop over the parameters would make them."""

from __future__ import annotations

import functools
import json
import random

import torch

from grader.checks import CheckFailure, check, exact, paired, plain_tensor
from labs.modules import probes

EXERCISE = "modules.foreach-adamw"
#: the entries of AdamW's state per parameter, in the order they are compared
KEYS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
ORDER = (
    "Bit for bit means the same floating-point operations in the same order as "
    "torch/optim/adam.py: _single_tensor_adam (read it): the step counted before the bias "
    "corrections, which are Python floats from step.item(); the weight decay as "
    "param * (1 - lr * weight_decay) first; lerp_ for exp_avg; mul_ then addcmul_ for "
    "exp_avg_sq; sqrt, then / sqrt(bias_correction2), then + eps; addcdiv_ with value "
    "-lr / bias_correction1."
)


def torch_adamw(groups, **options):
    """The oracle: AdamW on its single-tensor path."""
    return torch.optim.AdamW(groups, foreach=False, **options)


@functools.lru_cache(maxsize=64)
def _expected(text: str) -> list[dict]:
    return probes.adamw_steps(torch_adamw, json.loads(text))


def expected(case: dict) -> list[dict]:
    """AdamW's snapshots for ``case`` (cached: the same cases come back across checks); for a
    resumed case, those of the whole run from where it resumes (AdamW continues from its own
    state_dict as if never stopped)."""
    resume = case.get("resume")
    plain = {k: v for k, v in case.items() if k != "resume"}
    return _expected(json.dumps(plain, sort_keys=True))[resume["after"] if resume else 0:]


def resumed(case: dict, after: int) -> dict:
    """``case`` made to continue at step ``after`` from a real AdamW's state_dict and
    parameters."""
    keep: list = []
    probes.adamw_steps(torch_adamw, {**case, "steps": after}, keep)
    opt, flat = keep
    return {**case, "resume": {"after": after, "params": [p.detach().clone() for p in flat],
                               "state_dict": opt.state_dict()}}


def ulps(mine: torch.Tensor, want: torch.Tensor) -> float:
    """The largest distance between ``mine`` and ``want`` in units in the last place of
    ``want``'s values."""
    big = torch.full_like(want, float("inf"))
    spacing = torch.nextafter(want.abs(), big) - want.abs()
    return ((mine - want).abs() / spacing).max().item()


def where(case: dict, i: int) -> str:
    """Parameter ``i`` of ``case`` in words: its group, dtype and shape."""
    at = i
    for g, group in enumerate(case["groups"]):
        if at < len(group["shapes"]):
            return (f"parameter {i} (group {g}, {group['dtypes'][at]}, shape "
                    f"{tuple(group['shapes'][at])})")
        at -= len(group["shapes"])
    return f"parameter {i}"


def _tensor(mine, want: torch.Tensor, what: str) -> None:
    if not isinstance(mine, torch.Tensor):
        raise CheckFailure(f"{what} is {mine!r}, not a tensor: AdamW keeps a "
                           f"{'0-d float32 tensor' if 'step' in what else 'tensor'} there.")
    mine = plain_tensor(mine, what)
    if mine.dtype != want.dtype or mine.shape != want.shape:
        raise CheckFailure(f"{what} is a {mine.dtype} tensor of shape {tuple(mine.shape)}; "
                           f"AdamW's is a {want.dtype} tensor of shape {tuple(want.shape)} "
                           "(state_dict and load_state_dict rely on that layout).")
    if torch.equal(mine, want):
        return
    if not torch.isfinite(mine).all():
        raise CheckFailure(f"{what} holds inf or nan; AdamW's holds finite values: is a bias "
                           "correction 1 - beta ** step computed with the step before it is "
                           "counted (it is 0 at the first step)?")
    diff = (mine.double() - want.double()).abs().max().item()
    units = ulps(mine, want)
    near = (" So close means the same formula in another order of operations. "
            if units < 1000 else " That is a different formula, not only another order. ")
    raise CheckFailure(f"{what} differs from torch.optim.AdamW(foreach=False)'s by up to "
                       f"{diff:.3g} ({units:.3g} ulps).{near}{ORDER}")


def judge(reply, cases: list[dict]) -> None:
    """Compare the answer's snapshots with AdamW's, case by case, step by step."""
    for case, runs in paired(cases, reply, "cases"):
        want = expected(case)
        first = case["resume"]["after"] if case.get("resume") else 0
        origin = " (resumed from AdamW's state_dict)" if first else ""
        for k, (exp, snap) in enumerate(paired(want, runs, "steps")):
            step = first + k + 1
            snap = exact(snap, dict, "a snapshot")
            mine_p = paired(exp["params"], snap.get("params"), "parameters")
            mine_s = paired(exp["state"], snap.get("state"), "parameters' states")
            for i, ((want_s, got_s), (want_p, got_p)) in enumerate(zip(mine_s, mine_p)):
                at = f"after step {step}{origin}, {where(case, i)}"
                got_s = exact(got_s, dict, f"the state of {where(case, i)}")
                if set(got_s) != set(want_s):
                    if not want_s:
                        raise CheckFailure(
                            f"{at} has state {sorted(got_s)}, but its grad has been None at "
                            "every step so far: AdamW skips such a parameter and makes no "
                            "state for it.")
                    raise CheckFailure(f"{at} has state {sorted(got_s)}; AdamW keeps "
                                       f"{sorted(want_s)} (keyed as AdamW's, so that "
                                       "load_state_dict works both ways).")
                for key in (k for k in KEYS if k in want_s):
                    _tensor(got_s[key], want_s[key], f"{at}: state['{key}']")
                _tensor(got_p, want_p, f"{at}: the parameter")


def _case(rng: random.Random, seed: int, amsgrad: bool, maximize: bool) -> dict:
    groups = []
    for _ in range(rng.randint(2, 3)):
        n = rng.randint(1, 3)
        group = {"shapes": [[rng.randint(1, 4)] * rng.randint(0, 2) for _ in range(n)],
                 "dtypes": [rng.choice(["float32", "float64"]) for _ in range(n)]}
        if rng.random() < 0.7:
            group["lr"] = rng.choice([1e-3, 3e-3, 1e-2, 0.1])
        if rng.random() < 0.6:
            group["weight_decay"] = rng.choice([0.0, 1e-2, 0.1])
        if rng.random() < 0.5:
            group["betas"] = [rng.choice([0.8, 0.9, 0.95]), rng.choice([0.99, 0.999])]
        if rng.random() < 0.3:
            group["eps"] = rng.choice([1e-6, 1e-8])
        groups.append(group)
    total = sum(len(g["shapes"]) for g in groups)
    steps = rng.randint(3, 6)
    none = [sorted(rng.sample(range(total), rng.randint(0, total // 2))) for _ in range(steps)]
    return {"seed": seed, "groups": groups, "steps": steps, "none": none,
            "options": {"lr": 0.01, "amsgrad": amsgrad, "maximize": maximize}}


PUBLIC = {"seed": 0, "groups": [{"shapes": [[3], [2, 3], []],
                                 "dtypes": ["float32", "float32", "float32"]}],
          "options": {"lr": 0.01}, "steps": 4}


@check(EXERCISE)
def one_group(ForeachAdamW, ctx):
    """one group of float32 parameters, four steps, against AdamW(foreach=False)"""
    case = {**PUBLIC, "seed": ctx.seed}
    judge(ForeachAdamW.probe(probes.foreach_adamw, [case]), [case])


@check(EXERCISE, hidden=True)
def seeded_groups(ForeachAdamW, ctx):
    """several groups, float32 and float64, amsgrad and maximize, grads None on some steps"""
    rng = random.Random(ctx.seed)
    flags = [(False, False), (True, False), (False, True), (True, True)]
    cases = [_case(rng, ctx.seed * 10 + i, a, m) for i, (a, m) in enumerate(flags)]
    judge(ForeachAdamW.probe(probes.foreach_adamw, cases), cases)


@check(EXERCISE, hidden=True)
def from_a_state_dict(ForeachAdamW, ctx):
    """continues bit for bit from a real AdamW's state_dict"""
    rng = random.Random(ctx.seed + 1)
    cases = []
    for i, amsgrad in enumerate((False, True)):
        case = _case(rng, ctx.seed * 10 + 7 + i, amsgrad, False)
        case["steps"] += 2
        cases.append(resumed(case, rng.randint(2, case["steps"] - 1)))
    judge(ForeachAdamW.probe(probes.foreach_adamw, cases), cases)


@check(EXERCISE, hidden=True)
def foreach(ForeachAdamW, ctx):
    """one step() runs as many operators for 8 parameters as for 2: no Python loop over them"""
    sizes = [2, 8]
    counts = []
    for n, calls in paired(sizes, ForeachAdamW.probe(probes.foreach_adamw_ops, sizes),
                           "group sizes"):
        calls = exact(calls, dict, "the operators counted")
        counts.append({str(k): v for k, v in calls.items() if k not in probes.ADAMW_READS
                       and type(v) is int})
    few, many = (sum(c.values()) for c in counts)
    if not any("_foreach_" in name for name in counts[1]):
        raise CheckFailure(f"one step() on a group of {sizes[1]} parameters ran no "
                           "torch._foreach_* operator; update the group's lists of tensors "
                           "with torch._foreach_* ops (torch/optim/adam.py: _multi_tensor_adam "
                           "shows them).")
    if many > few:
        grew = sorted(name for name in counts[1] if counts[1][name] > counts[0].get(name, 0))
        raise CheckFailure(
            f"one step() ran {few} operators on a group of {sizes[0]} parameters and {many} on "
            f"a group of {sizes[1]} (more calls of {', '.join(grew[:6])}): a Python loop over "
            "the parameters does the arithmetic. Each torch._foreach_* op takes the whole "
            "list at once; only reading a step with .item() is not counted.")
