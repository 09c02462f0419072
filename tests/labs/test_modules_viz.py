"""labs/modules/viz.py (module tree and hooks): the module tree renders headless with a box per
module and a tag per hook the module holds, and the hook explorer shows a real run's events
beside a prediction, following its checkboxes without a kernel."""
import torch
from torch import nn

from labs.modules import viz
from tests.labs._figures import by_gid, render


def test_the_module_tree_has_a_box_per_module_and_a_tag_per_hook():
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 2)))
    model[0].register_forward_pre_hook(lambda *args: None)
    model[1][1].register_full_backward_hook(lambda *args: None)
    model[1].register_buffer("count", torch.zeros(1))
    fig = render(viz.module_tree(model))
    patches = fig.axes[0].patches
    assert {p.get_gid() for p in by_gid(patches, "module:")} == {
        "module:(root)", "module:0", "module:1", "module:1.0", "module:1.1"}
    assert [p.get_gid() for p in by_gid(patches, "hook:")] == [
        "hook:0:forward pre:0", "hook:1.1:backward:0"]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "count (buffer)" in texts and "weight, bias" in texts


def test_the_hook_explorer_compares_a_real_run_with_the_prediction():
    box = viz.hook_explorer(lambda model, hooks: [["forward", ""]])
    checkboxes, picture = box.children[0].children, box.children[1]
    first = picture.value
    assert "a real run" in first and "#e6f4ea" in first and "#fde7e9" in first  # 1 agrees
    ticked = next(c for c in checkboxes if not c.value and "every module" in c.description)
    ticked.value = True
    assert picture.value != first and "@*" in picture.value  # a global hook's events now


def test_the_hook_explorer_shows_what_a_prediction_raised():
    def stub(model, hooks):
        raise NotImplementedError("modules.hook-order")

    assert "hook_order raised NotImplementedError" in viz.hook_explorer(stub).children[1].value
