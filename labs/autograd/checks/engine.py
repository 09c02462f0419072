"""Checks of ``autograd.engine``: the learner's ``run_backward(output, grad_output)`` against torch's
own engine.

Oracles: ``torch.autograd.grad`` for the gradients, and torch's engine for which nodes run, how
often and in what order. Calls are observed through saved-tensor hooks: every call of a node
unpacks what it saved, so the sequence of unpacks is the sequence of node calls. The answer runs
each graph in the kernel (the probe :func:`labs.autograd.probes.backward_runs`, which reports the
unpacks it caused, numbered by the order of the packs); the same graph is built here with the same
builder and run by ``torch.autograd.grad`` (with pre-hooks that name the node doing each unpack),
and the two sequences are compared. Some graphs are built by two threads: sequence numbers count
per thread, so there descending ``_sequence_nr()`` is not a valid schedule and only dependency
counting gives torch's order.
"""
from __future__ import annotations

from collections import Counter

from grader.checks import AnswerRaised, CheckFailure, check
from labs.autograd import probes
from labs.autograd.checks._plain import DICTS, exact_shown, is_a, rebuilt, type_name
from labs.autograd.checks.graph_walk import describe, torch_graph

EXERCISE = "autograd.engine"


def _calls(rec, tokens: list[int]) -> list:
    """The node calls behind a sequence of unpacks (consecutive unpacks of one node = one call)."""
    calls, last = [], None
    for tok in tokens:
        node = rec.owner.get(tok)
        if node is not last or node is None:
            calls.append(node)
        last = node
    return calls


def _resolve_in(leaves: list):
    """A ``resolve`` for :func:`rebuilt`: a leaf by its index, another tensor as its value
    (requiring grad when it did)."""
    import torch

    def resolve(ref: dict):
        kind = ref.get("?")
        if kind == "leaf" and type(ref.get("index")) is int and 0 <= ref["index"] < len(leaves):
            return leaves[ref["index"]]
        if kind == "tensor" and type(ref.get("value")) is torch.Tensor:
            value = ref["value"]
            if ref.get("requires_grad") is True and value.is_floating_point():
                value = value.detach().requires_grad_()
            return value
        return None
    return resolve


