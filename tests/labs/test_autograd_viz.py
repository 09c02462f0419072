"""labs/autograd/viz.py: the pictures render headless and show what torch does (the engine's
execution order recorded by pre-hooks, saved bytes measured by pack hooks); the explorers react
to their controls without a kernel."""

import io
import random

import matplotlib
import pytest
import torch

from labs.autograd import viz


def _recorded_order(output):
    """The Nodes in the order torch's engine runs them, recorded by Node pre-hooks (written here
    independently of viz.record_execution)."""
    order, handles, seen, stack = [], [], {output.grad_fn}, [output.grad_fn]
    while stack:
        node = stack.pop()
        handles.append(node.register_prehook(lambda grads, node=node: order.append(node)))
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    output.backward()
    for handle in handles:
        handle.remove()
    return order


def _two_branches():
    x1, x2 = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    loss = (x1.sin() * x1 + x2.cos().exp()).sum()
    return loss, {"x1": x1, "x2": x2}


def _stack_of_leaves(n=8):
    leaves = [torch.randn(2, requires_grad=True) for _ in range(n)]
    return torch.stack(leaves).sum(), leaves


def _random_dag(seed):
    rng = random.Random(seed)
    values = [torch.randn(3, requires_grad=True) for _ in range(rng.randint(2, 7))]
    for _ in range(rng.randint(3, 12)):
        args = rng.sample(values, rng.randint(2, min(4, len(values))))
        op = rng.choice(
            [
                lambda a: torch.stack(a).sin().sum(0),
                lambda a: a[0] * a[-1],
                lambda a: a[0].exp() + a[1] - a[-1],
            ]
        )
        values.append(op(args))
    return values[-1].sum() + values[-2].mean()


def _graph_nodes(output):
    seen, stack = {output.grad_fn}, [output.grad_fn]
    while stack:
        for nxt, _ in stack.pop().next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _texts(fig, gid_prefix):
    return [t for ax in fig.axes for t in ax.texts if (t.get_gid() or "").startswith(gid_prefix)]


def _renders(fig):
    assert isinstance(fig, matplotlib.figure.Figure)
    fig.savefig(io.BytesIO(), format="png")


# ------------------------------------------------------------------ the ready queue
@pytest.mark.parametrize("build", ["two-branches", "stack", *[f"dag{s}" for s in range(12)]])
def test_simulated_order_is_the_engines(build):
    if build == "two-branches":
        loss, _ = _two_branches()
    elif build == "stack":
        loss, leaves = _stack_of_leaves()
    else:
        loss = _random_dag(int(build[3:]))
    steps = viz.backward_steps(loss)
    assert [s.node for s in steps] == _recorded_order(loss)
    if build == "stack":  # ties among AccumulateGrads: not first-in-first-out, as in std::heap
        accumulate = [s.node.variable for s in steps[2:]]
        assert [id(t) for t in accumulate] != [id(t) for t in leaves]


def test_record_execution_matches_independent_recorder():
    loss, _ = _two_branches()
    expected = [s.node for s in viz.backward_steps(loss)]
    assert viz.record_execution(loss) == expected


def test_steps_count_dependencies_like_the_engine():
    loss, leaves = _two_branches()
    steps = viz.backward_steps(loss)
    nodes = _graph_nodes(loss)
    assert {s.node for s in steps} == nodes and len(steps) == len(nodes)
    edges = {n: 0 for n in nodes}
    for n in nodes:
        for nxt, _ in n.next_functions:
            if nxt is not None:
                edges[nxt] += 1
    acc_x1 = next(n for n in nodes if getattr(n, "variable", None) is leaves["x1"])
    assert edges[acc_x1] == 2  # x1 feeds sin and *
    ran = set()
    for k, step in enumerate(steps):
        assert step.done == frozenset(ran)
        ran.add(step.node)
        for n in nodes:  # unmet dependencies = edges from Nodes that have not run yet
            unmet = sum(1 for p in nodes - ran for nxt, _ in p.next_functions if nxt is n)
            assert step.remaining[n] == unmet, (k, n.name())
        if k + 1 < len(steps):
            assert step.queue[0] is steps[k + 1].node
        assert set(step.queue) == {
            n for n in nodes - ran if step.remaining[n] == 0 and n is not loss.grad_fn
        }
    assert steps[-1].queue == ()


def test_steps_are_numbered_from_one():
    loss, _ = _two_branches()
    steps = viz.backward_steps(loss)
    assert [s.index for s in steps] == list(range(1, len(steps) + 1))


