"""labs/export/viz.py: the pictures render headless and draw what torch.export produced (one box
per input spec in its InputKind's colour and placeholder order, one per output spec, each
mutation written back to the input it updates; each graph's call_function ops in order, marked
by which graph has them); the shape explorer's verdicts are torch's own (the output's shape, or
the guard's message) and it follows its sliders without a kernel."""

import html
import operator
import warnings

import pytest
import torch
import torch.nn.functional as F
from matplotlib.colors import to_rgba
from torch import nn
from torch.export import Dim, export
from torch.export.graph_signature import InputKind, OutputKind

from labs.export import models, viz
from tests.labs._figures import by_gid as _gid
from tests.labs._figures import render as _render


def _export(model, args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation warnings
        return export(model, args, **kwargs)


def _decompose(ep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ep.run_decompositions()


class Transformerish(nn.Module):
    """Linear, LayerNorm, GELU, softmax: ops that run_decompositions() rewrites (linear, the
    layer norm, softmax) next to one it keeps (gelu, a core ATen op)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return torch.softmax(F.gelu(self.norm(self.lin(x))), dim=-1)


class Bump(nn.Module):
    """Mutates its user input in place."""

    def forward(self, x):
        x.add_(1)
        return x * 2


@pytest.fixture(scope="module")
def programs():
    """{name: ExportedProgram}: each model exported raw (training IR) and decomposed."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    found = {}
    counter = models.Counter()
    x, y = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    found["counter"] = _export(counter, (x, y))
    norm = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    found["batchnorm"] = _export(norm, (torch.randn(5, 4, generator=g),))
    found["bump"] = _export(Bump(), (torch.randn(3, generator=g),))
    found["transformerish"] = _export(Transformerish(), (torch.randn(2, 8, generator=g),))
    for name in list(found):
        found[f"{name}-decomposed"] = _decompose(found[name])
    return found


# ------------------------------------------------------------------ signature_figure
def _shape(node):
    return str(tuple(int(d) for d in node.meta["val"].shape))


def _centre_y(box):
    return box.get_y() + box.get_height() / 2


@pytest.mark.parametrize(
    "name",
    [
        "counter",
        "counter-decomposed",
        "batchnorm",
        "batchnorm-decomposed",
        "bump-decomposed",
    ],
)
def test_signature_figure_draws_every_input_and_output_spec(programs, name):
    ep = programs[name]
    sig = ep.graph_signature
    fig = _render(viz.signature_figure(ep))
    (ax,) = fig.axes
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    boxes, labels = _gid(ax.patches, "input:"), _gid(ax.texts, "input-label")
    assert len(boxes) == len(labels) == len(sig.input_specs) == len(placeholders)
    for box, label, spec, node in zip(boxes, labels, sig.input_specs, placeholders):
        assert box.get_gid() == f"input:{spec.kind.name.lower()}"
        assert box.get_facecolor() == to_rgba(viz.INPUT_COLOURS[spec.kind])
        lines = label.get_text().split("\n")
        assert lines[0] == node.name == spec.arg.name
        assert lines[-1] == _shape(node)
        if spec.target is not None:
            assert lines[1].startswith(spec.target)
            assert ("non-persistent" in lines[1]) == (spec.persistent is False)
        else:
            assert len(lines) == 2
    ys = [b.get_y() for b in boxes]
    assert ys == sorted(ys, reverse=True)  # in placeholder order, top to bottom

    outputs = list(ep.graph.output_node().args[0])
    boxes, labels = _gid(ax.patches, "output:"), _gid(ax.texts, "output-label")
    assert len(boxes) == len(labels) == len(sig.output_specs) == len(outputs)
    for box, label, spec, node in zip(boxes, labels, sig.output_specs, outputs):
        assert box.get_gid() == f"output:{spec.kind.name.lower()}"
        assert box.get_facecolor() == to_rgba(viz.OUTPUT_COLOURS[spec.kind])
        lines = label.get_text().split("\n")
        assert lines[0] == node.name == spec.arg.name and lines[-1] == _shape(node)
        assert (f"→ {spec.target}" in lines) == (spec.kind in viz.MUTATIONS)

    n_ops = sum(n.op == "call_function" for n in ep.graph.nodes)
    (graph,) = _gid(ax.texts, "graph-label")
    assert graph.get_text() == f"graph\n{n_ops} ops"
    assert len(_gid(ax.texts, "flow")) == len(placeholders) + len(outputs)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    kinds = [s.kind for s in sig.input_specs] + [s.kind for s in sig.output_specs]
    assert [x for x in legend if x != "written back"] == [
        k.name.lower().replace("_", " ")
        for k in [*viz.INPUT_COLOURS, *viz.OUTPUT_COLOURS]
        if k in kinds
    ]

    # each mutation output has one dashed route back to the input it updates
    inputs = {
        (s.kind, s.target if s.kind != InputKind.USER_INPUT else s.arg.name): i
        for i, s in enumerate(sig.input_specs)
    }
    input_boxes = _gid(ax.patches, "input:")
    written = sorted(
        inputs[(viz.MUTATIONS[s.kind], s.target)]
        for s in sig.output_specs
        if s.kind in viz.MUTATIONS
    )
    routes, heads = _gid(ax.lines, "write-back:"), _gid(ax.texts, "write-back-head")
    assert len(routes) == len(heads) == len(written)
    assert sorted(r.get_gid() for r in routes) == sorted(
        f"write-back:{s.kind.name.lower()}" for s in sig.output_specs if s.kind in viz.MUTATIONS
    )
    for head, i in zip(heads, written):  # the arrowhead ends on the input box's left edge
        assert head.xy == pytest.approx((input_boxes[i].get_x(), _centre_y(input_boxes[i])))
    for route in routes:  # from an output box's right edge back over the top
        x0, y0 = route.get_xydata()[0]
        assert any(
            (x0, y0) == pytest.approx((b.get_x() + b.get_width(), _centre_y(b)))
            for b in _gid(ax.patches, "output:")
        )
    assert ("written back" in legend) == bool(written)


def test_signature_figure_of_counter_before_and_after_decomposition(programs):
    raw, decomposed = programs["counter"], programs["counter-decomposed"]
    kinds = {s.kind for s in raw.graph_signature.input_specs}
    assert kinds == {
        InputKind.PARAMETER,
        InputKind.BUFFER,
        InputKind.CONSTANT_TENSOR,
        InputKind.USER_INPUT,
    }
    # the raw export keeps self.calls.add_(1) in the graph, with no mutation output
    assert not any(s.kind in viz.MUTATIONS for s in raw.graph_signature.output_specs)
    (add_,) = [n for n in raw.graph.nodes if n.target is torch.ops.aten.add_.Tensor]
    (note,) = _gid(viz.signature_figure(raw).axes[0].texts, "in-place")
    assert f"{add_.target} on {add_.args[0].name}" in note.get_text()
    # decomposed: the same write is a buffer-mutation output, written back to `calls`
    (mutation,) = [s for s in decomposed.graph_signature.output_specs if s.kind in viz.MUTATIONS]
    assert (mutation.kind, mutation.target) == (OutputKind.BUFFER_MUTATION, "calls")
    fig = viz.signature_figure(decomposed)
    assert not _gid(fig.axes[0].texts, "in-place")
    assert "1 written back" in fig._suptitle.get_text()
    (head,) = _gid(fig.axes[0].texts, "write-back-head")
    (calls,) = [t for t in _gid(fig.axes[0].texts, "input-label") if "\ncalls\n" in t.get_text()]
    assert head.xy[1] == calls.get_position()[1]
    assert viz.signature_figure(raw, title="Counter").get_suptitle() == "Counter"
    with pytest.raises(TypeError, match="ExportedProgram"):
        viz.signature_figure(raw.module())


def test_signature_figure_writes_batchnorm_statistics_back(programs):
    sig = programs["batchnorm-decomposed"].graph_signature
    mutated = [s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
    buffers = [s.target for s in sig.input_specs if s.kind == InputKind.BUFFER]
    assert sorted(mutated) == sorted(buffers) and len(buffers) == 3  # mean, var, count
    ax = viz.signature_figure(programs["batchnorm-decomposed"]).axes[0]
    assert len(_gid(ax.lines, "write-back:buffer_mutation")) == 3


# ------------------------------------------------------------------ decomposition_figure
def _op(node):
    target = node.target
    return str(target) if isinstance(target, torch._ops.OpOverload) else target.__name__


def _ops(ep):
    return [_op(n) for n in ep.graph.nodes if n.op == "call_function"]


def test_decomposition_figure_lists_both_graphs_ops_marked_by_where_they_are(programs):
    before, after = programs["transformerish"], programs["transformerish-decomposed"]
    ops = [_ops(before), _ops(after)]
    assert "aten.linear.default" in ops[0] and "aten.linear.default" not in ops[1]
    assert {"aten.addmm.default", "aten.permute.default"} <= set(ops[1])
    fig = _render(viz.decomposition_figure(before, after))
    left, right = fig.axes[:2]
    both = set(ops[0]) & set(ops[1])
    assert both  # gelu is core ATen: kept
    for ax, names, side in ((left, ops[0], "before"), (right, ops[1], "after")):
        texts = _gid(ax.texts, "op:")
        assert [t.get_text().split() for t in texts] == [
            [str(i + 1), n] for i, n in enumerate(names)
        ]
        for t, n in zip(texts, names):
            where = "both" if n in both else side
            assert t.get_gid() == f"op:{where}"
            assert t.get_bbox_patch().get_facecolor() == to_rgba(viz.OP_COLOURS[where])
        assert ax.get_title() == f"{side}: {len(names)} ops"
        assert not _gid(ax.texts, "more")
    gone, new = set(ops[0]) - both, set(ops[1]) - both
    assert fig._suptitle.get_text() == (
        f"{len(gone)} op names only before, {len(new)} op names only after, {len(both)} in both"
    )
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "in both",
        "only before",
        "only after",
    ]
    getitem = next(n for n in after.graph.nodes if n.target is operator.getitem)
    assert viz.op_name(getitem) == "getitem"  # native_layer_norm's first output


def test_decomposition_figure_cuts_long_graphs(programs, monkeypatch):
    before, after = programs["transformerish"], programs["transformerish-decomposed"]
    monkeypatch.setattr(viz, "MAX_OPS", 3)
    fig = _render(viz.decomposition_figure(before, after, titles=("raw", "core ATen")))
    for ax, names, title in zip(fig.axes, (_ops(before), _ops(after)), ("raw", "core ATen")):
        assert len(_gid(ax.texts, "op:")) == 3
        (more,) = _gid(ax.texts, "more")
        assert more.get_text().strip() == f"+{len(names) - 3} more"
        assert ax.get_title() == f"{title}: {len(names)} ops"
    with pytest.raises(TypeError, match="before"):
        viz.decomposition_figure(before.graph_module, after)


# ------------------------------------------------------------------ dynamic shapes
@pytest.fixture(scope="module")
def window():
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=2, max=128)
    shapes = {
        "tokens": {0: batch, 1: seq},
        "mask": {0: batch, 1: seq},
        "prev": {0: batch, 1: seq + 1},
    }
    g = torch.Generator().manual_seed(0)
    ep = _export(models.Window(), models.window_inputs(2, 5, g), dynamic_shapes=shapes)
    return ep, ep.module()


def _inputs(batch, seq, related=True):
    tokens, mask, prev = models.window_inputs(batch, seq, torch.Generator().manual_seed(batch))
    return (tokens, mask, prev if related else prev[:, :seq])


def _torch_says(module, args):
    """What calling the exported module does: (True, output shape) or (False, message)."""
    try:
        return True, tuple(module(*args).shape)
    except AssertionError as exc:
        return False, str(exc)


@pytest.mark.parametrize("batch, seq", [(1, 2), (3, 7), (64, 128)])
def test_shape_verdict_accepts_sizes_in_range(window, batch, seq):
    ep, module = window
    args = _inputs(batch, seq)
    ok, shape = _torch_says(module, args)
    assert ok and shape == (batch, seq, 8)
    assert viz.shape_verdict(module, args) == (True, f"output shape {shape}")
    assert viz.shape_verdict(ep, args) == (True, f"output shape {shape}")


@pytest.mark.parametrize(
    "batch, seq, related", [(65, 7, True), (3, 129, True), (3, 1, True), (3, 7, False)]
)
def test_shape_verdict_rejects_with_torchs_message(window, batch, seq, related):
    _, module = window
    args = _inputs(batch, seq, related)
    ok, message = _torch_says(module, args)
    assert not ok and message.startswith("Guard failed: ")
    assert viz.shape_verdict(module, args) == (False, message)


def test_shape_verdict_reports_wrong_inputs_and_several_outputs(window, programs):
    _, module = window
    tokens, mask, _ = _inputs(2, 5)
    ok, message = viz.shape_verdict(module, (tokens, mask))
    assert not ok and "tree spec" in message  # torch's ValueError: two inputs, not three
    x = torch.randn(3, 4)
    outputs = programs["counter"].module()(x, x)
    ok, message = viz.shape_verdict(programs["counter"], (x, x))
    assert ok and message == "output shapes " + ", ".join(str(tuple(o.shape)) for o in outputs)


def test_range_lines_name_each_symbol_its_range_and_its_dims(window):
    ep, _ = window
    lines = viz.range_lines(ep)
    assert len(lines) == len(ep.range_constraints)
    for line, (expr, vr) in zip(lines, ep.range_constraints.items()):
        assert line.startswith(f"{expr}: [{vr.lower}, {vr.upper}]")
    tokens = next(n for n in ep.graph.nodes if n.name == "tokens").meta["val"]
    batch, seq = (str(s) for s in tokens.shape[:2])
    (line,) = [x for x in lines if x.startswith(f"{batch}: ")]
    assert line == f"{batch}: [1, 64] (tokens.size()[0], mask.size()[0], prev.size()[0])"
    (line,) = [x for x in lines if x.startswith(f"{seq}: ")]
    assert line == f"{seq}: [2, 128] (tokens.size()[1], mask.size()[1])"
    (line,) = [x for x in lines if x.startswith(f"{seq} + 1: ")]
    assert line == f"{seq} + 1: [3, 129] (prev.size()[1])"


def test_shape_explorer_follows_its_sliders_and_checkbox(window):
    ep, module = window
    box = viz.shape_explorer(
        ep, _inputs, {"batch": (1, 80), "seq": (1, 160)}, start={"batch": 3, "seq": 7}
    )
    batch, seq, broken, out = box.children
    assert (batch.description, batch.min, batch.max, batch.value) == ("batch", 1, 80, 3)
    assert (seq.min, seq.max, seq.value) == (1, 160, 7)
    assert broken.description == "break the relation" and broken.value is False
    first = out.value
    assert html.escape("accepted: output shape (3, 7, 8)") in first
    assert html.escape("tokens (3, 7, 8), mask (3, 7), prev (3, 8, 8)") in first
    for line in viz.range_lines(ep):
        assert html.escape(line) in first
    batch.value = 70
    _, message = _torch_says(module, _inputs(70, 7))
    assert html.escape(f"rejected: {message}") in out.value
    batch.value = 3
    assert out.value == first
    broken.value = True
    _, message = _torch_says(module, _inputs(3, 7, related=False))
    assert html.escape(f"rejected: {message}") in out.value and "prev.size()[1]" in message
    assert viz.REJECT_COLOUR in out.value and viz.ACCEPT_COLOUR in first


def test_shape_explorer_without_a_relation_to_break(window):
    ep, _ = window
    box = viz.shape_explorer(ep, models.window_inputs, {"batch": (1, 9), "seq": (1, 9)})
    assert len(box.children) == 3  # no checkbox: window_inputs takes no `related`
    assert [s.value for s in box.children[:2]] == [5, 5]
    assert html.escape("accepted: output shape (5, 5, 8)") in box.children[-1].value

    def fails(n):
        raise ValueError("no inputs today")

    box = viz.shape_explorer(ep, fails, {"n": (1, 3)})
    assert "make_inputs failed: ValueError: no inputs today" in box.children[-1].value
    with pytest.raises(ValueError, match="no sizes"):
        viz.shape_explorer(ep, fails, {})
    with pytest.raises(ValueError, match="min > max"):
        viz.shape_explorer(ep, fails, {"n": (3, 1)})


def test_outside_ranges_and_the_explorers_note_for_what_no_guard_checks(window):
    ep, module = window
    tokens = next(n for n in ep.graph.nodes if n.name == "tokens").meta["val"]
    batch, seq = (str(s) for s in tokens.shape[:2])
    assert viz.outside_ranges(ep, _inputs(3, 7)) == []
    assert viz.outside_ranges(ep, _inputs(70, 7)) == [f"{batch} = 70 not in [1, 64]"]
    assert viz.outside_ranges(ep, _inputs(3, 1)) == [
        f"{seq} = 1 not in [2, 128]",
        f"{seq} + 1 = 2 not in [3, 129]",
    ]
    assert viz.outside_ranges(ep, _inputs(0, 7)) == [f"{batch} = 0 not in [1, 64]"]
    accepted, _ = _torch_says(module, _inputs(0, 7))  # torch 2.13: no guard for batch >= 1
    box = viz.shape_explorer(ep, _inputs, {"batch": (0, 80), "seq": (1, 160)}, start={"seq": 7})
    box.children[0].value = 0
    shown = box.children[-1].value
    assert ("accepted: output shape (0, 7, 8)" in shown) == accepted
    assert (f"note: {batch} = 0 not in [1, 64]" in shown) == accepted


# ------------------------------------------------------------------ hierarchy_table
def test_hierarchy_table_lists_each_module_what_it_holds_and_what_its_graph_runs():
    """torch.export.unflatten's tree of models.Deep, row for row: every module in
    named_modules() order, indented by depth; its own parameters and buffers with their shapes;
    its graph's calls and ops in order (getitem left out): "nothing" for the ModuleList
    ``stages``, which torch gives an empty graph, "—" for a module without a graph."""
    torch.manual_seed(0)
    model = models.Deep(5, 2, 3)
    x = torch.randn(4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = torch.export.unflatten(_export(model, (x, x.clone())))
    t = viz.hierarchy_table(tree, caption="deep")
    assert t.caption == "deep" and t.header == ["module", "type", "holds", "its graph runs"]
    names = [name for name, _ in tree.named_modules()]
    assert len(t.rows) == len(names)
    rows = dict(zip(names, t.rows))
    assert rows[""][:2] == ["(root)", "UnflattenedModule"]
    assert rows[""][3] == "call stages.0, call stages.1, call out"
    assert rows["stages"] == ["  stages", "InterpreterModule", "—", "nothing"]
    assert rows["stages.0.mix"][0] == "      mix"
    assert rows["stages.0.mix"][3] == "call proj, sigmoid, mul.Tensor, tanh, add.Tensor"
    assert rows["stages.0.mix.proj"][2] == "weight (5, 5), bias (5,)"
    assert rows["stages.0.norm"][2] == "gain (5,), mean (5,), std (5,)"
    assert rows["stages.0.centre"][2:] == ["—", "mean.dim, sub.Tensor"]
    lines = repr(t).splitlines()  # (caption, header, rule, then the rows)
    assert lines[0] == "deep" and lines[1].split("  ")[0] == "module"
    assert lines[3 + names.index("stages.0.norm")].split() == ["norm", "InterpreterModule", "gain", "(5,),",
                                               "mean", "(5,),", "std", "(5,)", "sub.Tensor,",
                                               "div.Tensor,", "mul.Tensor"]
    assert "<table" in t._repr_html_()
    plain = viz.hierarchy_table(nn.Sequential(nn.Linear(2, 2)))  # no graph anywhere
    assert [row[3] for row in plain.rows] == ["—", "—"]


def test_hierarchy_table_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="expected a torch.nn.Module, got ExportedProgram"):
        viz.hierarchy_table(_export(models.Centre(), (torch.randn(2, 3),)))
