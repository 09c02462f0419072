"""Checks of ``export.mini-interpreter``: ``interpret(ep, *args)`` must run the graph of a
decomposed (functional, ``run_decompositions()``) ExportedProgram node by node, from
``ep.graph_signature`` and the program's state: bind each placeholder to ``ep.state_dict[target]``
(parameters, persistent buffers), ``ep.constants[target]`` (non-persistent buffers, constant
tensors) or the next user argument; call each ``call_function`` node's target on its arguments'
values (Nodes replaced inside lists, tuples and kwargs too; ``operator.getitem`` included); then
write each ``BUFFER_MUTATION`` output into its buffer and each ``USER_INPUT_MUTATION`` output into
the caller's tensor (``copy_``), and return the ``USER_OUTPUT`` values as a tuple. The oracle is
``copy.deepcopy(ep).module()`` (the unlifted module, which writes the mutations back itself),
called with the same arguments; outputs, mutated inputs and, after two calls, every buffer are
compared (a buffer rebound to a new tensor with the right values is accepted). The answer runs
in the kernel (the probe :func:`labs.export.probes.interpreted`, which exports the same model,
its weights sent as a state dict, and reports what it returned, the arguments and buffers it
left). An answer that runs the program by a ready-made path (a GraphModule's generated forward,
``torch.fx.Interpreter``, ``ep.module()``, calling ``ep``: ``models`` in the lab table) fails,
whatever it returns. Public: ``models.Counter``.
Hidden (seeded sizes): BatchNorm1d in train mode, an input written in place with multi-output ops
(``max(dim)``, ``split``) and list arguments (``cat``), and ops with kwargs (``div``
``rounding_mode``, ``_to_copy`` ``dtype``, ``sort`` ``stable``). (torch/fx/interpreter.py:
Interpreter.run, run_node; torch/export/_unlift.py: _unlift_exported_program_lifted_states,
_insert_copy_for_mutations; torch/export/graph_signature.py: InputKind, OutputKind.)"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn
from torch.utils import _pytree as pytree

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.export import probes

EXERCISE = "export.mini-interpreter"
CALLS = 2
def _quiet(fn, *args):
    """``fn(*args)`` with torch's own warnings (deprecations while it exports or copies a
    program) kept out of the learner's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


#: what an ATen op says when it is handed a node's list argument as it is (Nodes inside)
_NODES_IN_A_LIST = ("immutable_list", "immutable_dict")


def _explained(run: dict, ep, when: str) -> None:
    """Turn three likely slips into a message that says what went wrong: an op handed a node's
    list argument with the Nodes still inside (``aten.cat``'s tensors), and the KeyErrors of
    looking a non-persistent buffer or constant up in ``ep.state_dict`` and of matching
    placeholders to input specs by name after ``copy.deepcopy`` renamed one (``input`` ->
    ``input_1``)."""
    raised = run["raised"]
    key, where = run["key"], raised.get("where", "")
    said = f"{raised.get('ename', '')}: {raised.get('evalue', '')}"
    if key is None and any(kind in said for kind in _NODES_IN_A_LIST):
        raise CheckFailure(
            f"{when}, your answer raised {said.strip().splitlines()[0][:200]}{where}. A "
            "node's args are not "
            "only Nodes and constants: they hold lists and tuples too "
            "(torch.fx.immutable_collections.immutable_list), whose elements may be Nodes "
            "(aten.cat's tensors). Replace the Nodes inside them by their values as well, at "
            "any depth (torch.fx.node.map_arg does), and pass the op a list of tensors.")
    if key is None:
        return
    mine = _quiet(copy.deepcopy, ep)  # (the copy the answer ran on: the same renaming)
    nodes = [n.name for n in mine.graph.nodes if n.op == "placeholder"]
    renamed = [(n, s.arg.name) for n, s in zip(nodes, mine.graph_signature.input_specs)
               if n != s.arg.name]
    for node, spec in renamed:
        if key in (node, spec):
            raise CheckFailure(
                f"{when}, your answer raised KeyError: {key!r}{where}. The "
                f"placeholder {node!r} is the input spec named {spec!r}: copy.deepcopy(ep), "
                "which the check runs your answer on, renames a placeholder called `input`. "
                "The input specs are in placeholder order: match them by position, not by "
                "name.")
    if key in ep.constants and key not in ep.state_dict:
        raise CheckFailure(
            f"{when}, your answer raised KeyError: {key!r}{where}. {key} is not "
            "in ep.state_dict: non-persistent buffers and constant tensors are in "
            "ep.constants.")


def _state(ep, name: str) -> torch.Tensor:
    return ep.state_dict[name] if name in ep.state_dict else ep.constants[name]


