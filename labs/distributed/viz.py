"""Pictures and an explorer for lab 5 (torch.distributed), each one call from a cell.

Pictures return a ``matplotlib.figure.Figure`` built without pyplot (no global figure state);
importing :mod:`grader.kernel.display` registers the PNG formatter that shows it in JupyterLab. The
explorer returns an ``ipywidgets.VBox`` whose picture lives in an ``ipywidgets.HTML`` value, so
it works, and can be tested, without a kernel.

- :func:`ring_schedule`, :func:`ring_allreduce`: the chunks a ring all-reduce sends, step by
  step (reduce-scatter, then all-gather), and what each rank holds after each step;
- :func:`ring_explorer`: a slider over the states of that schedule, one table per state;
- :func:`record_ddp_iterations`, :func:`ddp_timeline`: inside a rank, when each gradient of a
  ``DistributedDataParallel`` model became ready and when each bucket's all-reduce ran, over a
  few iterations (the first bucket layout, then the rebuilt one), and their timeline;
- :func:`placement_blocks`, :func:`placement_map`: which block of a 2-D tensor each rank of a
  ``DeviceMesh`` holds under ``torch.distributed.tensor`` placements;
- :func:`cost_curves`, :func:`default_sizes`: a learner's alpha-beta cost model of
  collectives, time against message size, with the point where ring and tree all-reduce cross.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Sequence

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

import grader.kernel.display  # noqa: F401  (registers the PNG formatter for figures)

#: fill colour of a chunk that holds every rank's contribution
COMPLETE_COLOUR = "#1a9641"
#: colour of the send arrows and outline of a chunk sent (explorer) or received (figure)
SEND_COLOUR = "#d7191c"
#: colours of buckets, ranks' blocks and curves (cycled)
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
#: the (op, algorithm) pairs :func:`cost_curves` plots, in its legend's order
COLLECTIVES = (
    ("all_reduce", "ring"),
    ("all_reduce", "tree"),
    ("broadcast", "ring"),
    ("broadcast", "tree"),
    ("all_gather", "ring"),
    ("reduce_scatter", "ring"),
)
#: :func:`ring_allreduce` draws at most this many ranks (world_size**2 boxes per row)
MAX_RING_FIGURE = 8
#: above this many ranks :func:`ring_allreduce`'s boxes show how many ranks contributed
SHORT_LABELS = 5
KiB = 1024


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


# ------------------------------------------------------------------ ring all-reduce
def ring_schedule(world_size: int) -> list[dict]:
    """The states of a ring all-reduce (sum) of a tensor split into ``world_size`` chunks, in
    order: the initial state, the ``world_size - 1`` steps of the reduce-scatter, then the
    ``world_size - 1`` steps of the all-gather (``2 * world_size - 1`` states).

    Each state is ``{"phase": "initial" | "reduce-scatter" | "all-gather", "step": int,
    "chunks": chunks, "sends": sends}``: ``step`` counts from 1 in each phase (0 for the
    initial state); ``chunks[r][c]`` is the set of ranks whose contribution chunk ``c`` on rank
    ``r`` holds after the step (initially ``{r}``); ``sends`` the ``(src, dst, chunk)`` of the
    step, one per rank, ``dst = (src + 1) % world_size`` (none in the initial state). In
    reduce-scatter step ``s`` (from 0) rank ``r`` sends chunk ``(r - s) % p`` and the receiver
    adds it to its own; after ``p - 1`` steps rank ``r`` holds the complete chunk
    ``(r + 1) % p``. In all-gather step ``s`` rank ``r`` sends chunk ``(r + 1 - s) % p`` and the
    receiver overwrites its own. Each rank sends ``2 (p - 1)`` chunks of ``n / p`` elements,
    whatever ``p``: the bandwidth-optimal all-reduce. Raises ValueError below 2 ranks.

    Models the ring algorithm of gloo (``third_party/gloo/gloo/allreduce.cc: ring``, which
    ``torch/csrc/distributed/c10d/ProcessGroupGlooDetail.hpp: AsyncAllreduceWork`` calls) and of
    NCCL's ``NCCL_ALGO=Ring``."""
    p = int(world_size)
    if p < 2:
        raise ValueError(f"a ring needs at least 2 ranks, not world_size={world_size}")
    chunks = [[{r} for _ in range(p)] for r in range(p)]
    states = [{"phase": "initial", "step": 0, "chunks": chunks, "sends": []}]
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(p - 1):
            first = 0 if phase == "reduce-scatter" else 1
            sends = [(r, (r + 1) % p, (r + first - s) % p) for r in range(p)]
            new = [[set(c) for c in row] for row in chunks]
            for src, dst, c in sends:  # (every rank sends, then every rank receives)
                if phase == "reduce-scatter":
                    new[dst][c] = chunks[dst][c] | chunks[src][c]
                else:
                    new[dst][c] = set(chunks[src][c])
            chunks = new
            states.append({"phase": phase, "step": s + 1, "chunks": chunks, "sends": sends})
    return states


