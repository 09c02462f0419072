"""Checks of ``modules.fx-pass``: ``fold_batchnorm(gm)`` takes a GraphModule traced from a model in
eval mode and returns a GraphModule in which every BatchNorm (1d/2d) ``call_module`` node whose
input is a Conv1d, Conv2d or Linear ``call_module`` node with no other user is folded into that
layer (its weight and bias replaced by the folded ones, a bias created where it had none) and
removed from the graph and the module; a BatchNorm that cannot be folded stays; the outputs are
the model's within float32 tolerance; the GraphModule passed in is left unchanged.

Torch is the oracle twice: the original model's outputs, and torch's own pass
(``torch/fx/experimental/optimization.py: fuse``, whose rules in 2.13.0 are the contract's: it
folds Conv1d+BatchNorm1d, Conv2d+BatchNorm2d and Linear+BatchNorm1d, and skips a layer whose
output has another user) for which BatchNorms remain and what each folded layer's weight and
bias become (``torch/nn/utils/fusion.py: fuse_conv_bn_weights, fuse_linear_bn_weights``). The
probe :func:`labs.modules.probes.folded` traces the same model in the kernel, runs the answer and
reports the graph, the modules it holds, whether its code is its graph's, the layers' parameters,
the outputs, and whether the GraphModule passed in changed.
"""

from __future__ import annotations

import torch
from torch import nn

from grader.checks import CheckFailure, check, paired
from labs.modules import probes

EXERCISE = "modules.fx-pass"
LAYERS = (nn.Conv1d, nn.Conv2d, nn.Linear)
BN_RULE = ("in eval mode a BatchNorm computes (x - running_mean) / sqrt(running_var + eps) * "
           "weight + bias, per channel (weight 1 and bias 0 when affine=False)")

#: the public model: conv without bias + BN, conv + relu + BN (stays), a nested Sequential
#: with a BN without affine parameters, flatten, linear without bias + BN1d
PUBLIC = ["seq", [["conv2d", 3, 8, 3, False], ["bn2d", 8, 0.25, True], ["relu"],
                  ["conv2d", 8, 8, 3, True], ["relu"], ["bn2d", 8, 1e-5, True],
                  ["seq", [["conv2d", 8, 4, 3, True], ["bn2d", 4, 0.1, False]]],
                  ["flatten"], ["linear", 4 * 25, 10, False], ["bn1d", 10, 0.5, True]]]
PUBLIC_LABEL = ("the public Sequential (conv+BN, conv+relu+BN, a nested conv+BN, "
                "linear+BN1d)")


def _said(error: dict) -> str:
    lines = [ln.strip() for ln in error["text"].splitlines() if ln.strip()]
    said = " ".join(lines)
    return f"{error['ename']}: {said[:300]}"


def _why_stays(gm: torch.fx.GraphModule, target: str) -> str:
    """Why the BatchNorm node calling ``target`` in ``gm`` cannot be folded, in words."""
    modules = dict(gm.named_modules())
    node = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == target)
    arg = node.args[0] if node.args else None
    if not (isinstance(arg, torch.fx.Node) and arg.op == "call_module"
            and isinstance(modules.get(arg.target), LAYERS)):
        what = (f"{arg.op} {arg.target}" if isinstance(arg, torch.fx.Node) else repr(arg))
        return f"its input is {what}, not a Conv or Linear module's output"
    others = [u.name for u in arg.users if u is not node]
    return (f"its input, the output of '{arg.target}', is also used by {', '.join(others)}: "
            "folding would change what they see")


