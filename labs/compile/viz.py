"""Pictures, an explorer and a table for lab 4 (torch.compile), each one call from a cell.

Pictures return a ``matplotlib.figure.Figure`` built without pyplot (no global figure state);
importing :mod:`grader.kernel.display` registers the PNG formatter that shows it in JupyterLab. The
explorer returns an ``ipywidgets.VBox`` whose picture lives in an ``ipywidgets.HTML`` value, so
it works, and can be tested, without a kernel.

Everything drawn is read from what torch itself produced:

- :func:`graph_figure`: an FX graph (Dynamo's, AOTAutograd's, or one a pass rewrote) as a
  layered DAG, one box per node coloured by ``node.op``; with a second graph, before and after
  side by side;
- :func:`break_map`, :func:`graph_break_map`: a function's source, line by line, shaded by the
  graph ``torch._dynamo.explain`` put each line's ops in, with the lines where the graph broke
  marked and their reasons;
- :func:`break_explorer`: a dropdown over several functions' graph-break maps, drawn as HTML
  text (:func:`break_map_html`: code at :data:`CODE_PX` pixels, however wide the function);
- :func:`log_view`: a captured log (``TORCH_LOGS``) shown as it was written, one line per line,
  scrolling sideways instead of wrapping inside an identifier;
- :func:`kernels`, :func:`kernels_table`: the kernels in Inductor's output code (generated C++
  or Triton, and ATen fallbacks), in the order the wrapper calls them;
- :func:`timings_figure`: medians of ``torch.utils.benchmark`` timings as bars, titled with
  what was timed, the unit and the thread count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import inspect
import io
import logging
import os
import re
import warnings
from collections.abc import Callable

import numpy as np
import torch
import torch.fx
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

import grader.kernel.display  # noqa: F401  (registers the PNG formatter for figures)
from grader.kernel.display import show_cached, strip_paths, table

#: fill colour of an FX node's box, by ``node.op`` (the six opcodes of ``torch/fx/node.py``)
OP_COLOURS = {
    "placeholder": "#a6d854",
    "get_attr": "#e5c494",
    "call_function": "#8da0cb",
    "call_method": "#66c2a5",
    "call_module": "#fc8d62",
    "output": "#d9d9d9",
}
#: shading of the source lines of graph 1, 2, ... (cycled past the tenth graph)
GRAPH_COLOURS = (
    "#8da0cb",
    "#66c2a5",
    "#fc8d62",
    "#e78ac3",
    "#a6d854",
    "#ffd92f",
    "#e5c494",
    "#b3b3b3",
    "#80b1d3",
    "#bc80bd",
)
#: the colour that marks a graph break
BREAK_COLOUR = "#d7191c"
#: the kinds of kernel :func:`kernels` reports
KINDS = ("generated C++", "generated Triton", "ATen fallback")

#: CSS pixels of the code in the explorer and in :func:`log_view` (text in HTML, never scaled
#: down with a picture); notes (line numbers, break reasons) are one pixel smaller
CODE_PX = 13

_MAX_WIDTH, _MAX_HEIGHT = 18.0, 16.0  # inches: fonts shrink from 8 pt for graphs to fit
_REASON_CHARS = 64  # a break reason is cut to this many characters
#: monospace text in HTML that keeps its lines: no wrapping at all, a scroll bar when too wide
#: (JupyterLab's own ``pre`` outputs wrap anywhere, inside identifiers: ``word-break:
#: break-all``; a ``div`` with these styles is not subject to that rule)
_PRE = (
    f"font-family:var(--jp-code-font-family,monospace);font-size:{CODE_PX}px;"
    "line-height:1.4;white-space:pre;word-break:normal;overflow-wrap:normal"
)


# ------------------------------------------------------------------ FX graphs
def node_label(node: torch.fx.Node) -> str:
    """The short name a box shows for ``node``: a placeholder's name (``l_x_``, ``primals_1``),
    a ``call_function``'s target (``sin`` for ``torch.sin``, ``mul`` for ``operator.mul``,
    ``aten.mm`` for ``torch.ops.aten.mm.default``: the overload is kept unless it is
    ``default``), a method's or submodule's or attribute's name, or ``output``."""
    if node.op in ("placeholder", "output"):
        return node.name if node.op == "placeholder" else "output"
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        packet = target._schema.name.replace("::", ".")
        return packet if target._overloadname == "default" else f"{packet}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.replace("::", ".")
    return getattr(target, "__name__", None) or str(target)


