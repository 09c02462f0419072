"""Pictures and explorers for lab 2 (autograd), each called in one line from a notebook cell.

Pictures return a ``matplotlib.figure.Figure`` built without pyplot (no global figure state);
importing :mod:`grader.kernel.display` registers the PNG formatter that shows it in JupyterLab.
Explorers return an ``ipywidgets`` box whose picture lives in an ``ipywidgets.HTML`` value, so
they work, and can be tested, without a kernel.

Everything drawn is measured from real torch: the backward graph is read from ``grad_fn`` /
``next_functions``, and saved bytes are counted with ``saved_tensors_hooks``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.utils.checkpoint as torch_checkpoint
from matplotlib.figure import Figure
from torch import nn

import grader.kernel.display  # noqa: F401  (registers the PNG formatter for figures)
from grader.kernel.display import figure_html, show_cached

#: ``Node::sequence_nr()`` of every ``AccumulateGrad`` node (its constructor passes UINT64_MAX)
ACCUMULATE_GRAD_SEQ = 2**64 - 1

_COLOURS = {"running": "#ffd866", "done": "#e4e4e4", "queued": "#c8ebc4", "waiting": "#dde8f7"}


# ------------------------------------------------------------------ the engine's ready queue
@dataclasses.dataclass(frozen=True)
class Step:
    """One turn of the engine's loop (``Engine::thread_main`` -> ``evaluate_function``).

    ``index``: the step's number, counted from 1 (the picture's "step k of n"); ``node``: the Node
    popped from the ready queue and run; ``queue``: the Nodes waiting in the
    ready queue after it ran, in the order they would be popped; ``made_ready``: the Nodes it
    pushed; ``remaining``: for every Node of the graph, how many of its dependencies are still
    unmet after this step; ``done``: the Nodes that ran before this step."""

    index: int
    node: object
    queue: tuple
    made_ready: tuple
    remaining: dict
    done: frozenset


def _less(a, b) -> bool:
    """``ReadyQueue::CompareNodeTaskTime`` for tasks of one reentrant depth: a runs after b."""
    return a._sequence_nr() < b._sequence_nr()


def _sift_up(heap: list, hole: int, value) -> None:
    parent = (hole - 1) // 2
    while hole > 0 and _less(heap[parent], value):
        heap[hole] = heap[parent]
        hole, parent = parent, (parent - 1) // 2
    heap[hole] = value


def _push(heap: list, node) -> None:
    """``std::priority_queue::push``: libstdc++'s ``std::push_heap``."""
    heap.append(node)
    _sift_up(heap, len(heap) - 1, node)


def _pop(heap: list):
    """``std::priority_queue::pop`` after ``top``: libstdc++'s ``std::pop_heap``
    (``__adjust_heap``: move the hole to a leaf along the larger children, then sift up)."""
    top, last = heap[0], heap.pop()
    n = len(heap)
    if n:
        hole = child = 0
        while child < (n - 1) // 2:
            child = 2 * (child + 1)
            if _less(heap[child], heap[child - 1]):
                child -= 1
            heap[hole], hole = heap[child], child
        if n % 2 == 0 and child == (n - 2) // 2:
            child = 2 * (child + 1)
            heap[hole], hole = heap[child - 1], child - 1
        _sift_up(heap, hole, last)
    return top


def _pop_order(heap: list) -> tuple:
    copy = list(heap)
    return tuple(_pop(copy) for _ in heap)


def _dependencies(root) -> dict:
    """``Engine::compute_dependencies``: for each Node reachable from ``root``, the number of
    edges pointing at it (the root has 0)."""
    deps, stack = {root: 0}, [root]
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            if nxt not in deps:
                deps[nxt] = 0
                stack.append(nxt)
            deps[nxt] += 1
    return deps