def verify(fold_batchnorm, spec: list, xs: list, label: str, g: torch.Generator) -> None:
    """Build ``spec``'s model with seeded statistics, have the kernel trace it and run the answer,
    and compare what came back with torch's ``fuse`` and with the model's outputs."""
    from torch.fx.experimental.optimization import fuse

    model = probes.fold_model(spec)
    state = probes.fold_statistics(model, g)
    traced = torch.fx.symbolic_trace(model)
    fused = fuse(model)
    with torch.no_grad():
        wants = [model(x) for x in xs]
    stays = set(probes.batchnorm_targets(fused))
    seen = fold_batchnorm.probe(probes.folded, spec, state, xs)
    if type(seen) is not dict or "passed_in" not in seen:
        raise CheckFailure("what came back from your answer is not the probe's reply.")
    if not seen["graph_module"]:
        raise CheckFailure(f"on {label}, fold_batchnorm returned a {seen['type']}; return a "
                           "torch.fx.GraphModule.")
    passed_in = seen["passed_in"]
    if passed_in["changed"] or passed_in["graph"]:
        what = (f"its state entries {', '.join(passed_in['changed'][:4])}"
                if passed_in["changed"] else "its graph")
        raise CheckFailure(
            f"on {label}, fold_batchnorm changed the GraphModule passed in ({what}). Leave it "
            "as it was: fold into copies of the layers (the caller may still use the original "
            "model, in training for instance).")
    if seen["lint"] is not None:
        raise CheckFailure(f"on {label}, the returned graph does not lint: "
                           f"{_said(seen['lint'])}.")
    called = seen["batchnorms"]
    for target in probes.batchnorm_targets(traced):
        if target in stays and target not in called:
            raise CheckFailure(
                f"on {label}, BatchNorm '{target}' was removed, but it cannot be folded: "
                f"{_why_stays(traced, target)}. Leave it in the graph.")
        if target not in stays and target in called:
            node = next(n for n in traced.graph.nodes if n.target == target)
            layer = node.args[0].target
            raise CheckFailure(
                f"on {label}, BatchNorm '{target}' is still called, but its input is the output "
                f"of '{layer}' ({type(traced.get_submodule(layer)).__name__}), which nothing "
                "else uses: fold it into that layer and remove it.")
    if len(called) != len(stays):
        raise CheckFailure(f"on {label}, the returned graph calls {len(called)} BatchNorm "
                           f"module(s); {len(stays)} should remain.")
    dead = [name for name in seen["held"] if name not in called]
    if dead:
        raise CheckFailure(
            f"on {label}, the returned module still holds BatchNorm submodule(s) "
            f"{', '.join(repr(d) for d in dead[:4])} that no node calls: remove what the graph "
            "no longer uses from the module too (GraphModule has a method for it).")
    if seen["stale"]:
        raise CheckFailure(
            f"on {label}, the returned GraphModule's code is not its graph's: it still runs "
            "the forward generated before your edits. Call recompile() after editing the "
            "graph.")
    _check_layers(seen["layers"], traced, fused, label)
    for i, (want, got) in enumerate(paired(wants, seen["outputs"], "inputs")):
        if isinstance(got, dict) and "error" in got:
            raise CheckFailure(f"on {label}, calling the returned GraphModule raised "
                               f"{_said(got['error'])}.")
        if type(got) is not torch.Tensor or got.shape != want.shape:
            what = tuple(got.shape) if type(got) is torch.Tensor else got.get("type")
            raise CheckFailure(f"on {label}, the returned GraphModule gave {what} for input "
                               f"{i}, the model {tuple(want.shape)}.")
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            err = (got - want).abs().max().item()
            raise CheckFailure(f"on {label}, the returned GraphModule's output differs from "
                               f"the model's by up to {err:.3g} on input {i}; {BN_RULE}.")


def _check_layers(layers: dict, traced, fused, label: str) -> None:
    """The Conv and Linear modules the returned graph calls against fuse's: the same targets,
    and the folded weight and bias of each."""
    modules = dict(traced.named_modules())
    want = {n.target: fused.get_submodule(n.target) for n in fused.graph.nodes
            if n.op == "call_module" and isinstance(modules.get(n.target), LAYERS)}
    if type(layers) is not dict or sorted(layers) != sorted(want):
        raise CheckFailure(
            f"on {label}, the returned graph calls the Conv/Linear modules "
            f"{sorted(layers) if type(layers) is dict else layers}, the traced model "
            f"{sorted(want)}: keep each layer under its own name, and fold into it.")
    for target, mine in layers.items():
        real = want[target]
        bn = next((n.target for n in traced.graph.nodes if n.op == "call_module"
                   and n.args and getattr(n.args[0], "target", None) == target
                   and n.target not in probes.batchnorm_targets(fused)
                   and n.target in probes.batchnorm_targets(traced)), None)
        what = f"layer '{target}' ({type(real).__name__}" + (
            f", folded with BatchNorm '{bn}')" if bn else ", not folded)")
        if type(mine.get("weight")) is not torch.Tensor or mine["weight"].shape != \
                real.weight.shape:
            raise CheckFailure(f"on {label}, the weight of {what} is not a tensor of shape "
                               f"{tuple(real.weight.shape)}.")
        if real.bias is not None and mine.get("bias") is None:
            raise CheckFailure(
                f"on {label}, {what} has no bias after folding: a folded BatchNorm shifts each "
                "channel, so a layer built with bias=False needs a bias now (a new Parameter).")
        bias_differs = real.bias is not None and (
            type(mine["bias"]) is not torch.Tensor or mine["bias"].shape != real.bias.shape
            or not torch.allclose(mine["bias"], real.bias, rtol=1e-4, atol=1e-5))
        weight_differs = not torch.allclose(mine["weight"], real.weight, rtol=1e-4, atol=1e-5)
        if not bn and (weight_differs or bias_differs):
            raise CheckFailure(f"on {label}, the parameters of {what} changed: a layer whose "
                               "output no folded BatchNorm reads keeps its weight and bias.")
        if weight_differs:
            raise CheckFailure(f"on {label}, the weight of {what} is not the folded weight: "
                               f"{BN_RULE}; scale each output channel of the weight by what "
                               "multiplies x.")
        if bias_differs:
            raise CheckFailure(f"on {label}, the bias of {what} is not the folded bias: "
                               f"{BN_RULE}; the layer's own bias goes through it too.")