def graph_layers(gm: torch.fx.GraphModule) -> dict:
    """``{node: layer}`` for every node of ``gm.graph``, counted from 0 at the top: the length
    of the longest path to the node from a node without inputs, following
    ``node.all_input_nodes`` (``torch/fx/node.py: Node.all_input_nodes``). A node without
    inputs (a placeholder, a ``get_attr``) sits one layer above its first reader, so that a
    weight read late in the graph is drawn next to its reader, not in the top row."""
    layer: dict = {}
    for node in gm.graph.nodes:  # an FX graph's node list is in topological order
        layer[node] = 1 + max((layer[i] for i in node.all_input_nodes), default=-1)
    for node in gm.graph.nodes:
        if not node.all_input_nodes and node.users:
            layer[node] = min(layer[u] for u in node.users) - 1
    return layer


def _positions(gm: torch.fx.GraphModule, sweeps: int = 4) -> dict:
    """(x, y) per node: y = -layer (:func:`graph_layers`); within a layer, nodes one unit apart
    and centred on x = 0, ordered to cut crossings by the barycentre heuristic of layered
    drawing: starting from the graph's order, a few sweeps down (each node under the mean x of
    its inputs) and up (over the mean x of its readers), ties kept in the previous order."""
    layer = graph_layers(gm)
    rows: list = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for node in gm.graph.nodes:
        rows[layer[node]].append(node)
    x = {n: i - (len(row) - 1) / 2 for row in rows for i, n in enumerate(row)}

    def place(row: list, neighbours) -> None:
        def centre(n):
            near = [x[m] for m in neighbours(n) if m in x]
            return float(np.mean(near)) if near else x[n]

        row.sort(key=lambda n: (centre(n), x[n]))
        for i, n in enumerate(row):
            x[n] = i - (len(row) - 1) / 2

    for _ in range(sweeps):
        for row in rows[1:]:
            place(row, lambda n: n.all_input_nodes)
        for row in reversed(rows[:-1]):
            place(row, lambda n: list(n.users))
    for row in rows[1:]:
        place(row, lambda n: n.all_input_nodes)
    return {n: (x[n], -layer[n]) for n in layer}


def _sizes(graphs: list, pos: list, fontsize: float) -> tuple[list, float]:
    """Each panel's width and the common height, in inches, at ``fontsize`` points."""
    widths = []
    for gm, p in zip(graphs, pos):
        label = max((len(node_label(n)) for n in gm.graph.nodes), default=6)
        ys = [q[1] for q in p.values()]
        columns = max((ys.count(y) for y in set(ys)), default=1)
        column = max(0.9, (label * 0.62 * fontsize + 2 * fontsize) / 72 + 0.25)
        widths.append(max(2.6, columns * column + 0.3))
    rows = max((1 - min((q[1] for q in p.values()), default=0) for p in pos), default=1)
    height = rows * 3.3 * fontsize / 72 + 1.3
    return widths, height


def _arc(p0, p1, rad: float, samples: int = 20) -> np.ndarray:
    """Points of matplotlib's ``arc3,rad=rad`` curve from display point ``p0`` to ``p1``
    (``matplotlib.patches.ConnectionStyle.Arc3``: a quadratic Bezier whose control point is the
    chord's midpoint moved by ``rad`` times the chord, turned a quarter)."""
    (x0, y0), (x1, y1) = p0, p1
    control = np.array([(x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)])
    t = np.linspace(0, 1, samples + 1)[1:-1, None]
    return (1 - t) ** 2 * np.array(p0) + 2 * t * (1 - t) * control + t**2 * np.array(p1)


def _edge_rad(ax, source, target, extents: dict, ends: tuple) -> float:
    """The ``arc3`` curvature for the arrow ``source -> target`` (from the fraction
    ``ends[0]`` of the way along the bottom of one box to ``ends[1]`` along the top of the
    other) that misses every other box: straight when nothing is in the way, else bowed by 0.45
    to 1.45 column widths, to the side away from the graph's middle first, never above the
    input's box or below the reader's; straight when no bow misses."""
    src, dst = extents[source], extents[target]
    p0 = (src.x0 + ends[0] * src.width, src.y0)
    p1 = (dst.x0 + ends[1] * dst.width, dst.y1)
    others = [b for n, b in extents.items() if n is not source and n is not target]
    others = np.array([[b.x0 - 3, b.y0 - 3, b.x1 + 3, b.y1 + 3] for b in others]).reshape(-1, 4)
    length = max(float(np.hypot(p1[0] - p0[0], p1[1] - p0[1])), 1.0)
    column = float(ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0])
    middle = float(ax.transData.transform((0, 0))[0])
    away = 1 if (p0[0] + p1[0]) / 2 <= middle else -1  # rad > 0 bends a downward edge left
    candidates = [0.0] + [
        sign * 2 * offset * column / length
        for offset in (0.45, 0.7, 0.95, 1.2, 1.45)
        for sign in (away, -away)
    ]
    for rad in candidates:
        xy = _arc(p0, p1, rad)
        if xy[:, 1].min() < p1[1] - 2 or xy[:, 1].max() > p0[1] + 2:
            continue  # a bow that loops above its input or below its reader
        inside = (
            (xy[:, None, 0] > others[None, :, 0])
            & (xy[:, None, 0] < others[None, :, 2])
            & (xy[:, None, 1] > others[None, :, 1])
            & (xy[:, None, 1] < others[None, :, 3])
        )
        if not inside.any():
            return rad
    return 0.0


