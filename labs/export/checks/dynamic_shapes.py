"""Checks of ``export.dynamic-shapes``: ``window_shapes(max_batch, max_seq)`` must return the
``dynamic_shapes`` spec, a dict keyed by the forward argument names ``tokens``, ``mask`` and
``prev``, with which ``export(models.Window(), example, dynamic_shapes=spec, strict=False)``
exports. The program (``ep.module()``) must run every ``batch`` in ``[1, max_batch]`` and every
``seq`` in ``[2, max_seq]`` (``tokens (batch, seq, 8)``, ``mask (batch, seq)``,
``prev (batch, seq + 1, 8)``) with eager ``Window``'s outputs; ``ep.range_constraints`` must
promise exactly those ranges; and it must refuse ``batch = max_batch + 1``, ``seq = 1``,
``seq = max_seq + 1`` and a ``prev`` that is not ``seq + 1`` long. The oracle is torch itself:
the program's own guards (an ``AssertionError`` "Guard failed: ..."), its range constraints, and
eager ``Window``. The answer's spec is exported in the kernel (the probe
:func:`labs.export.probes.window_program`, on the judge's weights and inputs), which reports what
export said, the program's outputs, its range constraints and what it refused; the judge runs
eager ``Window`` here. (torch/export/dynamic_shapes.py: Dim, _DerivedDim, _DimHint;
torch/export/exported_program.py: ExportedProgram.range_constraints.)
"""

from __future__ import annotations

import re

import torch
from torch import nn

from grader.checks import CheckFailure, check
from labs.export import models, probes

EXERCISE = "export.dynamic-shapes"
ARGS = probes.WINDOW_ARGS
#: lines of torch's export errors that point at logs and docs, not at the cause
_NOISE = ("For more information", "For extended logs", "If you suspect", "For C++",
          "For more debugging", "Set TORCHDYNAMO", "The error above occurred", "Alternatively")


def torch_says(error: dict, limit: int = 420) -> str:
    """Torch's explanation in ``error`` (``{"ename", "text"}``, what a probe saw raised), on one
    line and short: without the lines that point at logs and docs, duplicates removed, and
    torch's suggested fixes kept whole at the end."""
    text, _, fixes = error["text"].partition("Suggested fixes:")
    lines: list[str] = []
    for line in text.splitlines():
        line = line.split(" For more information, run with")[0].strip()
        if line and not line.startswith(_NOISE) and "http" not in line and line not in lines:
            lines.append(line)
    said = " ".join(lines).rstrip(".")
    said = said if len(said) <= limit else said[: limit - 3] + "..."
    fixes = "; ".join(f.strip() for f in fixes.splitlines()
                      if f.strip() and not f.strip().startswith(_NOISE))
    return f"{error['ename']}: {said}" + (f". Suggested fixes: {fixes}" if fixes else "")


def _window(g: torch.Generator) -> nn.Module:
    model = models.Window()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def _spec(seen: dict, max_batch: int, max_seq: int) -> None:
    spec = seen["spec"]
    if not spec["dict"] or spec["keys"] != sorted(ARGS):
        got = spec["keys"] if spec["dict"] else spec["type"]
        raise CheckFailure(f"window_shapes({max_batch}, {max_seq}) returned {got}; return a "
                           "dict keyed by Window.forward's argument names 'tokens', 'mask' and "
                           "'prev', each value the spec of that input's dimensions.")


def _export(seen: dict, call: str) -> None:
    if seen["export"] is None:
        return
    said = torch_says(seen["export"])
    fixes = said.partition("Suggested fixes:")[2]
    if re.search(r"\w+ = \d+(;|$)", fixes):
        fix = "torch found a size that your code fixes to a constant: mark it Dim.STATIC"
    elif fixes:
        fix = ("torch's suggested fix says how the sizes are related: derive one Dim from "
               "another (seq + 1) instead of giving each its own Dim")
    else:
        fix = ("every size that varies needs a torch.export.Dim, shared by the inputs that "
               "share that size; sizes that never vary are Dim.STATIC")
    raise CheckFailure(f"{call} raised {said}. ({fix}.)")


def _inputs(batch: int, seq: int, g: torch.Generator, prev_len: int | None = None):
    tokens, mask, prev = models.window_inputs(batch, seq, g)
    if prev_len is not None:
        prev = torch.randn(batch, prev_len, 8, generator=g)
    return tokens, mask, prev


def _accepts(seen: dict, model, sizes, inputs, call: str, max_batch: int,
             max_seq: int) -> None:
    """The program ran every (batch, seq) in ``sizes`` and matched eager."""
    for (batch, seq), args, got in zip(sizes, inputs, seen["accepted"], strict=True):
        if isinstance(got, dict) and "error" in got:
            raise CheckFailure(
                f"the program from {call} rejected batch {batch}, seq {seq} (prev {seq + 1} "
                f"long), inside the ranges batch 1..{max_batch} and seq 2..{max_seq}: "
                f"{torch_says(got['error'], 200)}. The spec must let batch and seq vary over the "
                "whole range (a Dim per varying size, with min and max).")
        with torch.no_grad():
            want = model(*args)
        if (not isinstance(got, torch.Tensor) or got.shape != want.shape
                or not torch.allclose(got, want, rtol=1e-5, atol=1e-6)):
            raise CheckFailure(f"the program from {call} ran batch {batch}, seq {seq} but its "
                               "output differs from eager Window's on the same inputs.")


