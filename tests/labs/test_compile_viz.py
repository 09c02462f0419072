"""labs/compile/viz.py: the pictures render headless and draw what torch produced (one box per
FX node in its opcode's colour, one arrow per input edge; each source line in the graph that
``torch._dynamo.explain`` put its ops in, each break on its line); the explorer follows its
dropdown without a kernel; the kernel list reads real Inductor output code."""

import html
import inspect
import operator
import re

import pytest
import torch
import torch.fx
from matplotlib.colors import to_rgba
from torch.fx.experimental.proxy_tensor import make_fx

from labs.compile import programs, viz
from tests.labs._figures import by_gid as _gid
from tests.labs._figures import render as _render


def _boxes(ax):
    return _gid(ax.texts, "node:")


def _mlp(x, w):
    h = torch.sin(x) @ w
    return torch.relu(h).sum(0) + x.mean() * 2


def _chain(x):
    for i in range(12):
        x = torch.sin(x) * x + i
    return x


def smooth(x):
    y = x.sin()
    return y * 2 + 1


# ------------------------------------------------------------------ graph_figure
def test_graph_figure_draws_one_box_per_node_in_its_opcode_colour_and_one_arrow_per_edge():
    gm = torch.fx.symbolic_trace(_mlp)
    fig = _render(viz.graph_figure(gm))
    (ax,) = fig.axes
    nodes = list(gm.graph.nodes)
    boxes = _boxes(ax)
    assert len(boxes) == len(nodes) == 10
    assert [b.get_text() for b in boxes] == [viz.node_label(n) for n in nodes]
    assert [b.get_text() for b in boxes] == [
        *["x", "w", "sin", "matmul", "relu", "sum", "mean", "mul", "add", "output"]
    ]
    for box, node in zip(boxes, nodes):
        assert box.get_gid() == f"node:{node.op}"
        assert box.get_bbox_patch().get_facecolor() == to_rgba(viz.OP_COLOURS[node.op])
    assert {n.op for n in nodes} == {"placeholder", "call_function", "call_method", "output"}
    edges = _gid(ax.texts, "edge")
    assert len(edges) == sum(len(n.all_input_nodes) for n in nodes)
    # rows are layers: the longest path from a placeholder, top to bottom; w sits just above
    # its reader (matmul)
    layers = viz.graph_layers(gm)
    assert [layers[n] for n in nodes] == [0, 1, 1, 2, 3, 4, 1, 2, 5, 6]
    assert [b.get_position()[1] for b in boxes] == [-layers[n] for n in nodes]
    assert ax.get_title() == "FX graph: 10 nodes"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["placeholder", "call_function", "call_method", "output"]


def test_graph_figure_shows_before_and_after_side_by_side():
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    before = torch.fx.symbolic_trace(_mlp)
    after = make_fx(_mlp)(x, w)  # the same program as aten ops
    fig = _render(viz.graph_figure(before, after, titles=("torch", "aten")))
    left, right = fig.axes
    assert [len(_boxes(ax)) for ax in fig.axes] == [
        len(before.graph.nodes),
        len(after.graph.nodes),
    ]
    assert left.get_title() == f"torch: {len(before.graph.nodes)} nodes"
    assert right.get_title() == f"aten: {len(after.graph.nodes)} nodes"
    labels = [b.get_text() for b in _boxes(right)]
    assert {"aten.sin", "aten.mm", "aten.relu", "aten.mean"} <= set(labels)
    assert {"aten.mul.Tensor", "aten.sum.dim_IntList"} <= set(labels)  # overloads kept
    assert [a.get_title() for a in viz.graph_figure(before, after).axes] == [
        "before: 10 nodes",
        f"after: {len(after.graph.nodes)} nodes",
    ]


def test_node_label_names_targets_briefly():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    nodes = [
        graph.call_function(torch.sin, (x,)),
        graph.call_function(operator.mul, (x, x)),
        graph.call_function(torch.ops.aten.mm.default, (x, x)),
        graph.call_function(torch.ops.aten.sort.stable, (x,)),
        graph.call_method("tanh", (x,)),
        graph.get_attr("weight"),
    ]
    graph.output(nodes[0])
    assert [viz.node_label(n) for n in graph.nodes] == [
        *["x", "sin", "mul", "aten.mm", "aten.sort.stable", "tanh", "weight", "output"]
    ]