def compare(interpret, spec: list, model: nn.Module, example: tuple, draw, what: str) -> None:
    """Have the kernel run ``interpret`` on ``copy.deepcopy(ep)`` (``ep`` the decomposed program
    of ``model``, built there from ``spec`` and its state), ``CALLS`` times on the arguments
    ``draw()`` returns; run the oracle ``copy.deepcopy(ep).module()`` here on the same; compare
    the outputs and the mutated inputs after each call, and the buffers after the last."""
    state = dict(model.state_dict())  # (before export, which leaves it as it is anyway)
    ep = probes.core_aten(model, example)
    oracle = _quiet(lambda: copy.deepcopy(ep).module())
    sig = ep.graph_signature
    n_out = sum(s.kind.name == "USER_OUTPUT" for s in sig.output_specs)
    written = [s.target for s in sig.output_specs if s.kind.name == "USER_INPUT_MUTATION"]
    names = [s.arg.name for s in sig.input_specs if s.kind.name == "USER_INPUT"]
    calls = [list(draw()) for _ in range(CALLS)]
    seen = interpret.probe(probes.interpreted, spec, state, list(example), calls)
    for call, (args, run) in enumerate(paired(calls, seen["calls"], "calls"), start=1):
        when = f"for {what}, call {call} of {CALLS}"
        if "raised" in run:
            _explained(run, ep, when)
            raise AnswerRaised(run["raised"])
        theirs = copy.deepcopy(args)
        want = pytree.tree_leaves(oracle(*theirs))
        if run["type"] != "tuple":
            raise CheckFailure(f"{when}, interpret's result has type {run['type']}, "
                               + ("a subclass of tuple; return a plain tuple."
                                  if run["values"] is not None else "not a tuple."))
        got = run["values"]
        if len(got) != n_out:
            extra = (" You returned every output of the graph: the BUFFER_MUTATION and "
                     "USER_INPUT_MUTATION ones are written back, not returned."
                     if len(got) == len(sig.output_specs) else "")
            raise CheckFailure(f"{when}, interpret returned {len(got)} values; the program has "
                               f"{n_out} user outputs (USER_OUTPUT in ep.graph_signature."
                               f"output_specs), in that order.{extra}")
        for i, (have, real) in enumerate(zip(got, want)):
            if not isinstance(have, torch.Tensor):
                raise CheckFailure(f"{when}, output {i} has type {have['type']}, not a "
                                   "plain Tensor.")
            torch.testing.assert_close(have, real.detach(), msg=lambda m, i=i, when=when: (
                f"{when}, output {i} differs from what ep.module() returns: {m}"))
        for name, have, real, before in zip(names, run["args"], theirs, args, strict=True):
            if not _same(have, real):
                how = ("is unchanged: write each USER_INPUT_MUTATION output into the caller's "
                       "tensor (copy_)" if torch.equal(have, before) and name in written else
                       "differs from what ep.module() leaves in it")
                raise CheckFailure(f"{when}, the user input {name} {how}.")
    for name, real in oracle.named_buffers():
        have = seen["buffers"].get(name)
        if have is None:
            raise CheckFailure(f"for {what}, after {CALLS} calls the buffer {name} is no longer "
                               "a tensor in ep.state_dict or ep.constants: write each "
                               "BUFFER_MUTATION output into it with copy_.")
        if _same(have, real):
            continue
        how = ("Yours still holds its value from before the first call. Write each "
               "BUFFER_MUTATION output into ep.state_dict[target] (persistent) or "
               "ep.constants[target] (non-persistent), with copy_" if torch.equal(
                   have, _state(ep, name)) else
               "Is each call's new value written once, after the whole graph ran?")
        raise CheckFailure(f"for {what}, after {CALLS} calls the buffer {name} holds "
                           f"{_short(have)}; ep.module() leaves {_short(real)} in it. {how}.")


def _same(have: torch.Tensor, real: torch.Tensor) -> bool:
    """Same shape, dtype and values, floating-point ones within assert_close's tolerance for
    the dtype: the kernel computed ``have`` with its thread count, the judge ``real`` with its
    own, and a reduction's order of summation follows the thread count."""
    try:
        torch.testing.assert_close(have, real.detach(), check_device=False)
    except AssertionError:
        return False
    return True


def _short(t: torch.Tensor) -> str:
    flat = t.detach().reshape(-1)
    text = ", ".join(f"{float(v):.4g}" for v in flat[:4]) + (", ..." if flat.numel() > 4 else "")
    return f"[{text}]"


@check(EXERCISE)
def counter(interpret, ctx):
    """runs models.Counter's decomposed program twice like ep.module()"""
    g = ctx.generator()
    width, batch = (int(v) for v in torch.randint(2, 7, (2,), generator=g))
    spec = ["counter", width]
    compare(interpret, spec, probes.interpreter_model(spec),
            (torch.randn(batch, width), torch.randn(batch, width)),
            lambda: (torch.randn(batch, width, generator=g),
                     torch.randn(batch, width, generator=g)),
            f"models.Counter({width}) on x, y of shape ({batch}, {width})")


@check(EXERCISE, hidden=True)
def batchnorm_mutated_input_kwargs(interpret, ctx):
    """BatchNorm1d in train mode, an input written in place with max/split/cat, kwargs"""
    g = ctx.generator(1)
    width, batch, hidden = (int(v) for v in torch.randint(3, 9, (3,), generator=g))
    spec = ["batchnorm", width, hidden]
    compare(interpret, spec, probes.interpreter_model(spec), (torch.randn(batch, width),),
            lambda: (torch.randn(batch, width, generator=g),),
            f"Sequential(Linear({width}, {hidden}), BatchNorm1d({hidden}), ReLU) in train mode")
    cut = int(torch.randint(1, width, (1,), generator=g))
    spec = ["mixer", width, cut]
    compare(interpret, spec, probes.interpreter_model(spec),
            (torch.randn(batch, width), torch.randn(batch, width)),
            lambda: (torch.randn(batch, width, generator=g),
                     torch.randn(batch, width, generator=g)),
            f"Mixer({width}, cut {cut}): forward(x, acc) writes acc in place, takes max(dim=1), "
            "split and cat")
    compare(interpret, ["kwargs"], probes.interpreter_model(["kwargs"]),
            (torch.randn(batch, width), torch.randn(batch, width)),
            lambda: (torch.randn(batch, width, generator=g) * 4,
                     torch.randn(batch, width, generator=g)),
            f"Kwargs on x, y of shape ({batch}, {width}): div(rounding_mode='floor'), "
            "to(float64), sort(descending=True, stable=True)")
