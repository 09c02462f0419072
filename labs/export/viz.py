"""Pictures and an explorer for lab 6 (torch.export), each one call from a cell.

Pictures return a ``matplotlib.figure.Figure`` built without pyplot (no global figure state);
importing :mod:`grader.kernel.display` registers the PNG formatter that shows it in JupyterLab. The
explorer returns an ``ipywidgets.VBox`` whose verdict lives in an ``ipywidgets.HTML`` value, so
it works, and can be tested, without a kernel.

Everything drawn is read from what torch itself produced:

- :func:`signature_figure`: an ``ExportedProgram``'s graph signature: its inputs (parameters,
  buffers, constants, user inputs) flowing into the graph, its outputs (buffer and user-input
  mutations, user outputs) flowing out, and each buffer mutation written back to its buffer;
- :func:`decomposition_figure`: the ``call_function`` ops of a program before and after
  ``run_decompositions()``, side by side, the ops only one of them has marked;
- :func:`shape_verdict`, :func:`range_lines`, :func:`outside_ranges`, :func:`shape_explorer`:
  sliders over the sizes of an exported program's inputs, showing whether its guards accept
  them (the output's shape) or reject them (torch's own message), next to its
  ``range_constraints``;
- :func:`hierarchy_table`: a module tree as a table (the tree that ``torch.export.unflatten``
  or the learner's ``unflatten`` rebuilt): each module, what it holds and what its graph runs.
"""

from __future__ import annotations

import html
import inspect
import operator
from collections.abc import Callable

import torch
import torch.fx
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

import grader.kernel.display  # noqa: F401  (registers the PNG formatter for figures)

#: fill colour of an input's box, by ``InputKind`` (``torch/export/graph_signature.py``)
INPUT_COLOURS = {
    InputKind.PARAMETER: "#8da0cb",
    InputKind.BUFFER: "#fc8d62",
    InputKind.CONSTANT_TENSOR: "#e5c494",
    InputKind.USER_INPUT: "#a6d854",
    InputKind.CUSTOM_OBJ: "#e78ac3",
    InputKind.TOKEN: "#d9d9d9",
}
#: fill colour of an output's box, by ``OutputKind``
OUTPUT_COLOURS = {
    OutputKind.BUFFER_MUTATION: "#e6550d",
    OutputKind.USER_INPUT_MUTATION: "#31a354",
    OutputKind.PARAMETER_MUTATION: "#3f5fbf",
    OutputKind.USER_OUTPUT: "#ffd92f",
    OutputKind.LOSS_OUTPUT: "#bc80bd",
    OutputKind.GRADIENT_TO_PARAMETER: "#80b1d3",
    OutputKind.GRADIENT_TO_USER_INPUT: "#b3de69",
    OutputKind.TOKEN: "#d9d9d9",
}
#: fill colour of the graph's box
GRAPH_COLOUR = "#eeeeee"
#: colour of the write-back arrows (a mutation output back to the input it updates)
WRITE_BACK_COLOUR = "#b2182b"
#: the mutation outputs and the kind of input each writes back to
MUTATIONS = {
    OutputKind.BUFFER_MUTATION: InputKind.BUFFER,
    OutputKind.PARAMETER_MUTATION: InputKind.PARAMETER,
    OutputKind.USER_INPUT_MUTATION: InputKind.USER_INPUT,
}
#: fill colour of an op in :func:`decomposition_figure`: in both graphs, only before, only after
OP_COLOURS = {"both": "#d9d9d9", "before": "#fc8d62", "after": "#66c2a5"}
#: :func:`decomposition_figure` lists at most this many ops per graph, then "+k more"
MAX_OPS = 40
#: colours of the explorer's verdicts
ACCEPT_COLOUR, REJECT_COLOUR = "#1a9641", "#d7191c"

