"""export.unflatten: plausible wrong answers fail, called directly through run_checks, each
with a message that says what to fix. Most are the reference answer with one step changed. The
reference and the stub are tested for every exercise in test_exercise_contract.py (and the
reference, in a kernel, by test_labs_end_to_end.py)."""
import operator

import pytest
import torch
from torch import nn

from grader.checks import run_checks
from tests.conftest import assert_rejected

EX = "export.unflatten"
#: what the check says of an answer that runs the PyTorch code the exercise models
MODELLED = "the mechanism this exercise asks you to model"


def flawed(flaw: str):
    """The reference answer with one flaw."""

    def unflatten(ep):
        sig = ep.graph_signature
        owned = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
        nodes = [node for node in ep.graph.nodes if node.op == "call_function"]
        path = {node: [fqn for fqn, _ in node.meta["nn_module_stack"].values() if fqn]
                for node in nodes}
        if flaw == "outermost entry":
            path = {node: fqns[:1] for node, fqns in path.items()}

        def build(prefix, part, reads, outs):
            fqn = prefix[-1] if prefix else ""
            graph, env, attrs = torch.fx.Graph(), {}, {}
            for node in reads:
                env[node] = graph.placeholder(node.name)

            def value(node):
                if node not in env:
                    name = owned[node.name].removeprefix(f"{fqn}." if fqn else "")
                    if flaw == "flattened names":  # (only the root reads them: passed down)
                        name = owned[node.name].replace(".", "_")
                    attrs[name] = ep.state_dict[owned[node.name]]
                    if flaw == "buffers as parameters":
                        attrs[name] = nn.Parameter(attrs[name], requires_grad=False)
                    env[node] = graph.get_attr(name)
                return env[node]

            i = 0
            while i < len(part):
                node = part[i]
                if len(path[node]) == len(prefix):
                    env[node] = graph.node_copy(node, value)
                    i += 1
                    continue
                child = path[node][: len(prefix) + 1]
                j = i
                while j < len(part) and path[part[j]][: len(child)] == child:
                    j += 1
                run, inside = part[i:j], set(part[i:j])
                reads = list(dict.fromkeys(
                    a for n in run for a in n.all_input_nodes
                    if a not in inside and (a.name not in owned or flaw == "flattened names")))
                outs_ = [n for n in run if any(u not in inside for u in n.users)]
                name = child[-1].removeprefix(f"{fqn}." if fqn else "")
                attrs[name] = build(child, run, reads, outs_)
                call = graph.call_module(name, tuple(value(a) for a in reads))
                if len(outs_) == 1:
                    env[outs_[0]] = call
                else:
                    for k, out in enumerate(outs_):
                        env[out] = graph.call_function(operator.getitem, (call, k))
                i = j
            if prefix and len(outs) == 1:
                graph.output(env[outs[0]])
            else:
                graph.output(tuple(env[o] for o in outs))
            return torch.fx.GraphModule(attrs, graph)

        users = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name not in owned]
        return build([], nodes, users, list(ep.graph.output_node().args[0]))

    return unflatten


def flat(with_empty_submodules: bool):
    """The whole graph in the root, the parameters and buffers under their FQNs (what
    ep.module() builds, by hand); with every module of the stacks there too, empty."""

    def unflatten(ep):
        sig = ep.graph_signature
        owned = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
        graph, env, attrs = torch.fx.Graph(), {}, {}
        for node in ep.graph.nodes:
            if node.op == "placeholder" and node.name in owned:
                attrs[owned[node.name]] = ep.state_dict[owned[node.name]]
                env[node] = graph.get_attr(owned[node.name])
            elif node.op == "placeholder":
                env[node] = graph.placeholder(node.name)
            elif node.op == "call_function":
                env[node] = graph.node_copy(node, env.__getitem__)
        graph.output(tuple(env[o] for o in ep.graph.output_node().args[0]))
        root = torch.fx.GraphModule(attrs, graph)
        if with_empty_submodules:
            for node in ep.graph.nodes:
                for fqn, _ in node.meta.get("nn_module_stack", {}).values():
                    parent = root
                    for name in filter(None, fqn.split(".")):
                        if not hasattr(parent, name):
                            parent.add_module(name, nn.Module())
                        parent = getattr(parent, name)
        return root

    return unflatten


@pytest.mark.parametrize("answer, phrase", [
    (flat(False), "your module has no submodule 'blocks.0.ff.1'"),
    (flat(True), ("the submodule stem was never called; torch.export.unflatten(ep)'s stem is "
                  "called 1 time(s). Each submodule runs its own part of the graph")),
    (flawed("outermost entry"), "a node runs in the module of its innermost (last) entry"),
    (flawed("flattened names"), ("the parameter blocks.0.ff.0.bias is not among your module's "
                                 "parameters (yours: blocks_0_ff_0_bias")),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_a_buffer_registered_as_a_parameter_fails_on_the_hidden_model_with_buffers():
    v = assert_rejected(EX, flawed("buffers as parameters"),
                        "the buffer stages.0.norm.mean is not among your module's buffers")
    assert "it is among your parameters: register it as a buffer" in v.message, v.message
    assert v.message.startswith("hidden check 2/2"), v.message


def test_the_outermost_entry_misses_the_nested_submodules():
    v = assert_rejected(EX, flawed("outermost entry"), "no submodule 'blocks.0.ff.1'")
    assert "every prefix of one" in v.message, v.message


@pytest.mark.parametrize("answer", [
    pytest.param(lambda ep: torch.export.unflatten(ep), id="torch.export.unflatten"),
    pytest.param(lambda ep: ep.module(), id="ep.module()"),
])
def test_running_the_mechanism_itself_fails(answer):
    assert_rejected(EX, answer, MODELLED)


def test_an_answer_that_is_torchs_unflatten_fails():
    assert_rejected(EX, torch.export.unflatten, "your answer is torch/export/unflatten.py: "
                                                "unflatten, PyTorch's own code")


def test_something_else_than_a_module_fails():
    assert_rejected(EX, lambda ep: ep.graph_module.code,
                    "unflatten returned a str, not a torch.nn.Module")


@pytest.mark.parametrize("seed", [3, 4])
def test_the_reference_passes_on_other_seeds(reference, seed):
    v = run_checks(EX, reference(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message
