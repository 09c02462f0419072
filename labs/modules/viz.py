"""Pictures and an explorer for lab 8 (the user layer), each one call from a cell.

Pictures return a ``matplotlib.figure.Figure`` built without pyplot; importing
:mod:`grader.kernel.display` registers the PNG formatter that shows it in JupyterLab.
"""

from __future__ import annotations

import html

from matplotlib.figure import Figure

import grader.kernel.display  # noqa: F401  (registers the PNG formatter for figures)

# ================================================================ module tree and hooks

#: hook kinds as a module holds them: (attribute, short name, colour)
HOOKS = (
    ("_forward_pre_hooks", "forward pre", "#8da0cb"),
    ("_forward_hooks", "forward", "#66c2a5"),
    ("_backward_pre_hooks", "backward pre", "#fc8d62"),
    ("_backward_hooks", "backward", "#e78ac3"),
)


def _hook_name(fn) -> str:
    name = getattr(fn, "__qualname__", type(fn).__name__).replace(".<locals>", "")
    return name if len(name) <= 28 else name[:27] + "…"


def module_rows(model) -> list[dict]:
    """One row per module of ``model`` (an ``nn.Module``), in ``named_modules`` order:
    ``{"path", "depth", "type", "params", "buffers", "hooks": {kind: [hook names]}}`` (a
    module's own entries only; torch/nn/modules/module.py: Module.__init__'s dictionaries)."""
    rows = []
    for path, m in model.named_modules():
        rows.append(
            {
                "path": path or "(root)",
                "depth": path.count(".") + 1 if path else 0,
                "type": type(m).__name__,
                "params": [n for n, p in m._parameters.items() if p is not None],
                "buffers": [n for n, b in m._buffers.items() if b is not None],
                "hooks": {
                    kind: [_hook_name(h) for h in getattr(m, attr).values()]
                    for attr, kind, _ in HOOKS
                },
            }
        )
    return rows


