"""labs/distributed/viz.py: the ring schedule is a correct all-reduce and its picture draws one
box per chunk per rank per state and one arrow per rank per step; the explorer follows its
slider without a kernel; record_ddp_iterations, run on two real ranks, sees DDP's single first
bucket and its rebuilt buckets, and the timeline draws one bar per bucket; placement_blocks
agrees with what ``distribute_tensor`` leaves on each rank of a real mesh; the cost curves plot
what the cost model returns and mark where ring and tree all-reduce cross."""

import itertools
import math
import re

import pytest
import torch
import torch._dynamo  # (distribute_tensor's first call imports it: once here, not per rank)
import torch.distributed as dist
import torch.nn.parallel  # (imported before the ranks fork, not in each)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from labs.distributed import launch, viz
from tests.labs._figures import by_gid as _gid
from tests.labs._figures import render as _render


def _exactly(artists, gid):
    return [a for a in artists if a.get_gid() == gid]


# ------------------------------------------------------------------ ring_schedule
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_ring_schedule_is_a_correct_all_reduce(p):
    states = viz.ring_schedule(p)
    assert len(states) == 2 * p - 1
    assert [(s["phase"], s["step"]) for s in states] == [
        ("initial", 0),
        *[("reduce-scatter", k) for k in range(1, p)],
        *[("all-gather", k) for k in range(1, p)],
    ]
    assert states[0]["chunks"] == [[{r}] * p for r in range(p)] and not states[0]["sends"]
    sent = [0] * p
    for before, state in itertools.pairwise(states):
        assert sorted(src for src, _, _ in state["sends"]) == list(range(p))  # one each
        for src, dst, c in state["sends"]:
            assert dst == (src + 1) % p
            sent[src] += 1
            if state["phase"] == "reduce-scatter":
                assert not before["chunks"][src][c] & before["chunks"][dst][c]  # no double sum
                assert (
                    state["chunks"][dst][c] == before["chunks"][src][c] | before["chunks"][dst][c]
                )
            else:
                assert before["chunks"][src][c] == set(range(p))  # only complete chunks travel
                assert state["chunks"][dst][c] == set(range(p))
        changed = {
            (r, c)
            for r in range(p)
            for c in range(p)
            if state["chunks"][r][c] != before["chunks"][r][c]
        }
        assert changed <= {(dst, c) for _, dst, c in state["sends"]}
    assert sent == [2 * (p - 1)] * p
    after_rs = states[p - 1]["chunks"]
    assert all(after_rs[r][(r + 1) % p] == set(range(p)) for r in range(p))
    assert all(ch == set(range(p)) for row in states[-1]["chunks"] for ch in row)
    with pytest.raises(ValueError, match="at least 2"):
        viz.ring_schedule(1)


# ------------------------------------------------------------------ ring_allreduce
@pytest.mark.parametrize("p", [3, 4])
def test_ring_allreduce_draws_every_chunk_and_one_arrow_per_rank_per_step(p):
    states = viz.ring_schedule(p)
    fig = _render(viz.ring_allreduce(p))
    (ax,) = fig.axes
    boxes = _gid(ax.patches, "chunk:")
    assert len(boxes) == len(states) * p * p
    expected = [len(ch) for s in states for row in s["chunks"] for ch in row]
    assert [int(b.get_gid().split(":")[1]) for b in boxes] == expected
    last = boxes[-p * p :]
    assert {b.get_facecolor()[:3] for b in last} == {
        tuple(int(viz.COMPLETE_COLOUR[i : i + 2], 16) / 255 for i in (1, 3, 5))
    }
    for k in range(len(states)):
        assert len(_exactly(ax.patches, f"send:{k}")) == (0 if k == 0 else p)
    labels = [t.get_text() for t in _gid(ax.texts, "chunk-label")]
    assert len(labels) == len(boxes) and labels[-p * p :] == ["Σ"] * (p * p)
    assert p <= viz.SHORT_LABELS  # the boxes name the contributing ranks
    assert "0+1" in labels and f"{p - 1}+0" in labels  # contributors in ring order
    assert ("0+1+2" in labels) == (p > 3)
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows[0] == "initial" and rows[1] == f"reduce-scatter 1/{p - 1}"
    assert rows[-1] == f"all-gather {p - 1}/{p - 1}"
    assert [t.get_text() for t in _gid(ax.texts, "rank")] == [f"rank {r}" for r in range(p)]


def test_ring_allreduce_refuses_a_ring_too_big_to_read():
    with pytest.raises(ValueError, match="ring_explorer"):
        viz.ring_allreduce(viz.MAX_RING_FIGURE + 1)