def backward_steps(output: torch.Tensor) -> list[Step]:
    """Simulate the order in which torch's engine runs the backward graph of ``output``.

    ``output``: a tensor with a ``grad_fn`` (any shape and dtype). Returns one :class:`Step` per
    Node, in execution order, numbered from 1 (``steps[k - 1].index == k``). Nothing is run and
    the graph is left as it is.

    Models a CPU-only ``loss.backward()`` in ``torch/csrc/autograd/engine.cpp``:
    ``Engine::compute_dependencies`` counts edges, the root is pushed, and
    ``Engine::evaluate_function`` decrements ``dependencies_`` along each of a Node's
    ``next_edges`` in order, pushing a Node when its count reaches 0. The ready queue
    (``torch/csrc/autograd/engine.h: struct ReadyQueue``) is a ``std::priority_queue`` ordered by
    ``CompareNodeTaskTime``: highest ``Node::sequence_nr()`` first. Ties (every
    ``AccumulateGrad`` has UINT64_MAX) are broken by the heap's layout, so the queue is replayed
    with libstdc++'s ``push_heap`` / ``pop_heap``, not first-in-first-out. Not modelled: device
    threads (a CUDA graph runs on several queues), reentrant depth, and ``exec_info_`` (the
    pruning ``torch.autograd.grad(..., inputs=...)`` does). Raises ValueError for a tensor
    without ``grad_fn``.
    """
    root = output.grad_fn
    if root is None:
        raise ValueError("output has no grad_fn: it is a leaf or does not require grad")
    remaining = _dependencies(root)
    heap, done, steps = [root], [], []
    while heap:
        node = _pop(heap)
        made_ready = []
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            remaining[nxt] -= 1
            if remaining[nxt] == 0:
                _push(heap, nxt)
                made_ready.append(nxt)
        steps.append(
            Step(
                len(steps) + 1,
                node,
                _pop_order(heap),
                tuple(made_ready),
                dict(remaining),
                frozenset(done),
            )
        )
        done.append(node)
    return steps


def record_execution(output: torch.Tensor, **backward_kwargs) -> list:
    """Run ``output.backward(**backward_kwargs)`` and return the Nodes in the order torch's
    engine ran them, seen by a pre-hook on each (``torch/autograd/graph.py:
    Node.register_prehook``; the engine's ``call_function`` runs pre-hooks just before the
    Node). Leaves' ``.grad`` are written as by any backward; the hooks are removed after."""
    order, handles = [], []
    for node in _dependencies(output.grad_fn):
        handles.append(node.register_prehook(lambda grads, node=node: order.append(node)))
    try:
        output.backward(**backward_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return order


def node_label(node, leaves: dict | None = None) -> str:
    """A Node's name as torch gives it (``node.name()``, ``torch::autograd::`` dropped), with
    the leaf's name from ``leaves`` (``{"x": x}``) for an ``AccumulateGrad``."""
    name = node.name().replace("torch::autograd::", "")
    if hasattr(node, "variable"):
        for leaf_name, leaf in (leaves or {}).items():
            if leaf is node.variable:
                return f"{name} ({leaf_name})"
    return name


def _seq(node) -> str:
    seq = node._sequence_nr()
    return "max" if seq == ACCUMULATE_GRAD_SEQ else str(seq)


def _layout(steps: list[Step]) -> dict:
    """(x, y) per Node: rows by the longest path from the root, parents' mean x within a row."""
    depth = {steps[0].node: 0}
    for step in steps:  # execution order is a topological order
        for nxt, _ in step.node.next_functions:
            if nxt is not None:
                depth[nxt] = max(depth.get(nxt, 0), depth[step.node] + 1)
    parents: dict = {}
    for step in steps:
        for nxt, _ in step.node.next_functions:
            if nxt is not None:
                parents.setdefault(nxt, []).append(step.node)
    pos: dict = {}
    for d in range(max(depth.values()) + 1):
        row = [n for n in depth if depth[n] == d]
        row.sort(
            key=lambda n: (
                sum(pos[p][0] for p in parents.get(n, [])) / max(len(parents.get(n, [])), 1),
                -n._sequence_nr(),
            )
        )
        for i, n in enumerate(row):
            pos[n] = (i - (len(row) - 1) / 2, -d)
    return pos


def _box_extents(ax, boxes: dict) -> dict:
    """{Node: display-space Bbox of its drawn box}, after a draw without rendering."""
    ax.get_figure(root=True).draw_without_rendering()
    return {node: text.get_bbox_patch().get_window_extent() for node, text in boxes.items()}


def _arc(p0, p1, rad: float, samples: int = 24) -> list:
    """Points of matplotlib's ``arc3,rad=rad`` curve from display point ``p0`` to ``p1``
    (``matplotlib.patches.ConnectionStyle.Arc3``: a quadratic Bezier whose control point is the
    midpoint moved by ``rad`` times the chord, turned a quarter)."""
    (x0, y0), (x1, y1) = p0, p1
    cx, cy = (x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)
    points = []
    for i in range(1, samples):
        t = i / samples
        a, b, c = (1 - t) ** 2, 2 * t * (1 - t), t**2
        points.append((a * x0 + b * cx + c * x1, a * y0 + b * cy + c * y1))
    return points


def _edge_rad(ax, pos: dict, extents: dict, source, target) -> float:
    """The ``arc3`` curvature for the edge ``source -> target`` that passes beside every other
    box: straight when nothing is in the way, else bowed by 0.45, 0.7 or 0.95 column widths,
    away from the middle of the graph first."""
    p0, p1 = ax.transData.transform([pos[source], pos[target]])
    length = max(float(((p1 - p0) ** 2).sum() ** 0.5), 1.0)
    column = float(ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0])
    away = 1 if pos[source][0] + pos[target][0] <= 0 else -1  # rad > 0 bends a down edge left
    others = [box.padded(3) for n, box in extents.items() if n is not source and n is not target]
    candidates = [0.0] + [
        sign * 2 * offset * column / length
        for offset in (0.45, 0.7, 0.95)
        for sign in (away, -away)
    ]
    for rad in candidates:
        curve = _arc(p0, p1, rad)
        if not any(box.contains(x, y) for box in others for x, y in curve):
            return rad
    return candidates[1]