def test_ready_queue_figure_shows_the_step():
    loss, leaves = _two_branches()
    steps = viz.backward_steps(loss)
    k = 4  # the 5th step (step=5 in the picture's numbering)
    fig = viz.ready_queue_figure(loss, k + 1, leaves=leaves)
    _renders(fig)
    assert fig.axes[0].get_title().startswith(f"step {k + 1} of {len(steps)}: ran ")
    boxes = _texts(fig, "node:")
    names = sorted(t.get_text().split("\n")[0].split(" (")[0] for t in boxes)
    assert names == sorted(n.name().replace("torch::autograd::", "") for n in _graph_nodes(loss))
    labels = {t.get_text().split("\n")[0]: t for t in boxes}
    assert "AccumulateGrad (x1)" in labels and "AccumulateGrad (x2)" in labels
    running = [t for t in boxes if t.get_gid() == "node:running"]
    assert len(running) == 1
    assert running[0].get_text().startswith(viz.node_label(steps[k].node))
    assert len([t for t in boxes if t.get_gid() == "node:done"]) == k
    assert (
        labels["AccumulateGrad (x1)"]
        .get_text()
        .endswith(f"deps {steps[k].remaining[steps[-1].node]}")
    )
    queue = [t.get_text() for t in _texts(fig, "queue")]
    assert [q.split(". ", 1)[1].split("  seq")[0] for q in queue] == [
        viz.node_label(n, leaves) for n in steps[k].queue
    ]
    assert queue and queue[0].split(". ", 1)[1].startswith(
        viz.node_label(steps[k + 1].node, leaves)
    )


def test_ready_queue_figure_step_numbers_match_the_title():
    """``step=k`` draws "step k of n" with the k-th Node running, 1 <= k <= n; -1 is the last."""
    loss, leaves = _two_branches()
    steps = viz.backward_steps(loss)
    n = len(steps)
    for k, expected in [(1, 1), (5, 5), (n, n), (-1, n), (-n, 1)]:
        fig = viz.ready_queue_figure(loss, k, leaves=leaves, steps=steps)
        node = steps[expected - 1].node
        assert fig.axes[0].get_title() == (
            f"step {expected} of {n}: ran {viz.node_label(node, leaves)}"
        )
        (running,) = [t for t in _texts(fig, "node:running")]
        assert running.get_text().startswith(viz.node_label(node, leaves))


def test_notebook_step_five_is_cos_backward():
    """The notebook draws ``step=5`` and its text says step 5, just after CosBackward0 ran."""
    x1, x2 = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    a1, a2 = x1.sin(), x2.cos()
    loss = (a1 * x1 + a2.exp()).sum()
    fig = viz.ready_queue_figure(loss, step=5, leaves={"x1": x1, "x2": x2})
    assert fig.axes[0].get_title() == "step 5 of 8: ran CosBackward0"


def _edges_cross_boxes(fig):
    """(edge, box label) pairs where a drawn edge passes through a box other than its ends."""
    fig.draw_without_rendering()
    ax = fig.axes[0]
    boxes = [(t.get_text(), t.get_bbox_patch().get_window_extent()) for t in _texts(fig, "node:")]
    crossings = []
    for i, edge in enumerate(t for t in ax.texts if t.get_gid() == "edge"):
        patch = edge.arrow_patch
        path = patch.get_transform().transform_path(patch.get_path())
        points = [pt for poly in path.to_polygons(closed_only=False) for pt in poly]

        def nearest(pt):
            return min(
                boxes,
                key=lambda b: (
                    (b[1].x0 + b[1].x1 - 2 * pt[0]) ** 2 + (b[1].y0 + b[1].y1 - 2 * pt[1]) ** 2
                ),
            )[0]

        ends = {nearest(points[0]), nearest(points[-1])}
        for label, box in boxes:
            if label not in ends and any(box.contains(x, y) for x, y in points):
                crossings.append((i, label.split("\n")[0]))
    return crossings


@pytest.mark.parametrize("graph", ["two-branches", "explorer", "stack"])
def test_ready_queue_edges_go_around_the_boxes(graph):
    """No edge runs through a box it does not connect (the explorer's graph had its
    MulBackward0 -> MulBackward0 edge through SinBackward0)."""
    x1, w1 = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    if graph == "two-branches":
        loss, leaves = _two_branches()
    elif graph == "explorer":
        hid = x1 * w1
        loss, leaves = (hid.sin() * hid + x1).sum(), {"x1": x1, "w1": w1}
    else:
        loss, leaves = _stack_of_leaves(4)[0], None
    fig = viz.ready_queue_figure(loss, 2, leaves=leaves)
    assert _edges_cross_boxes(fig) == []
    edges = [t for t in fig.axes[0].texts if t.get_gid() == "edge"]
    assert all(e.get_zorder() < t.get_zorder() for e in edges for t in _texts(fig, "node:"))