@check(EXERCISE)
def public_sequential(fold_batchnorm, ctx):
    """A Sequential with Conv2d/Linear + BatchNorm pairs, a BN after a relu and a nested one"""
    g = ctx.generator()
    xs = [torch.randn(2, 3, 5, 5, generator=g), torch.randn(1, 3, 5, 5, generator=g)]
    verify(fold_batchnorm, PUBLIC, xs, PUBLIC_LABEL, g)


def _channels(g: torch.Generator) -> int:
    return int(torch.randint(3, 9, (), generator=g))


def _eps(g: torch.Generator) -> float:
    return [1e-5, 1e-3, 0.1, 0.5][int(torch.randint(0, 4, (), generator=g))]


def _flag(g: torch.Generator) -> bool:
    return bool(torch.randint(0, 2, (), generator=g))


def residual_spec(g: torch.Generator, dims: str) -> list:
    """A module whose forward folds two pairs and keeps a BN whose conv output is also added
    to the result (a layer output used twice), in ``dims`` ("1d" or "2d")."""
    c_in, c = _channels(g), _channels(g)
    conv, bn = f"conv{dims}", f"bn{dims}"
    layers = {"stem": [conv, c_in, c, 3, _flag(g)], "stem_bn": [bn, c, _eps(g), True],
              "branch": [conv, c, c, 3, _flag(g)], "branch_bn": [bn, c, _eps(g), _flag(g)],
              "head": [conv, c, c, 3, _flag(g)], "head_bn": [bn, c, _eps(g), True]}
    steps = [["a", "stem", "x"], ["b", "stem_bn", "a"], ["c", "relu", "b"],
             ["d", "branch", "c"], ["e", "branch_bn", "d"], ["f", "add", "d", "e"],
             ["h", "head", "f"], ["i", "head_bn", "h"], ["j", "relu", "i"]]
    return ["graph", layers, steps]


def mlp_spec(g: torch.Generator) -> list:
    """A Sequential of Conv1d/Linear layers with and without bias, BNs after layers and after
    relus, in a nested Sequential too."""
    c_in, c, width, out = _channels(g), _channels(g), _channels(g), _channels(g)
    length = 6
    return ["seq", [["conv1d", c_in, c, 3, _flag(g)], ["bn1d", c, _eps(g), _flag(g)],
                    ["relu"], ["bn1d", c, _eps(g), True], ["flatten"],
                    ["seq", [["linear", c * length, width, _flag(g)],
                             ["bn1d", width, _eps(g), True]]],
                    ["relu"], ["linear", width, out, _flag(g)], ["bn1d", out, 0.5, True]]]


@check(EXERCISE, hidden=True)
def seeded_models(fold_batchnorm, ctx):
    """Seeded residual blocks (a layer output used twice, 1d and 2d) and a Conv1d/Linear MLP"""
    g = ctx.generator(1)
    spec = residual_spec(g, "2d")
    c_in = spec[1]["stem"][1]
    verify(fold_batchnorm, spec, [torch.randn(2, c_in, 6, 5, generator=g)],
           "a seeded residual block (Conv2d)", g)
    spec = residual_spec(g, "1d")
    c_in = spec[1]["stem"][1]
    verify(fold_batchnorm, spec, [torch.randn(3, c_in, 7, generator=g)],
           "a seeded residual block (Conv1d)", g)
    spec = mlp_spec(g)
    c_in = spec[1][0][1]
    verify(fold_batchnorm, spec, [torch.randn(4, c_in, 6, generator=g)],
           "a seeded Sequential of Conv1d and Linear layers", g)
