"""The programs lab 4 hands the learner: the functions whose graph breaks exercise 2 removes, the
call sequences whose compiles exercise 3 predicts, the functions exercise 5 partitions, the chain
exercise 6 makes Inductor fuse, the functions exercise 7's tiny Dynamo traces, and exercise 8's
functions whose dynamic shapes are guarded or come from data.
The notebook, the checks and the tests read them from here, so all three see the same code.

Every function takes and returns ``torch.float32`` CPU tensors unless it says otherwise; none
has side effects beyond the ``print`` in :func:`logged`.
"""

from __future__ import annotations

import heapq

import torch


# ------------------------------------------------------------------ exercise 2: graph breaks
def branch(x: torch.Tensor) -> torch.Tensor:
    """A data-dependent ``if``: which branch runs depends on the values in ``x`` (any shape)."""
    if x.sum() > 0:
        return x.relu() * 2
    return x.sigmoid() - 1


def logged(x: torch.Tensor) -> torch.Tensor:
    """A ``print`` in the middle: a side effect Dynamo cannot put in a graph (any shape)."""
    y = x.tanh()
    print("mean activation:", y.mean())
    return y * 3 + 1


def item(x: torch.Tensor) -> torch.Tensor:
    """``Tensor.item()``: a Python float out of a tensor, to scale ``x`` (any shape, nonzero)."""
    scale = x.abs().max().item()
    return x / scale


def builtin(x: torch.Tensor) -> torch.Tensor:
    """An unsupported builtin: ``heapq.nlargest`` (whose C helper ``_heapq.heapify`` Dynamo
    cannot trace) picks the two rows of ``x`` (shape ``(n, d)``, ``n >= 2``) with the largest
    sums; returns their sum, ``(d,)``."""
    top = heapq.nlargest(2, x.unbind(0), key=lambda row: row.sum())
    return top[0] + top[1]


def _windows(x: torch.Tensor, k: int):
    for i in range(x.shape[0] - k + 1):
        yield x[i : i + k]


def generator(x: torch.Tensor) -> torch.Tensor:
    """A generator of sliding windows (``k = 2`` rows of ``x``, shape ``(n, d)``, ``n >= 2``)
    and ``max`` over it with a tensor-valued key: returns the window with the largest sum,
    ``(2, d)``."""
    return max(_windows(x, 2), key=lambda w: w.sum())


#: exercise 2's functions, by the name the answer's dict uses
BREAKING = {f.__name__: f for f in (branch, logged, item, builtin, generator)}


# ------------------------------------------------------------------ exercise 3: recompiles
def scaled_sum(x: torch.Tensor, scale) -> torch.Tensor:
    """The function whose compiles exercise 3 counts: ``(x * scale).sum(0)``; ``scale`` is a
    Python number (or bool)."""
    return (x * scale).sum(0)


def call_sequences() -> dict[str, list[tuple]]:
    """Exercise 3's call sequences: name -> the argument tuples ``scaled_sum`` is called with,
    in order (fresh tensors each time: a mark_dynamic is on the first tensor of its sequence)."""
    r = torch.randn
    marked = r(2, 3)
    torch._dynamo.mark_dynamic(marked, 0)
    return {
        "growing batch": [(r(2, 3), 2), (r(3, 3), 2), (r(4, 3), 2), (r(5, 3), 2)],
        "dtype flip": [(r(2, 3), 2), (r(2, 3).double(), 2), (r(2, 3), 2), (r(2, 3).double(), 2)],
        "python int": [(r(2, 3), 2), (r(2, 3), 3), (r(2, 3), 4), (r(2, 3), 5)],
        "python float": [(r(2, 3), 0.5), (r(2, 3), 1.5), (r(2, 3), 2.5)],
        "bool flag": [(r(2, 3), True), (r(2, 3), False), (r(2, 3), True), (r(2, 3), False)],
        "a batch of one later": [(r(2, 3), 2), (r(3, 3), 2), (r(1, 3), 2), (r(4, 3), 2)],
        "mark_dynamic": [(marked, 2), (r(5, 3), 2), (r(7, 3), 2)],
        "same shape, new values": [(r(4, 3), 2), (r(4, 3), 2), (r(4, 3), 2)],
    }


# ------------------------------------------------------------------ exercise 6: fusion
def unfused(x: torch.Tensor) -> torch.Tensor:
    """A row softmax, floored at 1e-4 and scaled by each row's total, written with ops Inductor
    cannot fuse on CPU (``sort`` and ``cumsum`` run as ATen fallbacks): ``x`` ``(n, d)`` ->
    ``(n, d)``."""
    rowmax = torch.sort(x, dim=1).values[:, -1:]
    e = torch.exp(x - rowmax)
    total = torch.cumsum(e, dim=1)[:, -1:]
    p = e / total
    return torch.clamp(p, min=1e-4) * torch.cumsum(x, dim=1)[:, -1:]


#: the most kernels ``fused`` may make Inductor emit (generated kernels plus ATen fallbacks)
MAX_KERNELS = 1


# ------------------------------------------------------------------ exercise 5: partitioner
def mm_chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A matmul followed by a pointwise chain: ``x`` ``(n, k)``, ``w`` ``(k, m)`` -> ``(n, m)``."""
    return torch.tanh(x @ w).sin() * 2


def gated_sum(x: torch.Tensor) -> torch.Tensor:
    """A pointwise chain with a row sum: ``x`` ``(n, d)`` -> ``(n,)``."""
    return (x.exp() * x.sigmoid()).cos().sum(1)


#: exercise 5's functions and the shapes of their inputs
PARTITIONED = {"mm_chain": (mm_chain, [(32, 16), (16, 64)]), "gated_sum": (gated_sum, [(64, 48)])}


# ------------------------------------------------------------------ exercise 7: mini-dynamo
def sin_plus(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A torch function, a constant and two binary ops: ``x``, ``y`` of one shape."""
    return torch.sin(x) + y * 2


