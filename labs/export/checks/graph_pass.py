"""Checks of ``export.graph-pass``: ``fuse_linear_relu(gm)`` rewrites, in place, the graph module
of a Core ATen program (``export(model, (x,)).run_decompositions().graph_module``, ``x`` 2-D) so
that every ``aten.relu.default(aten.addmm.default(bias, x, aten.permute.default(weight,
[1, 0])))`` whose ``addmm`` and ``permute`` have no other users becomes one call
``torch.ops.course.linear_relu.default(x, weight, bias)`` (``labs/export/models.py``), removes the
nodes left dead, recompiles ``gm``, and returns the number of rewrites. Nothing else may change:
a Linear without bias (``mm``), a linear whose output also feeds a residual ``add``, a relu of
anything else and a linear without relu stay as they are.

Each check builds seeded models; the probe :func:`labs.export.probes.fused` exports the same
model (its weights sent as a state dict) in the kernel, runs the answer on ``ep.graph_module``
and reports the graph it left (nodes, targets as strings, argument names, user counts), its lint,
``gm.code``, the outputs and the saved program's bytes; the judge compares with what it built:
the count, the ``linear_relu`` calls and their arguments (the parameters, by
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
from torch import nn

from grader.checks import CheckFailure, check
from labs.export import models, probes

EXERCISE = "export.graph-pass"
LINEAR_RELU = "course.linear_relu.default"
ADDMM, MM, RELU, PERMUTE = ("aten.addmm.default", "aten.mm.default", "aten.relu.default",
                            "aten.permute.default")
PATTERN = ("relu(addmm(bias, x, permute(weight, [1, 0]))) whose addmm and permute have no other "
           "users")
MIXED = ("Mixed({w}): linear a feeding a relu and a residual add, Linear b without bias then "
         "relu, relu of linear c times 2, linear d then relu, linear e")


def torch_says(error: dict, limit: int = 300) -> str:
    """The first lines of what a probe saw raised (``{"ename", "text"}``), on one line and
    short."""
    lines = [ln.strip() for ln in error["text"].splitlines() if ln.strip()]
    said = " ".join(lines).rstrip(".")
    said = said if len(said) <= limit else said[: limit - 3] + "..."
    return f"{error['ename']}: {said}"


def _said(exc: BaseException) -> str:
    return torch_says({"ename": type(exc).__name__, "text": str(exc)})


class Graph:
    """The nodes a probe reported (:func:`labs.export.probes.graph_nodes`), by name."""

    def __init__(self, nodes: list[dict]):
        self.nodes, self.by_name = nodes, {n["name"]: n for n in nodes}

    def calls(self, target: str) -> list[dict]:
        return [n for n in self.nodes if n["op"] == "call_function" and n["target"] == target]

    def node(self, arg) -> dict | None:
        """The node an argument refers to (``{"node": name}``), else None."""
        if isinstance(arg, dict) and set(arg) == {"node"}:
            return self.by_name.get(arg["node"])
        return None


def _fusable(graph: Graph) -> list[dict]:
    """The relu nodes of the pattern still in the graph."""
    found = []
    for relu in graph.calls(RELU):
        mm = graph.node(relu["args"][0]) if relu["args"] else None
        if not (mm and mm["target"] == ADDMM and mm["users"] == 1 and len(mm["args"]) == 3
                and not mm["kwargs"]):
            continue
        perm = graph.node(mm["args"][2])
        if (perm and perm["target"] == PERMUTE and len(perm["args"]) > 1
                and list(perm["args"][1]) == [1, 0] and perm["users"] == 1):
            found.append(relu)
    return found


def _check_arguments(graph: Graph, params: dict, what: str) -> None:
    """Each linear_relu call takes (x, weight, bias): the weight and bias parameters' own
    placeholders, by the program's graph signature."""
    for node in graph.calls(LINEAR_RELU):
        args = list(node["args"]) + [node["kwargs"][k] for k in ("x", "weight", "bias")
                                     if k in node["kwargs"]]
        if len(args) != 3:
            raise CheckFailure(f"in {what}, {node['name']} has {len(args)} arguments; "
                               "linear_relu takes three: (x, weight, bias).")
        for arg, role in zip(args[1:], ("weight", "bias")):
            ref = graph.node(arg)
            name = ref["name"] if ref else (arg.get("other") if isinstance(arg, dict)
                                            and "other" in arg else repr(arg))
            if ref and ref["target"] == PERMUTE:
                raise CheckFailure(
                    f"in {what}, the {role} argument of {node['name']} is {name}, the transposed "
                    "weight (aten.permute); pass the weight placeholder itself: linear_relu "
                    "computes relu(x @ weight.T + bias) and transposes it.")
            fqn = params.get(name, "") if ref else ""
            if not fqn.endswith(f".{role}"):
                got = f"the parameter {fqn}" if fqn else f"the node {name}"
                raise CheckFailure(
                    f"in {what}, {node['name']} gets {got} as its {role}: linear_relu takes "
                    "(x, weight, bias), and addmm's arguments are (bias, x, permute(weight, "
                    "[1, 0])). Map them in that order.")


