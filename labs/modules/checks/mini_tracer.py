"""Checks of ``modules.mini-tracer``: ``trace(root)`` symbolically traces an ``nn.Module`` with the
learner's own Proxy objects into a ``torch.fx.Graph``: a placeholder per positional parameter of
``forward``, a get_attr node the first time a parameter or buffer is read (one per name),
call_module for leaf modules (``torch.nn`` modules but ``nn.Sequential``, the default rule of
``torch/fx/_symbolic_trace.py: Tracer.is_leaf_module``) and traced through otherwise,
call_function for ``torch.*``, ``torch.nn.functional.*`` and operators (``operator.add``,
``operator.getitem``, ...; a reflected operator such as ``2 * h`` keeps Python's operand order:
``mul(2, h)``), call_method for tensor methods, and an output node.

``torch.fx.symbolic_trace`` is the oracle: the judge traces the same model and compares the
nodes one by one (op, target with functions by qualified name, then the arguments, nodes by
position), then runs ``torch.fx.GraphModule(model, graph)`` on inputs in the kernel
(:func:`labs.modules.probes.traced`) against the model's own outputs.
"""

from __future__ import annotations

import torch

from grader.checks import CheckFailure, check, paired
from labs.modules import probes

EXERCISE = "modules.mini-tracer"
#: the public model's steps: leaf modules, a Sequential, a module traced through, a parameter
#: read twice, a buffer, torch.* and F.* calls, a method, reflected and indexing operators
PUBLIC = ["steps", 6, ["linear", "scale", "relu", "sequential", "center", "block", "rsub",
                       "halves", "shift", "gelu", "matmul", "scale"], True]
PUBLIC_LABEL = "the public model (the steps " + ", ".join(PUBLIC[2]) + ", forward(x, y))"
LEAF_RULE = ("modules of torch.nn are leaves (one call_module node, named by the module's "
             "path), except nn.Sequential, which is traced through like your own modules "
             "(torch/fx/_symbolic_trace.py: Tracer.is_leaf_module)")


def _node(n: list) -> str:
    return f"{n[0]} {n[1]}"


def _hint(mine: list, real: list) -> str:
    """What a first differing node (``[op, target, ...]``, yours and symbolic_trace's) says
    about the answer, in words."""
    (op, target), (real_op, real_target) = mine[:2], real[:2]
    if real_op == "call_method" and op == "call_function":
        return (" A tensor method called on a proxy (h.mean(...), h.tanh()) is a call_method "
                "node whose target is the method's name.")
    if real_op == "call_function" and op == "call_method":
        return (" A function of torch or torch.nn.functional, or an operator, is a "
                "call_function node whose target is the function itself.")
    if real_op == "call_module" and op == "call_module" and real_target.startswith(
            target + "."):
        return f" '{target}' is an nn.Sequential: {LEAF_RULE}."
    if real_op == "call_module" or op == "call_module":
        return f" {LEAF_RULE}."
    if real_op == "get_attr" or op == "get_attr":
        return (" A parameter or buffer that forward reads (self.scale) is a get_attr node "
                "with its path as target, created the first time it is read, and only once "
                "per name.")
    if real_op == "placeholder" or op == "placeholder":
        return " forward's positional parameters (after self) are the placeholders, in order."
    return ""


def verify(trace, spec: list, inputs: list, label: str) -> None:
    """Trace ``spec``'s model with torch.fx.symbolic_trace; have the kernel build the same model
    and trace it with the answer; compare the nodes and the outputs."""
    model = probes.tracer_model(spec)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    real = probes.fx_calls(torch.fx.symbolic_trace(model).graph)
    with torch.no_grad():
        wants = [model(*args) for args in inputs]
    seen = trace.probe(probes.traced, spec, state, inputs)
    if type(seen) is not dict or "graph" not in seen:
        raise CheckFailure("what came back from your answer is not the probe's reply.")
    if not seen["graph"]:
        raise CheckFailure(f"on {label}, trace returned a {seen['type']}; return a "
                           "torch.fx.Graph.")
    mine = seen["nodes"]
    if type(mine) is not list:
        raise CheckFailure("what came back from your answer is not the probe's reply.")
    for i, (want, got) in enumerate(zip(real, mine)):
        if type(got) is not list or len(got) != 4:
            raise CheckFailure("what came back from your answer is not the probe's reply.")
        if got[:2] != want[:2]:
            raise CheckFailure(
                f"on {label}, node {i} of your graph is {_node(got)}; symbolic_trace records "
                f"{_node(want)} there.{_hint(got, want)}")
        if got[2:] != want[2:]:
            raise CheckFailure(
                f"on {label}, node {i} ({_node(want)}) has args {got[2]} and kwargs {got[3]}; "
                f"symbolic_trace records args {want[2]} and kwargs {want[3]} (%k is node k). "
                "Record the arguments as Python passes them: for 1.0 - h, Python calls "
                "h.__rsub__(1.0), and the node is sub(1.0, h).")
    if len(mine) != len(real):
        which = (f"ends after {len(mine)} nodes" if len(mine) < len(real) else
                 f"has {len(mine) - len(real)} node(s) more, from {_node(mine[len(real)])}")
        raise CheckFailure(f"on {label}, your graph {which}; symbolic_trace's has {len(real)} "
                           "nodes, the last one the output.")
    for i, (want, got) in enumerate(paired(wants, seen["outputs"], "inputs")):
        if isinstance(got, dict) and "error" in got:
            err = got["error"]
            raise CheckFailure(
                f"on {label}, torch.fx.GraphModule(model, your graph) raised {err['ename']}: "
                f"{err['text'][:300]}")
        if type(got) is not torch.Tensor or not torch.allclose(got, want, rtol=1e-5,
                                                                atol=1e-6):
            raise CheckFailure(f"on {label}, torch.fx.GraphModule(model, your graph) computes "
                               f"another output than the model on inputs {i}.")


def _inputs(g: torch.Generator, width: int, n: int = 2) -> list:
    out = []
    for _ in range(n):
        batch = int(torch.randint(1, 5, (), generator=g))
        out.append([torch.randn(batch, width, generator=g), torch.randn(batch, width,
                                                                        generator=g)])
    return out


@check(EXERCISE)
def public_model(trace, ctx):
    """Leaf modules, a Sequential, parameters, a buffer, functions, a method and operators"""
    g = ctx.generator()
    verify(trace, PUBLIC, _inputs(g, PUBLIC[1]), PUBLIC_LABEL)


@check(EXERCISE, hidden=True)
def seeded_models(trace, ctx):
    """Seeded models: steps of every kind in a seeded order, and a Sequential root"""
    g = ctx.generator(1)
    kinds = list(probes.TRACE_STEPS)
    for k in range(2):
        order = torch.randperm(len(kinds), generator=g).tolist()
        steps = [kinds[i] for i in order[: 9 + k * 4]]
        width = int(torch.randint(4, 9, (), generator=g))
        two = bool(k)
        verify(trace, ["steps", width, steps, two], _inputs(g, width),
               f"a seeded model (width {width}, the steps {', '.join(steps)})")
    width = int(torch.randint(3, 8, (), generator=g))
    verify(trace, ["sequential", width], [[x] for x, _ in _inputs(g, width)],
           "a model whose root is an nn.Sequential (forward(input))")