def _chunk_label(ranks: set, chunk: int, p: int, short: bool = False) -> str:
    """``Σ`` for a complete chunk, else its contributors in ring order from the chunk's own
    index (``3+0+1``), shortened to ``3+…+1`` past three; with ``short``, their number."""
    if len(ranks) == p:
        return "Σ"
    if short:
        return str(len(ranks))
    order = sorted(ranks, key=lambda r: (r - chunk) % p)
    if len(order) > 3:
        return f"{order[0]}+…+{order[-1]}"
    return "+".join(map(str, order))


def _chunk_colour(n: int, p: int) -> str:
    """The fill of a chunk holding ``n`` of ``p`` contributions: light to dark blue, green
    when complete."""
    if n >= p:
        return COMPLETE_COLOUR
    frac = 0.12 + 0.6 * (n - 1) / max(p - 2, 1)
    return matplotlib.colors.to_hex(matplotlib.colormaps["Blues"](frac))


def _state_name(state: dict, p: int) -> str:
    if state["phase"] == "initial":
        return "initial"
    return f"{state['phase']} {state['step']}/{p - 1}"


def ring_allreduce(world_size: int = 4) -> Figure:
    """A ring all-reduce (sum) step by step, as :func:`ring_schedule` gives it: one row per
    state (initial, reduce-scatter steps 1..p-1, all-gather steps 1..p-1, labelled by phase and
    step), one column group per rank, and in each group the rank's ``p`` chunks as boxes
    labelled with the ranks whose contributions they hold (``0+1+2``, ``Σ`` when complete;
    above :data:`SHORT_LABELS` ranks, too narrow for that, with how many ranks contributed) and
    filled by how complete they are (light to dark blue, green when complete). In each step a
    red arrow goes from the chunk each rank sends (in the row above: what it held before the
    step) to the same chunk of rank ``(r + 1) % p`` in the step's row, outlined in red (what
    the receiver holds after adding or copying it): ``p`` arrows per step. Raises
    ValueError below 2 or above :data:`MAX_RING_FIGURE` ranks (use :func:`ring_explorer`).

    Artists' gids: ``chunk:<n>`` (a box holding ``n`` contributions), ``chunk-label``,
    ``send:<k>`` (an arrow of state ``k``, counted from 0 with the initial state).

    Models ``third_party/gloo/gloo/allreduce.cc: ring`` (see :func:`ring_schedule`)."""
    p = int(world_size)
    if p > MAX_RING_FIGURE:
        raise ValueError(
            f"{p} ranks draw {p * p} boxes per row: too many to read; ring_figure draws at "
            f"most {MAX_RING_FIGURE} ranks (ring_explorer shows any number)"
        )
    states = ring_schedule(p)
    gap, row_h, box_h = 0.8, 1.7, 0.8
    box_in = min(0.55, 15.0 / (p * (p + gap)))  # inches per chunk box
    font = max(4.5, min(8.0, box_in * 15))
    fig = Figure(figsize=(p * (p + gap) * box_in + 2.2, len(states) * row_h * 0.42 + 1.6))
    ax = fig.subplots()

    def left(rank: int, chunk: int) -> float:
        return rank * (p + gap) + chunk

    for k, state in enumerate(states):
        y = k * row_h
        received = {(dst, c) for _, dst, c in state["sends"]}
        for r, row in enumerate(state["chunks"]):
            for c, ranks in enumerate(row):
                outline = (r, c) in received
                ax.add_patch(
                    Rectangle(
                        (left(r, c) + 0.05, y - box_h / 2),
                        0.9,
                        box_h,
                        facecolor=_chunk_colour(len(ranks), p),
                        edgecolor=SEND_COLOUR if outline else "#555555",
                        linewidth=1.8 if outline else 0.6,
                        gid=f"chunk:{len(ranks)}",
                    )
                )
                dark = len(ranks) >= p or len(ranks) > p / 2
                ax.text(
                    left(r, c) + 0.5,
                    y,
                    _chunk_label(ranks, c, p, short=p > SHORT_LABELS),
                    ha="center",
                    va="center",
                    fontsize=font,
                    color="white" if dark else "black",
                    gid="chunk-label",
                )
        for src, dst, c in state["sends"]:  # from the sender's chunk before the step
            ax.add_patch(
                FancyArrowPatch(
                    (left(src, c) + 0.5, y - row_h + box_h / 2),
                    (left(dst, c) + 0.5, y - box_h / 2),
                    arrowstyle="-|>",
                    mutation_scale=8,
                    color=SEND_COLOUR,
                    linewidth=0.9,
                    shrinkA=1,
                    shrinkB=1,
                    gid=f"send:{k}",
                )
            )
    for r in range(p):
        ax.text(
            left(r, 0) + p / 2,
            -row_h * 0.55,
            f"rank {r}",
            ha="center",
            va="bottom",
            fontsize=9,
            fontweight="bold",
            gid="rank",
        )
    ax.set_xlim(-0.2, left(p - 1, p) + 0.2)
    ax.set_ylim((len(states) - 1) * row_h + row_h / 2, -row_h * 0.8)
    ax.set_yticks([k * row_h for k in range(len(states))], [_state_name(s, p) for s in states])
    ax.tick_params(axis="y", labelsize=8, length=0)
    ax.set_xticks(
        [left(r, c) + 0.5 for r in range(p) for c in range(p)],
        [str(c) for _ in range(p) for c in range(p)],
        fontsize=max(font - 1, 4),
    )
    ax.tick_params(axis="x", length=0)
    counted = "; a box's number: how many ranks contributed" if p > SHORT_LABELS else ""
    ax.set_xlabel(
        f"chunk index on each rank (the tensor split into p chunks of n/p elements){counted}"
    )
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(
        f"ring all-reduce on {p} ranks: {p - 1} reduce-scatter steps (receiver adds), "
        f"{p - 1} all-gather steps (receiver overwrites);\neach step every rank sends one "
        f"chunk (red arrow) to rank r+1: {2 * (p - 1)} chunks of n/{p}, "
        f"{2 * (p - 1) / p:.3g}·n elements per rank (2(p-1)/p·n: under 2n for any p)",
        fontsize=9,
    )
    handles = [
        Patch(facecolor=_chunk_colour(n, p), edgecolor="#555555", label=f"{n} of {p} ranks")
        for n in range(1, p)
    ]
    handles.append(Patch(facecolor=COMPLETE_COLOUR, edgecolor="#555555", label="Σ: all ranks"))
    handles.append(Patch(facecolor="white", edgecolor=SEND_COLOUR, label="received this step"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    fig.tight_layout()
    return fig


def _sent_so_far(states: list[dict], k: int, p: int) -> list[int]:
    sent = [0] * p
    for state in states[1 : k + 1]:
        for src, _, _ in state["sends"]:
            sent[src] += 1
    return sent


def _state_html(states: list[dict], k: int) -> str:
    state = states[k]
    p = len(state["chunks"])
    sends = {src: c for src, _, c in state["sends"]}
    received = {dst: c for _, dst, c in state["sends"]}
    sent = _sent_so_far(states, k, p)
    if state["phase"] == "initial":
        what = "initial state: each rank holds its own tensor, split into chunks"
    else:
        verb = "adds it to" if state["phase"] == "reduce-scatter" else "overwrites"
        what = (
            f"{state['phase']} step {state['step']} of {p - 1}: each rank r sends one chunk to "
            f"rank (r+1) % {p}, which {verb} its own"
        )
    if len(set(sent)) == 1:
        so_far = f"each rank has sent {_plural(sent[0], 'chunk')} so far"
    else:
        so_far = "sent so far: " + ", ".join(f"rank {r}: {n}" for r, n in enumerate(sent))
    caption = (
        f"State {k} of {len(states) - 1} ({html.escape(what)}); {so_far} "
        f"(a chunk is n/{p} of the tensor's bytes; {2 * (p - 1)} in all)"
    )
    head = "".join(f"<th>chunk {c}</th>" for c in range(p))
    rows = []
    for r, row in enumerate(state["chunks"]):
        cells = []
        for c, ranks in enumerate(row):
            style = f"background:{_chunk_colour(len(ranks), p)};text-align:center;padding:2px 8px"
            if len(ranks) > p / 2:
                style += ";color:white"
            note = ""
            if sends.get(r) == c:  # (dashed: what it sent; solid, as in the figure: received)
                style += f";outline:2px dashed {SEND_COLOUR};outline-offset:-3px"
                note = f" → {(r + 1) % p}"
            if received.get(r) == c:
                style += f";outline:3px solid {SEND_COLOUR};outline-offset:-3px"
                note += f" ← {(r - 1) % p}"
            label = html.escape(_chunk_label(ranks, c, p) + note)
            cells.append(f'<td class="chunk" style="{style}">{label}</td>')
        rows.append(f"<tr><th>rank {r}</th>{''.join(cells)}<td>{sent[r]}</td></tr>")
    key = (
        ""
        if state["phase"] == "initial"
        else f'<p style="font-size:smaller">solid <span style="color:{SEND_COLOUR}">red</span> '
        "outline: the chunk a rank received this step (← from whom), as in the figure; dashed: "
        "the chunk it sent (→ to whom)</p>"
    )
    return (
        f"<p><b>{html.escape(_state_name(state, p))}</b></p>"
        '<table style="border-collapse:collapse">'
        f"<caption>{caption}</caption>"
        f"<tr><th></th>{head}<th>sent so far (chunks)</th></tr>{''.join(rows)}</table>{key}"
    )


def ring_explorer(world_size: int = 4):
    """An explorer: a slider over the states of :func:`ring_schedule` (0: initial, then the
    reduce-scatter and all-gather steps), showing the chosen state as an HTML table, one row
    per rank and one column per chunk, each cell labelled like :func:`ring_allreduce`'s boxes
    and filled in the same colours, the chunk each rank received in the step outlined in solid
    red and marked ``← src`` (as the figure outlines it), the chunk it sent outlined dashed and
    marked ``→ dst`` (a key under the table says so), a column with the chunks each rank has
    sent so far and a caption naming the phase and step and those counts (units of chunks,
    ``n / p`` of the tensor's bytes each). Returns an ``ipywidgets.VBox``: ``children[0]`` is
    the ``IntSlider`` (0 to ``2 * (p - 1)``), ``children[1]`` the ``ipywidgets.HTML`` shown.
    Raises ValueError below 2 ranks."""
    import ipywidgets as widgets

    states = ring_schedule(world_size)
    slider = widgets.IntSlider(value=0, min=0, max=len(states) - 1, description="state")
    picture, cache = widgets.HTML(), {}

    def show(change=None):
        k = slider.value
        if k not in cache:
            cache[k] = _state_html(states, k)
        picture.value = cache[k]

    slider.observe(show, names="value")
    show()
    return widgets.VBox([slider, picture])


# ------------------------------------------------------------------ DDP buckets
def record_ddp_iterations(ddp_model, step: Callable, iterations: int = 2) -> list[dict]:
    """Run ``iterations`` training iterations of ``ddp_model`` (a
    ``torch.nn.parallel.DistributedDataParallel``) on this rank and record, for each, when each
    parameter's gradient became ready and when each bucket's all-reduce started and ended.
    Call it inside a rank (a function :func:`labs.distributed.launch.run` runs), on every rank.

    ``step()`` runs one forward and returns the loss (zeroing the gradients, or taking the
    optimizer's step for the previous iteration, first if wanted); this function calls
    ``loss.backward()`` on it. Before the first iteration it registers a comm hook
    (``ddp_model.register_comm_hook(None, hook)``) that does what DDP's default does (divide
    the bucket's buffer by the world size, all-reduce it asynchronously) and records, per
    bucket, its index, its parameters' names (``bucket.parameters()`` matched by identity
    against ``ddp_model.module.named_parameters()``), its size, the time the hook was called
    and the time the all-reduce's future completed (``fut.then``); and a
    ``register_post_accumulate_grad_hook`` on every parameter that records when its gradient
    was accumulated. The parameter hooks are removed at the end; the comm hook cannot be (DDP
    keeps the first one registered, and accepts one only before the first backward): it keeps
    averaging gradients as the default does, recording nothing. So pass a model that has not
    run a backward and has no comm hook yet (RuntimeError otherwise); record several iterations
    in one call to see DDP's first bucket layout and its rebuilt one.

    Returns one dict per iteration, plain data: ``{"iteration": i (from 1), "backward":
    (0.0, t_end), "grads": [(name, t), ...] (in the order they became ready), "buckets":
    [{"index", "params" (names), "nbytes", "start", "end"}, ...] (by index)}``, times in
    seconds from the start of that iteration's ``loss.backward()``.

    In iteration 1 DDP has one bucket holding all parameters (it does not yet know the order
    gradients come in; unless ``find_unused_parameters=True``, which buckets by size in
    reverse definition order from the start); after it, ``Reducer::rebuild_buckets``
    regroups the parameters in the order their gradients became ready, ``bucket_cap_mb`` each,
    so from iteration 2 a bucket's all-reduce starts as soon as its last gradient is ready and
    the buckets before it have started (``Reducer::mark_bucket_ready`` launches them in bucket
    order), while backward continues. Models ``torch/nn/parallel/distributed.py:
    DistributedDataParallel.register_comm_hook``, ``torch/distributed/algorithms/ddp_comm_hooks/
    default_hooks.py: allreduce_hook`` and ``torch/csrc/distributed/c10d/reducer.cpp:
    Reducer::mark_variable_ready, Reducer::rebuild_buckets``."""
    import torch.distributed as dist

    group = getattr(ddp_model, "process_group", None)
    world = dist.get_world_size(group)
    names = {id(p): n for n, p in ddp_model.module.named_parameters()}
    current: dict = {}  # the iteration being recorded: "t0", "grads", "buckets"

    def hook(state, bucket):
        started = time.perf_counter()
        buffer = bucket.buffer()
        buffer.div_(world)  # (as the default hook: divide first, against overflow)
        fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()
        if not current:
            return fut.then(lambda f: f.value()[0])
        entry = {
            "index": bucket.index(),
            "params": [names.get(id(p), "?") for p in bucket.parameters()],
            "nbytes": buffer.numel() * buffer.element_size(),
            "start": started - current["t0"],
            "end": None,
        }
        current["buckets"].append(entry)
        t0 = current["t0"]

        def done(f):
            entry["end"] = time.perf_counter() - t0
            return f.value()[0]

        return fut.then(done)

    try:
        ddp_model.register_comm_hook(None, hook)
    except RuntimeError as exc:
        raise RuntimeError(
            "record_ddp_iterations registers a comm hook, which DDP accepts once and only "
            f"before the first backward ({exc}); build a new DistributedDataParallel model"
        ) from exc

    def ready(name):
        def grad_hook(param):
            if current:
                current["grads"].append((name, time.perf_counter() - current["t0"]))

        return grad_hook

    handles = [
        p.register_post_accumulate_grad_hook(ready(n))
        for n, p in ddp_model.module.named_parameters()
        if p.requires_grad
    ]
    records = []
    try:
        for i in range(1, iterations + 1):
            loss = step()
            current.update(grads=[], buckets=[], t0=time.perf_counter())
            loss.backward()
            end = time.perf_counter() - current["t0"]
            buckets = sorted(current["buckets"], key=lambda b: b["index"])
            records.append(
                {
                    "iteration": i,
                    "backward": (0.0, end),
                    "grads": list(current["grads"]),
                    "buckets": buckets,
                }
            )
            current.clear()
    finally:
        current.clear()
        for h in handles:
            h.remove()
    return records


def _short(name: str) -> str:
    """``layers.3.weight`` -> ``3.w``: the last module name and the parameter's initial."""
    parts = name.split(".")
    if len(parts) == 1:
        return name
    return f"{parts[-2]}.{parts[-1][:1]}"


def ddp_timeline(records: list[dict]) -> Figure:
    """The timelines :func:`record_ddp_iterations` recorded on one rank, one panel per
    iteration (time in ms from the start of its backward): the backward as a grey span on the
    top row; one tick per gradient when it became ready on the second row, coloured by the
    bucket its parameter is in (:data:`PALETTE`, grey when in none) and labelled with the
    parameter's short name (``3.w`` for ``...3.weight``; one label, ``3.b,3.w``, for the
    gradients ready within 1% of the backward) when there are at most 16; one bar per
    bucket's all-reduce, from the hook's call to its future's completion, each on its own lane
    of the "communication" rows, labelled "bucket i (n params, X KiB)", with a dotted line up
    from its start to the gradients row. Returns a ``Figure``.

    It shows what DDP overlaps: gradients become ready in reverse order of the forward; a
    bucket's all-reduce starts when the last of its gradients is ready and runs while backward
    computes the rest; iteration 1 has one bucket (all-reduced after the whole backward), later
    ones the buckets DDP rebuilt in gradient order.

    Artists' gids: ``backward``, ``grad:<bucket index>`` (``grad:none``), ``grad-name``,
    ``bucket:<index>``, ``bucket-label``, ``bucket-start``. Models ``torch/csrc/distributed/
    c10d/reducer.cpp: Reducer::autograd_hook, Reducer::mark_variable_ready`` (a bucket is
    launched when all its variables are ready) and ``Reducer::rebuild_buckets``."""
    n = max(len(records), 1)
    lanes = [max(len(r["buckets"]), 1) for r in records] or [1]
    fig = Figure(figsize=(11, sum(2.0 + 0.35 * k for k in lanes) + 1.0))
    if not records:
        ax = fig.subplots()
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no iterations recorded", ha="center", va="center", gid="empty")
        return fig
    axes = fig.subplots(n, 1, squeeze=False, height_ratios=[2.0 + 0.35 * k for k in lanes])
    for ax, rec in zip(axes[:, 0], records):
        bucket_of = {name: b["index"] for b in rec["buckets"] for name in b["params"]}
        colour = {b["index"]: PALETTE[b["index"] % len(PALETTE)] for b in rec["buckets"]}
        t_end = rec["backward"][1] * 1e3
        few = len(rec["grads"]) <= 16
        top = 2.8 if few else 2.0  # the backward row: above the gradients' names
        ax.barh(top, t_end, left=0, height=0.5, color="#bbbbbb", gid="backward")
        ax.text(t_end / 2, top, "backward", ha="center", va="center", fontsize=8)
        for name, t in rec["grads"]:
            b = bucket_of.get(name)
            ax.plot(
                [t * 1e3, t * 1e3],
                [0.65, 1.35],
                color=colour.get(b, "#7f7f7f"),
                linewidth=1.6,
                gid=f"grad:{'none' if b is None else b}",
            )
        groups: list[list] = []  # names of gradients ready within 1% of the span: one label
        for name, t in rec["grads"] if few else []:
            if groups and t * 1e3 - groups[-1][0] <= 0.01 * t_end:
                groups[-1][1].append(_short(name))
            else:
                groups.append([t * 1e3, [_short(name)]])
        for t, shorts in groups:
            ax.text(
                t,
                1.4,
                ",".join(shorts),
                rotation=90,
                ha="center",
                va="bottom",
                fontsize=6,
                gid="grad-name",
            )
        for lane, b in enumerate(rec["buckets"]):
            y = -lane * 0.7
            start, end = b["start"] * 1e3, (b["end"] if b["end"] is not None else b["start"])
            end *= 1e3
            ax.barh(
                y,
                max(end - start, t_end * 0.002),
                left=start,
                height=0.5,
                color=colour[b["index"]],
                gid=f"bucket:{b['index']}",
            )
            ax.plot(
                [start, start], [y + 0.25, 0.65], ":", color=colour[b["index"]], gid="bucket-start"
            )
            ax.text(
                end + t_end * 0.01,
                y,
                f"bucket {b['index']} ({_plural(len(b['params']), 'param')}, "
                f"{b.get('nbytes', 0) / KiB:.0f} KiB)",
                ha="left",
                va="center",
                fontsize=7,
                gid="bucket-label",
            )
        last = max([t_end] + [(b["end"] or 0) * 1e3 for b in rec["buckets"]])
        ax.set_xlim(0, last * 1.3 if last > 0 else 1)
        bottom = -(len(rec["buckets"]) - 1) * 0.7 - 0.5
        ax.set_ylim(bottom, top + 0.45)
        comm = -(len(rec["buckets"]) - 1) * 0.35 if rec["buckets"] else 0
        ax.set_yticks([top, 1, comm], ["backward", "gradient ready", "communication"], fontsize=8)
        ax.set_title(
            f"iteration {rec.get('iteration', '?')}: {_plural(len(rec['buckets']), 'bucket')}, "
            f"{_plural(len(rec['grads']), 'gradient')}, backward {t_end:.2f} ms",
            fontsize=9,
        )
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms from the start of loss.backward()")
    fig.suptitle(
        "DDP: gradients become ready in reverse order; a bucket's all-reduce starts when its "
        "last gradient is ready,\noverlapping the rest of backward. Iteration 1 has one bucket "
        "(all parameters); later ones the buckets rebuilt in gradient order.",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ DTensor placements
def _mesh_coords(rank: int, mesh_shape: Sequence[int]) -> list[int]:
    coords = []
    for size in reversed(mesh_shape):
        coords.append(rank % size)
        rank //= size
    return coords[::-1]


def _kind(placement) -> tuple[str, int | None]:
    """``("shard", dim)``, ``("replicate", None)`` or ``("partial", None)``."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if type(placement) is Shard:
        return "shard", placement.dim
    if isinstance(placement, Replicate):
        return "replicate", None
    if isinstance(placement, Partial):
        return "partial", None
    raise ValueError(
        f"placement {placement!r}: only Shard(d), Replicate() and Partial() are drawn"
    )


def _check(shape, mesh_shape, placements) -> tuple[tuple[int, int], tuple[int, ...], list]:
    shape = tuple(int(s) for s in shape)
    mesh_shape = tuple(int(s) for s in mesh_shape)
    placements = list(placements)
    if len(shape) != 2:
        raise ValueError(f"shape {shape}: a 2-D tensor's shape, (rows, columns)")
    if len(mesh_shape) not in (1, 2) or min(mesh_shape) < 1:
        raise ValueError(f"mesh_shape {mesh_shape}: a 1-D or 2-D mesh's shape")
    if len(placements) != len(mesh_shape):
        raise ValueError(
            f"{len(placements)} placements for a {len(mesh_shape)}-D mesh: one per mesh dim"
        )
    for p in placements:
        kind, dim = _kind(p)
        if kind == "shard" and not -2 <= dim < 2:
            raise ValueError(f"{p!r}: a 2-D tensor has dims 0 and 1")
    return shape, mesh_shape, placements


def placement_blocks(
    shape: tuple[int, int], mesh_shape: tuple[int, ...], placements
) -> dict[int, tuple[slice, slice]]:
    """``{rank: (rows, columns)}``: the block of a 2-D global tensor of ``shape`` that each rank
    of a ``DeviceMesh`` of ``mesh_shape`` (1-D or 2-D, ranks numbered row-major, as
    ``init_device_mesh`` lays them out) holds under ``placements`` (one per mesh dim,
    ``torch.distributed.tensor`` ``Shard(d)``, ``Replicate()`` or ``Partial()``), as slices
    with explicit ``start`` and ``stop``.

    Starting from the whole tensor, the placements apply in mesh-dim order: ``Shard(d)`` on mesh
    dim ``i`` keeps the rank's piece, by its coordinate along ``i``, of the current block split
    along tensor dim ``d`` into ``mesh_shape[i]`` pieces with ``torch.chunk`` semantics (pieces
    of ``ceil(size / n)``, the last ones shorter or empty); ``Replicate()`` and ``Partial()``
    keep the block (a ``Partial`` rank holds a partial sum of it, not its values). Pure
    arithmetic: no process group needed. Raises ValueError for other shapes or placements.

    Models ``torch/distributed/tensor/placement_types.py: Shard._split_tensor`` and
    ``torch/distributed/tensor/_utils.py: compute_local_shape_and_global_offset`` (what
    ``torch/distributed/tensor/_api.py: distribute_tensor`` keeps on each rank)."""
    shape, mesh_shape, placements = _check(shape, mesh_shape, placements)
    blocks = {}
    for rank in range(math.prod(mesh_shape)):
        coords = _mesh_coords(rank, mesh_shape)
        lo, hi = [0, 0], list(shape)
        for i, p in enumerate(placements):
            kind, dim = _kind(p)
            if kind != "shard":
                continue
            dim %= 2
            n = mesh_shape[i]
            size = hi[dim] - lo[dim]
            piece = -(-size // n) if size else 0
            start = min(lo[dim] + coords[i] * piece, hi[dim])
            lo[dim], hi[dim] = start, min(start + piece, hi[dim])
        blocks[rank] = (slice(lo[0], hi[0]), slice(lo[1], hi[1]))
    return blocks


def _placement_text(p) -> str:
    kind, dim = _kind(p)
    return {"shard": f"Shard({dim})", "replicate": "Replicate()", "partial": "Partial()"}[kind]


def placement_map(shape: tuple[int, int], mesh_shape: tuple[int, ...], placements) -> Figure:
    """Where a 2-D tensor of ``shape`` lives on a 1-D or 2-D ``DeviceMesh`` of ``mesh_shape``
    under ``placements`` (one per mesh dim: ``Shard(d)``, ``Replicate()``, ``Partial()``): one
    panel per rank, laid out as the mesh (a 1-D mesh as one row), each showing the global
    tensor (rows down, columns across, a grid line per element when at most 32 a side) with the
    block :func:`placement_blocks` gives the rank filled in the rank's colour; when a mesh dim
    is ``Partial()`` the block is hatched and the panel's title says "partial sum" (each rank
    holds a term of a sum over that mesh dim, not the values). Titles: the rank, its mesh
    coordinates and its local shape. Returns a ``Figure``.

    Artists' gids: ``block`` (``block:partial`` when hatched), ``tensor`` (the global outline);
    each panel's axes has gid ``rank:<r>``. Models ``torch/distributed/tensor/_api.py:
    distribute_tensor`` (see :func:`placement_blocks`)."""
    shape, mesh_shape, placements = _check(shape, mesh_shape, placements)
    blocks = placement_blocks(shape, mesh_shape, placements)
    h, w = shape
    rows, cols = (1, mesh_shape[0]) if len(mesh_shape) == 1 else mesh_shape
    partial = [i for i, p in enumerate(placements) if _kind(p)[0] == "partial"]
    panel_w = 2.6  # inches; the height follows the tensor's aspect
    panel_h = min(max(panel_w * h / max(w, 1), 0.8), 4.0) + 0.7
    fig = Figure(figsize=(cols * panel_w + 0.6, rows * panel_h + 0.9))
    axes = fig.subplots(rows, cols, squeeze=False)
    for rank, (rs, cs) in blocks.items():
        ax = axes.flat[rank]
        ax.set_gid(f"rank:{rank}")
        ax.add_patch(
            Rectangle((0, 0), w, h, facecolor="#f0f0f0", edgecolor="#555555", gid="tensor")
        )
        if max(h, w) <= 32:
            ax.vlines(range(1, w), 0, h, colors="white", linewidth=0.6)
            ax.hlines(range(1, h), 0, w, colors="white", linewidth=0.6)
        bh, bw = rs.stop - rs.start, cs.stop - cs.start
        if bh and bw:
            ax.add_patch(
                Rectangle(
                    (cs.start, rs.start),
                    bw,
                    bh,
                    facecolor=PALETTE[rank % len(PALETTE)],
                    edgecolor="black",
                    alpha=0.85,
                    hatch="///" if partial else None,
                    linewidth=1.2,
                    gid="block:partial" if partial else "block",
                )
            )
        coords = tuple(_mesh_coords(rank, mesh_shape))
        title = f"rank {rank} {coords if len(coords) > 1 else ''}".rstrip()
        title += f": local {bh}×{bw}" if bh and bw else ": empty"
        if partial:
            dims = ", ".join(map(str, partial))
            title += f"\npartial sum over mesh dim {dims}"
        ax.set_title(title, fontsize=8)
        ax.set_xlim(0, w)
        ax.set_ylim(h, 0)
        ax.set_aspect("equal")
        ax.set_xticks([0, w], ["0", str(w)], fontsize=6)
        ax.set_yticks([0, h], ["0", str(h)], fontsize=6)
    said = ", ".join(_placement_text(p) for p in placements)
    fig.suptitle(
        f"a {h}×{w} tensor on a mesh of shape {mesh_shape}\nwith [{said}]: "
        "the block each rank holds",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ alpha-beta costs
def default_sizes(world_size: int) -> list[int]:
    """Message sizes in bytes: the powers of 2 from 1 KiB to 1 GiB, each rounded to the nearest
    multiple of ``4 * world_size`` (so ``n / p`` bytes of float32 split evenly)."""
    unit = 4 * int(world_size)
    return sorted({max(unit, round(2**k / unit) * unit) for k in range(10, 31)})


def _bytes(n: int) -> str:
    """``n`` bytes as ``512 B``, ``32 KiB``, ``1 GiB`` (powers of 1024)."""
    for unit, size in (("GiB", KiB**3), ("MiB", KiB**2), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _seconds(cost, op, algorithm, nbytes, p, alpha, beta) -> tuple[list, float]:
    result = cost(op, algorithm, int(nbytes), p, alpha, beta)
    try:
        sent, seconds = result
        return list(sent), float(seconds)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"cost({op!r}, {algorithm!r}, {nbytes}, ...) returned {result!r}: expected "
            "(bytes_sent_per_rank: list[int], seconds: float)"
        ) from exc


def _crossover(cost, sizes, p, alpha, beta) -> int | None:
    """The smallest size (a multiple of 4p, between two of ``sizes`` where ring and tree
    all-reduce swap places) at which the one slower on small messages becomes no slower, by
    bisection; None when they never swap in ``sizes``."""
    unit = 4 * p

    def diff(n):
        ring = _seconds(cost, "all_reduce", "ring", n, p, alpha, beta)[1]
        tree = _seconds(cost, "all_reduce", "tree", n, p, alpha, beta)[1]
        return ring - tree

    d = [diff(n) for n in sizes]
    for i in range(len(sizes) - 1):
        if d[i] != 0 and (d[i] > 0) != (d[i + 1] > 0):
            sign = d[i] > 0
            lo, hi = sizes[i] // unit, sizes[i + 1] // unit  # diff(lo) has `sign`, hi not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                d_mid = diff(mid * unit)
                if d_mid != 0 and (d_mid > 0) == sign:
                    lo = mid
                else:
                    hi = mid
            return hi * unit
    return None


def cost_curves(cost: Callable, world_size: int, alpha: float, beta: float, sizes=None) -> Figure:
    """A learner's alpha-beta cost model of collectives, plotted: seconds (log) against message
    size in bytes (log) for each (op, algorithm) of :data:`COLLECTIVES`, on ``world_size``
    ranks with latency ``alpha`` (seconds per message) and inverse bandwidth ``beta``
    (seconds per byte).

    ``cost(op, algorithm, nbytes, world_size, alpha, beta)`` returns ``(bytes_sent_per_rank,
    seconds)``: a list of the bytes each rank sends, and the collective's time; ``nbytes`` is
    the size of the whole tensor. Each curve's legend entry gives the most any rank sends, as
    a multiple of ``n``, at the largest size. ``sizes``: the bytes to evaluate (default
    :func:`default_sizes`: 1 KiB to 1 GiB). Where ring and tree all-reduce swap places a dashed
    vertical line marks the size (refined by bisection over multiples of ``4 * world_size``),
    with the latency-bound side (small messages: fewer steps, fewer alphas win) and the
    bandwidth-bound side (large messages: fewer bytes per rank win) named. Returns a
    ``Figure``; artists' gids: ``cost:<op>:<algorithm>`` (a curve), ``crossover``.

    Models the latency/bandwidth trade-off behind NCCL's choice between its Ring and Tree
    algorithms (``NCCL_ALGO``), which ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``
    leaves to NCCL."""
    p = int(world_size)
    if p < 2:
        raise ValueError(f"collectives need at least 2 ranks, not world_size={world_size}")
    sizes = sorted(int(n) for n in (sizes if sizes is not None else default_sizes(p)))
    if not sizes:
        raise ValueError("no message sizes to evaluate")
    fig = Figure(figsize=(10, 5.5))
    ax = fig.subplots()
    styles = {"ring": "-", "tree": "--"}
    markers = {"all_reduce": ".", "broadcast": "s", "all_gather": "^", "reduce_scatter": "v"}
    for k, (op, algorithm) in enumerate(COLLECTIVES):
        results = [_seconds(cost, op, algorithm, n, p, alpha, beta) for n in sizes]
        most = max(results[-1][0], default=0) / sizes[-1]
        ax.plot(
            sizes,
            [s for _, s in results],
            styles[algorithm],
            color=PALETTE[k],
            marker=markers.get(op, "."),
            markersize=3.5,
            label=f"{op}, {algorithm} (≤ {most:.3g} n sent per rank)",
            gid=f"cost:{op}:{algorithm}",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    crossing = _crossover(cost, sizes, p, alpha, beta)
    if crossing is not None:
        ax.axvline(crossing, color="black", linestyle=":", linewidth=1.2, gid="crossover")
        small = _seconds(cost, "all_reduce", "ring", sizes[0], p, alpha, beta)[1]
        small_tree = _seconds(cost, "all_reduce", "tree", sizes[0], p, alpha, beta)[1]
        left_wins, right_wins = ("tree", "ring") if small_tree < small else ("ring", "tree")
        ax.text(
            crossing / 1.15,
            0.97,
            f"← latency-bound:\n{left_wins} all-reduce wins",
            transform=ax.get_xaxis_transform(),
            ha="right",
            va="top",
            fontsize=8,
        )
        ax.text(
            crossing * 1.15,
            0.97,
            f"bandwidth-bound: →\n{right_wins} all-reduce wins",
            transform=ax.get_xaxis_transform(),
            ha="left",
            va="top",
            fontsize=8,
        )
        where = f"ring and tree all-reduce cross at {crossing:,} bytes"
    else:
        where = "ring and tree all-reduce do not cross in this range"
    powers = [2**k for k in range(sizes[0].bit_length() - 1, sizes[-1].bit_length())]
    powers = [n for n in powers if sizes[0] / 1.5 <= n <= sizes[-1] * 1.5]
    if powers:
        every = next(  # (a stride that keeps the first and the last power, <= 9 ticks)
            (
                d
                for d in range(1, len(powers))
                if (len(powers) - 1) % d == 0 and len(powers) <= 8 * d + 1
            ),
            1,
        )
        ax.set_xticks(powers[::every], [_bytes(n) for n in powers[::every]])
    ax.set_xlabel("message size n (bytes)")
    ax.set_ylabel("time (s)")
    ax.set_title(
        f"alpha-beta model on {p} ranks (α = {alpha:g} s, β = {beta:g} s/byte): {where}",
        fontsize=9,
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    ax.grid(which="major", alpha=0.3)
    fig.tight_layout()
    return fig
