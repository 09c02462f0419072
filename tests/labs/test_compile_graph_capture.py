"""compile.graph-capture: plausible wrong recorders fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch

from tests.conftest import assert_rejected

EX = "compile.graph-capture"


class Right:
    def __init__(self):
        self.graphs, self.example_inputs = [], []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        self.example_inputs.append(example_inputs)
        return gm.forward


class FirstOnly(Right):
    def __call__(self, gm, example_inputs):
        if not self.graphs:
            super().__call__(gm, example_inputs)
        return gm.forward


class LastOnly(Right):
    def __call__(self, gm, example_inputs):
        self.graphs[:] = [gm]
        self.example_inputs[:] = [example_inputs]
        return gm.forward


class ReturnsNone(Right):
    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)


class ReturnsZeros(Right):
    """Returns a callable that never runs the graph."""

    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        return lambda *args: [torch.zeros_like(a) for a in args]


class KeepsTheGraph(Right):
    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        self.graphs[-1] = gm.graph
        return gm.forward


class SharedLists:
    graphs = []  # noqa: RUF012  (the mistake: one list for every recorder)
    example_inputs = []  # noqa: RUF012

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        self.example_inputs.append(example_inputs)
        return gm.forward


class KeepsShapes(Right):
    """Keeps the shapes, not the example inputs."""

    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        self.example_inputs[-1] = [tuple(t.shape) for t in example_inputs]
        return gm.forward


class NewestFirst(Right):
    def __call__(self, gm, example_inputs):
        self.graphs.insert(0, gm)
        self.example_inputs.insert(0, example_inputs)
        return gm.forward


def test_a_right_recorder_passes():
    from grader.checks import run_checks

    v = run_checks(EX, Right, seed=1)
    assert v.status == "passed", v.message


@pytest.mark.parametrize("answer, phrase", [
    (FirstOnly, "Append every graph"),
    (LastOnly, "Append every graph"),
    (ReturnsNone, "cannot call"),
    (ReturnsZeros, "output differs from eager"),
    (KeepsTheGraph, "not an fx.GraphModule"),
    (SharedLists, "Create them in __init__"),
    (KeepsShapes, "a tuple, not a tensor"),
    (NewestFirst, "in the order your backend receives them"),
])
def test_wrong_recorders_fail(answer, phrase):
    assert_rejected(EX, answer, phrase)


def test_a_function_instead_of_a_class_is_refused():
    assert_rejected(EX, lambda gm, example_inputs: gm.forward, "define a class")


class DropsRepeats(Right):
    """Keeps a graph only when its code differs from every graph kept so far."""

    def __call__(self, gm, example_inputs):
        if all(kept.code != gm.code for kept in self.graphs):
            self.graphs.append(gm)
            self.example_inputs.append(example_inputs)
        return gm.forward


def test_a_recorder_that_drops_repeated_graphs_fails_on_a_hidden_case():
    from grader.checks import run_checks

    for seed in (0, 1):
        v = run_checks(EX, DropsRepeats, seed=seed, hidden=True)
        assert v.status == "failed" and "identical graphs" in v.message, v.message
        assert v.passed == 1, v.message  # (the public check passes)
