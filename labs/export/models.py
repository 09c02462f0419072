"""The models the export lab's demos and checks export, and the custom operator its graph pass
targets.

* :class:`Counter`: every kind of graph-signature input and output in one small module.
* :class:`Window`: three inputs whose sizes are related (``seq`` and ``seq + 1``).
* :class:`GateEager`: a data-dependent ``if`` that neither strict nor non-strict export takes.
* :func:`mlp`: ``nn.Linear`` and ``nn.ReLU`` layers, for the graph pass, ONNX and AOTInductor.
* ``torch.ops.course.linear_relu``: ``relu(x @ weight.T + bias)`` as one custom operator
  (``torch.library.custom_op`` with a fake kernel, so export can trace through it).
* The models the checks export (built in the learner's kernel too, when an answer is judged):
  :class:`Block`, :class:`Stack`, :class:`Tied` and :class:`Writes` (export.signature),
  :class:`Mixed` (export.graph-pass), :class:`Mixer` and :class:`Kwargs`
  (export.mini-interpreter), :class:`Tower` and :class:`Deep` (export.unflatten: nested
  submodules, built from :class:`Residual`, :class:`Stage`, :class:`Mix`, :class:`Centre` and
  :class:`Standardize`).
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


# ----------------------------------------------------------------------------- the checks' models
class Head(nn.Module):
    """``softmax(out(gelu(norm(inp([x, 1])))), dim=-1)`` for ``x`` of shape ``(batch, d)``:
    ops beyond Linear and ReLU, and a column of ones as tall as the batch
    (``x.new_ones(x.shape[0], 1)``): a shape op that names the batch, so that a program exported
    for one batch holds that batch as a constant. Weights drawn from ``generator``."""

    def __init__(self, d: int, hidden: int, k: int, generator: torch.Generator):
        super().__init__()
        self.inp = nn.Linear(d + 1, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, k)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3 + (p.dim() == 1) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
        return torch.softmax(self.out(nn.functional.gelu(self.norm(self.inp(x)))), dim=-1)


class Block(nn.Module):
    """``tanh(lin(x) * gain + shift)``: a Linear, a non-persistent buffer ``gain``, a constant
    ``shift`` and, when ``counted``, a persistent int64 buffer ``seen`` that forward adds 1 to."""

    def __init__(self, width: int, g: torch.Generator, counted: bool):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("gain", torch.rand(width, generator=g) + 0.5, persistent=False)
        self.shift = torch.randn(width, generator=g)
        self.counted = counted
        if counted:
            self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        if self.counted:
            self.seen.add_(1)
        return torch.tanh(self.lin(x) * self.gain + self.shift)


class Stack(nn.Module):
    """A root buffer ``steps`` (forward adds 1), ``blocks`` of :class:`Block`, a root constant
    ``bias`` read after the blocks, a Linear ``out``, and a tensor attribute ``spare`` that
    forward never reads (export lifts only the constants forward reads)."""

    def __init__(self, width: int, counted: list[bool], g: torch.Generator):
        super().__init__()
        self.register_buffer("steps", torch.zeros(1))
        self.blocks = nn.ModuleList(Block(width, g, c) for c in counted)
        self.bias = torch.randn(width, generator=g)
        self.out = nn.Linear(width, 2)
        self.spare = torch.randn(width, generator=g)

    def forward(self, x):
        self.steps.add_(1)
        for block in self.blocks:
            x = block(x)
        return self.out(x + self.bias)


class Tied(nn.Module):
    """``head(body(embed(x)))`` where ``head.weight`` is ``embed.weight`` (square, no bias)."""

    def __init__(self, width: int):
        super().__init__()
        self.embed = nn.Linear(width, width, bias=False)
        self.body = nn.Linear(width, width)
        self.head = nn.Linear(width, width, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(torch.relu(self.body(self.embed(x))))


class Writes(nn.Module):
    """``forward(x, state, extra)`` writes the inputs named in ``writes`` in place (in that
    order), accumulates a persistent buffer ``total``, and returns ``n_out`` tensors."""

    def __init__(self, width: int, writes: list[str], n_out: int):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("total", torch.zeros(width))
        self.writes, self.n_out = writes, n_out

    def forward(self, x, state, extra):
        for name in self.writes:
            {"x": x, "state": state, "extra": extra}[name].add_(1)
        y = self.lin(x) + state
        self.total.add_(y.sum(0))
        return (y, state.sum(), extra * 2)[: self.n_out]


class Mixed(nn.Module):
    """Every near miss of the graph pass's pattern, and one pair that is the pattern: ``a`` feeds
    a relu and a residual add (addmm with two users), ``b`` has no bias (mm), ``c``'s relu takes
    a product, ``d`` is a plain linear + relu (the one rewrite), ``e`` has no relu. Weights are
    drawn from ``g`` when given."""

    def __init__(self, width: int, out: int, g: torch.Generator | None = None):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width, bias=False)
        self.c, self.d = nn.Linear(width, width), nn.Linear(width, width)
        self.e = nn.Linear(width, out)
        if g is not None:
            with torch.no_grad():
                for p in self.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x):
        y = self.a(x)
        x = torch.relu(y) + y
        x = torch.relu(self.b(x))
        x = torch.relu(self.c(x) * 2)
        return self.e(torch.relu(self.d(x)))


class Mixer(nn.Module):
    """``forward(x, acc)``: writes ``acc`` in place (``acc.mul_(0.5).add_(h)``), takes
    ``max(dim=1)`` and ``split`` (multi-output ops: ``getitem`` nodes) and ``cat`` (a list
    argument); returns three tensors."""

    def __init__(self, width: int, cut: int):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.cut = cut

    def forward(self, x, acc):
        h = torch.tanh(self.lin(x))
        acc.mul_(0.5).add_(h)
        values, index = torch.max(h, dim=1)
        left, right = torch.split(acc, [self.cut, acc.shape[1] - self.cut], dim=1)
        mixed = torch.cat([right, left * values[:, None]], dim=1)
        return mixed, index, torch.stack([values, left.sum(1)]).sum(0)


class Kwargs(nn.Module):
    """Ops that keep keyword arguments in the decomposed graph: ``div`` with
    ``rounding_mode="floor"``, a float64 cast (``_to_copy(dtype=...)``) and a descending stable
    ``sort``."""

    def forward(self, x, y):
        floor = torch.div(x, y.abs() + 0.5, rounding_mode="floor")
        wide = x.to(torch.float64).cumsum(1)
        ranked = torch.sort(x + floor, dim=1, descending=True, stable=True).values
        return floor, wide, ranked


class Residual(nn.Module):
    """``x + ff(norm(x))`` for ``x`` of shape ``(batch, width)``, float32: a LayerNorm ``norm``
    and a feed-forward ``ff``, an ``nn.Sequential`` of ``Linear(width, hidden)``, ``GELU`` and
    ``Linear(hidden, width)``."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Tower(nn.Module):
    """``head(relu(blocks(stem(x))))``: a Linear ``stem`` (width to width), ``blocks`` an
    ``nn.Sequential`` of ``depth`` :class:`Residual` blocks, and a Linear ``head`` (width to
    ``classes``). ``x`` ``(batch, width)`` float32; returns ``(batch, classes)``. Modules four
    deep (``blocks.0.ff.0``), parameter-free ones among them (``GELU``)."""

    def __init__(self, width: int, hidden: int, depth: int, classes: int):
        super().__init__()
        self.stem = nn.Linear(width, width)
        self.blocks = nn.Sequential(*(Residual(width, hidden) for _ in range(depth)))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.blocks(self.stem(x))))


