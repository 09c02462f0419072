"""Checks of ``export.graph-pass``: ``fuse_linear_relu(gm)`` rewrites, in place, the graph module
of a Core ATen program (``export(model, (x,)).run_decompositions().graph_module``, ``x`` 2-D) so
that every ``aten.relu.default(aten.addmm.default(bias, x, aten.permute.default(weight,
[1, 0])))`` whose ``addmm`` and ``permute`` have no other users becomes one call
``torch.ops.course.linear_relu.default(x, weight, bias)`` (``labs/export/models.py``), removes the
nodes left dead, recompiles ``gm``, and returns the number of rewrites. Nothing else may change:
a Linear without bias (``mm``), a linear whose output also feeds a residual ``add``, a relu of
anything else and a linear without relu stay as they are.

Each check exports seeded models, runs the answer on ``ep.graph_module`` and compares with what
the check built: the count, the ``linear_relu`` calls and their arguments (the parameters, by
the program's graph signature), no fusable pair left, no dead node, ``gm.graph.lint()``,
``gm.code`` regenerated, and the outputs of the rewritten program (``ep.module()`` and ``gm``
called with the lifted parameters in signature order) against the original program's; the
public check also saves and loads the program (``torch.export.save``/``load``), which needs every
node's ``meta["val"]``. (torch/fx/graph.py: Graph.inserting_before, call_function,
eliminate_dead_code, lint; torch/fx/node.py: Node.replace_all_uses_with;
torch/export/graph_signature.py: ExportGraphSignature; torch/_export/serde/serialize.py.)
"""

from __future__ import annotations

import io
import warnings

import torch
from torch import fx, nn
from torch.export import export

from grader.checks import CheckFailure, check, exact
from labs.export import models

EXERCISE = "export.graph-pass"
aten = torch.ops.aten
LINEAR_RELU = torch.ops.course.linear_relu.default
PATTERN = ("relu(addmm(bias, x, permute(weight, [1, 0]))) whose addmm and permute have no other "
           "users")


class Mixed(nn.Module):
    """Every near miss of the pattern, and one pair that is the pattern: ``a`` feeds a relu and
    a residual add (addmm with two users), ``b`` has no bias (mm), ``c``'s relu takes a product,
    ``d`` is a plain linear + relu (the one rewrite), ``e`` has no relu."""

    def __init__(self, width: int, out: int, g: torch.Generator):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width, bias=False)
        self.c, self.d = nn.Linear(width, width), nn.Linear(width, width)
        self.e = nn.Linear(width, out)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x):
        y = self.a(x)
        x = torch.relu(y) + y
        x = torch.relu(self.b(x))
        x = torch.relu(self.c(x) * 2)
        return self.e(torch.relu(self.d(x)))


MIXED = ("Mixed({w}): linear a feeding a relu and a residual add, Linear b without bias then "
         "relu, relu of linear c times 2, linear d then relu, linear e")


def torch_says(exc: BaseException, limit: int = 300) -> str:
    """The first lines of ``exc``'s message, on one line and short."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    said = " ".join(lines).rstrip(".")
    said = said if len(said) <= limit else said[: limit - 3] + "..."
    return f"{type(exc).__name__}: {said}"


def _calls(gm: fx.GraphModule, target) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def _fusable(gm: fx.GraphModule) -> list[fx.Node]:
    """The relu nodes of the pattern still in the graph."""
    found = []
    for relu in _calls(gm, aten.relu.default):
        mm = relu.args[0]
        if not (isinstance(mm, fx.Node) and mm.target is aten.addmm.default
                and len(mm.users) == 1 and len(mm.args) == 3 and not mm.kwargs):
            continue
        perm = mm.args[2]
        if (isinstance(perm, fx.Node) and perm.target is aten.permute.default
                and list(perm.args[1]) == [1, 0] and len(perm.users) == 1):
            found.append(relu)
    return found


def _check_arguments(ep, what: str) -> None:
    """Each linear_relu call takes (x, weight, bias): the weight and bias parameters' own
    placeholders, by the program's graph signature."""
    params = ep.graph_signature.inputs_to_parameters
    for node in _calls(ep.graph_module, LINEAR_RELU):
        args = list(node.args) + [node.kwargs[k] for k in ("x", "weight", "bias")
                                  if k in node.kwargs]
        if len(args) != 3:
            raise CheckFailure(f"in {what}, {node.name} has {len(args)} arguments; "
                               "linear_relu takes three: (x, weight, bias).")
        for arg, role in zip(args[1:], ("weight", "bias")):
            name = getattr(arg, "name", repr(arg))
            target = getattr(arg, "target", None)
            if target is aten.permute.default:
                raise CheckFailure(
                    f"in {what}, the {role} argument of {node.name} is {name}, the transposed "
                    "weight (aten.permute); pass the weight placeholder itself: linear_relu "
                    "computes relu(x @ weight.T + bias) and transposes it.")
            fqn = params.get(name, "")
            if not fqn.endswith(f".{role}"):
                got = f"the parameter {fqn}" if fqn else f"the node {name}"
                raise CheckFailure(
                    f"in {what}, {node.name} gets {got} as its {role}: linear_relu takes "
                    "(x, weight, bias), and addmm's arguments are (bias, x, permute(weight, "
                    "[1, 0])). Map them in that order.")


