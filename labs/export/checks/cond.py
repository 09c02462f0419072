"""Checks of ``export.cond``: ``Gate(width)``, an ``nn.Module`` with the submodules ``up`` and
``down`` of ``models.GateEager(width)`` (so ``gate.load_state_dict(eager.state_dict())`` works),
computes what ``GateEager`` computes, ``relu(up(x))`` when ``x.sum() > 0`` and ``down(x) * 2``
otherwise, with ``torch.cond`` instead of a Python ``if``, so that ``torch.export.export`` takes
it both strict (``strict=True``, TorchDynamo) and non-strict. Each exported program must keep the
branch as a ``torch.ops.higher_order.cond`` node (both branches in the graph, chosen when the
program runs) and match eager ``GateEager`` on inputs that take either branch (and on a sum of
exactly 0: the ``else`` branch), also with a dynamic batch ``Dim``. The oracle is
``GateEager``, run eagerly with the same weights.
(torch/_higher_order_ops/cond.py: cond, CondOp; torch/export/_trace.py: _export.)
"""

from __future__ import annotations

import contextlib
import io

import torch
from torch import nn
from torch.export import Dim, export

from grader.checks import CheckFailure, check
from labs.export import models

EXERCISE = "export.cond"
#: lines of torch's errors that point at logs, docs and internals, not at the cause
_NOISE = ("For more", "For extended logs", "If you suspect", "For C++", "Set TORCHDYNAMO",
          "The error above occurred", "consider using data-dependent", "Caused by:",
          "Developer debug context", "from user code:", "^", "The branch condition involves")


def torch_says(exc: BaseException, limit: int = 450) -> str:
    """Torch's explanation in ``exc``, on one line and short: without the lines that point at
    logs, docs and torch's own frames, duplicates removed."""
    lines: list[str] = []
    skip_code = False
    for line in str(exc).splitlines():
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
    return f"{type(exc).__name__}: {said}"


def _seeded(module: nn.Module, g: torch.Generator) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def _pair(Gate, width: int, g: torch.Generator) -> tuple[nn.Module, nn.Module]:
    """GateEager(width) with seeded weights, and Gate(width) loaded with its state."""
    if not (isinstance(Gate, type) and issubclass(Gate, nn.Module)):
        raise CheckFailure(f"Gate is {type(Gate).__name__} {Gate!r:.60}; define a class "
                           "Gate(nn.Module) whose instances are built as Gate(width).")
    eager = _seeded(models.GateEager(width), g)
    gate = Gate(width)
    try:
        gate.load_state_dict(eager.state_dict())
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0][:200]
        raise CheckFailure(
            f"Gate({width}).load_state_dict(GateEager({width}).state_dict()) raised "
            f"RuntimeError: {first} ... Gate must hold the submodules of GateEager, nn.Linear("
            f"width, width) named up and down, and no other parameters or buffers.") from None
    return gate, eager


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
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailure(f"{who} returned {shape} for {what}; GateEager returns "
                           f"{tuple(want.shape)}.")
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise CheckFailure(
            f"{who} differs from GateEager for {what}: max abs difference "
            f"{float((got - want).abs().max()):.3g}. Check the predicate (x.sum() > 0, a 0-d "
            "bool tensor), which branch is true_fn (relu(up(x))) and false_fn (down(x) * 2), "
            "and that each branch uses its own submodule.")


def _eager(gate, eager, cases, width: int) -> None:
    for x, what in cases:
        with torch.no_grad():
            _same(gate(x.clone()), eager(x), what, f"Gate({width}) run eagerly")


def _export(gate, x: torch.Tensor, strict: bool, dynamic: bool, width: int):
    mode = "strict=True (TorchDynamo traces the bytecode)" if strict else (
        "strict=False (non-strict: Python runs forward on fake tensors)")
    ds = {"x": (Dim("batch"), Dim.STATIC)} if dynamic else None
    call = (f"export(Gate({width}), (x,), {mode}"
            + (', dynamic_shapes={"x": (Dim("batch"), Dim.STATIC)})' if dynamic else ")"))
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ep = export(gate, (x,), strict=strict, dynamic_shapes=ds)  # (torch prints graphs)
    except Exception as exc:  # noqa: BLE001  (torch's reason is the learner's lesson)
        fix = ("Making a Python bool of a tensor's value (an if, bool()) asks export to pick "
               "one branch while it traces, which it refuses: route with torch.cond(pred, "
               "true_fn, false_fn, (x,)), pred the 0-d bool tensor itself"
               if "data-dependent" in str(exc).lower() else
               "torch.cond takes a 0-d bool tensor as pred and two functions of the operands "
               "that return tensors of the same shape and dtype")
        raise CheckFailure(f"{call} raised {torch_says(exc)}. {fix}.") from None
    conds = [n for n in ep.graph.nodes if n.target is torch.ops.higher_order.cond]
    if not conds:
        ops = {getattr(n.target, "__name__", str(n.target)) for n in ep.graph.nodes
               if n.op == "call_function"}
        why = ("It computes torch.where, which runs both branches on every input and then picks "
               "elementwise: the numbers agree, but the exercise is to branch, running only the "
               "branch the predicate picks" if any(o.startswith("where") for o in ops) else
               "The branch was traced away: the predicate was already known (a Python bool, or "
               "a value of the example input) when export traced forward, so torch.cond was "
               "specialized to one branch. Make the predicate a 0-d bool tensor computed from x "
               "(x.sum() > 0)")
        raise CheckFailure(f"the program from {call} has no torch.ops.higher_order.cond node "
                           f"(its ops: {', '.join(sorted(ops))}). {why}.")
    return ep, call


def _program(ep, eager, cases, call: str) -> None:
    program = ep.module()
    for x, what in cases:
        try:
            got = program(x.clone())
        except Exception as exc:  # noqa: BLE001
            raise CheckFailure(f"the program from {call} raised {torch_says(exc, 200)} for "
                               f"{what}.") from None
        with torch.no_grad():
            _same(got.detach() if isinstance(got, torch.Tensor) else got, eager(x), what,
                  f"the program from {call}")


@check(EXERCISE)
def gate_8(Gate, ctx):
    """Gate(8) matches GateEager eagerly and exports strict and non-strict with a cond node"""
    g = ctx.generator()
    gate, eager = _pair(Gate, 8, g)
    cases = _signs(8, 4, g)
    _eager(gate, eager, cases, 8)
    for strict in (True, False):
        ep, call = _export(gate, cases[0][0], strict, False, 8)
        _program(ep, eager, cases, call)


@check(EXERCISE, hidden=True)
def seeded_widths(Gate, ctx):
    """Seeded widths and batches, a sum of exactly 0, exported with a dynamic batch Dim"""
    g = ctx.generator(1)
    width = int(torch.randint(3, 25, (), generator=g))
    batch = int(torch.randint(2, 9, (), generator=g))
    gate, eager = _pair(Gate, width, g)
    cases = _signs(width, batch, g) + [_zero_sum(width, batch, g)]
    _eager(gate, eager, cases, width)
    other = int(torch.randint(1, 17, (), generator=g))
    cases += _signs(width, other, g) + [_zero_sum(width, other + 1, g)]
    for strict in (True, False):
        ep, call = _export(gate, cases[0][0], strict, True, width)
        _program(ep, eager, cases, call)
