"""The models the export lab's demos and checks export, and the custom operator its graph pass
targets.

* :class:`Counter`: every kind of graph-signature input and output in one small module.
* :class:`Window`: three inputs whose sizes are related (``seq`` and ``seq + 1``).
* :class:`GateEager`: a data-dependent ``if`` that neither strict nor non-strict export takes.
* :func:`mlp`: ``nn.Linear`` and ``nn.ReLU`` layers, for the graph pass, ONNX and AOTInductor.
* ``torch.ops.course.linear_relu``: ``relu(x @ weight.T + bias)`` as one custom operator
  (``torch.library.custom_op`` with a fake kernel, so export can trace through it).
"""
from __future__ import annotations

import itertools

import torch
from torch import nn


class Counter(nn.Module):
    """``Linear(width, width)``, a persistent buffer ``calls`` (float32, shape ``(1,)``) that
    every call adds 1 to, a non-persistent buffer ``scale`` (shape ``(width,)``) and a plain tensor
    attribute ``offset`` (a constant to export). ``forward(x, y)`` with ``x`` and ``y`` shaped
    ``(batch, width)`` returns ``(lin(x) * scale + offset + y, x.sum())``."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("calls", torch.zeros(1))
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width), persistent=False)
        self.offset = torch.arange(width, dtype=torch.float32)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.add_(1)
        return self.lin(x) * self.scale + self.offset + y, x.sum()


class Window(nn.Module):
    """``forward(tokens, mask, prev)``: ``tokens`` ``(batch, seq, 8)``, ``mask`` ``(batch, seq)``
    and ``prev`` ``(batch, seq + 1, 8)``, all float32; returns ``proj(tokens) * mask[..., None] +
    prev[:, 1:]``, shaped ``(batch, seq, 8)``. The sizes are related: ``batch`` is shared by all
    three inputs, ``seq`` by ``tokens`` and ``mask``, and ``prev`` is one longer."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, tokens, mask, prev):
        return self.proj(tokens) * mask.unsqueeze(-1) + prev[:, 1:]


def window_inputs(batch: int, seq: int, generator: torch.Generator | None = None):
    """``(tokens, mask, prev)`` for :class:`Window`, drawn from ``generator``."""
    return (torch.randn(batch, seq, 8, generator=generator),
            (torch.rand(batch, seq, generator=generator) > 0.2).float(),
            torch.randn(batch, seq + 1, 8, generator=generator))


class GateEager(nn.Module):
    """Routes on the data: ``relu(up(x))`` when ``x.sum() > 0``, else ``down(x) * 2``; ``x`` is
    ``(batch, width)`` float32 and so is the result. The Python ``if`` on a tensor's value is
    what export cannot trace: strict export raises ``torch._dynamo.exc.Unsupported``, non-strict
    raises ``GuardOnDataDependentSymNode``."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.up = nn.Linear(width, width)
        self.down = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return torch.relu(self.up(x))
        return self.down(x) * 2


def mlp(widths: list[int], generator: torch.Generator, relu_after: list[bool] | None = None
        ) -> nn.Sequential:
    """``nn.Sequential`` of ``nn.Linear(widths[i], widths[i + 1])``, each followed by ``nn.ReLU``
    where ``relu_after[i]`` (default: every layer but the last); float32 weights drawn from
    ``generator`` (``N(0, 0.3**2)``). Input ``(batch, widths[0])``."""
    n = len(widths) - 1
    relu_after = relu_after if relu_after is not None else [i < n - 1 for i in range(n)]
    layers: list[nn.Module] = []
    for (a, b), relu in zip(itertools.pairwise(widths), relu_after, strict=True):
        layers.append(nn.Linear(a, b))
        if relu:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model


@torch.library.custom_op("course::linear_relu", mutates_args=())
def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``relu(x @ weight.T + bias)``: ``x`` ``(batch, in)``, ``weight`` ``(out, in)``, ``bias``
    ``(out,)``, float32; returns ``(batch, out)``. What ``nn.Linear`` then ``nn.ReLU`` compute,
    as one operator that a backend could give a fused kernel."""
    return torch.relu(torch.addmm(bias, x, weight.t()))


@linear_relu.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])
