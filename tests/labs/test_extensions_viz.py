"""labs/extensions/viz.py: the pictures render headless and draw what the dispatcher holds (one
box per file that registered a kernel, one per dispatch key, torchgen's files told from
hand-written ones; one box per kernel of the call path, boxed or unboxed), and the explorer
follows its dropdown without a kernel."""
import torch

from labs.extensions import viz
from labs.extensions.checks.schema import entries
from tests.labs._figures import by_gid, render

ADD = next(e for e in entries() if e["func"].startswith("add.Tensor("))


def test_registrations_read_the_dispatchers_dump():
    rows = {r["key"]: r for r in viz.registrations("aten::add.Tensor")}
    assert rows["CPU"]["file"].startswith("RegisterCPU") and rows["CPU"]["generated"]
    assert "unboxed" in rows["CPU"]["kinds"] and rows["Autograd"]["alias"]
    assert not rows["FuncTorchBatched"]["generated"]  # functorch's rules, by hand


def test_the_codegen_map_has_a_box_per_file_and_per_key():
    fig = viz.codegen_map(ADD)
    render(fig)
    rows = viz.registrations("aten::add.Tensor")
    assert by_gid(fig.axes[0].patches, "yaml")
    for r in rows:
        assert by_gid(fig.axes[0].patches, f"file:{r['file']}") and by_gid(fig.axes[0].patches, f"key:{r['key']}")


def test_the_call_path_tells_boxed_from_unboxed_kernels():
    fig = viz.call_path(torch.ops.aten.view.default)
    render(fig)
    assert by_gid(fig.axes[0].patches, "python") and by_gid(fig.axes[0].patches, "dispatcher")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("CPU: boxed only") for t in texts)  # view's kernel is boxed only
    assert any(t.startswith("Conjugate: fallthrough") for t in texts)


def test_the_explorer_draws_the_chosen_operator():
    box = viz.codegen_explorer({"add.Tensor": ADD, "matmul": next(
        e for e in entries() if e["func"].startswith("matmul("))})
    first = box.children[1].value
    assert first.startswith('<img src="data:image/png;base64,')
    box.children[0].value = "matmul"
    assert box.children[1].value != first and box.children[1].value.startswith("<img")
