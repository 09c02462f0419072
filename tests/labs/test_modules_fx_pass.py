"""modules.fx-pass: plausible wrong BatchNorm folds fail, called directly through run_checks (each
is the reference rewritten with one method per step, one step changed); torch's own fuse agrees
with the contract on the checks' models; and the before/after picture renders headless and marks
what the pass removed and changed. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import copy

import pytest
import torch
from torch import nn
from torch.fx.experimental.optimization import fuse

from labs.modules import probes, viz
from labs.modules.checks import fx_pass
from tests.conftest import assert_rejected
from tests.labs._figures import by_gid, render

EX = "modules.fx-pass"


class Fold:
    """The reference answer, one method per step."""

    def copy(self, gm):
        return copy.deepcopy(gm)

    def foldable(self, source, modules):
        return (isinstance(source, torch.fx.Node) and source.op == "call_module"
                and isinstance(modules[source.target], (nn.Conv1d, nn.Conv2d, nn.Linear))
                and len(source.users) == 1)

    def scale(self, bn):
        return torch.rsqrt(bn.running_var + bn.eps)

    def set_bias(self, layer, bias):
        layer.bias = nn.Parameter(bias)

    def fold(self, bn, layer):
        with torch.no_grad():
            scale = self.scale(bn) * (bn.weight if bn.weight is not None else 1.0)
            shift = -bn.running_mean * scale + (bn.bias if bn.bias is not None else 0.0)
            weight = layer.weight * scale.reshape(-1, *[1] * (layer.weight.dim() - 1))
            bias = shift if layer.bias is None else layer.bias * scale + shift
        layer.weight = nn.Parameter(weight)
        self.set_bias(layer, bias)

    def finish(self, gm):
        gm.delete_all_unused_submodules()
        gm.recompile()

    def __call__(self, gm):
        gm = self.copy(gm)
        modules = dict(gm.named_modules())
        for node in list(gm.graph.nodes):
            if node.op != "call_module" or not isinstance(modules[node.target],
                                                          (nn.BatchNorm1d, nn.BatchNorm2d)):
                continue
            if not self.foldable(node.args[0], modules):
                continue
            self.fold(modules[node.target], modules[node.args[0].target])
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
        self.finish(gm)
        return gm


class EpsIgnored(Fold):
    def scale(self, bn):
        return torch.rsqrt(bn.running_var)


class VarianceNotRooted(Fold):
    def scale(self, bn):
        return 1 / (bn.running_var + bn.eps)


class NoBiasCreated(Fold):
    def set_bias(self, layer, bias):
        if layer.bias is not None:
            layer.bias = nn.Parameter(bias)


class IgnoresOtherUsers(Fold):
    def foldable(self, source, modules):
        return source.op == "call_module" and isinstance(modules[source.target],
                                                          (nn.Conv1d, nn.Conv2d, nn.Linear))


class InPlace(Fold):
    def copy(self, gm):
        return gm


class SharesTheLayers(Fold):
    """A new GraphModule over a copied graph, but the same layer objects: folding them changes
    the caller's."""

    def copy(self, gm):
        return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


class NotRecompiled(Fold):
    def finish(self, gm):
        gm.delete_all_unused_submodules()


class DeadModulesLeft(Fold):
    def finish(self, gm):
        gm.recompile()


@pytest.mark.parametrize("answer, phrase", [
    (EpsIgnored(), "the weight of layer '0' (Conv2d, folded with BatchNorm '1') is not the "
                   "folded weight"),
    (VarianceNotRooted(), "is not the folded weight: in eval mode a BatchNorm computes"),
    (NoBiasCreated(), "layer '0' (Conv2d, folded with BatchNorm '1') has no bias after folding"),
    (InPlace(), "fold_batchnorm changed the GraphModule passed in"),
    (SharesTheLayers(), "changed the GraphModule passed in (its state entries 0.bias"),
    (NotRecompiled(), "Call recompile() after editing the graph"),
    (DeadModulesLeft(), "still holds BatchNorm submodule(s) '1', '6.1', '9'"),
])
def test_wrong_answers_fail_the_public_check(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_folding_a_layer_that_has_another_user_fails_on_a_hidden_model():
    v = assert_rejected(EX, IgnoresOtherUsers(), "BatchNorm 'branch_bn' was removed, but it "
                        "cannot be folded: its input, the output of 'branch', is also used by add")
    assert v.message.startswith("hidden check 2/2"), v.message


@pytest.mark.parametrize("seed", [0, 1])
def test_fuse_keeps_the_batchnorms_the_contract_keeps(seed):
    """The judge takes which BatchNorms remain from torch's fuse: on the checks' models its
    rules are the contract's (a Conv or Linear call_module input with no other user)."""
    g = torch.Generator().manual_seed(seed)
    for spec in (fx_pass.PUBLIC, fx_pass.residual_spec(g, "2d"), fx_pass.residual_spec(g, "1d"),
                 fx_pass.mlp_spec(g)):
        model = probes.fold_model(spec)
        probes.fold_statistics(model, g)
        traced = torch.fx.symbolic_trace(model)
        folded = probes.batchnorm_targets(Fold()(traced))
        assert probes.batchnorm_targets(fuse(model)) == folded
        assert len(folded) < len(probes.batchnorm_targets(traced))  # (some fold, some stay)


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv2(torch.relu(self.bn1(self.conv1(x))))
        return self.bn2(y) + y


def test_the_picture_marks_what_the_pass_removed_and_changed():
    before = torch.fx.symbolic_trace(_Residual().eval())
    fig = render(viz.fx_before_after(before, Fold()(before)))
    patches = fig.axes[0].patches
    assert [p.get_gid() for p in by_gid(patches, "before:removed:")] == ["before:removed:bn1"]
    changed = {p.get_gid() for p in by_gid(patches, "after:changed:")}
    assert changed == {"after:changed:conv1", "after:changed:relu"}  # folded; rewired
    assert by_gid(patches, "after:node:bn2") and not by_gid(patches, "after:new:")
    assert by_gid(patches, "after:edge:conv2->add") and by_gid(patches, "before:edge:bn1->relu")
    assert not by_gid(patches, "after:edge:bn1->relu")


def test_the_picture_of_one_graph_says_no_pass_ran():
    fig = render(viz.fx_before_after(torch.fx.symbolic_trace(_Residual().eval())))
    patches = fig.axes[0].patches
    assert len(by_gid(patches, "before:node:")) == 8 and not by_gid(patches, "after:")
    assert any("no pass applied" in t.get_text() for t in fig.axes[0].texts)