def ready_queue_figure(
    output: torch.Tensor,
    step: int = 1,
    *,
    leaves: dict | None = None,
    steps: list[Step] | None = None,
) -> Figure:
    """The backward graph of ``output`` at one step of the engine's loop, with its ready queue.

    Nodes are laid out by depth from the root; each box shows the Node's name, its
    ``_sequence_nr()`` and how many of its dependencies are still unmet after the step. The
    running Node is yellow, Nodes in the ready queue green, Nodes that already ran grey. Arrows
    are edges (``next_functions``), in the direction gradients flow. Beside the graph: the ready
    queue after the step, next to run on top. ``step``: the step's number, 1 for the first Node
    run up to ``len(backward_steps(output))`` (the title reads "step k of n"; negative counts
    from the end, -1 the last); ``leaves``: ``{"x": x}`` names for the leaves'
    ``AccumulateGrad`` boxes; ``steps``: the simulation, if already computed. Raises IndexError
    for a step out of range and ValueError for a tensor without ``grad_fn``."""
    steps = steps if steps is not None else backward_steps(output)
    if step == 0 or not -len(steps) <= step <= len(steps):
        raise IndexError(f"step {step}: the steps are numbered 1 to {len(steps)}")
    now = steps[step - 1 if step > 0 else step]
    pos = _layout(steps)
    rows = 1 - min(y for _, y in pos.values())
    width = max(sum(1 for p in pos.values() if p[1] == -d) for d in range(rows))
    key = [
        ("running", "running now"),
        ("queued", "in the ready queue"),
        ("done", "already ran"),
        ("waiting", "waiting: deps > 0"),
    ]
    side_rows = 0.5 * max(len(now.queue), 1) + 0.45 * len(key) + 1.2  # queue, then the key
    height = max(rows, side_rows)
    fig = Figure(figsize=(max(7.0, 2.2 * width + 3.5), 1.25 * height + 1.2))
    grid = fig.add_gridspec(1, 2, width_ratios=[max(width, 2) * 1.6, 1.3], wspace=0.05)
    ax, side = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])

    xs = [x for x, _ in pos.values()]
    ax.set_xlim(min(xs) - 1.0, max(xs) + 1.0)
    for axes in (ax, side):  # one vertical scale, graph at the top
        axes.set_ylim(-height + 0.5, 0.5)
    boxes = {}
    for node, (px, py) in pos.items():
        state = _state(node, now)
        boxes[node] = ax.text(
            px,
            py,
            f"{node_label(node, leaves)}\nseq {_seq(node)} · deps {now.remaining[node]}",
            ha="center",
            va="center",
            fontsize=8,
            gid=f"node:{state}",
            color="#777777" if state == "done" else "black",
            fontweight="bold" if state == "running" else "normal",
            zorder=3,  # above the edges
            bbox={
                "boxstyle": "round",
                "fc": _COLOURS[state],
                "ec": "#b08800" if state == "running" else "#999999",
            },
        )
    extents = _box_extents(ax, boxes)
    drawn: dict = {}  # (source, target) -> curvature of its first arrow
    for s in steps:
        for nxt, _ in s.node.next_functions:
            if nxt is None:
                continue
            if (s.node, nxt) in drawn:  # x * x: a second arrow, bent further
                rad = drawn[s.node, nxt] = drawn[s.node, nxt] + 0.3
            else:
                rad = drawn[s.node, nxt] = _edge_rad(ax, pos, extents, s.node, nxt)
            arrow = {
                "arrowstyle": "->",
                "color": "#888888",
                "shrinkA": 17,
                "shrinkB": 17,
                "connectionstyle": f"arc3,rad={rad:.4f}",
            }
            ax.annotate(
                "", xy=pos[nxt], xytext=pos[s.node], arrowprops=arrow, gid="edge", zorder=1
            )
    ax.axis("off")
    title = f"step {now.index} of {len(steps)}: ran {node_label(now.node, leaves)}"
    ax.set_title(title, fontsize=10)

    side.axis("off")
    side.set_xlim(0, 1)
    side.text(0, 0, "ready queue (next first)", fontsize=9, fontweight="bold")
    if not now.queue:
        side.text(0, -0.6, "(empty)", fontsize=8, color="#777777")
    for i, node in enumerate(now.queue):
        new = " (new)" if node in now.made_ready else ""
        side.text(
            0,
            -0.6 - 0.5 * i,
            f"{i + 1}. {node_label(node, leaves)}  seq {_seq(node)}{new}",
            fontsize=8,
            gid="queue",
            bbox={"boxstyle": "round", "fc": _COLOURS["queued"], "ec": "#999999"},
        )
    top = -0.6 - 0.5 * max(len(now.queue), 1) - 0.4
    for i, (state, text) in enumerate(key):
        side.text(
            0,
            top - 0.45 * i,
            text,
            fontsize=7,
            bbox={"boxstyle": "round", "fc": _COLOURS[state], "ec": "#999999"},
        )
    return fig