def _verify(seen, where: str, builder, options: dict) -> None:
    """Compare what the answer did on one graph (``seen``, the probe's entry) with torch's engine
    on the same graph, built here by ``builder``; raise CheckFailure on a miss."""
    note = (" This graph was built by two threads: sequence numbers count per thread, so a node "
            "made later can carry a lower number than a node it sends gradients to, and ordering "
            "by _sequence_nr() alone runs that node too early. Run a node only when its dependency "
            "count reaches zero." if builder.two_threads else "")
    import torch

    counts, order = options["counts"], options["order"]
    rec, leaves, out = builder.build()
    go = builder.grad_output(out, options["grad_output"] == "default")
    if type(seen) is not dict:
        raise CheckFailure("what came back from your run_backward is not the probe's report.")
    if "raised" in seen:
        if seen["raised"].get("ename") == "RecursionError":
            raise CheckFailure(
                f"on {where}, your engine hit Python's recursion limit. Graphs can be thousands of "
                "nodes deep: count dependencies with an explicit stack and drive execution from a "
                "ready queue (a loop), not by recursion.")
        raise AnswerRaised(seen["raised"])
    mine = seen.get("tokens")
    if type(mine) is not list or any(type(t) is not int for t in mine):
        raise CheckFailure("what came back from your run_backward is not the probe's report.")
    if seen.get("used_engine"):
        raise CheckFailure("your run_backward ran torch's own engine (backward() or torch.autograd.grad). "
                           "Call the nodes yourself: node(*grads) runs one node's backward.")
    if seen.get("leaf_grad"):
        raise CheckFailure("after your run_backward a leaf has a .grad: an AccumulateGrad node was called. "
                           "Don't call AccumulateGrad nodes: read the leaf from node.variable and put the "
                           "gradient in the dict you return.")
    if seen.get("grad_output_modified"):
        raise CheckFailure(
            "your run_backward modified grad_output in place. A node may return the very tensor it was "
            "given (AddBackward0 passes its gradient through to both inputs), so accumulate out of place "
            "(a + b), as InputBuffer::add does when a gradient may be shared.")
    result = rebuilt(seen.get("result"), _resolve_in(leaves))

    # the oracle: torch's engine on the same graph, naming the node behind each unpack
    nodes, _, _ = torch_graph(out)
    handles = [n.register_prehook(rec.entering(n)) for n in nodes if not hasattr(n, "variable")]
    rec.log.clear()
    try:
        expected = torch.autograd.grad(out, leaves, go, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
        rec.current = None
    theirs = list(rec.log)

    # 1. the gradients
    if not is_a(result, dict):
        raise CheckFailure("run_backward must return a dict {leaf tensor: gradient}; got "
                           f"{type_name(result)}.")
    # Plain types only, before anything is compared: a dict or tensor subclass could lie about its
    # contents (__iter__, __torch_function__ answering allclose/shape/dtype).
    exact_shown(result, DICTS, "the value run_backward returned")
    Tensor = torch.Tensor
    if any(not is_a(k, Tensor) for k in result):
        raise CheckFailure("the dict's keys must be the leaf tensors themselves (AccumulateGrad.variable), "
                           f"not {type_name(next(k for k in result if not is_a(k, Tensor)))}s.")
    for k in result:
        exact_shown(k, (Tensor, torch.nn.Parameter), "a key of the dict run_backward returned")
    got = {id(k): v for k, v in dict.items(result)}
    leaf_ids = {id(leaf) for leaf in leaves}
    for i, (leaf, want) in enumerate(zip(leaves, expected)):
        label = f"leaf #{i} (shape {tuple(leaf.shape)})"
        if want is None:
            if id(leaf) in got:
                raise CheckFailure(f"on {where}, your dict has an entry for {label}, which the output does "
                                   "not depend on; only leaves whose AccumulateGrad is reached get one.")
            continue
        if id(leaf) not in got:
            raise CheckFailure(f"on {where}, your dict has no gradient for {label}. Every leaf whose "
                               "AccumulateGrad node is reached from output.grad_fn gets one.")
        g = got[id(leaf)]
        if not is_a(g, torch.Tensor):
            raise CheckFailure(f"on {where}, the gradient of {label} is a {type_name(g)}, not a "
                               "tensor.")
        exact_shown(g, (torch.Tensor, torch.nn.Parameter), f"on {where}, the gradient of {label}")
        if g.shape != want.shape or g.dtype != want.dtype:
            raise CheckFailure(
                f"on {where}, the gradient of {label} has shape {tuple(g.shape)} and dtype {g.dtype}; "
                f"torch gives shape {tuple(want.shape)}, dtype {want.dtype}. A node returns each gradient "
                "in the shape and dtype of its own computation (broadcast, promoted); the engine's "
                "validate_outputs then sums it to the shape the next node expects and casts it to its "
                "dtype: meta = next_node._input_metadata[input_nr]; grad.sum_to_size(meta.shape), "
                "grad.to(meta.dtype).")
        tol = dict(rtol=1e-6, atol=1e-8) if want.dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
        if not torch.allclose(g, want, **tol):
            diff = (g - want).abs().max().item()
            raise CheckFailure(
                f"on {where}, the gradient of {label} differs from torch.autograd.grad (max abs diff "
                f"{diff:.3g}). If a node or leaf receives gradients along several edges, they must be "
                "summed before the node runs (InputBuffer) or into the leaf's entry; check that the "
                f"root gradient goes to slot output.output_nr of output.grad_fn.{note}")
        if g.requires_grad:
            raise CheckFailure(
                f"on {where}, the gradient of {label} has a grad_fn: your engine recorded a graph while "
                "running nodes. The engine runs backward with grad mode off unless create_graph=True; "
                "call the nodes under torch.no_grad().")
    stray = [k for k in got if k not in leaf_ids]
    if stray:
        raise CheckFailure(f"on {where}, your dict has {len(stray)} key(s) that are not leaves of this graph.")

    # 2. each node called exactly once
    if counts:
        have, need = Counter(mine), Counter(theirs)
        for tok, n in need.items():
            if have[tok] != n:
                node = rec.owner.get(tok)
                times = have[tok]
                hint = ("Call a node only once, when all the edges pointing at it have delivered their "
                        "gradient: count dependencies first (Engine::compute_dependencies), decrement on "
                        "each delivery, and run the node when its count reaches zero.")
                raise CheckFailure(f"on {where}, your engine called {describe(node)} {times} time(s); "
                                   f"torch's engine calls it once. {hint}")
        if have != need:
            raise CheckFailure(f"on {where}, your engine ran nodes that torch's engine does not run.")

    # 3. the order of torch's ReadyQueue
    if order and mine != theirs:
        a, b = _calls(rec, mine), _calls(rec, theirs)
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x is not y), min(len(a), len(b)))
        yours = describe(a[i]) if i < len(a) else "nothing"
        when = "first" if i == 0 else f"after the same first {i} node calls (of those that save tensors),"
        raise CheckFailure(
            f"on {where}, your engine runs nodes in a different order than torch's: {when} torch runs "
            f"{describe(b[i]) if i < len(b) else 'nothing'} and yours runs {yours}. Among the nodes that are ready, torch's ReadyQueue pops the one "
            "with the highest _sequence_nr() first (engine.h: CompareNodeTaskTime): use a priority "
            f"queue, e.g. heapq on (-node._sequence_nr(), ...).{note}")