def _check_graph(seen: dict, expected: int, counts: dict, what: str) -> None:
    returned = seen["returned"]
    if returned["value"] is None:
        why = ("a subclass of int; return a plain int" if returned["int"] else "not a int")
        raise CheckFailure(f"fuse_linear_relu's return value has type {returned['type']}, "
                           f"{why}.")
    got = returned["value"]
    if seen["lint"] is not None:
        raise CheckFailure(f"after fuse_linear_relu, the graph of {what} does not lint: "
                           f"{torch_says(seen['lint'])}.")
    if got != expected:
        more = (" An addmm with other users than the relu (a residual add) must stay, and a "
                "Linear without bias (mm), a relu of anything else or a linear without relu "
                "are not the pattern." if got > expected else "")
        raise CheckFailure(f"fuse_linear_relu returned {got} for {what}, which has {expected} "
                           f"pair(s) to fuse ({PATTERN}).{more}")
    graph = Graph(seen["nodes"])
    fused = graph.calls(LINEAR_RELU)
    if len(fused) != expected:
        raise CheckFailure(f"fuse_linear_relu returned {got} for {what}, but the graph now "
                           f"calls course.linear_relu {len(fused)} time(s): each rewrite "
                           "inserts one call and routes the relu's users to it.")
    dead = [n["name"] for n in graph.nodes
            if n["op"] in ("call_function", "get_attr") and not n["users"]]
    if dead:
        raise CheckFailure(f"after fuse_linear_relu, {what} keeps nodes that nothing uses: "
                           f"{', '.join(dead[:6])}. Call gm.graph.eliminate_dead_code() once "
                           "the uses are rerouted.")
    if left := _fusable(graph):
        raise CheckFailure(f"in {what}, {left[0]['name']} is still a relu of an addmm that "
                           "nothing else uses: replace_all_uses_with the new node, so that "
                           "nothing uses the old relu.")
    _check_arguments(graph, seen["parameters"], what)
    for target, name, change in ((ADDMM, "addmm", expected), (MM, "mm", 0),
                                 (RELU, "relu", expected)):
        n = len(graph.calls(target))
        if n != counts[name] - change:
            raise CheckFailure(f"after fuse_linear_relu, {what} has {n} {name} call(s); "
                               f"{counts[name] - change} should remain (the {counts[name]} "
                               f"before, less the {change} fused). Rewrite only {PATTERN}.")
    if seen["code"] != expected:
        raise CheckFailure(f"after fuse_linear_relu, gm.code of {what} does not call "
                           "linear_relu: gm still runs the code generated before the edit. Call "
                           "gm.recompile() after editing gm.graph.")


def _ran(got, what: str, how: str):
    if isinstance(got, dict) and "error" in got:
        raise CheckFailure(f"after fuse_linear_relu, running {how} of {what} raised "
                           f"{torch_says(got['error'])}. linear_relu takes (x, weight, bias), x "
                           "(batch, in), weight (out, in), bias (out,).")
    return got


def _check_outputs(seen: dict, wants, what: str) -> None:
    for (mod, gm), want in zip(seen["outputs"], wants, strict=True):
        for how, got in (("ep.module()", mod), ("gm with the lifted parameters", gm)):
            got = _ran(got, what, how)
            if not isinstance(got, torch.Tensor) or not torch.allclose(got, want, rtol=1e-5,
                                                                      atol=1e-6):
                raise CheckFailure(f"after fuse_linear_relu, {how} of {what} computes another "
                                   "output than the program did before the rewrite.")


