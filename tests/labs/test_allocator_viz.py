"""labs/allocator/viz.py: the pictures render headless and draw what the allocator's snapshot
and the simulated GPU's log say (one rectangle per block, in its state's colour; one point per
step of the statistics ``memory_stats()`` reports); the explorer follows its slider without a
kernel."""

import io
import re

import pytest
from matplotlib.colors import to_rgba

from labs.allocator import model, traces, viz
from labs.allocator.gpu import DeviceOutOfMemory, SimulatedGPU
from labs.allocator.snapshots import ALLOCATED, INACTIVE, PENDING_FREE, GiB, MiB

#: one block of each kind: small blocks in a split 2 MiB segment, a 5 MiB block splitting a
#: 20 MiB segment, a 30 MiB segment freed whole, and a block freed while used on stream 1
HAND = [
    ("malloc", 1, 1000, 0),
    ("malloc", 2, 3000, 0),
    ("malloc", 3, 5 * MiB, 0),
    ("malloc", 4, 30 * MiB, 0),
    ("free", 4),
    ("malloc", 5, 2 * MiB, 0),
    ("use", 5, 1),
    ("free", 5),
]
#: on a 64 MiB device: the third malloc finds no memory, the cached 20 MiB segment is freed
OOM = [
    ("malloc", 1, 30 * MiB, 0),
    ("malloc", 2, 5 * MiB, 0),
    ("free", 2),
    ("malloc", 3, 40 * MiB, 0),
]


def _render(fig):
    fig.savefig(io.BytesIO(), format="png")
    return fig


def _snapshot(trace, capacity=2 * GiB):
    alloc = model.CachingAllocatorModel(SimulatedGPU(capacity))
    traces.replay(alloc, alloc.gpu, trace)
    return alloc.snapshot()


def _blocks(fig):
    return [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("block:")]


