"""Pictures and an explorer for lab 3 (the CUDA caching allocator), each one call from a cell.

Pictures return a ``matplotlib.figure.Figure`` built without pyplot (no global figure state);
importing :mod:`grader.kernel.display` registers the PNG formatter that shows it in JupyterLab. The
explorer returns an ``ipywidgets.VBox`` whose picture lives in an ``ipywidgets.HTML`` value, so
it works, and can be tested, without a kernel.

Everything drawn is read from an allocator's ``snapshot()`` (the format of
``torch.cuda.memory._snapshot()["segments"]``, which the reference model and the learner's
allocators share) and from the runtime calls a :class:`SimulatedGPU` logged, step by step
(:class:`labs.allocator.traces.Step`): the reference model's recorded runs
(``traces.recorded(name).steps``) or a learner's allocator replaying any trace (:func:`record`):

- :func:`segments_figure`: the segments and their blocks, coloured by state;
- :func:`timeline_figure`: memory over the steps of a trace;
- :func:`explore_trace`: a slider over the steps of a trace.
"""

from __future__ import annotations

import copy
import html

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

import grader.kernel.display  # noqa: F401  (registers the PNG formatter for figures)
from grader.kernel.display import figure_html, show_cached, table
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.snapshots import ALLOCATED, PENDING_FREE, MiB, stats_from_segments
from labs.allocator.snapshots import format_bytes as fmt
from labs.allocator.traces import Step, describe, replay

#: fill colour of a block, by what it is (see :func:`block_kind`)
COLOURS = {
    "allocated": "#fc8d62",
    "pending free": "#ffd92f",
    "free, split segment": "#8da0cb",
    "free, whole segment": "#e0e0e0",
}
#: the statistics :func:`timeline_figure` draws and :func:`explore_trace` lists ("all" pool)
STATS = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes")
#: a block is labelled with its size when it spans at least this fraction of its segment's row
_LABEL_FRACTION = 0.08


# ------------------------------------------------------------------ segments and blocks
def block_kind(segment: dict, block: dict) -> str:
    """What ``block`` of ``segment`` is, a key of :data:`COLOURS`: ``"allocated"``
    (``active_allocated``), ``"pending free"`` (``active_pending_free``: freed, waiting for
    events on the streams it was used on), ``"free, split segment"`` (``inactive`` in a
    segment of several blocks: counted by ``inactive_split_bytes``) or ``"free, whole
    segment"`` (``inactive`` and alone: ``empty_cache`` can cudaFree it)."""
    if block["state"] == ALLOCATED:
        return "allocated"
    if block["state"] == PENDING_FREE:
        return "pending free"
    return "free, split segment" if len(segment["blocks"]) > 1 else "free, whole segment"