def _state(node, step: Step) -> str:
    """How a Node is drawn at ``step``: running, done, queued or waiting."""
    if node is step.node:
        return "running"
    if node in step.done:
        return "done"
    return "queued" if node in step.queue else "waiting"


def ready_queue_explorer(output: torch.Tensor, *, leaves: dict | None = None):
    """An explorer: a slider (and a play button) over the steps of ``output``'s backward
    (:func:`backward_steps`), showing :func:`ready_queue_figure` for the chosen step in an
    ``ipywidgets.HTML``, drawn when the slider is let go (under a busy sign the first time:
    :func:`grader.kernel.display.show_cached`). The slider runs from 1 to the number of
    steps, and its value is the picture's "step k of n". Returns an ``ipywidgets.VBox``; its
    ``children[1].value`` is the HTML shown. ``leaves`` names leaves as in
    :func:`ready_queue_figure`."""
    import ipywidgets as widgets

    steps = backward_steps(output)
    slider = widgets.IntSlider(
        value=1, min=1, max=len(steps), description="step", continuous_update=False
    )  # (drawn when let go, not per tick)
    play = widgets.Play(value=1, min=1, max=len(steps), interval=1200)
    widgets.jslink((play, "value"), (slider, "value"))
    picture, cache = widgets.HTML(), {}

    def show(change=None):
        i = slider.value
        show_cached(
            picture,
            cache,
            i,
            lambda: figure_html(ready_queue_figure(output, i, leaves=leaves, steps=steps)),
            f"drawing step {i}",
        )

    slider.observe(show, names="value")
    show()
    return widgets.VBox([widgets.HBox([play, slider]), picture])