def _check_saved(seen: dict, x: torch.Tensor, want: torch.Tensor, what: str) -> None:
    saved = seen["saved"]
    why_meta = (" A new node needs meta['val'], the fake tensor it produces (the replaced relu "
                "has the same one).")
    why_valid = (" The graph must stay a valid ExportedProgram: placeholders, signature and "
                 "node metadata as export left them.")
    if isinstance(saved, dict):
        said = torch_says(saved["error"])
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = torch.export.load(io.BytesIO(saved))
            said = ""
        except Exception as exc:  # noqa: BLE001
            said = _said(exc)
    if said:
        why = why_meta if "meta" in said and "val" in said else why_valid
        raise CheckFailure(f"after fuse_linear_relu, torch.export.save/load of {what} raised "
                           f"{said}.{why}")
    try:
        got = loaded.module()(x)
    except Exception as exc:  # noqa: BLE001
        raise CheckFailure(f"after fuse_linear_relu, running the saved and loaded program of "
                           f"{what} raised {_said(exc)}. linear_relu takes (x, weight, bias), x "
                           "(batch, in), weight (out, in), bias (out,).") from None
    got = got[0] if isinstance(got, (tuple, list)) else got
    if not isinstance(got, torch.Tensor) or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise CheckFailure(f"after fuse_linear_relu, {what} saved and loaded computes another "
                           "output than before the rewrite.")


def verify(fuse_linear_relu, spec: list, model: nn.Module, x: torch.Tensor, expected: int,
           what: str, g: torch.Generator, save: bool = False) -> None:
    """Export ``model`` here (the program before the rewrite); have the kernel export the same
    model (``spec``, its state) and run the answer on its Core ATen graph module; check the
    graph it reports and compare its outputs with the program's own before the rewrite."""
    ep = probes.core_aten(model, (x,))
    xs = [x, torch.randn(x.shape, generator=g)]
    before = ep.module()
    with torch.no_grad():
        wants = [before(v) for v in xs]
    graph = Graph(probes.graph_nodes(ep.graph))
    counts = {name: len(graph.calls(t)) for name, t in
              (("addmm", ADDMM), ("mm", MM), ("relu", RELU))}
    seen = fuse_linear_relu.probe(probes.fused, spec, dict(model.state_dict()), xs, save)
    _check_graph(seen, expected, counts, what)
    with torch.no_grad():
        _check_outputs(seen, wants, what)
        if save:
            _check_saved(seen, xs[0], wants[0], what)


@check(EXERCISE)
def mlp_16_32_32_4(fuse_linear_relu, ctx):
    """models.mlp([16, 32, 32, 4]): both linear + relu pairs fused, outputs unchanged, save/load"""
    g = ctx.generator()
    widths, relu_after = [16, 32, 32, 4], [True, True, False]
    model = models.mlp(widths, g, relu_after)
    verify(fuse_linear_relu, ["mlp", widths, relu_after], model,
           torch.randn(5, 16, generator=g), 2, "the program of models.mlp([16, 32, 32, 4])", g,
           save=True)


@check(EXERCISE, hidden=True)
def seeded_models(fuse_linear_relu, ctx):
    """Seeded MLPs with and without relus, and every near miss of the pattern in one model"""
    g = ctx.generator(1)
    widths = [int(w) for w in torch.randint(3, 40, (5,), generator=g)]
    relu_after = [bool(r) for r in torch.randint(0, 2, (4,), generator=g)]
    if all(relu_after) or not any(relu_after):  # (some linears with a relu, some without)
        relu_after[int(torch.randint(0, 4, (), generator=g))] ^= True
    batch = int(torch.randint(1, 9, (), generator=g))
    verify(fuse_linear_relu, ["mlp", widths, relu_after], models.mlp(widths, g, relu_after),
           torch.randn(batch, widths[0], generator=g), sum(relu_after),
           f"the program of models.mlp({widths}, relu_after={relu_after})", g)
    width, out = (int(w) for w in torch.randint(3, 33, (2,), generator=g))
    verify(fuse_linear_relu, ["mixed", width, out], models.Mixed(width, out, g),
           torch.randn(batch, width, generator=g), 1, "the program of " + MIXED.format(w=width),
           g)