# --------------------------------------------------------------------------- checks


def _judge(run_backward, name: str, ctx) -> None:
    """Run the graphs of check ``name`` through the answer in the kernel (one probe call) and
    compare each with torch's engine on the same graph built here, in order."""
    seen = run_backward.probe(probes.backward_runs, name, ctx.seed)
    if type(seen) is not list:
        raise CheckFailure("what came back from your run_backward is not the probe's report.")
    for i, (where, builder, options) in enumerate(probes.engine_cases(name, ctx.seed)):
        _verify(seen[i] if i < len(seen) else None, where, builder, options)


@check(EXERCISE)
def fan_out(run_backward, ctx):
    """gradients match torch.autograd.grad with fan-out, reuse and broadcasting"""
    _judge(run_backward, "fan_out", ctx)


@check(EXERCISE)
def each_node_once(run_backward, ctx):
    """calls every node exactly once, when all its gradients have arrived"""
    _judge(run_backward, "each_node_once", ctx)


@check(EXERCISE)
def ready_queue_order(run_backward, ctx):
    """runs ready nodes in the order of torch's ReadyQueue"""
    _judge(run_backward, "ready_queue_order", ctx)


@check(EXERCISE, hidden=True)
def random_graphs(run_backward, ctx):
    """matches torch's engine on seeded random DAGs with fan-out, reuse, constants and splits"""
    _judge(run_backward, "random_graphs", ctx)


@check(EXERCISE, hidden=True)
def graphs_built_by_two_threads(run_backward, ctx):
    """graphs built by two threads, where descending _sequence_nr() is not a valid schedule"""
    _judge(run_backward, "graphs_built_by_two_threads", ctx)


@check(EXERCISE, hidden=True)
def edge_cases(run_backward, ctx):
    """a root that is output k of a multi-output node, a 0-d leaf, x * x, an unused leaf, mixed dtypes"""
    _judge(run_backward, "edge_cases", ctx)


@check(EXERCISE, hidden=True)
def deep_chain(run_backward, ctx):
    """runs a chain of thousands of nodes without recursion"""
    _judge(run_backward, "deep_chain", ctx)