def _check_graph(ep, got, expected: int, counts: dict, what: str) -> None:
    gm = ep.graph_module
    exact(got, int, "fuse_linear_relu's return value")
    try:
        gm.graph.lint()
    except Exception as exc:  # noqa: BLE001  (lint's message says what is broken)
        raise CheckFailure(f"after fuse_linear_relu, the graph of {what} does not lint: "
                           f"{torch_says(exc)}.") from None
    if got != expected:
        more = (" An addmm with other users than the relu (a residual add) must stay, and a "
                "Linear without bias (mm), a relu of anything else or a linear without relu "
                "are not the pattern." if got > expected else "")
        raise CheckFailure(f"fuse_linear_relu returned {got} for {what}, which has {expected} "
                           f"pair(s) to fuse ({PATTERN}).{more}")
    fused = _calls(gm, LINEAR_RELU)
    if len(fused) != expected:
        raise CheckFailure(f"fuse_linear_relu returned {got} for {what}, but the graph now "
                           f"calls course.linear_relu {len(fused)} time(s): each rewrite "
                           "inserts one call and routes the relu's users to it.")
    dead = [n.name for n in gm.graph.nodes
            if n.op in ("call_function", "get_attr") and not n.users]
    if dead:
        raise CheckFailure(f"after fuse_linear_relu, {what} keeps nodes that nothing uses: "
                           f"{', '.join(dead[:6])}. Call gm.graph.eliminate_dead_code() once "
                           "the uses are rerouted.")
    if left := _fusable(gm):
        raise CheckFailure(f"in {what}, {left[0].name} is still a relu of an addmm that nothing "
                           "else uses: replace_all_uses_with the new node, so that nothing "
                           "uses the old relu.")
    _check_arguments(ep, what)
    for target, name, change in ((aten.addmm.default, "addmm", expected),
                                 (aten.mm.default, "mm", 0),
                                 (aten.relu.default, "relu", expected)):
        n = len(_calls(gm, target))
        if n != counts[name] - change:
            raise CheckFailure(f"after fuse_linear_relu, {what} has {n} {name} call(s); "
                               f"{counts[name] - change} should remain (the {counts[name]} "
                               f"before, less the {change} fused). Rewrite only {PATTERN}.")
    if gm.code.count("course.linear_relu.default(") != expected:
        raise CheckFailure(f"after fuse_linear_relu, gm.code of {what} does not call "
                           "linear_relu: gm still runs the code generated before the edit. Call "
                           "gm.recompile() after editing gm.graph.")


def _flat_inputs(ep, x: torch.Tensor) -> list:
    """The inputs gm takes, in signature order: lifted parameters and buffers, then x."""
    out = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == spec.kind.USER_INPUT:
            out.append(x)
        elif spec.target in ep.state_dict:
            out.append(ep.state_dict[spec.target])
        else:
            out.append(ep.constants[spec.target])
    return out


def _run(program, args, what: str, how: str):
    try:
        out = program(*args)
    except Exception as exc:  # noqa: BLE001
        raise CheckFailure(f"after fuse_linear_relu, running {how} of {what} raised "
                           f"{torch_says(exc)}. linear_relu takes (x, weight, bias), x "
                           "(batch, in), weight (out, in), bias (out,).") from None
    return out[0] if isinstance(out, (tuple, list)) else out