def test_graph_figure_keeps_a_forty_node_graph_readable():
    gm = torch.fx.symbolic_trace(_chain)
    assert len(gm.graph.nodes) == 38
    fig = viz.graph_figure(gm)
    width, height = fig.get_size_inches()
    assert width <= 18 and height <= 16
    fig.draw_without_rendering()
    extents = [b.get_bbox_patch().get_window_extent() for b in _boxes(fig.axes[0])]
    assert len(extents) == 38
    for i, a in enumerate(extents):  # no two boxes overlap
        assert not any(a.overlaps(b) for b in extents[i + 1 :])
    assert min(b.get_fontsize() for b in _boxes(fig.axes[0])) >= 5


def test_graph_figure_sinks_weights_next_to_their_reader():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    gm = make_fx(model)(torch.randn(2, 4))
    layers = viz.graph_layers(gm)
    for node in gm.graph.nodes:
        for i in node.all_input_nodes:
            assert layers[i] < layers[node]
        if not node.all_input_nodes and node.users:
            assert layers[node] == min(layers[u] for u in node.users) - 1
    _render(viz.graph_figure(gm))
    with pytest.raises(TypeError, match="GraphModule"):
        viz.graph_figure(gm.graph)


# ------------------------------------------------------------------ graph breaks
@pytest.fixture(scope="module")
def explained():
    """{name: (torch._dynamo.explain's output, viz.explain_breaks's map)} for each breaking
    program, each on a fresh Dynamo."""
    torch.manual_seed(0)
    found = {}
    for name, fn in {**programs.BREAKING, "smooth": smooth}.items():
        x = torch.randn(5, 3)
        torch._dynamo.reset()
        found[name] = (torch._dynamo.explain(fn)(x), viz.explain_breaks(fn, x))
    return found


def _line(rows, text):
    (row,) = [r for r in rows if text in r[1]]
    return row


def test_break_map_of_logged_puts_each_line_in_its_graph(capsys):
    rows = viz.break_map(programs.logged, torch.randn(4, 3))
    assert capsys.readouterr().out == ""  # logged ran (and printed), muted
    lineno, text, graph, reason = _line(rows, "y = x.tanh()")
    assert (graph, reason) == (1, None) and text == "    y = x.tanh()"
    assert lineno == inspect.getsourcelines(programs.logged)[1] + 2  # def, docstring, tanh
    _, _, graph, reason = _line(rows, "print(")
    assert graph == 1 and reason.startswith("Failed to trace builtin operator: print")
    assert _line(rows, "return y * 3 + 1")[2:] == (2, None)
    assert rows[0][1].startswith("def logged(")
    assert [r[0] for r in rows] == list(range(rows[0][0], rows[0][0] + len(rows)))
    assert all(r[2] is None and r[3] is None for r in rows[:2])  # def line, docstring


@pytest.mark.parametrize("name", list(programs.BREAKING))
def test_break_map_matches_explain(explained, name):
    explanation, found = explained[name]
    assert (found.graph_count, found.graph_break_count) == (
        explanation.graph_count,
        explanation.graph_break_count,
    )
    assert found.graph_break_count >= 1
    graphs = {k for ks in found.graphs.values() for k in ks}
    assert graphs == set(range(1, explanation.graph_count + 1))  # every graph has a line
    rows = found.rows
    assert {r[2] for r in rows if r[2] is not None} <= graphs
    # a break is on the innermost frame of its user_stack within the function's lines
    filename, lines = programs.BREAKING[name].__code__.co_filename, {r[0] for r in rows}
    expected, outside = set(), 0
    for reason in explanation.break_reasons:
        inside = [f.lineno for f in reason.user_stack if f.filename == filename]
        inside = [n for n in inside if n in lines]
        if inside:
            expected.add(inside[-1])
        else:
            outside += 1
    assert {r[0] for r in rows if r[3] is not None} == expected != set()
    assert len(found.outside) == outside
    last_code = [r for r in rows if r[1].strip()][-1]
    assert last_code[2] is not None  # the return line's ops are in some graph


def test_break_map_places_each_programs_break(explained):
    def where(name, text):
        return _line(explained[name][1].rows, text)

    assert where("branch", "if x.sum() > 0")[3] == "generic_jump TensorVariable()"
    assert where("item", "scale = x.abs()")[3].startswith("Unsupported Tensor.item()")
    reason = where("builtin", "top = heapq")[3]
    assert "_heapq.heapify" in reason and "heapq.py:" in reason  # broke inside nlargest
    assert explained["builtin"][1].graphs[where("builtin", "top = heapq")[0]] == (1, 2, 3)
    assert where("builtin", "return top[0] + top[1]")[2] == 4
    assert where("generator", "return max(")[2:] == (1, "invalid call to builtin op handler")


def test_break_map_of_a_function_without_break_has_one_graph(explained):
    explanation, found = explained["smooth"]
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    assert (found.graph_count, found.graph_break_count, found.outside) == (1, 0, [])
    assert [r[2:] for r in found.rows] == [(None, None), (1, None), (1, None)]
    fig = _render(viz._map_figure(found))
    (ax,) = fig.axes
    assert ax.get_title() == "smooth: 1 graph, 0 breaks"
    assert not _gid(ax.patches, "break")


