"""export.mini-interpreter: plausible wrong interpreters fail, called directly through
run_checks. Each is the reference answer with one step changed. The reference and the stub are
tested for every exercise in test_exercise_contract.py."""
import pytest
import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from tests.conftest import assert_rejected

EX = "export.mini-interpreter"


def flawed(flaw):
    """The reference answer with one flaw."""

    def interpret(ep, *args):
        if flaw == "runs ep.module()":
            return tuple(pytree.tree_leaves(ep.module()(*args)))
        if flaw == "runs the graph module":  # (the lifted state passed in as inputs)
            flat = [ep.state_dict[s.target] if s.target in ep.state_dict else
                    ep.constants.get(s.target) for s in ep.graph_signature.input_specs
                    if s.kind.name != "USER_INPUT"]
            ep.graph_module(*flat, *args)
        sig = ep.graph_signature
        env, inputs, user_args = {}, {}, iter(args)
        placeholders = [node for node in ep.graph.nodes if node.op == "placeholder"]
        specs = {spec.arg.name: spec for spec in sig.input_specs}
        for i, node in enumerate(placeholders):
            spec = specs[node.name] if flaw == "matched by name" else sig.input_specs[i]
            if spec.kind == InputKind.USER_INPUT:
                env[node] = next(user_args)
            elif spec.target in ep.state_dict or flaw == "state_dict only":
                env[node] = ep.state_dict[spec.target]
            else:
                env[node] = ep.constants[spec.target]
            inputs[spec.arg.name] = env[node]

        def value(arg):
            if flaw == "top-level Nodes only":
                seq = [env[a] if isinstance(a, torch.fx.Node) else a for a in arg] \
                    if isinstance(arg, (list, tuple)) else arg
                return type(arg)(seq) if isinstance(arg, tuple) else seq
            return torch.fx.node.map_arg(arg, env.__getitem__)

        for node in ep.graph.nodes:
            if node.op == "call_function":
                env[node] = node.target(*value(node.args), **value(node.kwargs))
            elif node.op == "output":
                results = value(node.args[0])
        if flaw == "returns every output":
            return tuple(results)
        outputs = []
        for spec, result in zip(sig.output_specs, results, strict=True):
            if spec.kind == OutputKind.BUFFER_MUTATION and flaw != "no mutations":
                state = ep.state_dict if spec.target in ep.state_dict else ep.constants
                state[spec.target].copy_(result)
            elif spec.kind == OutputKind.USER_INPUT_MUTATION and flaw != "no mutations":
                inputs[spec.target].copy_(result)
            elif spec.kind == OutputKind.USER_OUTPUT:
                outputs.append(result)
        return tuple(outputs)

    return interpret


@pytest.mark.parametrize("flaw, phrase", [
    ("no mutations", ("after 2 calls the buffer calls holds [0]; ep.module() leaves [2] in it. "
                      "Yours still holds its value from before the first call")),
    ("state_dict only", ("scale is not in ep.state_dict: non-persistent buffers and constant "
                         "tensors are in ep.constants")),
    ("returns every output", ("interpret returned 3 values; the program has 2 user outputs "
                              "(USER_OUTPUT in ep.graph_signature.output_specs), in that order. "
                              "You returned every output of the graph")),
    ("runs ep.module()", "your answer ran torch/export/exported_program.py: "
                         "ExportedProgram.module"),
    ("runs the graph module", "your answer ran torch/fx/graph_module.py: _WrappedCall.__call__"),
])
def test_wrong_answers_fail(flaw, phrase):
    v = assert_rejected(EX, flawed(flaw), phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_matching_placeholders_by_name_fails_on_a_hidden_case():
    v = assert_rejected(EX, flawed("matched by name"), "your answer raised KeyError: 'input_1'")
    assert "The placeholder 'input_1' is the input spec named 'input'" in v.message, v.message
    assert v.message.startswith("hidden check 2/2 'BatchNorm1d in train mode"), v.message


def test_nodes_left_inside_a_list_argument_are_explained():
    v = assert_rejected(EX, flawed("top-level Nodes only"), "immutable_list")
    assert v.message.startswith("hidden check 2/2"), v.message
    assert "Replace the Nodes inside them by their values as well" in v.message, v.message


def test_buffers_and_inputs_compare_within_the_dtypes_tolerance_not_bit_for_bit():
    """The kernel's interpreter and the judge's ep.module() run with different thread counts
    (one per job under --jobs 2), so a buffer's float sum may differ in its last bit: that is
    the same value; a real difference, or an integer one, is not."""
    from labs.export.checks.mini_interpreter import _same

    real = torch.tensor([0.1058, 0.08743, 0.05771, -0.04432])
    assert _same(torch.nextafter(real, real + 1), real)
    assert not _same(real + 1e-3, real)
    assert not _same(real.double(), real)  # (a dtype changed is a difference)
    assert _same(torch.arange(3), torch.arange(3))
    assert not _same(torch.arange(3) + 1, torch.arange(3))
