"""The models the distributed checks and demos train: :class:`Stack` (what FSDP2 shards) and
:func:`mlp` (what DDP replicates)."""
from __future__ import annotations

import itertools

import torch
from torch import nn


class Stack(nn.Module):
    """An MLP as FSDP2 is usually applied to a transformer: ``layers`` (an ``nn.ModuleList`` of
    ``nn.Linear(widths[i], widths[i + 1])``, each followed by ``tanh``), then ``head``
    (``nn.Linear(widths[-1], out)``). Sharded layer by layer, each layer gets its own
    ``fully_shard`` and the root ``fully_shard(model)`` owns what is left: ``head``.
    Input ``(batch, widths[0])`` float32, output ``(batch, out)``."""

    def __init__(self, widths: list[int], out: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(widths[-1], out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def mlp(widths: list[int], generator: torch.Generator) -> nn.Sequential:
    """``nn.Sequential`` of ``nn.Linear(widths[i], widths[i + 1])`` with ``nn.Tanh`` between
    them (``model[2 * i]`` is layer ``i``), float32 weights drawn from ``generator``
    (``N(0, 0.3**2)``), so every rank that builds it from the same seed holds the same model."""
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model
