"""export.graph-pass: plausible wrong graph passes fail, called directly through run_checks. Each
is the reference answer (rewritten with one method per step, so that one step can be overridden)
with one step changed. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import pytest
import torch

from tests.conftest import assert_rejected

EX = "export.graph-pass"
aten = torch.ops.aten


class Fuse:
    """The reference answer, one method per step."""

    def matches(self, relu):
        addmm = relu.args[0]
        return (addmm.target is aten.addmm.default and len(addmm.users) == 1
                and addmm.args[2].target is aten.permute.default
                and len(addmm.args[2].users) == 1)

    def arguments(self, addmm):
        bias, x, transposed = addmm.args
        return x, transposed.args[0], bias

    def replace(self, gm, relu):
        with gm.graph.inserting_before(relu):
            fused = gm.graph.call_function(torch.ops.course.linear_relu.default,
                                           self.arguments(relu.args[0]))
        fused.meta = dict(relu.meta)
        relu.replace_all_uses_with(fused)

    def finish(self, gm):
        gm.graph.eliminate_dead_code()
        gm.recompile()

    def __call__(self, gm):
        rewrites = 0
        for node in list(gm.graph.nodes):
            if node.target is aten.relu.default and self.matches(node):
                self.replace(gm, node)
                rewrites += 1
        self.finish(gm)
        return rewrites


class IgnoresOtherUsers(Fuse):
    """Fuses an addmm that also feeds a residual add."""

    def matches(self, relu):
        return relu.args[0].target is aten.addmm.default


class EveryAddmm(Fuse):
    """Turns every addmm into linear_relu and drops a relu after it if there is one."""

    def __call__(self, gm):
        rewrites = 0
        for addmm in list(gm.graph.nodes):
            if addmm.target is not aten.addmm.default:
                continue
            with gm.graph.inserting_before(addmm):
                fused = gm.graph.call_function(torch.ops.course.linear_relu.default,
                                               self.arguments(addmm))
            fused.meta = dict(addmm.meta)
            addmm.replace_all_uses_with(fused)
            for user in list(fused.users):
                if user.target is aten.relu.default:
                    user.replace_all_uses_with(fused)
            rewrites += 1
        self.finish(gm)
        return rewrites


class WeightAndBiasSwapped(Fuse):
    def arguments(self, addmm):
        bias, x, transposed = addmm.args
        return x, bias, transposed.args[0]


class OldNodesLeft(Fuse):
    """Reroutes the uses but never removes the old nodes."""

    def finish(self, gm):
        gm.recompile()


class NoMeta(Fuse):
    """Inserts the new node without the meta (meta['val']) of the relu it replaces."""

    def replace(self, gm, relu):
        with gm.graph.inserting_before(relu):
            fused = gm.graph.call_function(torch.ops.course.linear_relu.default,
                                           self.arguments(relu.args[0]))
        relu.replace_all_uses_with(fused)


class NotRecompiled(Fuse):
    def finish(self, gm):
        gm.graph.eliminate_dead_code()


@pytest.mark.parametrize("answer, phrase", [
    (EveryAddmm(), "fuse_linear_relu returned 3 for the program of models.mlp([16, 32, 32, 4]), "
                   "which has 2 pair(s) to fuse"),
    (WeightAndBiasSwapped(), "linear_relu_default gets the parameter 0.bias as its weight"),
    (OldNodesLeft(), "keeps nodes that nothing uses: relu, relu_1. Call "
                     "gm.graph.eliminate_dead_code()"),
    (NoMeta(), "is missing val field. A new node needs meta['val']"),
    (NotRecompiled(), "gm still runs the code generated before the edit. Call gm.recompile()"),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_fusing_a_linear_with_a_residual_fails_on_a_hidden_case():
    v = assert_rejected(EX, IgnoresOtherUsers(), "An addmm with other users than the relu (a "
                                                 "residual add) must stay")
    assert v.message.startswith("hidden check 2/2") and "Mixed(" in v.message, v.message