_FONT = 8.0  # points
_CHAR = 0.62 * _FONT / 72  # inches per monospace character
_LINE = 1.25 * _FONT / 72  # inches per line of text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _kind_name(kind) -> str:
    """``InputKind.CONSTANT_TENSOR`` -> ``constant tensor``."""
    return kind.name.lower().replace("_", " ")


def _shape(value) -> str:
    """What a box says of a placeholder's or output's ``meta["val"]``: a tensor's shape as
    ``(4, 4)``, ``(4,)``, ``()`` or ``(s31, s27 + 1, 8)`` (symbolic sizes as torch prints
    them), ``SymInt s0`` for a symbolic int, else the value's ``repr``."""
    if isinstance(value, torch.Tensor):
        dims = [str(d) for d in value.shape]
        return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
    if isinstance(value, torch.SymInt):
        return f"SymInt {value}"
    return repr(value)


def _val(node) -> str:
    if isinstance(node, torch.fx.Node):
        return _shape(node.meta.get("val")) if "val" in node.meta else "?"
    return _shape(node)


def _check_program(ep, name: str = "ep") -> None:
    if not isinstance(ep, ExportedProgram):
        raise TypeError(
            f"{name}: expected a torch.export.ExportedProgram (what torch.export.export "
            f"returns), got {type(ep).__name__}"
        )


def _ops(ep: ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in ep.graph.nodes if n.op == "call_function"]


def op_name(node: torch.fx.Node) -> str:
    """The name :func:`decomposition_figure` gives a ``call_function`` node's target: an
    ``OpOverload``'s full name with its overload (``aten.linear.default``,
    ``aten.add.Tensor``, ``course.linear_relu.default``), a higher-order operator's name
    (``cond``), a Python function's ``__name__`` (``getitem`` for ``operator.getitem``)."""
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name()
    return getattr(target, "__name__", None) or str(target)


def _in_place(ep: ExportedProgram) -> list[tuple[str, str]]:
    """``(op name, placeholder name)`` for each op of the graph that writes one of its
    placeholders in place (an argument its schema marks as written: ``Tensor(a!)``), as the
    raw (training IR) export keeps ``self.calls.add_(1)``."""
    found = []
    for node in _ops(ep):
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if isinstance(value, torch.fx.Node) and value.op == "placeholder":
                found.append((op_name(node), value.name))
    return found


# ------------------------------------------------------------------ graph signature
def _box(ax, x, y, width, height, colour, text, gid) -> None:
    ax.add_patch(
        Rectangle(
            (x, y - height / 2),
            width,
            height,
            facecolor=colour,
            edgecolor="#555555",
            linewidth=0.7,
            gid=gid,
        )
    )
    ax.text(
        x + 0.08,
        y,
        text,
        ha="left",
        va="center",
        fontsize=_FONT,
        family="monospace",
        linespacing=1.1,
        gid=f"{gid.split(':')[0]}-label",
    )


