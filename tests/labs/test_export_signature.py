"""export.signature: plausible wrong signature predictions fail, called directly through
run_checks. Each is the reference answer with one rule changed. The reference and the stub are
tested for every exercise in test_exercise_contract.py."""
import copy
import inspect

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from tests.conftest import assert_rejected

EX = "export.signature"


def flawed(flaw):
    """The reference answer with one flaw."""

    def predict_signature(model, args):
        twin, twin_args = copy.deepcopy(model), copy.deepcopy(args)
        params = [n for n, _ in twin.named_parameters(remove_duplicate=flaw == "deduplicated")]
        buffers = dict(twin.named_buffers(remove_duplicate=False))
        if flaw == "state_dict buffers":
            buffers = {n: b for n, b in buffers.items() if n in twin.state_dict()}
        state = {id(t) for t in [*twin.parameters(), *buffers.values()]}
        attrs = {id(v): f"{prefix}.{n}".lstrip(".")
                 for prefix, mod in twin.named_modules(remove_duplicate=False)
                 for n, v in vars(mod).items()
                 if isinstance(v, torch.Tensor) and id(v) not in state}
        used = []

        class FirstUse(TorchFunctionMode):
            def __torch_function__(self, func, types, fargs=(), kwargs=None):
                for leaf in pytree.tree_leaves((fargs, kwargs)):
                    if id(leaf) in attrs and attrs[id(leaf)] not in used:
                        used.append(attrs[id(leaf)])
                return func(*fargs, **(kwargs or {}))

        before = {n: (b._version, b.clone()) for n, b in buffers.items()}
        tensors = [(i, a, a._version, a.clone()) for i, a in enumerate(twin_args)]
        with torch.no_grad(), FirstUse():
            out = twin(*twin_args)

        def written(t, version, old):
            return t._version != version or (flaw != "_version only" and not torch.equal(t, old))

        kept = {n for n in buffers if n not in twin.state_dict()}  # (non-persistent)
        state_inputs = [("CONSTANT_TENSOR" if flaw == "non-persistent as constants" and n in kept
                         else "BUFFER", n) for n in buffers]
        if flaw == "every tensor attribute a constant":  # (export lifts what forward reads)
            used += [n for n in attrs.values() if n not in used]
        state_inputs += [("CONSTANT_TENSOR", n) for n in used]
        if flaw == "constants first":
            state_inputs = state_inputs[::-1]
        forward = type(twin).forward if flaw == "self is an input" else twin.forward
        names = list(inspect.signature(forward).parameters)[: len(args)]
        inputs = [("PARAMETER", n) for n in params] + state_inputs
        inputs += [("USER_INPUT", n) for n in names]
        if flaw == "user inputs first":
            inputs = inputs[-len(names):] + inputs[:-len(names)]
        outputs = [("BUFFER_MUTATION", fqn) for kind, fqn in inputs
                   if kind == "BUFFER" and written(buffers[fqn], *before[fqn])]
        outputs += [("USER_INPUT_MUTATION", names[i]) for i, a, version, old in tensors
                    if written(a, version, old)]
        outputs += [("USER_OUTPUT", None)] * len(pytree.tree_leaves(out))
        return {"inputs": inputs, "outputs": outputs}

    return predict_signature


@pytest.mark.parametrize("flaw, phrase", [
    ("state_dict buffers",
     ("inputs[4]: the exported program has ('BUFFER', 'scale'); you predicted "
      "('USER_INPUT', 'x')")),
    ("non-persistent as constants",
     "inputs[4]: the exported program has ('BUFFER', 'scale'); you predicted ('CONSTANT_TENSOR', "
     "'scale')"),
    ("user inputs first", "inputs[2] is ('PARAMETER', 'lin.weight'), after ('USER_INPUT', 'y'): "
     "placeholders come in three blocks"),
    ("self is an input",
     ("inputs[5]: the exported program has ('USER_INPUT', 'x'); you predicted ('USER_INPUT', "
      "'self'). The user inputs come last, one per forward argument")),
])
def test_wrong_answers_fail(flaw, phrase):
    v = assert_rejected(EX, flawed(flaw), phrase)
    assert v.message.startswith("check 1/3"), v.message


@pytest.mark.parametrize("flaw, phrase", [
    ("_version only",
     ("in train mode, outputs[0]: the exported program has ('BUFFER_MUTATION', "
      "'1.running_mean'); you predicted ('BUFFER_MUTATION', '1.num_batches_tracked')")),
    ("deduplicated", "the exported program has ('PARAMETER', 'head.weight')"),
    ("every tensor attribute a constant", "('CONSTANT_TENSOR', 'spare')"),
])
def test_wrong_answers_fail_on_hidden_cases(flaw, phrase):
    v = assert_rejected(EX, flawed(flaw), phrase)
    assert v.message.startswith("hidden check 2/3"), v.message


def exports(model, args):
    """Asks export itself (what the exercise forbids)."""
    ep = torch.export.export(model, args).run_decompositions()
    sig = ep.graph_signature
    return {"inputs": [(s.kind.name, s.arg.name if s.kind.name == "USER_INPUT" else s.target)
                       for s in sig.input_specs],
            "outputs": [(s.kind.name, s.target) for s in sig.output_specs]}


def lowered_by_aot_autograd(model, args):
    """Reads the lifted inputs from AOTAutograd's export (the machinery under export), then
    answers as the reference does."""
    from torch._functorch.aot_autograd import aot_export_module

    aot_export_module(copy.deepcopy(model), copy.deepcopy(args), trace_joint=False)
    return flawed(None)(model, args)


@pytest.mark.parametrize("answer, phrase", [
    (exports, "your answer ran torch/export/"),
    (lowered_by_aot_autograd, "your answer ran torch/_functorch/aot_autograd.py: "
                              "aot_export_module"),
])
def test_running_export_itself_fails(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/3"), v.message
    assert "mechanism this exercise asks you to model" in v.message, v.message