def module_tree(model) -> Figure:
    """The module tree of ``model``: a box per module (indented by depth) with its own
    parameters and buffers, and a coloured tag per hook it holds (forward pre, forward,
    backward pre, backward), drawn as ``_call_impl`` would meet them. Boxes have gid
    ``module:<path>``, tags ``hook:<path>:<kind>:<i>``. Raises ValueError for a model with
    more than 40 modules (too many to read)."""
    from matplotlib.patches import FancyBboxPatch

    rows = module_rows(model)
    if len(rows) > 40:
        raise ValueError(f"{len(rows)} modules: draw a submodule instead")
    height = 0.9 + 0.62 * len(rows)
    fig = Figure(figsize=(12, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 12)
    ax.set_ylim(0, height)
    ax.axis("off")
    ax.text(
        0.1,
        height - 0.35,
        f"{type(model).__name__}: modules, their state and their "
        "hooks (global hooks, on every module, are not shown)",
        fontsize=11,
        weight="bold",
    )
    for i, row in enumerate(rows):
        y = height - 0.95 - 0.62 * i
        x = 0.2 + 0.45 * row["depth"]
        if row["depth"]:
            ax.plot([x - 0.3, x - 0.3, x], [y + 0.55, y + 0.22, y + 0.22], color="#999", lw=0.8)
        ax.add_patch(
            FancyBboxPatch(
                (x, y),
                4.4,
                0.45,
                boxstyle="round,pad=0.02",
                fc="#f2f2f2",
                ec="#555",
                lw=0.8,
                gid=f"module:{row['path']}",
            )
        )
        state = ", ".join(row["params"] + [f"{b} (buffer)" for b in row["buffers"]])
        ax.text(
            x + 0.1,
            y + 0.3,
            f"{row['path']}: {row['type']}",
            fontsize=8,
            family="monospace",
            va="center",
        )
        ax.text(
            x + 0.1,
            y + 0.11,
            state[:60] or "no state of its own",
            fontsize=7,
            color="#555",
            va="center",
        )
        hx = x + 4.6
        for attr, kind, colour in HOOKS:
            for j, name in enumerate(row["hooks"][kind]):
                text = f"{kind}: {name}"
                width = 0.075 * len(text) + 0.2
                ax.add_patch(
                    FancyBboxPatch(
                        (hx, y + 0.06),
                        width,
                        0.33,
                        boxstyle="round,pad=0.02",
                        fc=colour,
                        ec="none",
                        gid=f"hook:{row['path']}:{kind}:{j}",
                    )
                )
                ax.text(hx + 0.1, y + 0.22, text, fontsize=7, va="center")
                hx += width + 0.1
    return fig


#: the model of the hook explorer (a spec of labs/modules/probes.py)
EXPLORER_MODEL = {
    "params": [["w", [3]]],
    "children": [
        ["encoder", {"params": [["w", [3]]], "calls": []}],
        [
            "decoder",
            {
                "params": [["w", [3]]],
                "children": [["head", {"params": [["w", [3]]], "calls": []}]],
                "calls": ["head"],
            },
        ],
    ],
    "calls": ["encoder", "decoder", "encoder"],
}


def _events_html(real: list, predicted, error: str) -> str:
    """Real events beside predicted ones, each row green where they agree."""
    rows = []
    for i in range(max(len(real), len(predicted or []))):
        r = real[i] if i < len(real) else None
        p = predicted[i] if predicted is not None and i < len(predicted) else None
        ok = predicted is not None and r is not None and list(p or []) == list(r)
        colour = "#e6f4ea" if ok else "#fde7e9" if predicted is not None else "#fff"
        cell = lambda e: "" if e is None else html.escape(f"{e[0]} on {e[1]!r}")
        rows.append(
            f'<tr style="background:{colour}"><td>{i + 1}</td><td>{cell(r)}</td>'
            f"<td>{cell(p) if predicted is not None else ''}</td></tr>"
        )
    note = f'<p style="color:#b42318">{html.escape(error)}</p>' if error else ""
    return (
        f"{note}<table style='border-collapse:collapse;font-family:monospace;"
        f"font-size:12px'><tr><th>#</th><th>a real run</th><th>hook_order</th></tr>"
        f"{''.join(rows)}</table>"
    )


def hook_explorer(hook_order=None):
    """Checkboxes over hooks of :data:`EXPLORER_MODEL` (each kind on the root, the encoder,
    the decoder's head, and global); for the ones ticked, the events of a real run
    (:func:`labs.modules.probes.traced_run`) beside what ``hook_order(model, hooks)``
    predicts (rows green where they agree; its error shown when it raises). Returns an
    ``ipywidgets.VBox``: ``children[0]`` the checkboxes' box, ``children[1]`` the HTML."""
    import ipywidgets as widgets

    from labs.modules import probes

    options = [
        (kind, on) for on in ("", "encoder", "decoder.head", None) for kind in probes.HOOK_KINDS
    ]
    boxes = [
        widgets.Checkbox(
            value=(kind, on) in {("forward_pre", "encoder"), ("backward", "decoder.head")},
            description=f"{kind} on {'every module' if on is None else on or 'root'}",
            indent=False,
            layout=widgets.Layout(width="260px"),
        )
        for kind, on in options
    ]
    picture = widgets.HTML()

    def show(change=None):
        hooks = [
            {
                "label": f"{kind}@{'*' if on is None else on or 'root'}",
                "kind": kind,
                "on": on,
                "prepend": False,
            }
            for (kind, on), box in zip(options, boxes)
            if box.value
        ]
        real = probes.traced_run(EXPLORER_MODEL, hooks, 0)
        predicted, error = None, ""
        if hook_order is not None:
            try:
                predicted = [list(e) for e in hook_order(EXPLORER_MODEL, hooks)]
            except Exception as exc:  # noqa: BLE001  (shown beside the real run)
                error = f"hook_order raised {type(exc).__name__}: {exc}"
        picture.value = _events_html(real, predicted, error)

    for box in boxes:
        box.observe(show, names="value")
    show()
    return widgets.VBox(
        [
            widgets.GridBox(
                boxes, layout=widgets.Layout(grid_template_columns="repeat(4, 270px)")
            ),
            picture,
        ]
    )


# ================================================================ DataLoader timeline


class TimedItems:
    """The timeline's dataset: item ``i`` sleeps ``ms`` milliseconds (``slow_ms`` for the
    indices in ``slow``) and returns ``{"index": i, "pid": the process that fetched it,
    "start", "end": time.perf_counter() around the sleep}`` (on Linux one clock for every
    process)."""

    def __init__(self, n: int = 12, ms: float = 5, slow=(0, 1), slow_ms: float = 60):
        self.n, self.ms, self.slow, self.slow_ms = n, ms, set(slow), slow_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        import os
        import time

        start = time.perf_counter()
        time.sleep((self.slow_ms if int(i) in self.slow else self.ms) / 1000)
        return {"index": int(i), "pid": os.getpid(), "start": start, "end": time.perf_counter()}


def loader_events(
    make_loader, dataset_size: int = 12, ms: float = 5, slow=(0, 1), slow_ms: float = 60
) -> dict:
    """One epoch of ``make_loader(TimedItems(dataset_size, ms, slow, slow_ms))`` (a loader that
    collates as ``default_collate`` does), timed: ``{"main": this process's pid, "batches":
    [{"batch": k (the k-th yielded), "items", "pid" (of the process that fetched it), "start",
    "end" (of its items), "received" (when the loop got it)}]}``, times in milliseconds from
    the moment the epoch's ``iter()`` was called. Raises TimeoutError when the epoch has not
    ended after ``probes.LOADER_DEADLINE`` seconds; every process the loader started is gone
    when it returns or raises (:func:`labs.modules.probes.reap`)."""
    import os
    import time

    from labs.modules import probes

    before, rows = probes.descendants(), []
    try:
        with probes.Deadline(probes.LOADER_DEADLINE):
            loader = make_loader(TimedItems(dataset_size, ms, slow, slow_ms))
            t0 = time.perf_counter()
            for k, batch in enumerate(loader):
                received = time.perf_counter()
                rows.append(
                    {
                        "batch": k,
                        "items": [int(i) for i in batch["index"]],
                        "pid": int(batch["pid"][0]),
                        "start": (float(min(batch["start"])) - t0) * 1e3,
                        "end": (float(max(batch["end"])) - t0) * 1e3,
                        "received": (received - t0) * 1e3,
                    }
                )
            del loader
    except probes.LoaderStuck:
        raise TimeoutError(
            f"the epoch had not ended after {probes.LOADER_DEADLINE:.0f} s: stopped"
        ) from None
    finally:
        probes.reap(before)
    return {"main": os.getpid(), "batches": rows}


def loader_timeline(make_loader, title: str = "", **dataset) -> Figure:
    """The processes of one epoch of ``make_loader``'s loader over time
    (:func:`loader_events`, ``dataset`` its keywords): a lane per process (the main process on
    top, then each worker in the order it first delivered), a box per batch from its first
    item's start to its last item's end, coloured by batch, and a marker in the main lane
    where the loop received it, with an arrow from the worker. Boxes have gid ``batch:<k>``,
    markers ``received:<k>``, arrows ``arrow:<k>``, lane labels ``lane:<pid>``."""
    import matplotlib
    from matplotlib.patches import FancyArrowPatch, Rectangle

    events = loader_events(make_loader, **dataset)
    rows, main = events["batches"], events["main"]
    pids = [main] + list(dict.fromkeys(r["pid"] for r in rows if r["pid"] != main))
    lane = {pid: len(pids) - 1 - i for i, pid in enumerate(pids)}
    colours = matplotlib.colormaps["viridis"]
    fig = Figure(figsize=(11, 1.4 + 0.7 * len(pids)))
    ax = fig.add_axes(
        (0.14, 0.8 / (1.4 + 0.7 * len(pids)), 0.84, 0.7 * len(pids) / (1.4 + 0.7 * len(pids)))
    )
    end = max([r["received"] for r in rows] + [r["end"] for r in rows] + [1.0])
    ax.set_xlim(0, end * 1.04)
    ax.set_ylim(-0.6, len(pids) - 0.4)
    ax.set_yticks([lane[p] for p in pids])
    labels = ax.set_yticklabels([f"main ({p})" if p == main else f"worker ({p})" for p in pids])
    for label, pid in zip(labels, pids):
        label.set_gid(f"lane:{pid}")
    ax.set_xlabel("milliseconds since iter()")
    ax.grid(axis="x", color="#ddd", lw=0.6)
    ax.set_axisbelow(True)
    ax.set_title(
        title
        or "DataLoader timeline: batches fetched per process, and when the "
        "main process received each",
        fontsize=10,
        loc="left",
    )
    for r in rows:
        k, y = r["batch"], lane[r["pid"]]
        colour = colours(k / max(len(rows) - 1, 1))
        ax.add_patch(
            Rectangle(
                (r["start"], y - 0.3),
                max(r["end"] - r["start"], end * 0.003),
                0.6,
                fc=colour,
                ec="#333",
                lw=0.6,
                alpha=0.9,
                gid=f"batch:{k}",
            )
        )
        ax.text(
            (r["start"] + r["end"]) / 2,
            y,
            str(k),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if k / max(len(rows) - 1, 1) < 0.6 else "black",
        )
        ax.plot(
            [r["received"]],
            [lane[main] - 0.38],
            marker="v",
            ms=7,
            color=colour,
            mec="#333",
            mew=0.5,
            gid=f"received:{k}",
        )
        if r["pid"] != main:
            ax.add_patch(
                FancyArrowPatch(
                    (r["end"], y + 0.3),
                    (r["received"], lane[main] - 0.3),
                    arrowstyle="-|>",
                    mutation_scale=7,
                    lw=0.6,
                    color=colour,
                    gid=f"arrow:{k}",
                )
            )
    return fig


# ================================================================ FX graph before and after

#: node colours: as it was, removed by the pass, changed by it (a layer's parameters, a node's
#: target or inputs), new
FX_COLOURS = {"node": "#e8e8e8", "removed": "#f4a6a6", "changed": "#a6dba0", "new": "#9ecae1"}


def _fx_label(gm, node) -> str:
    """``name: op target`` of an FX node, short (a module's type after its path)."""
    target = node.target
    if node.op == "call_module":
        target = f"{target} ({type(gm.get_submodule(target)).__name__})"
    elif callable(target):
        target = getattr(target, "__name__", str(target))
    op = {
        "placeholder": "input",
        "call_function": "fn",
        "call_method": "method",
        "call_module": "module",
        "get_attr": "attr",
        "output": "output",
    }.get(node.op, node.op)
    text = f"{node.name}: {op} {target}"
    return text if len(text) <= 44 else text[:43] + "…"


def _fx_signature(gm, node) -> tuple:
    """What a node is, for telling changed nodes: op, target, input names, and for a module
    call the module's state."""
    state = ()
    if node.op == "call_module":
        m = gm.get_submodule(node.target)
        state = (
            type(m).__name__,
            tuple((k, tuple(v.shape), v.float().sum().item()) for k, v in m.state_dict().items()),
        )
    return (node.op, str(node.target), tuple(n.name for n in node.all_input_nodes), state)


def fx_marks(before, after) -> tuple[dict, dict]:
    """``(marks of before's nodes, marks of after's)`` by node name: ``"removed"`` (a node of
    ``before`` that ``after`` lacks), ``"new"`` (one of ``after`` that ``before`` lacks),
    ``"changed"`` (in both, with another op, target, inputs, or module state), else
    ``"node"``. With ``after`` None, every node of ``before`` is ``"node"``."""
    if after is None:
        return {n.name: "node" for n in before.graph.nodes}, {}
    old = {n.name: n for n in before.graph.nodes}
    new = {n.name: n for n in after.graph.nodes}
    left = {name: "removed" if name not in new else "node" for name in old}
    right = {}
    for name, node in new.items():
        if name not in old:
            right[name] = "new"
        elif _fx_signature(before, old[name]) != _fx_signature(after, node):
            right[name] = "changed"
        else:
            right[name] = "node"
    return left, right


def fx_before_after(before, after=None) -> Figure:
    """Two FX graphs side by side, ``before`` (a GraphModule) on the left and ``after`` (the
    GraphModule a pass returned) on the right: a column of boxes per graph, one per node in
    order, arrows from each node's inputs to it; nodes the pass removed in red, nodes it
    changed (a folded layer, a node rewired) in green, new ones in blue. With ``after`` None,
    ``before`` alone, titled as such. Boxes have gid ``<side>:<mark>:<node name>`` (side
    ``before`` or ``after``, mark as :func:`fx_marks` gives), arrows
    ``<side>:edge:<input>-><node>``. Raises ValueError for a graph of more than 60 nodes."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    graphs = [("before", before)] + ([("after", after)] if after is not None else [])
    longest = max(len(gm.graph.nodes) for _, gm in graphs)
    if longest > 60:
        raise ValueError(f"a graph of {longest} nodes is too long to draw (60 at most)")
    marks = dict(zip(("before", "after"), fx_marks(before, after)))
    row, height = 0.42, 0.3
    fig_h = 1.3 + row * longest
    fig = Figure(figsize=(12, fig_h))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 12)
    ax.set_ylim(0, fig_h)
    ax.axis("off")
    title = (
        "FX graph before and after the pass"
        if after is not None
        else "FX graph as traced (no pass applied)"
    )
    ax.text(0.1, fig_h - 0.35, title, fontsize=11, weight="bold")
    for col, (side, gm) in enumerate(graphs):
        x0, width = 0.9 + col * 6.0, 4.6
        ax.text(x0, fig_h - 0.75, side, fontsize=10, weight="bold")
        ys = {}
        for i, node in enumerate(gm.graph.nodes):
            y = fig_h - 1.15 - i * row
            ys[node.name] = y
            mark = marks[side][node.name]
            ax.add_patch(
                FancyBboxPatch(
                    (x0, y - height / 2),
                    width,
                    height,
                    boxstyle="round,pad=0.02",
                    fc=FX_COLOURS[mark],
                    ec="#555",
                    lw=0.8,
                    gid=f"{side}:{mark}:{node.name}",
                )
            )
            ax.text(
                x0 + 0.08,
                y,
                _fx_label(gm, node),
                ha="left",
                va="center",
                fontsize=7.5,
                family="monospace",
            )
        for node in gm.graph.nodes:
            for src in node.all_input_nodes:
                y0, y1 = ys[src.name], ys[node.name]
                rows = max(1.0, abs(y0 - y1) / row)  # how far apart, bulging left with it
                rad = (0.12 + 0.07 * rows) / (rows * row)
                ax.add_patch(
                    FancyArrowPatch(
                        (x0 - 0.03, y0),
                        (x0 - 0.03, y1),
                        arrowstyle="-|>",
                        connectionstyle=f"arc3,rad={rad}",
                        mutation_scale=7,
                        lw=0.6,
                        color="#555",
                        gid=f"{side}:edge:{src.name}->{node.name}",
                    )
                )
    legend = (
        [
            (FX_COLOURS["removed"], "removed by the pass"),
            (FX_COLOURS["changed"], "changed: parameters or inputs"),
            (FX_COLOURS["new"], "new"),
        ]
        if after is not None
        else []
    )
    for k, (colour, text) in enumerate(legend):
        ax.add_patch(
            FancyBboxPatch(
                (4.6 + k * 2.5, fig_h - 0.43),
                0.2,
                0.16,
                fc=colour,
                ec="#555",
                lw=0.6,
                boxstyle="square,pad=0",
            )
        )
        ax.text(4.85 + k * 2.5, fig_h - 0.35, text, fontsize=7.5, va="center")
    return fig