def signature_figure(ep: ExportedProgram, *, title: str | None = None) -> Figure:
    """An exported program's graph signature as a diagram, left to right: one box per input
    placeholder (``ep.graph_signature.input_specs``, in placeholder order), filled by its
    ``InputKind`` (:data:`INPUT_COLOURS`: parameter, buffer, constant tensor, user input) and
    labelled with the placeholder's name, its target (the FQN in the module: ``lin.weight``;
    ``(non-persistent)`` after a buffer left out of the state dict; none for a user input) and
    its shape (``meta["val"]``, symbolic sizes as torch prints them); one box in the middle for
    the graph ("N ops": its ``call_function`` nodes); one box per output (``output_specs``),
    filled by its ``OutputKind`` (:data:`OUTPUT_COLOURS`: buffer mutation, user input
    mutation, user output), labelled with the output node's name, for a mutation
    ``→ <target>`` (the buffer's FQN, the user input's name), and its shape. Each mutation
    output has a dashed arrow (:data:`WRITE_BACK_COLOUR`) around the diagram back to the input
    box it updates: what ``ep.module()`` copies back after each call. A raw export (training
    IR) keeps mutations in the graph as in-place ops on placeholders, with no mutation
    outputs: those ops are named under the graph's box (``aten.add_.Tensor on b_calls``);
    ``run_decompositions()`` turns them into outputs. A legend names the kinds present.
    ``title``: the figure's title (default: the inputs, ops and outputs counted).

    ``ep``: a ``torch.export.ExportedProgram``; raises TypeError for anything else. Returns a
    ``Figure``; artists' gids: ``input:<kind>`` (a box, ``<kind>`` as in
    ``input:constant_tensor``), ``input-label``, ``graph``, ``graph-label``,
    ``output:<kind>``, ``output-label``, ``flow`` (a solid arrow), ``write-back:<kind>`` (the
    dashed route, ``<kind>`` the output's) and ``write-back-head`` (its arrowhead, an annotation
    whose ``xy`` is on the left edge of the input box it updates), ``in-place``.

    Draws ``torch/export/graph_signature.py: ExportGraphSignature`` (``InputSpec``,
    ``OutputSpec``), as ``torch/export/exported_program.py: ExportedProgram`` prints it."""
    _check_program(ep)
    sig = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    outputs = list(ep.graph.output_node().args[0])
    ins, outs = list(sig.input_specs), list(sig.output_specs)
    in_text = []
    for spec, node in zip(ins, placeholders):
        target = spec.target
        if spec.kind == InputKind.BUFFER and spec.persistent is False:
            target += " (non-persistent)"
        lines = [node.name] + ([target] if target else []) + [_val(node)]
        in_text.append("\n".join(lines))
    out_text = []
    for spec, node in zip(outs, outputs):
        name = node.name if isinstance(node, torch.fx.Node) else repr(node)
        lines = [name] + ([f"→ {spec.target}"] if spec.kind in MUTATIONS else []) + [_val(node)]
        out_text.append("\n".join(lines))
    n_ops = len(_ops(ep))
    in_place = _in_place(ep)

    def width(texts):
        return max((len(line) for t in texts for line in t.split("\n")), default=6) * _CHAR + 0.2

    pitch = 3 * _LINE + 0.22
    box_h = 3 * _LINE + 0.1
    w_in, w_out = max(width(in_text), 1.0), max(width(out_text), 1.0)
    w_graph = max(width([f"{n_ops} ops", "graph"]), 1.0)
    gap = 0.9  # between columns (inches)
    x_graph = w_in + gap
    x_out = x_graph + w_graph + gap
    rows = max(len(ins), len(outs), 1)
    top = 0.0

    def ys(n):  # a column of n boxes centred on the tallest column
        offset = (rows - n) * pitch / 2
        return [top - offset - i * pitch for i in range(n)]

    y_in, y_out = ys(len(ins)), ys(len(outs))
    bottom = top - (rows - 1) * pitch
    backs = [
        (k, spec)
        for k, spec in enumerate(outs)
        if spec.kind in MUTATIONS and _written(ins, spec) is not None
    ]
    backs.sort(key=lambda b: _written(ins, b[1]))  # inner lanes for the top inputs
    lane = 0.22
    margin = lane * (len(backs) + 1)
    x_min, x_max = -margin - 0.1, x_out + w_out + margin + 0.1
    y_max = top + box_h / 2 + margin + 0.1
    y_min = bottom - box_h / 2 - (0.35 if in_place else 0.1)
    legend_h = 0.45
    title_h = 0.4
    fig = Figure(figsize=(x_max - x_min, y_max - y_min + legend_h + title_h))
    ax = fig.add_axes(
        (0, legend_h / fig.get_figheight(), 1, 1 - (legend_h + title_h) / fig.get_figheight())
    )
    ax.set_xlim(x_min, x_max)
    ax.set_ylim(y_min, y_max)
    ax.axis("off")

    for spec, y, text in zip(ins, y_in, in_text):
        _box(
            ax,
            0,
            y,
            w_in,
            box_h,
            INPUT_COLOURS.get(spec.kind, "#ffffff"),
            text,
            f"input:{spec.kind.name.lower()}",
        )
    g_top, g_bottom = top + box_h / 2, bottom - box_h / 2
    ax.add_patch(
        Rectangle(
            (x_graph, g_bottom),
            w_graph,
            g_top - g_bottom,
            facecolor=GRAPH_COLOUR,
            edgecolor="#555555",
            linewidth=0.9,
            gid="graph",
        )
    )
    ax.text(
        x_graph + w_graph / 2,
        (g_top + g_bottom) / 2,
        f"graph\n{_plural(n_ops, 'op')}",
        ha="center",
        va="center",
        fontsize=_FONT + 1,
        family="monospace",
        gid="graph-label",
    )
    if in_place:
        said = ", ".join(f"{op} on {name}" for op, name in in_place)
        ax.text(
            x_graph + w_graph / 2,
            g_bottom - 0.08,
            f"in place in the graph: {said}",
            ha="center",
            va="top",
            fontsize=_FONT - 0.5,
            color=WRITE_BACK_COLOUR,
            gid="in-place",
        )
    for spec, y, text in zip(outs, y_out, out_text):
        _box(
            ax,
            x_out,
            y,
            w_out,
            box_h,
            OUTPUT_COLOURS.get(spec.kind, "#ffffff"),
            text,
            f"output:{spec.kind.name.lower()}",
        )
    flow = {"arrowstyle": "-|>", "color": "#777777", "lw": 0.7, "mutation_scale": 9}
    for y in y_in:
        ax.annotate("", xy=(x_graph, y), xytext=(w_in, y), arrowprops=flow, gid="flow")
    for y in y_out:
        ax.annotate("", xy=(x_out, y), xytext=(x_graph + w_graph, y), arrowprops=flow, gid="flow")
    for lane_k, (k, spec) in enumerate(backs):
        i = _written(ins, spec)
        d = lane * (lane_k + 1)
        x_right, x_left, y_lane = x_out + w_out + d, -d, top + box_h / 2 + d
        route_x = [x_out + w_out, x_right, x_right, x_left, x_left]
        route_y = [y_out[k], y_out[k], y_lane, y_lane, y_in[i]]
        ax.add_line(
            Line2D(
                route_x,
                route_y,
                color=WRITE_BACK_COLOUR,
                linestyle="--",
                linewidth=1.0,
                gid=f"write-back:{spec.kind.name.lower()}",
            )
        )
        ax.annotate(
            "",
            xy=(0, y_in[i]),
            xytext=(x_left, y_in[i]),
            arrowprops={
                "arrowstyle": "-|>",
                "color": WRITE_BACK_COLOUR,
                "lw": 1.0,
                "linestyle": "--",
                "mutation_scale": 10,
                "shrinkA": 0,
                "shrinkB": 0,
            },
            gid="write-back-head",
        )
    handles = [
        Patch(facecolor=c, edgecolor="#555555", label=_kind_name(kind))
        for kind, c in INPUT_COLOURS.items()
        if any(s.kind == kind for s in ins)
    ] + [
        Patch(facecolor=c, edgecolor="#555555", label=_kind_name(kind))
        for kind, c in OUTPUT_COLOURS.items()
        if any(s.kind == kind for s in outs)
    ]
    if backs:
        handles.append(
            Line2D([], [], color=WRITE_BACK_COLOUR, linestyle="--", label="written back")
        )
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=min(len(handles), 5),
        fontsize=7,
        frameon=False,
    )
    if title is None:
        title = (
            f"graph signature: {_plural(len(ins), 'input')} → {_plural(n_ops, 'op')} → "
            f"{_plural(len(outs), 'output')}"
        )
        n_mut = sum(s.kind in MUTATIONS for s in outs)
        if n_mut:
            title += f" ({n_mut} written back)"
    fig.suptitle(title, fontsize=9, y=1 - 0.12 / fig.get_figheight(), va="top")
    return fig