def segments_figure(segments: list[dict], title: str | None = None) -> Figure:
    """The segments of an allocator, one horizontal bar per segment, in the order given.

    ``segments``: a list in the format of ``CachingAllocatorModel.snapshot()`` and
    ``torch.cuda.memory._snapshot()["segments"]``; only the keys ``address``, ``total_size``
    (bytes), ``stream``, ``segment_type`` (``"small"``/``"large"``) and ``blocks`` (each with
    ``address``, ``size`` in bytes, ``state``) are read. Each row is labelled with the
    segment's index, pool, size and stream and scaled to its own size, so a 2 MiB small segment
    and an 80 MiB large one are both readable; each block is a rectangle as wide as its share
    of the segment, coloured by :func:`block_kind` (:data:`COLOURS`) and labelled with its size
    when wide enough. ``title`` defaults to the totals. An empty list gives a figure that says
    "no segments". Returns a ``Figure``.

    Draws what ``torch/cuda/_memory_viz.py: segment_plot`` (and the text of ``segsum``) shows
    of a snapshot taken by ``c10/cuda/CUDACachingAllocator.cpp:
    DeviceCachingAllocator::snapshot``."""
    fig = Figure(figsize=(10, 0.55 * max(len(segments), 1) + 1.6))
    ax = fig.subplots()
    if not segments:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no segments", ha="center", va="center", fontsize=11, gid="empty")
        ax.set_title(title or "no segments", fontsize=10)
        return fig
    for row, seg in enumerate(segments):
        start, total = seg["address"], seg["total_size"]
        for block in seg["blocks"]:
            left, width = (block["address"] - start) / total, block["size"] / total
            kind = block_kind(seg, block)
            ax.add_patch(
                Rectangle(
                    (left, row - 0.35),
                    width,
                    0.7,
                    facecolor=COLOURS[kind],
                    edgecolor="#555555",
                    linewidth=0.6,
                    gid=f"block:{kind}",
                )
            )
            if width >= _LABEL_FRACTION:
                ax.text(
                    left + width / 2,
                    row,
                    fmt(block["size"]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    gid="block-size",
                )
    ax.set_xlim(0, 1)
    ax.set_ylim(len(segments) - 0.5, -0.5)  # segment 0 on top
    ax.set_yticks(
        range(len(segments)),
        [
            f"{i}: {s['segment_type']}, {fmt(s['total_size'])}, stream {s['stream']}"
            for i, s in enumerate(segments)
        ],
        fontsize=8,
    )
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1], ["0", "25%", "50%", "75%", "100%"], fontsize=8)
    ax.set_xlabel("offset in the segment (each row scaled to its own size)", fontsize=9)
    if title is None:
        blocks = [b for s in segments for b in s["blocks"]]
        reserved = sum(s["total_size"] for s in segments)
        allocated = sum(b["size"] for b in blocks if b["state"] == ALLOCATED)
        title = (
            f"{len(segments)} segment{'s' * (len(segments) != 1)}: {fmt(reserved)} reserved, "
            f"{fmt(allocated)} allocated"
        )
    ax.set_title(title, fontsize=10)
    ax.legend(
        handles=[Patch(facecolor=c, edgecolor="#555555", label=k) for k, c in COLOURS.items()],
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize=8,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ a trace, step by step
def record(trace: list[tuple], allocator, *, capacity: int = 2 * 1024**3, **config) -> list[Step]:
    """Replay ``trace`` (``traces.replay``'s format) on a fresh ``SimulatedGPU(capacity)``
    (``capacity`` in bytes) through ``allocator(gpu, **config)``, and return one :class:`Step`
    per op, in order, ``steps[k - 1].index == k``.

    ``allocator``: an allocator class, such as one of yours: it needs ``malloc``, ``free`` and
    ``snapshot`` (and ``record_stream`` / ``empty_cache`` when the trace uses them); ``config``
    its options (e.g. ``max_split_size``). The reference model's steps on the notebook's traces
    are recorded: ``traces.recorded(name).steps``."""
    gpu = SimulatedGPU(capacity)
    alloc = allocator(gpu, **config)
    steps: list[Step] = []
    seen = [0]  # gpu.log entries before the op

    def after_step(i, op, result):
        segments = copy.deepcopy(alloc.snapshot())
        calls = tuple(gpu.log[seen[0] :])
        seen[0] = len(gpu.log)
        steps.append(
            Step(i + 1, op, describe(op), result, segments, stats_from_segments(segments), calls)
        )

    replay(alloc, gpu, trace, after_step)
    return steps


def timeline_figure(history: list[Step], title: str | None = None) -> Figure:
    """Memory over the steps of a trace (:class:`Step` s): ``allocated_bytes``,
    ``reserved_bytes``, ``active_bytes`` and ``inactive_split_bytes`` of the "all" pool (MiB)
    after each step (x: the step's number, from 1), with vertical lines at the steps that
    cudaMalloc'ed (green, dashed, just left of the step), cudaFree'd (purple, dotted, just
    right of it) or failed a cudaMalloc (orange, dash-dotted, on it) a segment, and red ones at
    the steps whose malloc ran out of memory. Returns a ``Figure``.

    The statistics are those of ``torch.cuda.memory_stats()``
    (``c10/cuda/CUDACachingAllocator.cpp: DeviceCachingAllocator::getStats``)."""
    fig = Figure(figsize=(10, 4))
    ax = fig.subplots()
    xs = [s.index for s in history]
    colours = ("#fc8d62", "#4d4d4d", "#66c2a5", "#8da0cb")
    for name, colour, width in zip(STATS, colours, (3, 1.5, 1.5, 1.5)):  # allocated <= active
        ys = [s.stats[f"{name}.all.current"] / MiB for s in history]
        ax.plot(xs, ys, color=colour, marker=".", linewidth=width, label=name)

    def made(call: str, failed: bool = False, shift: float = 0.0) -> list[float]:
        # a failed cudaMalloc is logged with ptr None; shifts keep one step's lines apart
        return [
            s.index + shift
            for s in history
            if any(c[0] == call and (None in c) == failed for c in s.calls)
        ]

    oom = [s.index for s in history if isinstance(s.result, DeviceOutOfMemory)]
    for label, at, colour, style, width in (
        ("cudaMalloc", made("cudaMalloc", shift=-0.12), "#1a9641", "--", 1),
        ("cudaFree", made("cudaFree", shift=0.12), "#7b3294", ":", 1.5),
        ("cudaMalloc failed", made("cudaMalloc", failed=True), "#f28e2b", "-.", 1.5),
        ("out of memory", oom, "#d7191c", "-", 2.5),
    ):
        if at:
            ax.vlines(
                at,
                0,
                1,
                transform=ax.get_xaxis_transform(),
                colors=colour,
                linestyles=style,
                linewidth=width,
                label=label,
                gid=label,
            )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0.5, max(len(history), 1) + 0.5)
    ax.set_xlabel("step (op of the trace)")
    ax.set_ylabel("MiB (all pools)")
    ax.set_title(title or f"memory over {len(history)} steps", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ explorer
def _call_text(call: tuple) -> str:
    if call[0] == "cudaMalloc":
        return f"cudaMalloc({fmt(call[1])})" + (" failed" if call[2] is None else "")
    return f"cudaFree({fmt(call[2])} segment at {call[1]:#x})"


def _step_html(step: Step, n: int) -> str:
    rows = [[name, f"{step.stats[f'{name}.all.current'] / MiB:.2f}"] for name in STATS]
    runtime = [_call_text(c) for c in step.calls if c[0] in ("cudaMalloc", "cudaFree")]
    parts = [
        f"<p><b>Step {step.index} of {n}:</b> <code>{html.escape(step.text)}</code></p>",
        "<p>" + html.escape(", ".join(runtime) or "no cudaMalloc or cudaFree") + "</p>",
    ]
    if isinstance(step.result, DeviceOutOfMemory):
        parts.append(f"<p><b>out of memory</b>: {html.escape(str(step.result))}</p>")
    parts.append(table(rows, ["statistic (all pools)", "MiB"])._repr_html_())
    parts.append(figure_html(segments_figure(step.segments)))
    return "".join(parts)


def explore_trace(steps: list[Step]):
    """An explorer: a slider over ``steps`` (:class:`Step` s of one trace, from
    ``traces.recorded(name).steps`` or :func:`record`), showing for the chosen step the op
    ("Step k of n: ..."), the cudaMalloc and cudaFree calls it made (or "out of memory" when its
    malloc raised), the statistics of :data:`STATS` in MiB and :func:`segments_figure` of the
    segments after it, drawn when the slider is let go (under a busy sign the first time:
    :func:`grader.kernel.display.show_cached`). Returns an ``ipywidgets.VBox``:
    ``children[0]`` is the ``IntSlider`` (1 to the number of steps), ``children[1]`` the
    ``ipywidgets.HTML`` shown. Raises ValueError for no steps."""
    import ipywidgets as widgets

    if not steps:
        raise ValueError("an empty trace has no steps to explore")
    slider = widgets.IntSlider(
        value=1, min=1, max=len(steps), description="step", continuous_update=False
    )  # (drawn when let go, not per tick)
    picture, cache = widgets.HTML(), {}

    def show(change=None):
        i = slider.value
        show_cached(
            picture,
            cache,
            i,
            lambda: _step_html(steps[i - 1], len(steps)),
            f"drawing step {i}",
            [slider],
        )

    slider.observe(show, names="value")
    show()
    return widgets.VBox([slider, picture])