def test_graph_break_map_draws_graphs_and_breaks(capsys):
    fig = _render(viz.graph_break_map(programs.builtin, torch.randn(5, 3)))
    (ax,) = fig.axes
    rows = viz.break_map(programs.builtin, torch.randn(5, 3))
    assert ax.get_title() == "builtin: 4 graphs, 3 breaks"
    shaded = _gid(ax.patches, "graph:")
    assert [p.get_gid() for p in shaded] == [f"graph:{r[2]}" for r in rows if r[2] is not None]
    for patch in shaded:
        k = int(patch.get_gid().split(":")[1])
        assert patch.get_facecolor()[:3] == to_rgba(viz.GRAPH_COLOURS[k - 1])[:3]
    assert [p.get_gid() for p in _gid(ax.patches, "chip:")] == [
        *["chip:1", "chip:2", "chip:3", "chip:4"]
    ]  # line 40 feeds graphs 1-3 (nlargest and its key lambda), the return line graph 4
    assert len(_gid(ax.patches, "break")) == sum(r[3] is not None for r in rows) == 1
    (reason,) = _gid(ax.texts, "reason")
    assert reason.get_text().startswith("← break: Attempted to call function marked as skipped")
    assert [t.get_text() for t in _gid(ax.texts, "lineno")] == [str(r[0]) for r in rows]
    assert len(_gid(ax.texts, "outside")) == 1  # the second break is inside heapq's frame
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["graph 1", "graph 2", "graph 3", "graph 4", "break"]


# ------------------------------------------------------------------ break_explorer
def test_break_explorer_follows_its_dropdown(monkeypatch):
    calls = []
    explain = viz.explain_breaks
    monkeypatch.setattr(viz, "explain_breaks", lambda fn, *a: calls.append(fn) or explain(fn, *a))

    def broken(x):
        raise RuntimeError("no good")

    x = torch.randn(4, 3)
    box = viz.break_explorer(
        {"logged": (programs.logged, (x,)), "smooth": (smooth, (x,)), "broken": (broken, (x,))}
    )
    choice, out = box.children
    assert list(choice.options) == ["logged", "smooth", "broken"] and choice.value == "logged"
    first = out.value
    assert "<b>logged</b>: 2 graphs, 1 graph break" in first
    # the map is HTML text, not a picture scaled down to the output's width
    assert "<img" not in first and f"font-size:{viz.CODE_PX}px" in first
    choice.value = "smooth"
    assert "<b>smooth</b>: 1 graph, 0 graph breaks" in out.value and out.value != first
    choice.value = "logged"
    assert out.value == first
    assert calls == [programs.logged, smooth]  # each explained once, then cached
    choice.value = "broken"
    assert "failed" in out.value and "no good" in out.value
    with pytest.raises(ValueError, match="no programs"):
        viz.break_explorer({})


def _code_cells(page: str) -> list[str]:
    return [
        html.unescape(c) for c in re.findall(r'<td class="code" style="[^"]*">(.*?)</td>', page)
    ]


def test_break_map_html_shows_the_code_at_a_readable_size_without_wrapping(explained):
    found = explained["builtin"][1]
    page = viz.break_map_html(found)
    assert viz.CODE_PX >= 12 and "<img" not in page
    code = _code_cells(page)
    indent = min(len(t) - len(t.lstrip()) for _, t, _, _ in found.rows if t.strip())
    assert code == [t[indent:] for _, t, _, _ in found.rows]  # every line, dedented, whole
    styles = re.findall(r'<td class="code" style="([^"]*)"', page)
    assert len(styles) == len(found.rows)
    for style in styles:
        assert f"font-size:{viz.CODE_PX}px" in style and "white-space:pre;" in style
        assert "break-all" not in style
    assert "overflow-x:auto" in page  # a wide function scrolls sideways
    # the break: a red bar, and its reason in a row of its own that wraps at spaces only
    (reason,) = re.findall(r'<td class="reason"[^>]*><div style="([^"]*)">(.*?)</div>', page)
    assert "white-space:normal" in reason[0] and "word-break:normal" in reason[0]
    assert html.unescape(reason[1]).startswith("← break: Attempted to call function marked")
    assert page.count(f"border-left:4px solid {viz.BREAK_COLOUR}") == 2  # line and reason row
    for k in range(1, found.graph_count + 1):
        assert f"graph {k} " in page
    assert "break in a frame outside builtin" in page  # heapq's own break