class MinimalAllocator:
    """A learner-style allocator with only ``malloc``/``free``/``snapshot``: one segment per
    request, its snapshot with only the keys the checks require."""

    def __init__(self, gpu):
        self.gpu, self.live = gpu, {}

    def malloc(self, size, stream=0):
        nbytes = -(-size // 512) * 512
        ptr = self.gpu.cuda_malloc(nbytes)
        if ptr is None:
            raise DeviceOutOfMemory(f"no {nbytes} bytes")
        self.live[ptr] = (nbytes, stream)
        return ptr

    def free(self, ptr):
        self.live.pop(ptr)
        self.gpu.cuda_free(ptr)

    def snapshot(self):
        return [
            {
                "address": ptr,
                "total_size": n,
                "stream": s,
                "segment_type": "small" if n <= MiB else "large",
                "blocks": [{"address": ptr, "size": n, "state": ALLOCATED}],
            }
            for ptr, (n, s) in sorted(self.live.items())
        ]


# ------------------------------------------------------------------ segments_figure
def test_segments_figure_draws_each_block_in_its_state_colour():
    segments = _snapshot(HAND)
    fig = _render(viz.segments_figure(segments))
    expected = []
    for seg in segments:
        for b in seg["blocks"]:
            if b["state"] == INACTIVE:
                kind = "free, split segment" if len(seg["blocks"]) > 1 else "free, whole segment"
            else:
                kind = {ALLOCATED: "allocated", PENDING_FREE: "pending free"}
                kind = kind[b["state"]]
            expected.append((kind, b["size"] / seg["total_size"]))
    assert {k for k, _ in expected} == set(viz.COLOURS)  # the trace shows every kind
    rects = _blocks(fig)
    assert len(rects) == sum(len(s["blocks"]) for s in segments) == len(expected)
    for rect, (kind, width) in zip(rects, expected):
        assert rect.get_gid() == f"block:{kind}"
        assert rect.get_facecolor() == to_rgba(viz.COLOURS[kind])
        assert rect.get_width() == pytest.approx(width)
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [
        "0: small, 2 MiB, stream 0",
        "1: large, 20 MiB, stream 0",
        "2: large, 30 MiB, stream 0",
    ]
    sizes = [t.get_text() for t in ax.texts if t.get_gid() == "block-size"]
    assert "5 MiB" in sizes and "30 MiB" in sizes and "1 KiB" not in sizes  # too narrow
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(viz.COLOURS)


def test_segments_figure_without_segments_says_so():
    fig = _render(viz.segments_figure([]))
    assert not _blocks(fig)
    assert [t.get_text() for ax in fig.axes for t in ax.texts] == ["no segments"]


def test_segments_figure_reads_only_the_keys_learners_must_give():
    base = 0x7F0000000000
    segments = [
        {
            "address": base,
            "total_size": 2 * MiB,
            "stream": 0,
            "segment_type": "small",
            "blocks": [
                {"address": base, "size": 512, "state": ALLOCATED},
                {"address": base + 512, "size": 2 * MiB - 512, "state": INACTIVE},
            ],
        },
        {
            "address": base + 2 * MiB,
            "total_size": 80 * MiB,
            "stream": 1,
            "segment_type": "large",
            "blocks": [{"address": base + 2 * MiB, "size": 80 * MiB, "state": INACTIVE}],
        },
    ]
    fig = _render(viz.segments_figure(segments, title="mine"))
    assert [r.get_gid() for r in _blocks(fig)] == [
        "block:allocated",
        "block:free, split segment",
        "block:free, whole segment",
    ]
    assert fig.axes[0].get_title() == "mine"
    assert fig.axes[0].get_yticklabels()[1].get_text() == "1: large, 80 MiB, stream 1"


# ------------------------------------------------------------------ record
def test_record_gives_one_step_per_op_with_its_calls_and_stats():
    steps = viz.record(HAND, model.CachingAllocatorModel)
    assert [s.index for s in steps] == list(range(1, len(HAND) + 1))
    assert [s.op for s in steps] == HAND
    assert steps[2].text == "#3 = malloc(5 MiB, stream 0)" and steps[4].text == "free(#4)"
    (call,) = steps[0].calls
    assert call[:2] == ("cudaMalloc", 2 * MiB) and isinstance(steps[0].result, int)
    assert steps[1].calls == () and steps[4].result is None
    assert steps[7].calls == (("cudaEventRecord", 1),)  # freed while used on stream 1
    assert steps[-1].segments == _snapshot(HAND)
    # the statistics are the ones the model's memory_stats() reports after each op
    alloc = model.CachingAllocatorModel(SimulatedGPU(2 * GiB))
    current = []
    traces.replay(
        alloc,
        alloc.gpu,
        HAND,
        lambda i, op, r: current.append(
            {k: v for k, v in alloc.memory_stats().items() if k.endswith(".current")}
        ),
    )
    assert [s.stats for s in steps] == current


def test_record_shows_the_out_of_memory_step():
    steps = viz.record(OOM, model.CachingAllocatorModel, capacity=64 * MiB)
    assert isinstance(steps[3].result, DeviceOutOfMemory)
    assert ("cudaMalloc", 40 * MiB, None) in steps[3].calls  # the failed cudaMalloc
    assert any(c[0] == "cudaFree" and c[2] == 20 * MiB for c in steps[3].calls)  # the retry
    assert steps[3].stats["reserved_bytes.all.current"] == 30 * MiB


def test_record_runs_a_learner_allocator_with_only_malloc_free_snapshot():
    trace = [("malloc", 1, 1000, 0), ("malloc", 2, 3 * MiB, 0), ("free", 1)]
    steps = viz.record(trace, allocator=MinimalAllocator, capacity=4 * MiB)
    assert [s.stats["reserved_bytes.all.current"] for s in steps] == [
        1024,
        1024 + 3 * MiB,
        3 * MiB,
    ]
    assert steps[2].calls[0][0] == "cudaFree"
    assert len(_blocks(viz.segments_figure(steps[1].segments))) == 2
    steps = viz.record([("malloc", 1, 8 * MiB, 0)], allocator=MinimalAllocator, capacity=4 * MiB)
    assert isinstance(steps[0].result, DeviceOutOfMemory) and steps[0].segments == []


# ------------------------------------------------------------------ timeline_figure
def test_timeline_figure_plots_the_four_statistics_and_marks_calls_and_oom():
    steps = viz.record(OOM, model.CachingAllocatorModel, capacity=64 * MiB)
    fig = _render(viz.timeline_figure(steps))
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == list(viz.STATS)
    for name, line in lines.items():
        assert list(line.get_xdata()) == [1, 2, 3, 4]
        assert list(line.get_ydata()) == [s.stats[f"{name}.all.current"] / MiB for s in steps]

    def marked(gid):
        (lines,) = [c for c in ax.collections if c.get_gid() == gid]
        return [segment[0][0] for segment in lines.get_segments()]

    assert marked("cudaMalloc") == pytest.approx([0.88, 1.88])  # just left of steps 1, 2
    assert marked("cudaFree") == pytest.approx([4.12])  # just right of step 4
    assert marked("cudaMalloc failed") == [4]
    assert marked("out of memory") == [4]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [*viz.STATS, "cudaMalloc", "cudaFree", "cudaMalloc failed", "out of memory"]
    assert "MiB" in ax.get_ylabel() and "step" in ax.get_xlabel()


# ------------------------------------------------------------------ explore_trace
def test_explore_trace_follows_its_slider():
    box = viz.explore_trace(viz.record(OOM, model.CachingAllocatorModel, capacity=64 * MiB))
    slider, out = box.children
    assert (slider.min, slider.max, slider.value) == (1, len(OOM), 1)
    first = out.value
    assert "Step 1 of 4:" in first and "#1 = malloc(30 MiB, stream 0)" in first
    assert "cudaMalloc(30 MiB)" in first and "<img" in first and "out of memory" not in first
    assert re.search(r"reserved_bytes</td><td[^>]*>30\.00</td>", first)
    slider.value = 4
    assert out.value != first and "Step 4 of 4:" in out.value
    assert "out of memory" in out.value and "cudaMalloc(40 MiB) failed" in out.value
    slider.value = 1
    assert out.value == first
    with pytest.raises(ValueError, match="empty trace"):
        viz.explore_trace([])
