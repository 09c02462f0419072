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


class Ordered(nn.Module):
    """Square ``nn.Linear`` layers (``width`` -> ``width``; ``out``: ``width`` -> 3) named
    ``defined``, registered in that order, and run in ``order`` (a name may come twice), each
    followed by tanh. Weights drawn from ``generator`` (``N(0, 0.1**2)``), in ``defined`` order."""

    def __init__(self, width: int, generator: torch.Generator, defined: list[str],
                 order: list[str]):
        super().__init__()
        for name in defined:
            setattr(self, name, nn.Linear(width, 3 if name == "out" else width))
        self.order = order
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.order:
            x = torch.tanh(getattr(self, name)(x))
        return x


class Crossed(Ordered):
    """Layers defined in one order and used in another: ``inp``, ``late``, ``early``, ``out``
    registered in that order and run as ``inp``, ``early``, ``late``, ``out``, so the order
    gradients become ready is not the reverse of the order parameters were registered in."""

    def __init__(self, width: int, generator: torch.Generator):
        super().__init__(width, generator, ["inp", "late", "early", "out"],
                         ["inp", "early", "late", "out"])


class Reused(Ordered):
    """One layer run twice: ``inp``, ``mid``, ``out`` run as ``inp``, ``mid``, ``inp``, ``out``.
    ``inp``'s gradient is ready only once both of its uses have been back-propagated (autograd
    sums them before its ``AccumulateGrad`` runs), so it comes after ``mid``'s, not between
    ``out``'s and ``mid``'s."""

    def __init__(self, width: int, generator: torch.Generator):
        super().__init__(width, generator, ["inp", "mid", "out"], ["inp", "mid", "inp", "out"])


def build(spec: dict) -> nn.Module:
    """A model from a plain ``spec``, the same in the probe and in the judge:
    ``{"kind": "mlp", "widths": [...]}`` (:func:`mlp`), ``{"kind": "crossed", "width": w}``
    (:class:`Crossed`), ``{"kind": "reused", "width": w}`` (:class:`Reused`) or
    ``{"kind": "stack", "widths": [...], "out": n}`` (:class:`Stack`);
    weights from ``spec["state"]`` (a state dict) when given, else drawn from ``spec["seed"]``;
    ``spec["frozen"]`` lists the layers (``mlp``: ``model[2 * i]``; ``stack``:
    ``model.layers[i]``) set to ``requires_grad_(False)``."""
    g = torch.Generator().manual_seed(int(spec.get("seed", 0)))
    kind = spec["kind"]
    if kind == "mlp":
        model: nn.Module = mlp(list(spec["widths"]), g)
    elif kind == "crossed":
        model = Crossed(int(spec["width"]), g)
    elif kind == "reused":
        model = Reused(int(spec["width"]), g)
    elif kind == "stack":
        model = Stack(list(spec["widths"]), int(spec["out"]))
        with torch.no_grad():  # (N(0, 1 / fan_in) weights, N(0, 0.1**2) biases)
            for layer in [*model.layers, model.head]:
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=g)
                                   / layer.in_features ** 0.5)
                layer.bias.copy_(torch.randn(layer.bias.shape, generator=g) * 0.1)
    else:
        raise ValueError(f"no model kind {kind!r}")
    if spec.get("state") is not None:
        model.load_state_dict(spec["state"])
    for i in spec.get("frozen", ()):
        layer = model.layers[i] if kind == "stack" else model[2 * i]
        layer.requires_grad_(False)
    return model