def _draw_graph(ax, gm: torch.fx.GraphModule, pos: dict, fontsize: float, rows: int) -> None:
    boxes = {}
    for node, (x, y) in pos.items():
        boxes[node] = ax.text(
            x,
            y,
            node_label(node),
            ha="center",
            va="center",
            fontsize=fontsize,
            family="monospace",
            gid=f"node:{node.op}",
            zorder=3,
            bbox={
                "boxstyle": "round,pad=0.3",
                "fc": OP_COLOURS.get(node.op, "#ffffff"),
                "ec": "#666666",
                "lw": 0.6,
            },
        )
    xs = [x for x, _ in pos.values()] or [0.0]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(-rows + 0.4, 0.6)
    ax.axis("off")
    ax.get_figure(root=True).draw_without_rendering()
    extents = {n: t.get_bbox_patch().get_window_extent() for n, t in boxes.items()}

    def spread(node, others) -> dict:  # where along a box each of its edges ends
        others = sorted(others, key=lambda n: pos[n][0])
        return {n: (i + 1) / (len(others) + 1) for i, n in enumerate(others)}

    exits = {n: spread(n, n.users) for n in gm.graph.nodes}
    for node in gm.graph.nodes:
        entries = spread(node, node.all_input_nodes)
        for source in node.all_input_nodes:
            ends = (exits[source][node], entries[source])
            rad = _edge_rad(ax, source, node, extents, ends)
            ax.annotate(
                "",
                xy=(ends[1], 1),  # on the top of the reader's box
                xycoords=boxes[node],
                xytext=(ends[0], 0),  # on the bottom of the input's box
                textcoords=boxes[source],
                arrowprops={
                    "arrowstyle": "-|>",
                    "color": "#777777",
                    "lw": 0.7,
                    "mutation_scale": 6 + fontsize,
                    "shrinkA": 0.3 * fontsize + 1,
                    "shrinkB": 0.3 * fontsize + 1,
                    "connectionstyle": f"arc3,rad={rad:.4f}",
                },
                gid="edge",
                zorder=1,
            )


def graph_figure(
    before: torch.fx.GraphModule,
    after: torch.fx.GraphModule | None = None,
    *,
    titles: tuple[str, ...] | None = None,
) -> Figure:
    """An FX graph drawn as a layered DAG; with ``after``, two panels side by side: the graph
    before and after a pass (Dynamo's torch-level graph and AOTAutograd's aten graph, say).

    ``before``, ``after``: ``torch.fx.GraphModule``s (only ``.graph`` is read). Each node is one
    box, labelled with :func:`node_label` and filled with its opcode's colour
    (:data:`OP_COLOURS`, with a legend of the opcodes present); each arrow is an edge from an
    input (``node.all_input_nodes``) to the node that reads it. Rows are layers
    (:func:`graph_layers`: the longest path from a placeholder, top to bottom); within a row,
    nodes are ordered to cut crossings, and an arrow that would cross a box is bowed around
    it. Boxes' text is 8 pt, shrunk (to 5 pt at least) until the figure fits 18 x 16 inches:
    about 40 layers or 14 boxes in a row at 8 pt. ``titles``: the panels' titles (default
    ``("before", "after")``, or ``("FX graph",)`` for one graph), each followed by its node
    count. Returns a ``Figure``; raises TypeError when a graph is not a ``GraphModule``.

    Draws what ``torch/fx/graph.py: Graph.print_tabular`` and
    ``torch/fx/passes/graph_drawer.py: FxGraphDrawer`` show of a graph."""
    graphs = [before] if after is None else [before, after]
    for gm in graphs:
        if not isinstance(gm, torch.fx.GraphModule):
            raise TypeError(f"expected a torch.fx.GraphModule, got {type(gm).__name__}")
    titles = titles or (("FX graph",) if after is None else ("before", "after"))
    pos = [_positions(gm) for gm in graphs]
    fontsize = 8.0
    widths, height = _sizes(graphs, pos, fontsize)
    while (sum(widths) > _MAX_WIDTH or height > _MAX_HEIGHT) and fontsize > 5:
        fontsize -= 0.5
        widths, height = _sizes(graphs, pos, fontsize)
    fig = Figure(figsize=(sum(widths), height))
    axes = fig.subplots(1, len(graphs), gridspec_kw={"width_ratios": widths}, squeeze=False)[0]
    fig.subplots_adjust(left=0.02, right=0.98, top=1 - 0.45 / height, bottom=0.5 / height)
    rows = max(1 - min((q[1] for q in p.values()), default=0) for p in pos)
    for ax, gm, p, title in zip(axes, graphs, pos, titles):
        n = len(gm.graph.nodes)
        _draw_graph(ax, gm, p, fontsize, rows)
        ax.set_title(f"{title}: {n} node{'s' * (n != 1)}", fontsize=10)
    present = {n.op for gm in graphs for n in gm.graph.nodes}
    fig.legend(
        handles=[
            Patch(facecolor=c, edgecolor="#666666", label=op)
            for op, c in OP_COLOURS.items()
            if op in present
        ],
        loc="lower center",
        ncol=6,
        fontsize=8,
        frameon=False,
    )
    return fig


