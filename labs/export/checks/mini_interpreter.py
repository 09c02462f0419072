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
compared (a buffer rebound to a new tensor with the right values is accepted). While the answer
runs, calling a GraphModule (``ep.module()(...)``, ``ep.graph_module(...)``, ``.forward``),
``torch.fx.Interpreter.run``, ``ep.module`` and ``ep.__call__`` raise. Public: ``models.Counter``.
Hidden (seeded sizes): BatchNorm1d in train mode, an input written in place with multi-output ops
(``max(dim)``, ``split``) and list arguments (``cat``), and ops with kwargs (``div``
``rounding_mode``, ``_to_copy`` ``dtype``, ``sort`` ``stable``). (torch/fx/interpreter.py:
Interpreter.run, run_node; torch/export/_unlift.py: _unlift_exported_program_lifted_states,
_insert_copy_for_mutations; torch/export/graph_signature.py: InputKind, OutputKind.)"""

from __future__ import annotations

import contextlib
import copy
import warnings

import torch
from torch import nn
from torch.utils import _pytree as pytree

from grader.checks import CheckFailure, check, exact, learner_line, plain_tensor
from labs.export import models

EXERCISE = "export.mini-interpreter"
CALLS = 2
WALK = (
    "interpret must run the graph itself: {what} is disabled while the check runs your answer. "
    "Walk ep.graph.nodes: bind each placeholder (ep.graph_signature.input_specs says from where), "
    "call each call_function node's target on its arguments' values, then write the mutations "
    "back and return the user outputs.")


@contextlib.contextmanager
def _walk_it_yourself(gm: torch.fx.GraphModule):
    """Make every ready-made way to run the program raise CheckFailure while the answer runs:
    calling any GraphModule, ``gm.forward``, ``Interpreter.run``, ``ExportedProgram.module`` and
    ``__call__``. Everything is put back on the way out."""

    def refuse(what):
        def refused(*args, **kwargs):
            raise CheckFailure(WALK.format(what=what))
        return refused

    patches = [
        (torch.fx.graph_module._WrappedCall, "__call__", "calling a GraphModule"),
        (torch.fx.Interpreter, "run", "torch.fx.Interpreter.run"),
        (torch.export.ExportedProgram, "module", "ExportedProgram.module()"),
        (torch.export.ExportedProgram, "__call__", "calling the ExportedProgram"),
    ]
    saved = []
    try:
        for owner, attr, what in patches:
            saved.append((owner, attr, owner.__dict__[attr]))
            setattr(owner, attr, refuse(what))
        gm.forward = refuse("ep.graph_module.forward")
        yield
    finally:
        gm.__dict__.pop("forward", None)
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def _quiet(fn, *args):
    """``fn(*args)`` with torch's own warnings (deprecations while it exports or copies a
    program) kept out of the learner's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def program(model: nn.Module, args: tuple) -> torch.export.ExportedProgram:
    """``export(model, args).run_decompositions()``."""
    return _quiet(lambda: torch.export.export(model, args).run_decompositions())


@contextlib.contextmanager
def _explained(ep, when: str):
    """Turn the KeyErrors of two likely slips into a message that says what went wrong: looking
    a non-persistent buffer or constant up in ``ep.state_dict``, and matching placeholders to
    input specs by name after ``copy.deepcopy`` renamed one (``input`` -> ``input_1``)."""
    try:
        yield
    except KeyError as exc:
        key = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else None
        nodes = [n.name for n in ep.graph.nodes if n.op == "placeholder"]
        renamed = [(n, s.arg.name) for n, s in zip(nodes, ep.graph_signature.input_specs)
                   if n != s.arg.name]
        for node, spec in renamed:
            if key in (node, spec):
                raise CheckFailure(
                    f"{when}, your answer raised KeyError: {key!r}{learner_line(exc)}. The "
                    f"placeholder {node!r} is the input spec named {spec!r}: copy.deepcopy(ep), "
                    "which the check runs your answer on, renames a placeholder called `input`. "
                    "The input specs are in placeholder order: match them by position, not by "
                    "name.") from None
        if key in ep.constants and key not in ep.state_dict:
            raise CheckFailure(
                f"{when}, your answer raised KeyError: {key!r}{learner_line(exc)}. {key} is not "
                "in ep.state_dict: non-persistent buffers and constant tensors are in "
                "ep.constants.") from None
        raise


def _state(ep, name: str) -> torch.Tensor:
    return ep.state_dict[name] if name in ep.state_dict else ep.constants[name]


