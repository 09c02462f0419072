"""Checks of ``export.cond``: ``Gate(width)``, an ``nn.Module`` with the submodules ``up`` and
``down`` of ``models.GateEager(width)`` (so ``gate.load_state_dict(eager.state_dict())`` works),
computes what ``GateEager`` computes, ``relu(up(x))`` when ``x.sum() > 0`` and ``down(x) * 2``
otherwise, with ``torch.cond`` instead of a Python ``if``, so that ``torch.export.export`` takes
it both strict (``strict=True``, TorchDynamo) and non-strict. Each exported program must keep the
branch as a ``torch.ops.higher_order.cond`` node (both branches in the graph, chosen when the
program runs) and match eager ``GateEager`` on inputs that take either branch (and on a sum of
exactly 0: the ``else`` branch), also with a dynamic batch ``Dim``. The oracle is
``GateEager``, run eagerly here with the same weights; the answer runs and is exported in
the kernel (the probe :func:`labs.export.probes.gate_runs`, given GateEager's state dict and the
inputs), which reports its outputs, what export said and the program's node targets.
(torch/_higher_order_ops/cond.py: cond, CondOp; torch/export/_trace.py: _export.)
"""

from __future__ import annotations

import torch
from torch import nn

from grader.checks import CheckFailure, check
from labs.export import models, probes

EXERCISE = "export.cond"
#: lines of torch's errors that point at logs, docs and internals, not at the cause
_NOISE = ("For more", "For extended logs", "If you suspect", "For C++", "Set TORCHDYNAMO",
          "The error above occurred", "consider using data-dependent", "Caused by:",
          "Developer debug context", "from user code:", "^", "The branch condition involves")


def torch_says(error: dict, limit: int = 450) -> str:
    """Torch's explanation in ``error`` (``{"ename", "text"}``, what a probe saw raised), on one
    line and short: without the lines that point at logs, docs and torch's own frames,
    duplicates removed."""
    lines: list[str] = []
    skip_code = False
    for line in error["text"].splitlines():
        line = line.strip()
        if skip_code:  # (the source line under a frame of torch's own)
            skip_code = False
            continue
        if line.startswith("# File") or (line.startswith('File "') and "/site-packages/" in line):
            skip_code = True
            continue
        if (not line or line.startswith(_NOISE) or "http" in line or line in lines
                or (line.startswith("Hint:") and "torch.cond" not in line)):
            continue
        lines.append(line)
    said = " ".join(lines).rstrip(".")
    said = said if len(said) <= limit else said[: limit - 3] + "..."
    return f"{error['ename']}: {said}"


def _seeded(module: nn.Module, g: torch.Generator) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def _pair(seen: dict, width: int) -> None:
    """Gate is an nn.Module class and Gate(width) took GateEager(width)'s state dict."""
    if seen["module"]:
        raise CheckFailure(f"Gate is {seen['module']}; define a class "
                           "Gate(nn.Module) whose instances are built as Gate(width).")
    if seen["load"]:
        raise CheckFailure(
            f"Gate({width}).load_state_dict(GateEager({width}).state_dict()) raised "
            f"RuntimeError: {seen['load']} ... Gate must hold the submodules of GateEager, "
            "nn.Linear(width, width) named up and down, and no other parameters or buffers.")


def _signs(width: int, batch: int, g: torch.Generator) -> list[tuple[torch.Tensor, str]]:
    """x and -x (one sums above 0, the other below), each with which branch it takes."""
    x = torch.randn(batch, width, generator=g)
    out = []
    for v in (x, -x):
        s = float(v.sum())
        out.append((v, f"x of shape {tuple(v.shape)} with x.sum() = {s:.3f}"
                       + (" > 0 (relu(up(x)))" if s > 0 else " <= 0 (down(x) * 2)")))
    return out


def _zero_sum(width: int, batch: int, g: torch.Generator) -> tuple[torch.Tensor, str]:
    """Whole numbers summing to exactly 0 (every partial sum is exact in float32)."""
    x = torch.randint(-4, 5, (batch, width), generator=g).float()
    x[-1, -1] -= x.sum()
    return x, (f"x of shape {tuple(x.shape)} with x.sum() == 0 exactly (the else branch, "
               "down(x) * 2: GateEager tests x.sum() > 0)")


def _same(got, want: torch.Tensor, what: str, who: str) -> None:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else got["type"]
        raise CheckFailure(f"{who} returned {shape} for {what}; GateEager returns "
                           f"{tuple(want.shape)}.")
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise CheckFailure(
            f"{who} differs from GateEager for {what}: max abs difference "
            f"{float((got - want).abs().max()):.3g}. Check the predicate (x.sum() > 0, a 0-d "
            "bool tensor), which branch is true_fn (relu(up(x))) and false_fn (down(x) * 2), "
            "and that each branch uses its own submodule.")