# ------------------------------------------------------------------ graph breaks
@dataclasses.dataclass(frozen=True)
class BreakMap:
    """What :func:`explain_breaks` found for one function.

    ``name``: the function's ``__name__``; ``rows``: one ``(line number, source text, graph
    index or None, break reason or None)`` per source line (see :func:`break_map`);
    ``graphs``: ``{line number: (graph indices, from 1)}`` for every line whose ops went into
    some graph (one line may feed several: a lambda a skipped builtin calls back); ``outside``:
    short descriptions of breaks whose stack has no frame in the function's lines;
    ``graph_count``, ``graph_break_count``: explain's counts."""

    name: str
    rows: list
    graphs: dict
    outside: list
    graph_count: int
    graph_break_count: int


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _short_reason(reason: str) -> str:
    """The first line of a break's reason, with the first `name` its explanation quotes when
    the first line has none (``Failed to trace builtin operator: print``), cut to fit."""
    lines = [line.strip() for line in (reason or "").strip().splitlines()] or ["?"]
    first = lines[0]
    quoted = re.search(r"`([^`]+)`", " ".join(lines[1:3]))
    if quoted and "`" not in first and quoted.group(1).rstrip(".") not in first:
        first += f": {quoted.group(1).rstrip('.')}"
    return first if len(first) <= _REASON_CHARS else first[: _REASON_CHARS - 1] + "…"


def _source(fn) -> tuple[list[str], int, str, str]:
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    target = inspect.unwrap(target)
    code = getattr(target, "__code__", None)
    if code is None:
        raise TypeError(f"{fn!r} is not a Python function: no source lines to map")
    lines, first = inspect.getsourcelines(target)
    return lines, first, code.co_filename, getattr(target, "__name__", "fn")


@contextlib.contextmanager
def dynamo_quiet():
    """Mute what Dynamo says about the graph breaks it meets while the body runs: Python warnings
    (``torch/_dynamo/utils.py: warn_once``) and log records below ERROR (``Graph break from
    Tensor.item()``); the previous settings come back on exit."""
    before = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(before)