def compare(interpret, ep, draw, what: str) -> None:
    """Run ``interpret`` on a copy of ``ep`` and the oracle ``copy.deepcopy(ep).module()`` on
    another, ``CALLS`` times on the arguments ``draw()`` returns; compare the outputs and the
    mutated inputs after each call, and the buffers after the last."""
    mine, oracle = _quiet(copy.deepcopy, ep), _quiet(lambda: copy.deepcopy(ep).module())
    sig = ep.graph_signature
    n_out = sum(s.kind.name == "USER_OUTPUT" for s in sig.output_specs)
    written = [s.target for s in sig.output_specs if s.kind.name == "USER_INPUT_MUTATION"]
    names = [s.arg.name for s in sig.input_specs if s.kind.name == "USER_INPUT"]
    for call in range(1, CALLS + 1):
        args = draw()
        theirs, ours = copy.deepcopy(args), copy.deepcopy(args)
        want = pytree.tree_leaves(oracle(*theirs))
        when = f"for {what}, call {call} of {CALLS}"
        with _walk_it_yourself(mine.graph_module), _explained(mine, when):
            got = interpret(mine, *ours)
        exact(got, tuple, f"{when}, interpret's result")
        if len(got) != n_out:
            extra = (" You returned every output of the graph: the BUFFER_MUTATION and "
                     "USER_INPUT_MUTATION ones are written back, not returned."
                     if len(got) == len(sig.output_specs) else "")
            raise CheckFailure(f"{when}, interpret returned {len(got)} values; the program has "
                               f"{n_out} user outputs (USER_OUTPUT in ep.graph_signature."
                               f"output_specs), in that order.{extra}")
        for i, (have, real) in enumerate(zip(got, want)):
            plain_tensor(have, f"{when}, output {i}")
            torch.testing.assert_close(have, real, msg=lambda m, i=i, when=when: (
                f"{when}, output {i} differs from what ep.module() returns: {m}"))
        for name, have, real, before in zip(names, ours, theirs, args):
            if not torch.equal(have, real):
                how = ("is unchanged: write each USER_INPUT_MUTATION output into the caller's "
                       "tensor (copy_)" if torch.equal(have, before) and name in written else
                       "differs from what ep.module() leaves in it")
                raise CheckFailure(f"{when}, the user input {name} {how}.")
    for name, real in oracle.named_buffers():
        have = _state(mine, name)
        if torch.equal(have, real):
            continue
        how = ("Yours still holds its value from before the first call. Write each "
               "BUFFER_MUTATION output into ep.state_dict[target] (persistent) or "
               "ep.constants[target] (non-persistent), with copy_" if torch.equal(
                   have, _state(ep, name)) else
               "Is each call's new value written once, after the whole graph ran?")
        raise CheckFailure(f"for {what}, after {CALLS} calls the buffer {name} holds "
                           f"{_short(have)}; ep.module() leaves {_short(real)} in it. {how}.")


def _short(t: torch.Tensor) -> str:
    flat = t.detach().reshape(-1)
    text = ", ".join(f"{float(v):.4g}" for v in flat[:4]) + (", ..." if flat.numel() > 4 else "")
    return f"[{text}]"


# ----------------------------------------------------------------------------- the hidden models
class Mixer(nn.Module):
    """``forward(x, acc)``: writes ``acc`` in place (``acc.mul_(0.5).add_(h)``), takes
    ``max(dim=1)`` and ``split`` (multi-output ops: ``getitem`` nodes) and ``cat`` (a list
    argument); returns three tensors."""

    def __init__(self, width: int, cut: int):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.cut = cut

    def forward(self, x, acc):
        h = torch.tanh(self.lin(x))
        acc.mul_(0.5).add_(h)
        values, index = torch.max(h, dim=1)
        left, right = torch.split(acc, [self.cut, acc.shape[1] - self.cut], dim=1)
        mixed = torch.cat([right, left * values[:, None]], dim=1)
        return mixed, index, torch.stack([values, left.sum(1)]).sum(0)


class Kwargs(nn.Module):
    """Ops that keep keyword arguments in the decomposed graph: ``div`` with
    ``rounding_mode="floor"``, a float64 cast (``_to_copy(dtype=...)``) and a descending stable
    ``sort``."""

    def forward(self, x, y):
        floor = torch.div(x, y.abs() + 0.5, rounding_mode="floor")
        wide = x.to(torch.float64).cumsum(1)
        ranked = torch.sort(x + floor, dim=1, descending=True, stable=True).values
        return floor, wide, ranked


@check(EXERCISE)
def counter(interpret, ctx):
    """runs models.Counter's decomposed program twice like ep.module()"""
    g = ctx.generator()
    width, batch = (int(v) for v in torch.randint(2, 7, (2,), generator=g))
    ep = program(models.Counter(width), (torch.randn(batch, width), torch.randn(batch, width)))
    compare(interpret, ep, lambda: (torch.randn(batch, width, generator=g),
                                    torch.randn(batch, width, generator=g)),
            f"models.Counter({width}) on x, y of shape ({batch}, {width})")


@check(EXERCISE, hidden=True)
def batchnorm_mutated_input_kwargs(interpret, ctx):
    """BatchNorm1d in train mode, an input written in place with max/split/cat, kwargs"""
    g = ctx.generator(1)
    width, batch, hidden = (int(v) for v in torch.randint(3, 9, (3,), generator=g))
    bn = nn.Sequential(nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU()).train()
    compare(interpret, program(bn, (torch.randn(batch, width),)),
            lambda: (torch.randn(batch, width, generator=g),),
            f"Sequential(Linear({width}, {hidden}), BatchNorm1d({hidden}), ReLU) in train mode")
    cut = int(torch.randint(1, width, (1,), generator=g))
    mixer = Mixer(width, cut)
    compare(interpret, program(mixer, (torch.randn(batch, width), torch.randn(batch, width))),
            lambda: (torch.randn(batch, width, generator=g),
                     torch.randn(batch, width, generator=g)),
            f"Mixer({width}, cut {cut}): forward(x, acc) writes acc in place, takes max(dim=1), "
            "split and cat")
    compare(interpret, program(Kwargs(), (torch.randn(batch, width), torch.randn(batch, width))),
            lambda: (torch.randn(batch, width, generator=g) * 4,
                     torch.randn(batch, width, generator=g)),
            f"Kwargs on x, y of shape ({batch}, {width}): div(rounding_mode='floor'), "
            "to(float64), sort(descending=True, stable=True)")