def _check_outputs(ep, xs, wants, what: str) -> None:
    program = ep.module()
    for x, want in zip(xs, wants):
        for how, got in (("ep.module()", _run(program, (x,), what, "ep.module()")),
                         ("gm with the lifted parameters",
                          _run(ep.graph_module, _flat_inputs(ep, x), what,
                               "gm with the lifted parameters"))):
            if not isinstance(got, torch.Tensor) or not torch.allclose(got, want, rtol=1e-5,
                                                                      atol=1e-6):
                raise CheckFailure(f"after fuse_linear_relu, {how} of {what} computes another "
                                   "output than the program did before the rewrite.")


def _check_saved(ep, x: torch.Tensor, want: torch.Tensor, what: str) -> None:
    buf = io.BytesIO()
    try:
        torch.export.save(ep, buf)
        buf.seek(0)
        loaded = torch.export.load(buf)
    except Exception as exc:  # noqa: BLE001
        said = torch_says(exc)
        why = (" A new node needs meta['val'], the fake tensor it produces (the replaced relu "
               "has the same one)." if "meta" in said and "val" in said else
               " The graph must stay a valid ExportedProgram: placeholders, signature and "
               "node metadata as export left them.")
        raise CheckFailure(f"after fuse_linear_relu, torch.export.save/load of {what} raised "
                           f"{said}.{why}") from None
    got = _run(loaded.module(), (x,), what, "the saved and loaded program")
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise CheckFailure(f"after fuse_linear_relu, {what} saved and loaded computes another "
                           "output than before the rewrite.")


def verify(fuse_linear_relu, model: nn.Module, x: torch.Tensor, expected: int, what: str,
           g: torch.Generator, save: bool = False) -> None:
    """Export ``model``, run the answer on its Core ATen graph module, check the graph and
    compare the outputs with the program's own before the rewrite."""
    with warnings.catch_warnings():  # (a FutureWarning from torch's own pytree use)
        warnings.simplefilter("ignore", FutureWarning)
        ep = export(model, (x,)).run_decompositions()
    xs = [x, torch.randn(x.shape, generator=g)]
    before = ep.module()
    with torch.no_grad():
        wants = [before(v) for v in xs]
    counts = {name: len(_calls(ep.graph_module, t)) for name, t in
              (("addmm", aten.addmm.default), ("mm", aten.mm.default),
               ("relu", aten.relu.default))}
    got = fuse_linear_relu(ep.graph_module)
    _check_graph(ep, got, expected, counts, what)
    with torch.no_grad():
        _check_outputs(ep, xs, wants, what)
        if save:
            _check_saved(ep, xs[0], wants[0], what)


@check(EXERCISE)
def mlp_16_32_32_4(fuse_linear_relu, ctx):
    """models.mlp([16, 32, 32, 4]): both linear + relu pairs fused, outputs unchanged, save/load"""
    g = ctx.generator()
    model = models.mlp([16, 32, 32, 4], g)
    verify(fuse_linear_relu, model, torch.randn(5, 16, generator=g), 2,
           "the program of models.mlp([16, 32, 32, 4])", g, save=True)


@check(EXERCISE, hidden=True)
def seeded_models(fuse_linear_relu, ctx):
    """Seeded MLPs with and without relus, and every near miss of the pattern in one model"""
    g = ctx.generator(1)
    widths = [int(w) for w in torch.randint(3, 40, (5,), generator=g)]
    relu_after = [bool(r) for r in torch.randint(0, 2, (4,), generator=g)]
    if all(relu_after) or not any(relu_after):  # (some linears with a relu, some without)
        relu_after[int(torch.randint(0, 4, (), generator=g))] ^= True
    batch = int(torch.randint(1, 9, (), generator=g))
    verify(fuse_linear_relu, models.mlp(widths, g, relu_after), torch.randn(
        batch, widths[0], generator=g), sum(relu_after),
        f"the program of models.mlp({widths}, relu_after={relu_after})", g)
    width, out = (int(w) for w in torch.randint(3, 33, (2,), generator=g))
    verify(fuse_linear_relu, Mixed(width, out, g), torch.randn(batch, width, generator=g), 1,
           "the program of " + MIXED.format(w=width), g)