def _eager(seen: dict, eager, cases, width: int) -> None:
    for got, (x, what) in zip(seen["eager"], cases, strict=True):
        with torch.no_grad():
            _same(got, eager(x), what, f"Gate({width}) run eagerly")


def _call(strict: bool, dynamic: bool, width: int) -> str:
    mode = "strict=True (TorchDynamo traces the bytecode)" if strict else (
        "strict=False (non-strict: Python runs forward on fake tensors)")
    return (f"export(Gate({width}), (x,), {mode}"
            + (', dynamic_shapes={"x": (Dim("batch"), Dim.STATIC)})' if dynamic else ")"))


def _export(run: dict, call: str) -> None:
    """The export in the kernel worked and kept a cond node."""
    if run["error"] is not None:
        fix = ("Making a Python bool of a tensor's value (an if, bool()) asks export to pick "
               "one branch while it traces, which it refuses: route with torch.cond(pred, "
               "true_fn, false_fn, (x,)), pred the 0-d bool tensor itself"
               if "data-dependent" in run["error"]["text"].lower() else
               "torch.cond takes a 0-d bool tensor as pred and two functions of the operands "
               "that return tensors of the same shape and dtype")
        raise CheckFailure(f"{call} raised {torch_says(run['error'])}. {fix}.")
    if not any(is_cond for _, is_cond in run["targets"]):
        ops = {name for name, _ in run["targets"]}
        why = ("It computes torch.where, which runs both branches on every input and then picks "
               "elementwise: the numbers agree, but the exercise is to branch, running only the "
               "branch the predicate picks" if any(o.startswith("where") for o in ops) else
               "The branch was traced away: the predicate was already known (a Python bool, or "
               "a value of the example input) when export traced forward, so torch.cond was "
               "specialized to one branch. Make the predicate a 0-d bool tensor computed from x "
               "(x.sum() > 0)")
        raise CheckFailure(f"the program from {call} has no torch.ops.higher_order.cond node "
                           f"(its ops: {', '.join(sorted(ops))}). {why}.")


def _program(run: dict, eager, cases, call: str) -> None:
    for i, (x, what) in enumerate(cases):
        got = run["outputs"][i] if i < len(run["outputs"]) else None
        if got is None or isinstance(got, dict) and "error" in got:
            said = torch_says(got["error"], 200) if got else "nothing"
            raise CheckFailure(f"the program from {call} raised {said} for {what}.")
        with torch.no_grad():
            _same(got, eager(x), what, f"the program from {call}")


def verify(Gate, eager: nn.Module, width: int, eager_cases: list, cases: list,
           dynamic: bool) -> None:
    """Gate(width) with ``eager``'s state (GateEager(width), seeded weights) in the kernel, run
    eagerly on ``eager_cases``, exported strict and non-strict (with a dynamic batch when
    ``dynamic``) from ``cases[0]`` and run on ``cases``; compare with ``eager`` here."""
    exports = [[strict, dynamic] for strict in (True, False)]
    seen = Gate.probe(probes.gate_runs, width, dict(eager.state_dict()),
                      [x for x, _ in eager_cases], exports, [x for x, _ in cases])
    _pair(seen, width)
    _eager(seen, eager, eager_cases, width)
    for (strict, _), run in zip(exports, seen["exports"]):
        call = _call(strict, dynamic, width)
        _export(run, call)
        _program(run, eager, cases, call)


@check(EXERCISE)
def gate_8(Gate, ctx):
    """Gate(8) matches GateEager eagerly and exports strict and non-strict with a cond node"""
    g = ctx.generator()
    eager = _seeded(models.GateEager(8), g)
    cases = _signs(8, 4, g)
    verify(Gate, eager, 8, cases, cases, False)


@check(EXERCISE, hidden=True)
def seeded_widths(Gate, ctx):
    """Seeded widths and batches, a sum of exactly 0, exported with a dynamic batch Dim"""
    g = ctx.generator(1)
    width = int(torch.randint(3, 25, (), generator=g))
    batch = int(torch.randint(2, 9, (), generator=g))
    eager = _seeded(models.GateEager(width), g)
    eager_cases = _signs(width, batch, g) + [_zero_sum(width, batch, g)]
    other = int(torch.randint(1, 17, (), generator=g))
    cases = eager_cases + _signs(width, other, g) + [_zero_sum(width, other + 1, g)]
    verify(Gate, eager, width, eager_cases, cases, True)
