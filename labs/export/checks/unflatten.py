"""Checks of ``export.unflatten``: ``unflatten(ep)`` must rebuild the module hierarchy that
``torch.export`` flattened away. ``ep`` is ``torch.export.export(model, args)`` (not
decomposed) of a model without mutations or constants, whose submodules are each called once and
own the parameters and buffers their nodes read. The answer returns an ``nn.Module`` whose
``named_modules()`` are those of ``torch.export.unflatten(ep)`` (every FQN of the nodes'
``nn_module_stack``, and the prefixes of each), whose parameters and buffers sit under their
original FQNs with the program's values, whose forward returns the program's outputs (compared
as pytree leaves: a 1-tuple for one tensor is accepted), and in which each submodule runs its
own part of the graph: called once, with the values its nodes read from outside it, returning
the values of its part used outside it. Each submodule's inputs and outputs are compared with
those of the oracle's same submodule, through forward hooks, as multisets (the order is the
answer's to choose: ``torch.export.unflatten`` takes them in the reverse order of first use,
and the original signatures are lost unless export was asked to keep them with
``preserve_module_call_signature``).

The oracle is ``torch.export.unflatten`` run here, on the judge's own export of the same model;
the answer runs in the kernel (the probe :func:`labs.export.probes.unflattened`, which exports
the same model, its state sent as a state dict, and reports the module tree, the state dict and,
per call, the outputs and every submodule call its forward hooks saw); an answer that calls
into ``torch/export/unflatten.py`` or ``torch/export/_unlift.py`` (``ep.module()``) fails
whatever it returns (``models`` in lab.toml: :mod:`grader.kernel.modelled`). Public:
``models.Tower`` (seeded sizes, ``nn.Sequential`` four deep, GELU). Hidden (seeded sizes):
``models.Deep``: an ``nn.ModuleList`` of stages, a submodule that takes two inputs and returns a
tuple, a parameter-free one, buffers. (torch/export/unflatten.py: unflatten, _ModuleFrame,
InterpreterModule; torch/fx/graph_module.py: GraphModule.)"""

from __future__ import annotations

import warnings

import torch

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.export import probes

EXERCISE = "export.unflatten"
CALLS = 2
#: what every message about a submodule's calls ends with
OWN_PART = ("Each submodule runs its own part of the graph: the nodes whose innermost (last) "
            "nn_module_stack entry is that submodule, called from its parent's graph (a "
            "call_module node) with the values those nodes read from outside it, returning the "
            "values of its part that are used outside it.")


def _same(have, real: torch.Tensor) -> bool:
    """``have`` is a tensor of ``real``'s shape and dtype, its values within assert_close's
    tolerance (the kernel and the judge may sum in different orders)."""
    if not isinstance(have, torch.Tensor):
        return False
    try:
        torch.testing.assert_close(have, real, check_device=False)
    except AssertionError:
        return False
    return True


def _matched(have: list, want: list) -> bool:
    """Whether ``have`` and ``want`` hold the same tensors (:func:`_same`), in any order."""
    left = list(have)
    for real in want:
        i = next((i for i, h in enumerate(left) if _same(h, real)), None)
        if i is None:
            return False
        del left[i]
    return not left


def _shapes(values: list) -> str:
    return ", ".join(str(tuple(v.shape)) if isinstance(v, torch.Tensor) else v.get("type", "?")
                     for v in values) or "nothing"


def _names(names, limit: int = 6) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit
                                       else "") if names else "none"


def _owner(fqn: str) -> str:
    owner, _, leaf = fqn.rpartition(".")
    return f"the attribute {leaf} of the submodule {owner}" if owner else \
        f"the attribute {leaf} of the root"


def _tree(seen: dict, oracle, what: str) -> None:
    """The module tree, then the parameters and buffers, by name and value."""
    if not seen["module"]:
        raise CheckFailure(f"for {what}, unflatten returned a {seen['type']}, not a "
                           "torch.nn.Module.")
    want = {name for name, _ in oracle.named_modules()}
    have = set(seen["modules"])
    if missing := sorted(want - have, key=lambda n: (n.count("."), n)):
        raise CheckFailure(
            f"for {what}, your module has no submodule {missing[0]!r}; torch.export.unflatten"
            f"(ep) rebuilds these: {_names(want - {''}, 12)}. Each FQN in the nodes' "
            "meta['nn_module_stack'] (the first item of each entry's value) is a module of the "
            "tree, a parameter-free one too, and so is every prefix of one (layers for "
            "layers.0); a node runs in the module of its innermost (last) entry.")
    if extra := sorted(have - want):
        raise CheckFailure(
            f"for {what}, your module has a submodule {extra[0]!r} that torch.export."
            "unflatten(ep) does not: the tree holds the modules named in the nodes' "
            "nn_module_stack and their prefixes, under the same names.")
    kinds = {"parameter": {name for name, _ in oracle.named_parameters()},
             "buffer": {name for name, _ in oracle.named_buffers()}}
    for kind, other in (("parameter", "buffer"), ("buffer", "parameter")):
        mine = set(seen[f"{kind}s"])
        if missing := sorted(kinds[kind] - mine):
            how = (f"; it is among your {other}s: register it as a {kind}"
                   + (" (an nn.Parameter)" if kind == "parameter" else " (a plain tensor)")
                   if missing[0] in seen[f"{other}s"] else "")
            raise CheckFailure(
                f"for {what}, the {kind} {missing[0]} is not among your module's {kind}s "
                f"(yours: {_names(mine)}){how}. A {kind} sits on the module that owns it, "
                f"under its original name: ep.graph_signature.inputs_to_{kind}s maps each "
                f"placeholder to its FQN, and {missing[0]} is {_owner(missing[0])}.")
    for kind in ("parameter", "buffer"):
        if extra := sorted(set(seen[f"{kind}s"]) - kinds[kind]):
            raise CheckFailure(
                f"for {what}, your module has a {kind} {extra[0]} that torch.export."
                f"unflatten(ep) does not have (its {kind}s: {_names(kinds[kind])}).")
    for name, real in oracle.state_dict().items():
        have = seen["state"].get(name)
        if not _same(have, real):
            raise CheckFailure(f"for {what}, your module's state_dict()[{name!r}] differs from "
                               f"ep.state_dict[{name!r}]: use the program's own tensors.")
    if extra := sorted(set(seen["state"]) - set(oracle.state_dict())):
        raise CheckFailure(f"for {what}, your module's state_dict() has {extra[0]!r}, which "
                           "torch.export.unflatten(ep)'s does not.")