def explain_breaks(fn: Callable, *args) -> BreakMap:
    """Run ``torch._dynamo.explain(fn)(*args)`` after ``torch._dynamo.reset()`` (so ``fn`` runs
    once, side effects included, though what it prints and what Dynamo warns about the breaks it
    meets are not shown) and map its graphs and breaks onto ``fn``'s source lines.

    A line is in graph ``k`` (counted from 1, in the order of ``ExplainOutput.graphs``) when a
    ``call_*`` or ``get_attr`` node of that graph has, in its ``node.meta["stack_trace"]`` (the
    ``File "...", line N`` text Dynamo records per node, outermost frame first), a frame of
    ``fn``'s file within ``fn``'s lines: the innermost such frame is the line. A break is on
    the line of the innermost frame of its ``GraphCompileReason.user_stack`` in ``fn``'s lines;
    its reason is the first line of ``.reason``, cut to 64 characters, followed by the place the
    break really happened when that is deeper (``heapq.py:568 in nlargest``). Breaks with no
    frame in ``fn`` (in a frame Dynamo compiled on its own after falling back) are listed in
    ``outside``. Raises what ``fn`` raises, TypeError when ``fn`` is not a Python function (or
    ``nn.Module``: its ``forward`` is mapped) and OSError when its source cannot be read.

    Models ``torch/_dynamo/eval_frame.py: explain`` and ``torch/_dynamo/backends/debugging.py:
    ExplainOutput``; the stack traces come from ``torch/_dynamo/output_graph.py:
    OutputGraph.create_proxy`` (``node.meta["stack_trace"]``)."""
    lines, first, filename, name = _source(fn)
    last = first + len(lines) - 1

    def line_of(frames) -> int | None:
        inside = [n for f, n in frames if f == filename and first <= n <= last]
        return inside[-1] if inside else None

    torch._dynamo.reset()
    with contextlib.redirect_stdout(io.StringIO()), dynamo_quiet():
        explained = torch._dynamo.explain(fn)(*args)
    graphs: dict = {}
    for k, gm in enumerate(explained.graphs, start=1):
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            frames = [(f, int(n)) for f, n in _FRAME.findall(node.meta.get("stack_trace") or "")]
            line = line_of(frames)
            if line is not None and k not in graphs.setdefault(line, []):
                graphs[line].append(k)
    reasons: dict = {}
    outside = []
    for br in explained.break_reasons:
        stack = list(br.user_stack or [])
        text = _short_reason(br.reason)
        line = line_of([(fs.filename, fs.lineno) for fs in stack])
        deepest = stack[-1] if stack else None
        if deepest is not None and (
            line is None or deepest.lineno != line or deepest.filename != filename
        ):
            text += f" ({os.path.basename(deepest.filename)}:{deepest.lineno} in {deepest.name})"
        if line is None:
            outside.append(text)
        elif text not in reasons.setdefault(line, []):
            reasons[line].append(text)
    rows = [
        (
            first + i,
            text.rstrip("\r\n").expandtabs(4),
            min(graphs[first + i]) if first + i in graphs else None,
            "; ".join(reasons[first + i]) if first + i in reasons else None,
        )
        for i, text in enumerate(lines)
    ]
    return BreakMap(
        name,
        rows,
        {line: tuple(sorted(ks)) for line, ks in graphs.items()},
        outside,
        explained.graph_count,
        explained.graph_break_count,
    )


def break_map(fn: Callable, *args) -> list[tuple[int, str, int | None, str | None]]:
    """``fn``'s source lines (``inspect.getsourcelines``, decorators included), one tuple per
    line: ``(line number in its file, the line's text without its newline, the first graph
    its ops went into, counted from 1, or None, the break reason(s) on that line or None)``.
    Runs ``torch._dynamo.explain(fn)(*args)`` once; see :func:`explain_breaks` for how lines,
    graphs and breaks are matched and what is raised."""
    return explain_breaks(fn, *args).rows


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _map_figure(found: BreakMap) -> Figure:
    rows = found.rows
    indent = min(
        (len(t) - len(t.lstrip()) for _, t, _, _ in rows if t.strip()), default=0
    )  # shown dedented
    code = [t[indent:] for _, t, _, _ in rows]
    width_code = max((len(c) for c in code), default=10)
    width_reason = max((len(r) + 9 for *_, r in rows if r), default=0)
    gutter = 1.1 * max((len(ks) for ks in found.graphs.values()), default=1) + 4.8
    chars = gutter + width_code + 3 + width_reason
    fig = Figure(figsize=(max(6.5, 0.078 * chars + 0.6), 0.25 * len(rows) + 1.0))
    ax = fig.subplots()
    for y, ((lineno, _, graph, reason), text) in enumerate(zip(rows, code)):
        ks = found.graphs.get(lineno, ())
        if graph is not None:
            ax.add_patch(
                Rectangle(
                    (-gutter, y - 0.5),
                    chars,
                    1,
                    facecolor=GRAPH_COLOURS[(graph - 1) % len(GRAPH_COLOURS)],
                    alpha=0.45,
                    linewidth=0,
                    gid=f"graph:{graph}",
                )
            )
        for j, k in enumerate(ks):  # one chip per graph the line feeds
            ax.add_patch(
                Rectangle(
                    (-gutter + 0.6 + 1.1 * j, y - 0.32),
                    0.9,
                    0.64,
                    facecolor=GRAPH_COLOURS[(k - 1) % len(GRAPH_COLOURS)],
                    edgecolor="#555555",
                    linewidth=0.5,
                    gid=f"chip:{k}",
                )
            )
        ax.text(
            -0.8,
            y,
            str(lineno),
            ha="right",
            va="center",
            fontsize=8,
            color="#777777",
            family="monospace",
            gid="lineno",
        )
        ax.text(0, y, text, ha="left", va="center", fontsize=9, family="monospace", gid="code")
        if reason is not None:
            ax.add_patch(
                Rectangle((-gutter, y - 0.5), 0.35, 1, facecolor=BREAK_COLOUR, gid="break")
            )
            ax.text(
                width_code + 3,
                y,
                f"← break: {reason}",
                ha="left",
                va="center",
                fontsize=8,
                color=BREAK_COLOUR,
                family="monospace",
                gid="reason",
            )
    ax.set_xlim(-gutter, chars - gutter)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_axis_off()
    n, m = found.graph_count, found.graph_break_count
    ax.set_title(
        f"{found.name}: {_plural(n, 'graph')}, {_plural(m, 'break')}", fontsize=10, pad=24
    )
    handles = [
        Patch(facecolor=GRAPH_COLOURS[(k - 1) % len(GRAPH_COLOURS)], alpha=0.6, label=f"graph {k}")
        for k in range(1, n + 1)
    ]
    handles.append(Patch(facecolor=BREAK_COLOUR, label="break"))
    ax.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0, 1.0),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
        borderaxespad=0.2,
    )
    if found.outside:
        note = "\n".join(f"break in a frame outside {found.name}: {o}" for o in found.outside)
        ax.text(
            -gutter,
            len(rows) - 0.1,
            note,
            ha="left",
            va="top",
            fontsize=8,
            color=BREAK_COLOUR,
            gid="outside",
        )
        fig.set_figheight(fig.get_figheight() + 0.2 * len(found.outside))
    fig.tight_layout()
    return fig