# ------------------------------------------------------------------ ring_explorer
def test_ring_explorer_follows_its_slider():
    box = viz.ring_explorer(4)
    slider, out = box.children
    assert (slider.min, slider.max, slider.value) == (0, 6, 0)
    first = out.value
    assert "initial" in first and "State 0 of 6" in first and "sent 0 chunks so far" in first
    assert len(re.findall(r'<td class="chunk"', first)) == 16 and "→" not in first
    assert "outline" not in first
    slider.value = 3
    third = out.value
    assert "reduce-scatter step 3 of 3" in third and "sent 3 chunks so far" in third
    table = third.split("</table>")[0]
    assert table.count("→") == 4 and table.count("←") == 4  # one sent, one received each
    assert third.count(f"3px solid {viz.SEND_COLOUR}") == 4  # received, solid as in the figure
    assert third.count(f"2px dashed {viz.SEND_COLOUR}") == 4  # sent
    assert "solid" in third.split("</table>")[1] and "received this step" in third
    assert "2+3+0 → 1" in third and "Σ ← 3" in third  # rank 0 sends chunk 2, receives chunk 1
    assert re.search(r"<th>rank 0</th>.*?<td>3</td></tr>", third)
    slider.value = 6
    assert "all-gather step 3 of 3" in out.value and "sent 6 chunks so far" in out.value
    assert out.value.count(">Σ") == 16
    slider.value = 0
    assert out.value == first


# ------------------------------------------------------------------ DDP
LAYERS = 4