# ------------------------------------------------------------------ checkpointing and memory
def mlp_blocks(n: int = 6, width: int = 256, layers: int = 2) -> list[nn.Module]:
    """``n`` blocks of ``layers`` x (``Linear(width, width)``, ``GELU``), float32 on CPU, with
    weights drawn from a fixed seed without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return [
            nn.Sequential(
                *[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())]
            )
            for _ in range(n)
        ]


def measure_checkpointing(
    blocks, x: torch.Tensor, checkpointed=(), *, reentrant: bool = False
) -> dict:
    """Run ``blocks`` in sequence on ``x``, checkpointing the blocks whose indices are in
    ``checkpointed`` with ``torch.utils.checkpoint.checkpoint(block, h, use_reentrant=...)``,
    then backward from the sum of the result.

    ``x``: the input batch (any float tensor the first block takes); it is detached and made to
    require grad, as the reentrant variant needs. Returns a dict: ``saved_bytes`` (int, bytes):
    the ``untyped_storage().nbytes()`` of the distinct storages that the saved-tensor pack hook
    (``torch/autograd/graph.py: saved_tensors_hooks``) saw during the forward, parameters'
    storages excluded (they live either way): the activations kept between forward and
    backward; ``per_block_bytes``: the same, split by the block that saved the storage first;
    ``forward_runs``: how many times a block's forward ran over forward and backward (counted
    by forward pre-hooks). With ``use_reentrant=False``, ``checkpoint``'s own
    ``_checkpoint_hook`` is the innermost hook inside a checkpointed block, so the count sees
    what it keeps: the block's input (``torch/utils/checkpoint.py:
    _CheckpointFrame.save_inputs``). Parameters' ``.grad`` are restored afterwards."""
    params = [p for b in blocks for p in b.parameters()]
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    grads = [p.grad for p in params]
    first_saver: dict = {}
    current = [0]

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_storages and ptr not in first_saver:
            first_saver[ptr] = (current[0], storage.nbytes())
        return t.detach()

    runs = [0]
    hooks = [
        b.register_forward_pre_hook(lambda m, a: runs.__setitem__(0, runs[0] + 1)) for b in blocks
    ]
    try:
        h = x.detach().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for i, block in enumerate(blocks):
                current[0] = i
                if i in checkpointed:
                    h = torch_checkpoint.checkpoint(block, h, use_reentrant=reentrant)
                else:
                    h = block(h)
        h.sum().backward()
    finally:
        for hook in hooks:
            hook.remove()
        for p, g in zip(params, grads):
            p.grad = g
    per_block = [0] * len(blocks)
    for i, nbytes in first_saver.values():
        per_block[i] += nbytes
    return {"saved_bytes": sum(per_block), "per_block_bytes": per_block, "forward_runs": runs[0]}


def checkpoint_modes(n: int) -> list[tuple[str, tuple, bool]]:
    """The modes the memory picture compares, for ``n`` blocks: (label, checkpointed block
    indices, use_reentrant)."""
    every, other = tuple(range(n)), tuple(range(0, n, 2))
    return [
        ("no\ncheckpointing", (), False),
        ("every\nblock", every, False),
        ("every other\nblock", other, False),
        ("every block,\nreentrant", every, True),
    ]