def _written(ins: list, spec) -> int | None:
    """The index of the input a mutation output updates: the buffer or parameter whose FQN is
    ``spec.target``, the user input whose name it is; None when there is none."""
    kind = MUTATIONS.get(spec.kind)
    for i, s in enumerate(ins):
        if s.kind != kind:
            continue
        if (s.target if kind != InputKind.USER_INPUT else s.arg.name) == spec.target:
            return i
    return None


# ------------------------------------------------------------------ decompositions
def decomposition_figure(
    before: ExportedProgram,
    after: ExportedProgram,
    *,
    titles: tuple[str, str] = ("before", "after"),
) -> Figure:
    """A program before and after ``run_decompositions()``: two columns, each listing its
    graph's ``call_function`` ops in graph order, numbered, named by :func:`op_name` with the
    overload (``aten.linear.default``); an op whose name both graphs have is filled with
    ``OP_COLOURS["both"]``, one only ``before`` has (decomposed away) with
    ``OP_COLOURS["before"]``, one only ``after`` has (what it became) with
    ``OP_COLOURS["after"]``; a legend names them. Each column shows its first :data:`MAX_OPS`
    ops, then a line ``+k more``. Column titles: ``titles`` with the op count ("before: 5
    ops"); the figure's title counts the op names each side alone has.

    ``before``, ``after``: ``torch.export.ExportedProgram``s (any two: a raw export and its
    ``run_decompositions()``, or two decomposition tables); raises TypeError for anything else.
    Returns a ``Figure``; artists' gids: ``op:both``, ``op:before``, ``op:after`` (an op's
    text, its fill the text's bbox), ``more``.

    Reflects ``torch/export/exported_program.py: ExportedProgram.run_decompositions`` (with
    ``torch/export/decomp_utils.py: CustomDecompTable``, the core ATen decompositions)."""
    _check_program(before, "before")
    _check_program(after, "after")
    names = [[op_name(n) for n in _ops(ep)] for ep in (before, after)]
    common = set(names[0]) & set(names[1])
    shown = [min(len(ns), MAX_OPS) for ns in names]
    rows = max(max(shown), 1) + any(len(ns) > MAX_OPS for ns in names)
    widths = [
        max((len(f"{i + 1:>3} {n}") for i, n in enumerate(ns[:MAX_OPS])), default=12) * _CHAR + 0.8
        for ns in names
    ]
    widths = [max(w, 2.4) for w in widths]
    pitch = _LINE + 0.08
    height = rows * pitch + 1.3
    fig = Figure(figsize=(sum(widths) + 0.4, height))
    axes = fig.subplots(1, 2, gridspec_kw={"width_ratios": widths})
    fig.subplots_adjust(
        left=0.2 / fig.get_figwidth(),
        right=1 - 0.2 / fig.get_figwidth(),
        top=1 - 0.7 / height,
        bottom=0.45 / height,
        wspace=0.05,
    )
    for ax, ns, side, title in zip(axes, names, ("before", "after"), titles):
        for i, name in enumerate(ns[:MAX_OPS]):
            where = "both" if name in common else side
            ax.text(
                0.02,
                -i,
                f"{i + 1:>3} {name}",
                ha="left",
                va="center",
                fontsize=_FONT,
                family="monospace",
                gid=f"op:{where}",
                bbox={"boxstyle": "round,pad=0.2", "fc": OP_COLOURS[where], "ec": "none"},
            )
        if len(ns) > MAX_OPS:
            ax.text(
                0.02,
                -MAX_OPS,
                f"    +{len(ns) - MAX_OPS} more",
                ha="left",
                va="center",
                fontsize=_FONT,
                family="monospace",
                style="italic",
                gid="more",
            )
        ax.set_xlim(0, 1)
        ax.set_ylim(-rows + 0.5, 0.5)
        ax.axis("off")
        ax.set_title(f"{title}: {_plural(len(ns), 'op')}", fontsize=10)
    gone, new = set(names[0]) - common, set(names[1]) - common
    fig.suptitle(
        f"{_plural(len(gone), 'op name')} only {titles[0]}, {_plural(len(new), 'op name')} "
        f"only {titles[1]}, {len(common)} in both",
        fontsize=9,
    )
    fig.legend(
        handles=[
            Patch(facecolor=OP_COLOURS["both"], label="in both"),
            Patch(facecolor=OP_COLOURS["before"], label=f"only {titles[0]}"),
            Patch(facecolor=OP_COLOURS["after"], label=f"only {titles[1]}"),
        ],
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    return fig


# ------------------------------------------------------------------ dynamic shapes
def shape_verdict(program, args: tuple) -> tuple[bool, str]:
    """Whether an exported program accepts ``args``: ``(True, "output shape (3, 7, 8)")``
    (``output shapes (3, 4), ()`` for several outputs) when ``program(*args)`` runs, else
    ``(False, message)`` with the message of the exception torch raised, unchanged: an
    ``AssertionError`` from a guard (``Guard failed: tokens.size()[0] <= 64``), a
    ``RuntimeError`` from an op (a wrong dtype), a ``ValueError`` from the input check (a
    wrong number of inputs). Other exceptions propagate.

    ``program``: a ``torch.export.ExportedProgram`` (its ``.module()`` is called) or that
    module itself (pass it to call it many times without rebuilding it); ``args``: the
    positional inputs.

    Reflects what ``ep.module()`` checks on each call: ``torch/export/_unlift.py:
    _check_inputs_match`` (the inputs' structure, a ValueError) in
    ``_check_input_constraints_pre_hook``, then the ``_guards_fn`` submodule that
    ``_convert_guards_code_to_fn`` builds from the tracer's guards (``torch._assert``: an
    AssertionError "Guard failed: ...")."""
    module = program.module() if isinstance(program, ExportedProgram) else program
    try:
        out = module(*args)
    except (AssertionError, RuntimeError, ValueError) as exc:
        return False, str(exc)
    leaves = [_shape(t) for t in torch.utils._pytree.tree_leaves(out)]
    return True, f"output shape{'s' * (len(leaves) != 1)} {', '.join(leaves)}"


def range_lines(ep: ExportedProgram) -> list[str]:
    """``ep.range_constraints`` readably, one line per symbol or expression in it:
    ``s31: [1, 64] (tokens.size()[0], mask.size()[0], prev.size()[0])``: its range
    (``int_oo`` shown as ``∞``) and the user inputs' dims whose size it is, written as torch's
    guards write them. Raises TypeError when ``ep`` is not an ``ExportedProgram``.

    Reads ``torch/export/exported_program.py: ExportedProgram.range_constraints`` (sympy
    expressions to ``torch/utils/_sympy/value_ranges.py: ValueRanges``)."""
    _check_program(ep)
    users = set(ep.graph_signature.user_inputs)
    where: dict[str, list[str]] = {}
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if node.op != "placeholder" or node.name not in users:
            continue
        if isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt):
                    where.setdefault(str(size), []).append(f"{node.name}.size()[{d}]")

    lines = []
    for expr, vr in ep.range_constraints.items():
        line = f"{expr}: [{_bound(vr.lower)}, {_bound(vr.upper)}]"
        if str(expr) in where:
            line += f" ({', '.join(where[str(expr)])})"
        lines.append(line)
    return lines