def _promises(seen: dict, call: str, max_batch: int, max_seq: int) -> None:
    """The program's range_constraints promise exactly batch in [1, max_batch] and seq in
    [2, max_seq]."""
    ranges = seen["ranges"]
    for name, want in (("batch", (1, max_batch)), ("seq", (2, max_seq))):
        rng = ranges[name]
        if rng is None or tuple(rng) == want:
            continue  # (a static size was refused by the accepting run already)
        why = []
        if rng[0] != want[0]:
            why.append(
                f"Export assumes a dynamic size is at least 2 (it specializes sizes 0 and 1) "
                f"unless the spec says otherwise, and Dim.AUTO and Dim.DYNAMIC keep that default "
                f"even with min=1; a named Dim('{name}', min={want[0]}, ...) does not"
                if rng[0] == 2 and want[0] == 1 else f"Give the {name} Dim min={want[0]}")
        if rng[1] != want[1]:
            why.append(f"Give the {name} Dim max={'max_batch' if name == 'batch' else 'max_seq'}")
        raise CheckFailure(
            f"the program from {call} gives {name} the range [{rng[0]}, {rng[1]}] "
            f"(ep.range_constraints), not [{want[0]}, {want[1]}]: export promises the program "
            f"for exactly that range, and whatever consumes it (AOTInductor, "
            f"run_decompositions) relies on the promise. {'. '.join(why)}.")


def _refusals(max_batch: int, max_seq: int, batch: int, seq: int) -> list[tuple]:
    """What the program must refuse: sizes outside the ranges and a prev that is not seq + 1
    long, as (batch, seq, prev length, what, fix)."""
    return [
        (max_batch + 1, seq, seq + 1, f"batch {max_batch + 1} (max_batch + 1)",
         "give the batch Dim max=max_batch"),
        (batch, 1, 2, "seq 1", "give the seq Dim min=2"),
        (batch, max_seq + 1, max_seq + 2, f"seq {max_seq + 1} (max_seq + 1)",
         "give the seq Dim max=max_seq"),
        (batch, seq, seq + 2, f"seq {seq} with prev {seq + 2} long (not seq + 1)",
         "prev's length must be derived from seq (seq + 1), not free"),
        (batch, seq, seq, f"seq {seq} with prev {seq} long (not seq + 1)",
         "prev's length must be derived from seq (seq + 1), not free"),
    ]


def _rejects(seen: dict, cases: list, call: str, max_batch: int, max_seq: int) -> None:
    """The program refused sizes outside the ranges and a prev that is not seq + 1 long."""
    for (_, _, _, what, fix), refused in zip(cases, seen["refused"], strict=True):
        if refused:
            continue
        raise CheckFailure(f"the program from {call} accepted {what}, outside what the exercise "
                           f"asks for (batch 1..{max_batch}, seq 2..{max_seq}, prev seq + 1 "
                           f"long): {fix}.")


def verify(window_shapes, max_batch: int, max_seq: int, batch: int, seq: int,
           g: torch.Generator, extra: list[tuple[int, int]]) -> None:
    """Export Window with the answer's spec from example sizes (batch, seq), in the kernel, and
    check what the program accepts, promises and rejects."""
    call = (f"export(Window(), example inputs of batch {batch} and seq {seq}, "
            f"dynamic_shapes=window_shapes({max_batch}, {max_seq}), strict=False)")
    model = _window(g)
    example = _inputs(batch, seq, g)
    corners = [(1, 2), (max_batch, max_seq), (1, max_seq), (max_batch, 2), (batch, seq)]
    sizes = corners + extra
    accept = [_inputs(b, s, g) for b, s in sizes]
    refusals = _refusals(max_batch, max_seq, batch, seq)
    reject = [_inputs(b, s, g, prev_len) for b, s, prev_len, _, _ in refusals]
    seen = window_shapes.probe(probes.window_program, max_batch, max_seq,
                               dict(model.state_dict()), list(example),
                               [list(a) for a in accept], [list(r) for r in reject])
    _spec(seen, max_batch, max_seq)
    _export(seen, call)
    _accepts(seen, model, sizes, accept, call, max_batch, max_seq)
    _promises(seen, call, max_batch, max_seq)
    _rejects(seen, refusals, call, max_batch, max_seq)


@check(EXERCISE)
def window_64_128(window_shapes, ctx):
    """Window exported with max_batch 64, max_seq 128: serves those ranges, refuses the rest"""
    g = ctx.generator()
    extra = [(int(torch.randint(2, 64, (), generator=g)),
              int(torch.randint(3, 128, (), generator=g)))]
    verify(window_shapes, 64, 128, 4, 6, g, extra)


@check(EXERCISE, hidden=True)
def seeded_maxima(window_shapes, ctx):
    """Window exported with seeded maxima and example sizes: serves the ranges, rejects the rest"""
    g = ctx.generator(1)
    for _ in range(2):
        max_batch = int(torch.randint(4, 48, (), generator=g))
        max_seq = int(torch.randint(4, 96, (), generator=g))
        batch = int(torch.randint(2, max_batch + 1, (), generator=g))
        seq = int(torch.randint(2, max_seq + 1, (), generator=g))
        extra = [(int(torch.randint(1, max_batch + 1, (), generator=g)),
                  int(torch.randint(2, max_seq + 1, (), generator=g))) for _ in range(2)]
        verify(window_shapes, max_batch, max_seq, batch, seq, g, extra)