def graph_break_map(fn: Callable, *args) -> Figure:
    """``fn``'s source, one row per line, as :func:`explain_breaks` maps it: each line whose
    ops went into a graph shaded in the colour of the first such graph (:data:`GRAPH_COLOURS`;
    a chip per graph in the left gutter when the line feeds several), each line where the graph
    broke marked in red at the left with ``← break: <reason>`` at the right, and breaks that
    happened outside ``fn``'s lines noted below. Line numbers are those of ``fn``'s file; the
    code is shown dedented. Legend: graph 1, graph 2, ..., break; title: the function's name,
    explain's ``graph_count`` graphs and ``graph_break_count`` breaks. Runs
    ``torch._dynamo.explain(fn)(*args)`` once (raises what :func:`explain_breaks` raises) and
    returns a ``Figure``.

    Draws what ``torch._dynamo.explain`` (``torch/_dynamo/eval_frame.py: explain``) and
    ``TORCH_LOGS=graph_breaks`` report, placed on the source."""
    return _map_figure(explain_breaks(fn, *args))


def _tint(colour: str, alpha: float) -> str:
    """``#rrggbb`` as a CSS ``rgba(...)`` of opacity ``alpha``."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _chip(colour: str, label: str = "") -> str:
    box = (
        f'<span style="display:inline-block;width:0.8em;height:0.9em;margin-right:2px;'
        f'vertical-align:middle;background:{colour};border:1px solid #555"></span>'
    )
    return box + (f"{html.escape(label)} " if label else "")


def break_map_html(found: BreakMap) -> str:
    """What :func:`graph_break_map` draws, as HTML text, for the explorer: one table row per
    source line (code dedented, in monospace at :data:`CODE_PX` pixels, spaces kept, never
    wrapped), shaded in the colour of the first graph its ops went into
    (:data:`GRAPH_COLOURS`), with a chip per graph it feeds and its line number; a line where
    the graph broke has a red bar at the left and, in a row of its own under it, ``← break:
    <reason>`` (wrapping at spaces only, never inside an identifier, at most 48 characters
    wide so it stays in view). Above: a legend (graph 1, graph 2, ..., break); below: the
    breaks that happened outside the function. The table sits in a box that scrolls sideways
    when it is wider than the output. ``found``: a :class:`BreakMap` (:func:`explain_breaks`)."""
    rows = found.rows
    indent = min((len(t) - len(t.lstrip()) for _, t, _, _ in rows if t.strip()), default=0)
    note = f"font-size:{CODE_PX - 1}px"
    legend = "".join(
        _chip(_tint(GRAPH_COLOURS[(k - 1) % len(GRAPH_COLOURS)], 0.6), f"graph {k}")
        for k in range(1, found.graph_count + 1)
    ) + _chip(BREAK_COLOUR, "break")
    body = []
    for lineno, text, graph, reason in rows:
        shade = (
            f' style="background:{_tint(GRAPH_COLOURS[(graph - 1) % len(GRAPH_COLOURS)], 0.45)}"'
            if graph is not None
            else ""
        )
        bar = f"border-left:4px solid {BREAK_COLOUR if reason else 'transparent'}"
        chips = "".join(
            _chip(GRAPH_COLOURS[(k - 1) % len(GRAPH_COLOURS)])
            for k in found.graphs.get(lineno, ())
        )
        body.append(
            f"<tr{shade}>"
            f'<td style="{bar};padding:0 4px;white-space:nowrap">{chips}</td>'
            f'<td class="lineno" style="{note};color:#777;text-align:right;padding:0 8px">'
            f"{lineno}</td>"
            f'<td class="code" style="{_PRE};padding:0 8px">{html.escape(text[indent:])}</td>'
            "</tr>"
        )
        if reason:
            body.append(
                f'<tr><td style="border-left:4px solid {BREAK_COLOUR}"></td><td></td>'
                f'<td class="reason" style="padding:0 8px 3px"><div style="{note};'
                f"color:{BREAK_COLOUR};max-width:48em;white-space:normal;word-break:normal;"
                f'overflow-wrap:normal">← break: {html.escape(reason)}</div></td></tr>'
            )
    outside = "".join(
        f'<div style="{note};color:{BREAK_COLOUR}">break in a frame outside '
        f"{html.escape(found.name)}: {html.escape(o)}</div>"
        for o in found.outside
    )
    return (
        f'<div style="{note};margin:2px 0 4px">{legend}</div>'
        '<div style="overflow-x:auto;max-width:100%">'
        '<table style="border-collapse:collapse;margin:0">'
        f"{''.join(body)}</table></div>{outside}"
    )


def break_explorer(programs: dict[str, tuple[Callable, tuple]]):
    """An explorer: a dropdown of the names of ``programs`` (``{name: (fn, args)}``), showing
    for the chosen one a one-line summary ("name: N graphs, M graph breaks") and its map as
    HTML text (:func:`break_map_html`, what :func:`graph_break_map` draws, with the code at
    :data:`CODE_PX` pixels: a picture would be scaled down to the output's width). Each
    function is explained the first time it is chosen and the result cached, so each runs
    once, under a busy sign with the dropdown disabled
    (:func:`grader.kernel.display.show_cached`); an exception from ``fn`` is shown instead of
    a map.
    Returns an ``ipywidgets.VBox``: ``children[0]`` is the ``Dropdown``, ``children[1]`` the
    ``ipywidgets.HTML`` shown. Raises ValueError for an empty dict."""
    import ipywidgets as widgets

    if not programs:
        raise ValueError("no programs to explore")
    names = list(programs)
    choice = widgets.Dropdown(options=names, value=names[0], description="function")
    picture, cache = widgets.HTML(), {}

    def render(name: str) -> str:
        fn, args = programs[name]
        try:
            found = explain_breaks(fn, *args)
        except Exception as exc:  # noqa: BLE001  (a learner's function may fail: show it)
            return f"<p><b>{html.escape(name)}</b> failed: {html.escape(repr(exc))}</p>"
        summary = (
            f"{_plural(found.graph_count, 'graph')}, "
            f"{_plural(found.graph_break_count, 'graph break')}"
        )
        return f"<p><b>{html.escape(name)}</b>: {summary}</p>" + break_map_html(found)

    def show(change=None):
        name = choice.value
        show_cached(
            picture,
            cache,
            name,
            lambda: render(name),
            f"explaining {name} with torch._dynamo.explain (a few seconds)",
            [choice],
        )

    choice.observe(show, names="value")
    show()
    return widgets.VBox([choice, picture])


# ------------------------------------------------------------------ logs
class LogView:
    """A captured log shown as it was written (see :func:`log_view`): ``text``, ``caption``."""

    def __init__(self, text: str, caption: str = ""):
        self.text = strip_paths(text)
        self.caption = caption

    def __repr__(self) -> str:
        return "\n".join(([self.caption] if self.caption else []) + [self.text])

    def _repr_html_(self) -> str:
        caption = (
            f'<div style="margin:2px 0">{html.escape(self.caption)}</div>' if self.caption else ""
        )
        return (
            f'{caption}<div class="log" style="{_PRE};overflow-x:auto;max-width:100%;'
            f'padding:2px 0">{html.escape(self.text)}</div>'
        )


def log_view(text: str, *, caption: str = "") -> LogView:
    """``text`` (a log, several lines) to show from a cell: in JupyterLab as HTML whose lines
    are kept whole, in monospace at :data:`CODE_PX` pixels, scrolling sideways when they are
    wider than the output (a ``print``ed line wraps at the output's edge, inside identifiers:
    JupyterLab's ``.jp-OutputArea-output pre`` sets ``word-break: break-all``); in plain text,
    ``caption`` then the lines. Folder prefixes of installed and temporary files are cut
    (``grader.kernel.display.strip_paths``)."""
    return LogView(text, caption)


# ------------------------------------------------------------------ Inductor's kernels
_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(cpp_pybinding|cpp|triton)\(", re.MULTILINE)
_STRING = re.compile(r"'''.*?'''|\"\"\".*?\"\"\"", re.DOTALL)
_CALL = re.compile(
    r"^\s*(?:[\w, ]+=\s*)?(torch\.ops\.[\w.]+|aten\.[\w.]+|extern_kernels\.\w+|\w+)"
    r"(?:\.run)?\(",
    re.MULTILINE,
)


def kernels(code: str | list[str]) -> list[tuple[str, str]]:
    """The kernels in Inductor's output code, in the order the wrapper calls them: one
    ``(name, kind)`` per call, ``kind`` one of :data:`KINDS`.

    ``code``: the Python wrapper module Inductor wrote (one string of the list
    ``torch._inductor.utils.run_and_get_code`` returns, or the list: its kernels in order).
    ``"generated C++"``: a kernel defined by ``name = async_compile.cpp_pybinding(`` (or
    ``.cpp(``); ``"generated Triton"``: one defined by ``name = async_compile.triton(`` (called
    as ``name.run(``); ``"ATen fallback"``: a statement that calls an operator,
    ``torch.ops.<namespace>.X(`` (named without ``torch.ops.``, overload kept:
    ``aten.sort.stable``; custom operators too), or ``extern_kernels.X(``. Kernel sources
    (triple-quoted strings), comments and calls nested in other calls (``assert_size_stride``)
    are not read; a generated kernel defined but never called is not listed. Pure text: no
    torch needed.

    Reads the wrapper ``torch/_inductor/codegen/wrapper.py: PythonWrapperCodegen`` writes: the
    kernel definitions of ``define_kernel`` and the calls of ``generate_kernel_call`` and
    ``generate_extern_kernel_out`` / ``ExternKernel`` fallbacks."""
    if not isinstance(code, str):
        return [k for one in code for k in kernels(one)]
    generated = {
        name: "generated Triton" if how == "triton" else "generated C++"
        for name, how in _KERNEL_DEF.findall(code)
    }
    found = []
    for match in _CALL.finditer(_STRING.sub("''", code)):
        name = match.group(1)
        if name in generated:
            found.append((name, generated[name]))
        elif name.startswith(("torch.ops.", "aten.", "extern_kernels.")):
            found.append((name.removeprefix("torch.ops."), "ATen fallback"))
    return found


def kernels_table(code: str | list[str]):
    """:func:`kernels` of ``code`` as a ``grader.kernel.display.table``: one row per kernel call
    (``#``, kernel name, kind), in call order, captioned with the counts ("5 kernels: 2
    generated, 3 ATen fallbacks")."""
    found = kernels(code)
    fallbacks = sum(1 for _, kind in found if kind == "ATen fallback")
    caption = (
        f"{_plural(len(found), 'kernel')}: {len(found) - fallbacks} generated, "
        f"{_plural(fallbacks, 'ATen fallback')}"
    )
    rows = [(i, name, kind) for i, (name, kind) in enumerate(found, start=1)]
    return table(rows, ["#", "kernel", "kind"], caption=caption)


# ------------------------------------------------------------------ timings
def timings_figure(medians: dict[str, float], *, what: str, threads: int) -> Figure:
    """Horizontal bars, one per entry of ``medians`` (``{label: median seconds per call}``, as
    ``torch.utils.benchmark.Measurement.median`` gives it), in microseconds, each labelled with
    its value and its ratio to the first entry. Title: ``what`` was timed, "median time per
    call", the unit and ``threads``, so the picture says what it measures on its own. Returns a
    ``Figure``; raises ValueError for an empty dict or a median that is not positive."""
    if not medians or any(not t > 0 for t in medians.values()):
        raise ValueError("timings_figure needs at least one positive median, in seconds")
    labels = list(medians)
    micro = [medians[k] * 1e6 for k in labels]
    fig = Figure(figsize=(7.5, 0.55 * len(labels) + 1.3))
    ax = fig.subplots()
    y = list(range(len(labels)))[::-1]
    bars = ax.barh(y, micro, color=GRAPH_COLOURS[: len(labels)], height=0.6)
    for bar, value in zip(bars, micro):
        bar.set_gid("timing")
        ax.text(
            value,
            bar.get_y() + bar.get_height() / 2,
            f" {value:,.0f} us ({value / micro[0]:.2f}x)",
            va="center",
            fontsize=9,
            gid="value",
        )
    ax.set_yticks(y, labels, fontsize=9)
    ax.set_xlim(0, max(micro) * 1.45)
    ax.set_xlabel("median time per call (microseconds; shorter is faster)", fontsize=9)
    ax.set_title(
        f"{what}: median time per call, torch.utils.benchmark, "
        f"{threads} thread{'s' * (threads != 1)}",
        fontsize=10,
    )
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