def outside_ranges(ep: ExportedProgram, args: tuple) -> list[str]:
    """The entries of ``ep.range_constraints`` that ``args`` (the user inputs, positionally)
    break: ``s31 = 0 not in [1, 64]`` for each symbol or expression whose value, from the
    sizes of the inputs' dims that are a bare symbol, falls outside its range. Not every
    bound becomes a guard that ``ep.module()`` checks (in torch 2.13 a ``Dim`` minimum of 1
    does not: a batch of 0 runs), so an accepted input can still be outside. Inputs that are
    not tensors, or have fewer dims than the program's, are skipped.

    Reads ``torch/export/exported_program.py: ExportedProgram.range_constraints`` and the
    placeholders' ``meta["val"]`` (``torch.SymInt`` sizes, ``.node.expr`` their symbols)."""
    _check_program(ep)
    users = set(ep.graph_signature.user_inputs)
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in users]
    values = {}
    for node, arg in zip(placeholders, args):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(arg, torch.Tensor):
            continue
        for size, actual in zip(val.shape, arg.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                values.setdefault(size.node.expr, int(actual))
    found = []
    for expr, vr in ep.range_constraints.items():
        if not expr.free_symbols <= set(values):
            continue
        value = expr.subs(values)
        if not value.is_Integer or vr.lower <= value <= vr.upper:
            continue
        found.append(f"{expr} = {value} not in [{_bound(vr.lower)}, {_bound(vr.upper)}]")
    return found


def _bound(b) -> str:
    text = str(b)
    return {"int_oo": "∞", "oo": "∞", "-int_oo": "-∞", "-oo": "-∞"}.get(text, text)


def _takes_related(make_inputs: Callable) -> bool:
    try:
        return "related" in inspect.signature(make_inputs).parameters
    except (TypeError, ValueError):
        return False


def shape_explorer(
    ep: ExportedProgram,
    make_inputs: Callable,
    dims: dict[str, tuple[int, int]],
    *,
    start: dict[str, int] | None = None,
):
    """An explorer of an exported program's dynamic shapes: one ``IntSlider`` per named size in
    ``dims`` (``{name: (slider min, slider max)}``: make it wider than the program's range to
    see the guards reject), and, when ``make_inputs`` takes a ``related`` keyword, a
    ``Checkbox`` "break the relation". On every change it calls
    ``make_inputs(**sizes)`` (with ``related=not checkbox.value`` when it takes it), which
    returns the args tuple, runs the program on it (:func:`shape_verdict`, one
    ``ep.module()`` for all calls) and shows, in an ``ipywidgets.HTML``: the inputs' shapes,
    then either ``accepted: output shape (...)`` in green or ``rejected: <torch's message>``
    in red (``make_inputs`` failing is shown as ``make_inputs failed: ...``); for accepted
    inputs outside ``range_constraints`` a note (:func:`outside_ranges`) that no guard caught
    them; then ``range_constraints`` (:func:`range_lines`). ``start``: the sliders' first
    values (default: the middle of each range).

    Returns an ``ipywidgets.VBox``: its children are the sliders in ``dims``' order, then the
    checkbox (if any), then the ``HTML``. Raises ValueError for empty ``dims`` or a range with
    min > max, TypeError when ``ep`` is not an ``ExportedProgram``.

    Reflects the checks ``ep.module()`` runs before each call (``torch/export/_unlift.py:
    _check_input_constraints_pre_hook``, ``_convert_guards_code_to_fn``)."""
    import ipywidgets as widgets

    _check_program(ep)
    if not dims:
        raise ValueError("no sizes to explore: pass dims={name: (min, max)}")
    for name, (lo, hi) in dims.items():
        if lo > hi:
            raise ValueError(f"dims[{name!r}] = ({lo}, {hi}): min > max")
    start = start or {}
    sliders = {
        name: widgets.IntSlider(
            value=start.get(name, (lo + hi) // 2),
            min=lo,
            max=hi,
            description=name,
            continuous_update=False,
        )
        for name, (lo, hi) in dims.items()
    }
    related = _takes_related(make_inputs)
    broken = widgets.Checkbox(value=False, description="break the relation") if related else None
    out = widgets.HTML()
    module = ep.module()
    names = list(ep.graph_signature.user_inputs)
    ranges = "".join(f"<li><code>{html.escape(line)}</code></li>" for line in range_lines(ep))
    ranges = f"<p>range_constraints:</p><ul>{ranges}</ul>"
    cache: dict = {}

    def render(key) -> str:
        sizes, is_broken = dict(key[0]), key[1]
        try:
            args = make_inputs(**sizes, related=not is_broken) if related else make_inputs(**sizes)
        except Exception as exc:  # noqa: BLE001  (a learner's make_inputs may fail: show it)
            line = html.escape(f"make_inputs failed: {type(exc).__name__}: {exc}")
            return f'<p style="color:{REJECT_COLOUR}">{line}</p>' + ranges
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        shapes = ", ".join(f"{n} {_shape(a)}" for n, a in zip(names + ["?"] * len(args), args))
        ok, message = shape_verdict(module, args)
        verdict = f"accepted: {message}" if ok else f"rejected: {message}"
        colour = ACCEPT_COLOUR if ok else REJECT_COLOUR
        note = ""
        outside = outside_ranges(ep, args) if ok else []
        if outside:
            note = html.escape(
                f"note: {'; '.join(outside)}, outside range_constraints, yet no guard rejected it"
            )
            note = f"<p><i>{note}</i></p>"
        return (
            f"<p>inputs: <code>{html.escape(shapes)}</code></p>"
            f'<p style="color:{colour};white-space:pre-wrap"><b>'
            f"{html.escape(verdict)}</b></p>" + note + ranges
        )

    def show(change=None):
        key = (tuple((n, s.value) for n, s in sliders.items()), bool(broken and broken.value))
        if key not in cache:
            cache[key] = render(key)
        out.value = cache[key]

    for s in sliders.values():
        s.observe(show, names="value")
    if broken is not None:
        broken.observe(show, names="value")
    show()
    return widgets.VBox([*sliders.values(), *([broken] if broken else []), out])


# ----------------------------------------------------------------------------- module hierarchy
def _runs(module: torch.nn.Module) -> str:
    """What the graph of ``module`` runs, in order: each ``call_function`` node's op without
    its namespace (``linear``, ``add.Tensor``; ``getitem`` left out) and each ``call_module``
    node as ``call <target>``; "—" for a module without a graph of its own."""
    graph = getattr(module, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return "—"
    steps = []
    for node in graph.nodes:
        if node.op == "call_module":
            steps.append(f"call {node.target}")
        elif node.op == "call_function" and node.target is not operator.getitem:
            steps.append(op_name(node).removeprefix("aten.").removesuffix(".default"))
    return ", ".join(steps) or "nothing"


def hierarchy_table(module: torch.nn.Module, *, caption: str = ""):
    """A table of ``module``'s tree, one row per ``named_modules()`` entry in that order: the
    module (indented by depth, the root as ``(root)``), its type's name, the parameters and
    buffers it holds itself (name and shape), and what its own graph runs (:func:`_runs`), as
    ``torch.export.unflatten`` (``torch/export/unflatten.py: InterpreterModule``) or the
    learner's ``unflatten`` (export.unflatten) rebuilt it. Returns a
    :class:`grader.kernel.display.Table`."""
    from grader.kernel.display import table

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(module).__name__}")
    rows = []
    for name, sub in module.named_modules():
        depth = name.count(".") + 1 if name else 0
        label = "  " * depth + (name.rpartition(".")[2] if name else "(root)")
        own = [*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False)]
        holds = ", ".join(f"{n} {_shape(t)}" for n, t in own) or "—"
        rows.append([label, type(sub).__name__, holds, _runs(sub)])
    return table(rows, ["module", "type", "holds", "its graph runs"], caption=caption)