def _ddp_ranks():
    """On each rank: a 4-layer MLP of 256x256 layers in DDP (0.25 MB buckets: one layer per
    rebuilt bucket), two iterations recorded."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(LAYERS)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    x = torch.randn(16, 256) + dist.get_rank()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        return ddp(x).square().mean()

    records = viz.record_ddp_iterations(ddp, step, iterations=2)
    try:  # a second call would register a second comm hook
        viz.record_ddp_iterations(ddp, step, iterations=1)
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    step().backward()  # the hook left behind still averages, recording nothing
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    names = [n for n, _ in model.named_parameters()]
    return {"records": records, "grads": grads, "names": names, "refused": refused}


@pytest.fixture(scope="module")
def ddp_run():
    return launch.run(_ddp_ranks, 2, timeout=60)


def test_record_ddp_iterations_sees_one_bucket_then_the_rebuilt_ones(ddp_run):
    for rank in ddp_run:
        names = rank["names"]
        first, second = rank["records"]
        assert (first["iteration"], second["iteration"]) == (1, 2)
        for rec in (first, second):
            start, end = rec["backward"]
            assert start == 0.0 and end > 0
            assert sorted(n for n, _ in rec["grads"]) == sorted(names)  # each grad once
            assert [n for n, _ in rec["grads"]][:2] == [
                f"{LAYERS - 1}.bias",
                f"{LAYERS - 1}.weight",
            ]
            ready = dict(rec["grads"])
            assert [b["index"] for b in rec["buckets"]] == list(range(len(rec["buckets"])))
            params = [n for b in rec["buckets"] for n in b["params"]]
            assert sorted(params) == sorted(names)  # each parameter in exactly one bucket
            for b in rec["buckets"]:
                assert b["start"] >= max(ready[n] for n in b["params"])
                assert b["start"] <= b["end"] <= end
                sizes = [256 * 256 * 4 if n.endswith("weight") else 256 * 4 for n in b["params"]]
                assert b["nbytes"] == sum(sizes)
        (only,) = first["buckets"]  # iteration 1: all parameters in one bucket
        assert sorted(only["params"]) == sorted(names)
        assert len(second["buckets"]) == LAYERS  # rebuilt: one layer per 0.25 MB bucket
        assert second["buckets"][0]["params"] == [f"{LAYERS - 1}.bias", f"{LAYERS - 1}.weight"]
        # the first rebuilt bucket starts before backward has finished the other layers
        assert second["buckets"][0]["start"] < max(t for _, t in second["grads"])
    # the hook averaged the gradients as DDP's default does: every rank holds the same ones
    g0, g1 = (r["grads"] for r in ddp_run)
    assert all(torch.equal(g0[n], g1[n]) for n in g0)


def test_record_ddp_iterations_refuses_a_second_comm_hook(ddp_run):
    for rank in ddp_run:
        assert rank["refused"] and "new DistributedDataParallel" in rank["refused"]
        assert len(rank["records"]) == 2


def test_ddp_timeline_draws_one_panel_per_iteration_and_one_bar_per_bucket(ddp_run):
    records = ddp_run[0]["records"]
    fig = _render(viz.ddp_timeline(records))
    axes = [ax for ax in fig.axes if _gid(ax.patches, "backward")]
    assert len(axes) == len(records) == 2
    for ax, rec in zip(axes, records):
        bars = _gid(ax.patches, "bucket:")
        assert len(bars) == len(rec["buckets"])
        for bar, b in zip(bars, rec["buckets"]):
            assert bar.get_gid() == f"bucket:{b['index']}"
            assert bar.get_x() == pytest.approx(b["start"] * 1e3)
            assert bar.get_x() + bar.get_width() == pytest.approx(b["end"] * 1e3, abs=1e-3)
        ticks = _gid(ax.lines, "grad:")
        assert len(ticks) == len(rec["grads"])
        bucket_of = {n: b["index"] for b in rec["buckets"] for n in b["params"]}
        for tick, (name, t) in zip(ticks, rec["grads"]):
            assert tick.get_gid() == f"grad:{bucket_of[name]}"
            assert list(tick.get_xdata()) == pytest.approx([t * 1e3, t * 1e3])
        same = [t.get_facecolor() for t in bars]
        assert len(set(same)) == len(bars)  # a colour per bucket
        labels = [t.get_text() for t in _gid(ax.texts, "bucket-label")]
        assert labels[0].startswith("bucket 0 (") and "KiB)" in labels[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == [
            "backward",
            "gradient ready",
            "communication",
        ]
        names = ",".join(t.get_text() for t in _gid(ax.texts, "grad-name")).split(",")
        assert names == [n[: n.index(".") + 2] for n, _ in rec["grads"]]  # 3.weight: 3.w
        assert names[:2] == [f"{LAYERS - 1}.b", f"{LAYERS - 1}.w"]
    assert "iteration 1: 1 bucket" in axes[0].get_title()
    assert f"iteration 2: {LAYERS} buckets" in axes[1].get_title()
    assert "reverse order" in fig._suptitle.get_text()
    assert _gid(_render(viz.ddp_timeline([])).axes[0].texts, "empty")


# ------------------------------------------------------------------ placements
CASES = [
    ((8, 12), (4,), [Shard(0)]),
    ((8, 12), (4,), [Shard(1)]),
    ((8, 12), (4,), [Replicate()]),
    ((8, 12), (2, 2), [Shard(0), Shard(1)]),
    ((8, 12), (2, 2), [Shard(1), Shard(0)]),
    ((8, 12), (2, 2), [Shard(0), Shard(0)]),
    ((8, 12), (2, 2), [Replicate(), Shard(1)]),
    ((8, 12), (2, 2), [Shard(-1), Replicate()]),
    ((6, 10), (4,), [Shard(0)]),  # uneven: torch.chunk gives 2, 2, 2 rows and an empty shard
]


def _local_shards(cases):
    out, meshes = [], {}
    for shape, mesh_shape, placements in cases:
        if mesh_shape not in meshes:
            meshes[mesh_shape] = init_device_mesh("cpu", mesh_shape)
        mesh = meshes[mesh_shape]
        full = torch.arange(math.prod(shape)).reshape(shape).float()
        out.append(distribute_tensor(full, mesh, placements).to_local().clone())
    return out


def test_placement_blocks_match_what_distribute_tensor_leaves_on_each_rank():
    by_rank = launch.run(_local_shards, 4, CASES, timeout=60)
    for k, (shape, mesh_shape, placements) in enumerate(CASES):
        blocks = viz.placement_blocks(shape, mesh_shape, placements)
        assert sorted(blocks) == [0, 1, 2, 3]
        full = torch.arange(math.prod(shape)).reshape(shape).float()
        for rank, (rows, cols) in blocks.items():
            local = by_rank[rank][k]
            assert torch.equal(local, full[rows, cols]), (shape, mesh_shape, placements, rank)


def test_placement_blocks_by_hand():
    blocks = viz.placement_blocks((8, 12), (2, 2), [Shard(0), Shard(1)])
    assert blocks[3] == (slice(4, 8), slice(6, 12))
    blocks = viz.placement_blocks((8, 12), (2, 2), [Shard(0), Partial()])
    assert blocks[1] == blocks[0] == (slice(0, 4), slice(0, 12))
    assert viz.placement_blocks((6, 10), (4,), [Shard(0)])[3] == (slice(6, 6), slice(0, 10))
    with pytest.raises(ValueError, match="one per mesh dim"):
        viz.placement_blocks((8, 12), (2, 2), [Shard(0)])
    with pytest.raises(ValueError, match="dims 0 and 1"):
        viz.placement_blocks((8, 12), (4,), [Shard(2)])
    with pytest.raises(ValueError, match="2-D tensor"):
        viz.placement_blocks((8, 12, 3), (4,), [Shard(0)])


@pytest.mark.parametrize(
    "mesh_shape, placements",
    [((4,), [Shard(1)]), ((2, 2), [Shard(0), Shard(1)]), ((2, 2), [Shard(0), Partial()])],
)
def test_placement_map_draws_one_panel_per_rank_with_its_block(mesh_shape, placements):
    shape = (8, 12)
    fig = _render(viz.placement_map(shape, mesh_shape, placements))
    blocks = viz.placement_blocks(shape, mesh_shape, placements)
    panels = [ax for ax in fig.axes if (ax.get_gid() or "").startswith("rank:")]
    assert [ax.get_gid() for ax in panels] == [f"rank:{r}" for r in range(4)]
    partial = any(isinstance(p, Partial) for p in placements)
    for ax, (rows, cols) in zip(panels, blocks.values()):
        (block,) = _gid(ax.patches, "block")
        assert block.get_gid() == ("block:partial" if partial else "block")
        assert (block.get_x(), block.get_y()) == (cols.start, rows.start)
        assert (block.get_width(), block.get_height()) == (
            cols.stop - cols.start,
            rows.stop - rows.start,
        )
        assert bool(block.get_hatch()) == partial
        assert ("partial sum" in ax.get_title()) == partial
        assert f"local {rows.stop - rows.start}×{cols.stop - cols.start}" in ax.get_title()
    if len(mesh_shape) == 2:  # laid out as the mesh: rank 1 right of rank 0, rank 2 below
        boxes = [ax.get_position() for ax in panels]
        assert boxes[1].x0 > boxes[0].x0 and boxes[2].y0 < boxes[0].y0


# ------------------------------------------------------------------ cost_curves
def alpha_beta(op, algorithm, nbytes, p, alpha, beta):
    """A correct alpha-beta model (n bytes, p ranks)."""
    log = math.ceil(math.log2(p))
    if (op, algorithm) == ("all_reduce", "ring"):
        return [2 * (p - 1) * nbytes // p] * p, 2 * (p - 1) * (alpha + nbytes * beta / p)
    if op in ("all_gather", "reduce_scatter"):
        return [(p - 1) * nbytes // p] * p, (p - 1) * (alpha + nbytes * beta / p)
    if (op, algorithm) == ("broadcast", "ring"):
        return [nbytes] * (p - 1) + [0], (p - 1) * (alpha + nbytes * beta)
    if (op, algorithm) == ("broadcast", "tree"):
        return [2 * nbytes] * (p // 2) + [0] * (p - p // 2), log * (alpha + nbytes * beta)
    if (op, algorithm) == ("all_reduce", "tree"):
        return [4 * nbytes] * p, 2 * log * (alpha + nbytes * beta)
    raise ValueError((op, algorithm))


def test_cost_curves_plot_the_model_and_mark_the_crossover():
    p, alpha, beta = 8, 1e-5, 1e-9
    fig = _render(viz.cost_curves(alpha_beta, p, alpha, beta))
    (ax,) = fig.axes
    sizes = viz.default_sizes(p)
    assert sizes[0] == 1024 and sizes[-1] == 2**30 and all(n % (4 * p) == 0 for n in sizes)
    assert len(sizes) == 21
    curves = _gid(ax.lines, "cost:")
    assert [c.get_gid() for c in curves] == [f"cost:{op}:{a}" for op, a in viz.COLLECTIVES]
    for curve, (op, a) in zip(curves, viz.COLLECTIVES):
        assert list(curve.get_xdata()) == sizes
        assert list(curve.get_ydata()) == [alpha_beta(op, a, n, p, alpha, beta)[1] for n in sizes]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    (cross,) = _gid(ax.lines, "crossover")
    # ring = tree: 2(p-1)(a + n b / p) = 2 L (a + n b), L = log2 p = 3
    # => n = (p - 1 - L) a / (b (L - (p - 1) / p))
    exact = (p - 1 - 3) * alpha / (beta * (3 - (p - 1) / p))
    x = cross.get_xdata()[0]
    assert x % (4 * p) == 0 and exact <= x < exact + 4 * p
    assert f"{x:,}" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0] == "all_reduce, ring (≤ 1.75 n sent per rank)"
    assert legend[3] == "broadcast, tree (≤ 2 n sent per rank)"
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "latency-bound" in texts and "tree all-reduce wins" in texts
    assert "bandwidth-bound" in texts and "ring all-reduce wins" in texts


def test_cost_curves_without_a_crossover_and_with_a_broken_model():
    fig = _render(viz.cost_curves(alpha_beta, 2, 1e-5, 1e-9, sizes=[64, 4096, 2**20]))
    (ax,) = fig.axes
    assert not _gid(ax.lines, "crossover") and "do not cross" in ax.get_title()
    assert list(_gid(ax.lines, "cost:")[0].get_xdata()) == [64, 4096, 2**20]
    with pytest.raises(TypeError, match="bytes_sent_per_rank"):
        viz.cost_curves(lambda *args: 1.0, 4, 1e-5, 1e-9)