def _submodules(mine: list, real: list, when: str) -> None:
    """Every submodule call the oracle made, made by the answer too: the same count per
    submodule, each call with the same inputs and outputs (as multisets)."""
    by_name: dict[str, list] = {}
    for name, ins, outs in mine:
        by_name.setdefault(name, []).append((ins, outs))
    wanted: dict[str, list] = {}
    for name, ins, outs in real:
        wanted.setdefault(name, []).append((ins, outs))
    for name, calls in wanted.items():
        got = by_name.get(name, [])
        if not got:
            raise CheckFailure(
                f"{when}, the submodule {name} was never called; torch.export.unflatten(ep)'s "
                f"{name} is called {len(calls)} time(s). {OWN_PART}")
        if len(got) != len(calls):
            raise CheckFailure(f"{when}, the submodule {name} was called {len(got)} times; "
                               f"torch.export.unflatten(ep)'s {name} {len(calls)} time(s).")
        for (ins, outs), (real_ins, real_outs) in zip(got, calls):
            if not _matched(ins, real_ins):
                raise CheckFailure(
                    f"{when}, the submodule {name} was called with {_shapes(ins)}; "
                    f"torch.export.unflatten(ep)'s {name} with {_shapes(real_ins)} (in some "
                    "order; compared as a multiset): its inputs are the values its nodes read "
                    "from outside it, not its own parameters and buffers, which are its "
                    f"attributes. {OWN_PART}")
            if not _matched(outs, real_outs):
                raise CheckFailure(
                    f"{when}, the submodule {name} returned {_shapes(outs)}; "
                    f"torch.export.unflatten(ep)'s {name} returns {_shapes(real_outs)} (in "
                    f"some order; compared as a multiset). {OWN_PART}")
    if extra := [name for name in by_name if name not in wanted]:
        raise CheckFailure(f"{when}, your module calls the submodule {extra[0]}, which "
                           "torch.export.unflatten(ep)'s never calls: it runs no node of its "
                           "own.")


def compare(unflatten, spec: list, example: tuple, draw, what: str) -> None:
    """Have the kernel run ``unflatten`` on its export of ``unflatten_model(spec)`` (this
    model's state) and the module it returns ``CALLS`` times on the arguments ``draw()``
    returns; run ``torch.export.unflatten`` here on this process's export of the same; compare
    the trees, the state and, per call, every submodule call and the outputs."""
    model = probes.unflatten_model(spec)
    state = dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = torch.export.unflatten(torch.export.export(model, example))
    calls = [list(draw()) for _ in range(CALLS)]
    seen = unflatten.probe(probes.unflattened, spec, state, list(example), calls)
    _tree(seen, oracle, what)
    for call, (args, run) in enumerate(paired(calls, seen["calls"], "calls"), start=1):
        when = f"for {what}, call {call} of {CALLS}"
        if "raised" in run:
            raise AnswerRaised(run["raised"])
        real = probes.module_calls(oracle, args)
        _submodules(run["submodules"], real["submodules"], when)
        got, want = run["outputs"], real["outputs"]
        if len(got) != len(want):
            raise CheckFailure(f"{when}, your module returned {_shapes(got)}; ep.module() "
                               f"returns {_shapes(want)}.")
        for i, (have, value) in enumerate(zip(got, want)):
            if not _same(have, value):
                raise CheckFailure(f"{when}, output {i} differs from what ep.module() "
                                   "returns.")


@check(EXERCISE)
def tower(unflatten, ctx):
    """rebuilds models.Tower's hierarchy: nn.Sequential blocks, four deep"""
    g = ctx.generator()
    width, hidden, batch = (int(v) for v in torch.randint(3, 8, (3,), generator=g))
    spec = ["tower", width, hidden, 2, 3]
    compare(unflatten, spec, (torch.randn(batch, width),),
            lambda: (torch.randn(batch, width, generator=g),),
            f"models.Tower({width}, hidden {hidden}, depth 2, 3 classes) on x of shape "
            f"({batch}, {width})")


@check(EXERCISE, hidden=True)
def deep(unflatten, ctx):
    """a ModuleList of stages: two inputs, a tuple returned, buffers, a parameter-free module"""
    g = ctx.generator(1)
    width, batch = (int(v) for v in torch.randint(3, 9, (2,), generator=g))
    depth = int(torch.randint(2, 4, (1,), generator=g))
    spec = ["deep", width, depth, 2]
    compare(unflatten, spec, (torch.randn(batch, width), torch.randn(batch, width)),
            lambda: (torch.randn(batch, width, generator=g),
                     torch.randn(batch, width, generator=g)),
            f"models.Deep({width}, depth {depth}, 2 classes): stages.i.mix takes (x, context) "
            "and returns a tuple, stages.i.centre has no parameters, stages.i.norm has buffers")