def test_ready_queue_figure_errors():
    loss, _ = _two_branches()
    n = len(viz.backward_steps(loss))
    for bad in (0, n + 1, -n - 1, 99):
        with pytest.raises(IndexError, match="numbered 1 to"):
            viz.ready_queue_figure(loss, bad)
    with pytest.raises(ValueError, match="grad_fn"):
        viz.backward_steps(torch.randn(3))


# ------------------------------------------------------------------ checkpointing
N, WIDTH, BATCH = 4, 32, 8


@pytest.fixture(scope="module")
def small():
    return viz.mlp_blocks(N, WIDTH), torch.randn(BATCH, WIDTH)


def test_measure_checkpointing_counts_what_autograd_keeps(small):
    blocks, x = small
    act = BATCH * WIDTH * 4  # one float32 activation
    plain = viz.measure_checkpointing(blocks, x)
    # each Linear and each GELU saves its input: 4 distinct activations per block
    assert plain == {
        "saved_bytes": 4 * N * act,
        "per_block_bytes": [4 * act] * N,
        "forward_runs": N,
    }
    every = viz.measure_checkpointing(blocks, x, range(N))
    assert every == {"saved_bytes": N * act, "per_block_bytes": [act] * N, "forward_runs": 2 * N}
    assert all(p.grad is None for b in blocks for p in b.parameters())


def test_checkpoint_memory_figure_bars_are_measured(small):
    blocks, x = small
    fig = viz.checkpoint_memory_figure(blocks, x)
    _renders(fig)
    mem, runs = fig.axes
    heights = [p.get_height() for p in mem.patches if p.get_gid() == "saved"]
    measured = [
        viz.measure_checkpointing(blocks, x, c, reentrant=r) for _, c, r in viz.checkpoint_modes(N)
    ]
    assert [h * 2**10 for h in heights] == [m["saved_bytes"] for m in measured]
    assert "KiB" in mem.get_ylabel()
    plain, every, other, reentrant = heights
    assert plain > other > every == reentrant
    calls = [p.get_height() for p in runs.patches if p.get_gid() == "runs"]
    assert calls == [N, 2 * N, N + (N + 1) // 2, 2 * N]
    assert [t.get_text() for t in mem.get_xticklabels()] == [
        m for m, _, _ in viz.checkpoint_modes(N)
    ]


# ------------------------------------------------------------------ explorers
def test_ready_queue_explorer_steps():
    loss, leaves = _two_branches()
    box = viz.ready_queue_explorer(loss, leaves=leaves)
    play, slider = box.children[0].children
    picture = box.children[1]
    n = len(viz.backward_steps(loss))
    assert (slider.min, slider.max, slider.value) == (1, n, 1) == (play.min, play.max, play.value)
    first = picture.value
    assert first.startswith("<img")
    slider.value = 4
    assert picture.value != first and picture.value.startswith("<img")
    slider.value = 1
    assert picture.value == first


def test_ready_queue_explorer_slider_value_is_the_title_step(monkeypatch):
    """The slider reads k exactly when the picture says "step k of n"."""
    monkeypatch.setattr(viz, "figure_html", lambda fig: fig.axes[0].get_title())
    loss, leaves = _two_branches()
    box = viz.ready_queue_explorer(loss, leaves=leaves)
    slider, picture = box.children[0].children[1], box.children[1]
    n = len(viz.backward_steps(loss))
    for k in [1, 4, n, 2]:
        slider.value = k
        assert picture.value.startswith(f"step {k} of {n}: ran "), (k, picture.value)


def test_per_block_figure_labels_each_bar_with_its_kib(small):
    blocks, x = small
    result = viz.measure_checkpointing(blocks, x, {1})
    fig = viz._per_block_figure(result, {1})
    _renders(fig)
    (ax,) = fig.axes
    heights = [p.get_height() for p in ax.patches if p.get_gid() == "block"]
    assert [h * 2**10 for h in heights] == result["per_block_bytes"]
    labels = [t.get_text() for t in ax.texts if t.get_gid() == "block-kib"]
    assert labels == [f"{b / 2**10:.0f} KiB" for b in result["per_block_bytes"]]


def test_checkpoint_explorer_reacts():
    box = viz.checkpoint_explorer(width=16, batch=4)
    count, reentrant = box.children[0].children
    chosen, picture = box.children[1], box.children[2]
    count.value = count.max
    assert chosen.rows >= len(chosen.options) == count.max  # every block visible at once
    count.value = 4
    seen = [picture.value]
    count.value = 6
    assert list(chosen.options) == list(range(6))
    seen.append(picture.value)
    chosen.value = (0, 2, 5)
    seen.append(picture.value)
    reentrant.value = True
    seen.append(picture.value)
    assert all(v.startswith("<img") for v in seen)
    assert len(set(seen[:3])) == 3  # the reentrant variant keeps the same bytes
    count.value = 3
    assert list(chosen.options) == [0, 1, 2] and chosen.value == (0, 2)