def test_log_view_keeps_each_line_whole():
    text = "+- GuardManager: source=L['x']\n| +- TENSOR_MATCH: check_tensor(L['x'], Tensor)"
    shown = viz.log_view(text, caption="guards")
    page = shown._repr_html_()
    (style, body) = re.findall(r'<div class="log" style="([^"]*)">(.*?)</div>', page, re.DOTALL)[0]
    assert "white-space:pre;" in style and "overflow-x:auto" in style
    assert "word-break:normal" in style and f"font-size:{viz.CODE_PX}px" in style
    assert html.unescape(body) == text and "<pre" not in page  # (JupyterLab's pre: break-all)
    assert page.startswith('<div style="margin:2px 0">guards</div>')
    assert repr(shown) == "guards\n" + text
    assert repr(viz.log_view("a\nb")) == "a\nb"


# ------------------------------------------------------------------ kernels
#: the shape of a CUDA wrapper (Triton kernels, an extern mm), sources cut short
TRITON_CODE = """
from torch._inductor.select_algorithm import extern_kernels
async_compile = AsyncCompile()

# Original ATen: [aten.add]
#   %add : call_function[target=torch.ops.aten.add.Tensor](args = (%arg0_1, 1), kwargs = {})
triton_poi_fused_add_0 = async_compile.triton('triton_poi_fused_add_0', '''
import triton
@triton.jit
def triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
    extern_kernels.mm(tmp0)
''', device_str='cuda')

async_compile.wait(globals())
del async_compile

def call(args):
    arg0_1, arg1_1 = args
    with torch.cuda._DeviceGuard(0):
        buf0 = empty_strided_cuda((4, 4), (4, 1), torch.float32)
        extern_kernels.mm(arg0_1, arg1_1, out=buf0)
        assert_size_stride(buf0, (4, 4), (4, 1), 'torch.ops.aten.mm.default')
        stream0 = get_raw_stream(0)
        triton_poi_fused_add_0.run(buf0, buf1, 16, stream=stream0)
        buf2 = torch.ops.aten.sort.stable(buf1, stable=False, dim=1)
    return (buf1, )
"""


def test_kernels_reads_triton_kernels_and_extern_calls_in_call_order():
    assert viz.kernels(TRITON_CODE) == [
        ("extern_kernels.mm", "ATen fallback"),
        ("triton_poi_fused_add_0", "generated Triton"),
        ("aten.sort.stable", "ATen fallback"),
    ]
    assert viz.kernels([TRITON_CODE, TRITON_CODE]) == viz.kernels(TRITON_CODE) * 2


def test_kernels_of_real_inductor_code_for_unfused():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x = torch.randn(33, 17)
    out, codes = run_and_get_code(torch.compile(programs.unfused), x)
    torch.testing.assert_close(out, programs.unfused(x))
    found = viz.kernels(codes)
    generated = [n for n, kind in found if kind == "generated C++"]
    fallbacks = [n for n, kind in found if kind == "ATen fallback"]
    assert len(generated) == 2 and all(n.startswith("cpp_fused_") for n in generated)
    assert sorted(fallbacks) == ["aten.cumsum.default", "aten.cumsum.default", "aten.sort.stable"]
    assert found[0] == ("aten.sort.stable", "ATen fallback")  # the wrapper sorts first
    shown = viz.kernels_table(codes)
    assert shown.caption == "5 kernels: 2 generated, 3 ATen fallbacks"
    assert shown.header == ["#", "kernel", "kind"]
    assert [row[1:] for row in shown.rows] == [list(k) for k in found]
    assert "aten.sort.stable" in shown._repr_html_()


# ------------------------------------------------------------------ timings
def test_timings_figure_says_what_was_timed_and_in_which_unit():
    fig = _render(
        viz.timings_figure({"eager": 2e-3, "compiled": 5e-4}, what="gelu_tanh", threads=2)
    )
    (ax,) = fig.axes
    assert ax.get_title() == "gelu_tanh: median time per call, torch.utils.benchmark, 2 threads"
    assert "median time per call (microseconds" in ax.get_xlabel()
    bars = _gid(ax.patches, "timing")
    assert [round(b.get_width()) for b in bars] == [2000, 500]
    assert [t.get_text() for t in _gid(ax.texts, "value")] == [
        *[" 2,000 us (1.00x)", " 500 us (0.25x)"]
    ]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["eager", "compiled"]
    one = viz.timings_figure({"eager": 1e-6}, what="f", threads=1)
    assert one.axes[0].get_title().endswith("1 thread")
    for bad in ({}, {"eager": 0.0}):
        with pytest.raises(ValueError, match="positive median"):
            viz.timings_figure(bad, what="f", threads=1)