def two_outputs(x: torch.Tensor, w: torch.Tensor):
    """A matmul, a local variable, tensor methods, keyword arguments and a tuple of results:
    ``x`` ``(n, k)``, ``w`` ``(k, m)`` -> ``((n,), (2m,))``."""
    h = torch.relu(x @ w)
    return h.sum(1), torch.cat((h, -h), dim=1).mean(dim=0)


def methods(x: torch.Tensor) -> torch.Tensor:
    """A chain of tensor methods with a reshape, a power and a keyword: ``x`` with an even
    number of elements -> ``(2,)``."""
    y = x.t().exp().reshape(2, -1)
    return torch.sum(y**2, dim=1) / 3.0 - 1


#: exercise 7's functions and the shapes of their inputs (first call, then a new shape)
TRACED = {
    "sin_plus": (sin_plus, [(3, 4), (3, 4)], [(5, 2), (5, 2)]),
    "methods": (methods, [(4, 3)], [(6, 5)]),
    "two_outputs": (two_outputs, [(3, 4), (4, 5)], [(2, 3), (3, 6)]),
}


# ------------------------------------------------------------------ exercise 8: dynamic shapes
def scaled_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x * y + 1``, broadcasting: ``x`` ``(n, d)``, ``y`` ``(n, d)``, ``(1, d)`` or ``(d,)``."""
    return x * y + 1


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A matmul: ``x`` ``(n, k)``, ``w`` ``(k, m)`` -> ``(n, m)``."""
    return (x @ w).relu()


def pairs(x: torch.Tensor) -> torch.Tensor:
    """The sums of consecutive pairs of ``x``'s elements (``x`` with an even number of them)."""
    return x.view(-1, 2).sum(1)


def big_batch(x: torch.Tensor) -> torch.Tensor:
    """A Python ``if`` on a size: the sum over dim 0 of a batch of more than 4, else the mean."""
    if x.shape[0] > 4:
        return x.sum(0)
    return x.mean(0)


def row_loop(x: torch.Tensor) -> torch.Tensor:
    """A Python loop over the rows of ``x`` ``(n, d)``: their sum, ``(d,)``."""
    out = x[0]
    for i in range(1, x.shape[0]):
        out = out + x[i]
    return out


#: exercise 8's public cases for ``shape_guards``: (function, the example's shapes, the dims
#: marked dynamic per argument, the shapes of the new arguments to accept or refuse)
SHAPE_CASES = [
    (scaled_add, [(4, 3), (4, 3)], [[0], [0]],
     [[(6, 3), (6, 3)], [(6, 3), (5, 3)], [(2, 3), (2, 3)], [(1, 3), (1, 3)], [(6, 3), (1, 3)]]),
    (scaled_add, [(4, 3), (4, 3)], [[0], []],
     [[(4, 3), (4, 3)], [(5, 3), (4, 3)]]),
    (scaled_add, [(4, 3), (1, 3)], [[0], [0]],
     [[(7, 3), (1, 3)], [(7, 3), (7, 3)], [(1, 3), (1, 3)]]),
    (project, [(5, 3), (3, 2)], [[0, 1], [0]],
     [[(8, 4), (4, 2)], [(8, 4), (3, 2)], [(8, 3), (3, 5)], [(2, 2), (2, 2)]]),
    (pairs, [(3, 4)], [[0]], [[(5, 4)], [(2, 4)], [(1, 4)]]),
    (pairs, [(3, 4)], [[0, 1]], [[(3, 3)], [(5, 2)], [(2, 5)], [(5, 5)], [(4, 5)]]),
    (big_batch, [(6, 3)], [[0]], [[(5, 3)], [(4, 3)], [(9, 3)]]),
    (big_batch, [(3, 3)], [[0]], [[(2, 3)], [(4, 3)], [(5, 3)], [(1, 3)]]),
    (row_loop, [(4, 3)], [[0, 1]], [[(4, 7)], [(5, 3)], [(4, 1)]]),
]
#: exercise 8's functions of SHAPE_CASES, by name (what the probe receives)
SHAPED = {f.__name__: f for f in (scaled_add, project, pairs, big_batch, row_loop)}


def top_rows(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The ``k = n.item()`` rows of ``x`` ``(m, d)`` with the largest sums, largest first
    (``n`` a 0-d int64 tensor). Promise: ``1 <= k <= m``."""
    k = n.item()
    if k < 1 or k > x.shape[0]:
        raise ValueError(f"k = {k} is not between 1 and {x.shape[0]}")
    return x[x.sum(1).topk(k).indices]


def positive_mean(x: torch.Tensor) -> torch.Tensor:
    """The mean of ``x``'s positive entries. Promise: ``x`` has at least one."""
    pos = x[x > 0]
    if pos.numel() == 0:
        raise ValueError("x has no positive entry")
    return pos.mean()


def regroup(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``x`` ``(m, d)`` cut into ``k = n.item()`` groups of consecutive rows, each summed:
    ``(k, d)`` (``n`` a 0-d int64 tensor). Promise: ``k >= 1`` divides ``m``."""
    k = n.item()
    if k < 1 or x.shape[0] % k != 0:
        raise ValueError(f"k = {k} does not divide {x.shape[0]} rows into groups")
    return x.view(k, -1, x.shape[1]).sum(1)


#: exercise 8's functions whose export fails on a size that comes from data (an unbacked
#: symbol), by the name the answer's dict uses
UNBACKED = {f.__name__: f for f in (top_rows, positive_mean, regroup)}