class Mix(nn.Module):
    """Two inputs, two outputs: ``h = proj(x) * sigmoid(context)``, returns ``(tanh(h), h +
    context)``; all ``(batch, width)`` float32."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x, context):
        h = self.proj(x) * torch.sigmoid(context)
        return torch.tanh(h), h + context


class Centre(nn.Module):
    """Parameter-free: ``x - x.mean(-1, keepdim=True)``."""

    def forward(self, x):
        return x - x.mean(-1, keepdim=True)


class Standardize(nn.Module):
    """``(x - mean) / std * gain``: persistent buffers ``mean`` and ``std`` (positive) and a
    parameter ``gain``, each of shape ``(width,)``."""

    def __init__(self, width: int):
        super().__init__()
        self.register_buffer("mean", torch.randn(width) * 0.1)
        self.register_buffer("std", torch.rand(width) + 0.5)
        self.gain = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):
        return (x - self.mean) / self.std * self.gain


class Stage(nn.Module):
    """``forward(x, context)``: ``a, b = mix(x, context)``; returns ``(norm(centre(a)), b)``
    (a :class:`Mix`, a :class:`Centre` and a :class:`Standardize`)."""

    def __init__(self, width: int):
        super().__init__()
        self.mix = Mix(width)
        self.centre = Centre()
        self.norm = Standardize(width)

    def forward(self, x, context):
        a, b = self.mix(x, context)
        return self.norm(self.centre(a)), b


class Deep(nn.Module):
    """``stages``, an ``nn.ModuleList`` (never called itself) of ``depth`` :class:`Stage` modules
    that pass ``(x, context)`` along, then a Linear ``out`` (width to ``classes``);
    ``forward(x, context)`` (both ``(batch, width)`` float32) returns ``(out(x), context)``."""

    def __init__(self, width: int, depth: int, classes: int):
        super().__init__()
        self.stages = nn.ModuleList(Stage(width) for _ in range(depth))
        self.out = nn.Linear(width, classes)

    def forward(self, x, context):
        for stage in self.stages:
            x, context = stage(x, context)
        return self.out(x), context