def checkpoint_memory_figure(blocks=None, x: torch.Tensor | None = None) -> Figure:
    """Bars: activation bytes kept for backward (KiB) and block forward runs, per
    checkpointing mode (:func:`checkpoint_modes`), each measured by
    :func:`measure_checkpointing` on the same ``blocks`` and input ``x``. Defaults: six
    :func:`mlp_blocks` (two ``Linear(256, 256)`` + ``GELU`` each) on a 64 x 256 batch."""
    blocks = blocks if blocks is not None else mlp_blocks()
    if x is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            x = torch.randn(64, 256)
    modes = checkpoint_modes(len(blocks))
    results = [measure_checkpointing(blocks, x, c, reentrant=r) for _, c, r in modes]
    labels = [label for label, _, _ in modes]
    colours = ["#8da0cb", "#66c2a5", "#a6d854", "#fc8d62"]

    fig = Figure(figsize=(10, 3.8))
    mem, runs = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    kib = [r["saved_bytes"] / 2**10 for r in results]
    bars = mem.bar(labels, kib, color=colours, gid="saved")
    mem.bar_label(bars, fmt="%.0f KiB", fontsize=8)
    mem.set_ylabel("activations kept for backward (KiB)")
    mem.set_title("memory: distinct saved storages, parameters excluded", fontsize=10)
    bars = runs.bar(labels, [r["forward_runs"] for r in results], color=colours, gid="runs")
    runs.bar_label(bars, fontsize=8)
    runs.set_ylabel("block forward runs (forward + backward)")
    runs.set_title(f"compute: {len(blocks)} blocks, recomputed ones run twice", fontsize=10)
    for ax in (mem, runs):
        ax.tick_params(axis="x", labelsize=8)
        ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def _per_block_figure(result: dict, checkpointed) -> Figure:
    fig = Figure(figsize=(7, 3))
    ax = fig.subplots()
    kib = [b / 2**10 for b in result["per_block_bytes"]]
    colours = ["#66c2a5" if i in checkpointed else "#8da0cb" for i in range(len(kib))]
    bars = ax.bar([str(i) for i in range(len(kib))], kib, color=colours, gid="block")
    for label in ax.bar_label(bars, fmt="%.0f KiB", fontsize=8):
        label.set_gid("block-kib")
    ax.set_xlabel("block (green: checkpointed)")
    ax.set_ylabel("kept for backward (KiB)")
    ax.set_title(
        f"total {result['saved_bytes'] / 2**10:.0f} KiB; "
        f"{result['forward_runs']} block forward runs",
        fontsize=10,
    )
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def checkpoint_explorer(width: int = 128, batch: int = 32):
    """An explorer: choose how many :func:`mlp_blocks` (``width`` features, two Linear + GELU
    each, input ``batch`` x ``width``), which of them to checkpoint and the variant; see the
    activation bytes each block keeps for backward and the forward runs, measured by
    :func:`measure_checkpointing`. Returns an ``ipywidgets.VBox`` whose last child is the
    ``ipywidgets.HTML`` that shows the result."""
    import ipywidgets as widgets

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        x = torch.randn(batch, width)
    count = widgets.IntSlider(value=4, min=1, max=8, description="blocks")
    chosen = widgets.SelectMultiple(  # tall enough for the most blocks: no scrolling
        options=list(range(4)), value=(1, 3), description="checkpoint", rows=count.max
    )
    reentrant = widgets.Checkbox(value=False, description="use_reentrant=True")
    picture = widgets.HTML()

    updating = [False]

    def show(change=None):
        if updating[0]:
            return
        n = count.value
        if list(chosen.options) != list(range(n)):
            keep = tuple(i for i in chosen.value if i < n)
            updating[0] = True  # new options reset the selection
            chosen.options = list(range(n))
            chosen.value = keep
            updating[0] = False
        result = measure_checkpointing(
            mlp_blocks(n, width), x, set(chosen.value), reentrant=reentrant.value
        )
        picture.value = figure_html(_per_block_figure(result, set(chosen.value)))

    for control in (count, chosen, reentrant):
        control.observe(show, names="value")
    show()
    return widgets.VBox([widgets.HBox([count, reentrant]), chosen, picture])
