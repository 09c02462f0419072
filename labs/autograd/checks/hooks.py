"""Checks of ``autograd.hooks``: the learner's ``backward_with_hooks(output, grad_output, hooks,
inputs=None)`` against torch's engine running the same graph with the same hooks registered.

Each case is built twice from one seed. The answer gets one copy, with the hooks as data:
``(kind, target, fn)`` triples in registration order. The other copy gets the same hooks really
registered (``Tensor.register_hook``, ``Tensor.retain_grad``, ``Node.register_prehook``,
``Node.register_hook``, ``Tensor.register_post_accumulate_grad_hook``) and runs
``torch.autograd.backward(output, grad_output, inputs=inputs)``. Every hook records its calls
(which hook, its arguments, and, for tensor and post-accumulate-grad hooks, the ``.grad`` of its
tensor at that moment); the two traces are compared, then the ``.grad`` of every tensor of the
case. Torch's engine is off while the answer runs: a pre-hook on every node of the answer's copy
would see torch's engine run one.

Not compared, because the engine does not guarantee it: the order among ``AccumulateGrad`` nodes
that one node made ready together (they share a sequence number, and ``ReadyQueue``'s heap
decides). Each such node's own hook calls are still compared in order.

The answer's copy lives in the kernel (the probe :func:`labs.autograd.probes.hook_runs`, which
builds each case with :func:`labs.autograd.probes.hook_cases` and reports the hook calls and the
``.grad`` of every tensor as plain data); torch's copy is built and run here.
"""
from __future__ import annotations

import torch

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.autograd import probes
from labs.autograd.checks._plain import Shown, exact_shown, rebuilt, type_name

EXERCISE = "autograd.hooks"
_NA = probes.HOOK_NA   # the "own .grad" of an event of a Node hook (it has no tensor of its own)

_ORDER = ("On one node the engine runs: its tensor hooks (each tensor's hooks together, the "
          "tensors in the order they got their first hook), then retain_grad, then the node's "
          "pre-hooks, then the node (AccumulateGrad: .grad is updated, then the "
          "post-accumulate-grad hooks run), then its post-hooks (torch/csrc/autograd/engine.cpp: "
          "call_function, call_tensor_pre_hooks; node.h: NOTE [Hooks ordering]).")
_RETURNS = ("A hook that returns a value replaces what comes after it: a tensor hook's value "
            "replaces that tensor's gradient (for its later hooks, retain_grad and the node), a "
            "pre-hook's tuple the node's inputs, a post-hook's tuple the node's results, which "
            "the next nodes then receive. Post-hooks are called as hook(grad_inputs, "
            "grad_outputs): what the node returned (fitted by validate_outputs) and what it was "
            "given (after the pre-hooks).")


# --------------------------------------------------------------------------- comparing


def _differs(mine, theirs, verb="passes") -> str:
    """How ``mine`` differs from torch's ``theirs`` (snapshots), in words; "" if it does not."""
    import torch

    if theirs is None or mine is None:
        if (theirs is None) == (mine is None):
            return ""
        return (f"None where torch {verb} a tensor" if mine is None
                else f"a tensor where torch {verb} None")
    if isinstance(theirs, tuple):
        if len(mine) != len(theirs):
            return f"a tuple of {len(mine)} where torch {verb} {len(theirs)}"
        for k, (a, b) in enumerate(zip(mine, theirs)):
            why = _differs(a, b, verb)
            if why:
                return f"{why} (item {k})"
        return ""
    if mine.shape != theirs.shape:
        return f"shape {tuple(mine.shape)} where torch's is {tuple(theirs.shape)}"
    if mine.dtype != theirs.dtype:
        return f"dtype {mine.dtype} where torch's is {theirs.dtype}"
    if not torch.allclose(mine, theirs, rtol=1e-6, atol=1e-9):
        return f"values that differ from torch's by up to {(mine - theirs).abs().max().item():.3g}"
    return ""


def _state(g) -> str:
    return "None" if g is None else "set"


def _canonical(events, case, ties) -> list:
    """``events`` with each run of back-to-back firings of tied AccumulateGrad nodes (``ties``:
    node name -> group) sorted by node name, each firing's own calls kept in order."""
    out, k = [], 0
    while k < len(events):
        group = ties.get(case.node_of[events[k][0]])
        j = k + 1
        while group is not None and j < len(events) and \
                ties.get(case.node_of[events[j][0]]) == group:
            j += 1
        firings = []
        for e in events[k:j]:
            if firings and case.node_of[firings[-1][-1][0]] == case.node_of[e[0]]:
                firings[-1].append(e)
            else:
                firings.append([e])
        names = [case.node_of[f[0][0]] for f in firings]
        if len(set(names)) == len(names):
            firings.sort(key=lambda f: case.node_of[f[0][0]])
        out.extend(e for f in firings for e in f)
        k = j
    return out


def _ties(order, case) -> dict:
    """Node name -> group for the AccumulateGrad nodes torch ran back to back (made ready by
    one node: they share the top sequence number)."""
    ties, run = {}, []
    for node in [*order, None]:
        if node is not None and hasattr(node, "variable"):
            run.append(node)
            continue
        if len(run) > 1:
            for n in run:
                if n in case.node_names:
                    ties[case.node_names[n]] = id(run[0])
        run = []
    return ties


def _pruned(name, ran, inputs) -> str:
    if name in ran:
        return ""
    if inputs is not None:
        return (f" Torch never runs {name}: with inputs=, only the nodes from which the node of "
                "an input can be reached run (GraphTask::init_to_execute marks them needed); "
                "the hooks of the others never fire.")
    return f" Torch never runs {name}, so its hooks never fire."


def _missing(ib, case, theirs) -> str:
    """Why torch calls hook ``ib`` (which the answer never calls), in words."""
    args = next(e[1] for e in theirs if e[0] == ib)
    if case.hooks[ib][0] == "tensor" and args == (None,):
        return (" Torch calls it with None: its tensor's slot received no gradient, but its "
                "node runs, and call_tensor_pre_hooks calls every tensor hook of the node.")
    return " Every node that runs fires its hooks."


def _compare_traces(mine, theirs, case, ran, where) -> None:
    called = {e[0] for e in mine}
    for k, (a, b) in enumerate(zip(mine, theirs)):
        (ia, args_a, own_a), (ib, args_b, own_b) = a, b
        after = "first" if k == 0 else f"after the same first {k} hook call(s)"
        if ia != ib:
            na, nb = case.node_of[ia], case.node_of[ib]
            if ib not in called:
                raise CheckFailure(f"on {where}, {after}, torch calls {case.about[ib]} (on "
                                   f"{nb}), which yours never calls.{_missing(ib, case, theirs)}")
            if na == nb:
                why = f" Both sit on {na}. {_ORDER}"
            else:
                why = _pruned(na, ran, case.inputs) or (
                    f" Torch runs {nb} before {na}: a node runs when all its gradients have "
                    "arrived, the ready one with the highest _sequence_nr() first (ReadyQueue), "
                    "and its hooks fire when it runs.")
            raise CheckFailure(f"on {where}, {after}, torch calls {case.about[ib]} and yours "
                               f"calls {case.about[ia]}.{why}")
        for n, (x, y) in enumerate(zip(args_a, args_b)):
            why = _differs(x, y)
            if why:
                arg = ("its argument" if len(args_b) == 1 else
                       ("its first argument (grad_inputs)",
                        "its second argument (grad_outputs)")[n])
                rule = _RETURNS
                if case.inputs is not None and n == 0 and len(args_b) == 2:
                    rule = ("With inputs=, a node does not compute the gradients for edges into "
                            "nodes that will not run (the generated nodes ask "
                            "Node::task_should_compute_output): those results are None. "
                            f"{rule}")
                raise CheckFailure(f"on {where}, your engine passed {case.about[ia]} (call "
                                   f"#{k + 1}) {why} in {arg}. {rule}")
        if own_b is not _NA and _differs(own_a, own_b):
            kind = case.hooks[ia][0]
            name = case.name_of(case.hooks[ia][1])
            if kind == "post_accumulate_grad":
                rule = ("AccumulateGrad::apply first updates .grad (adding to what is there), "
                        "then calls the post-accumulate-grad hooks.")
            elif case.hooks[ia][1].grad_fn is None:
                rule = ("A leaf's tensor hooks run before its AccumulateGrad updates .grad (they "
                        "can still change the gradient it adds).")
            else:
                rule = ("retain_grad's hook runs after every tensor hook of the node "
                        "(call_tensor_pre_hooks runs retains_grad_hooks_ last), so .grad gets "
                        "the gradient the hooks returned, whenever retain_grad() was called.")
            yours = _state(own_a) if _state(own_a) != _state(own_b) else "set to other values"
            raise CheckFailure(f"on {where}, when {case.about[ia]} ran, {name}.grad was "
                               f"{_state(own_b)} with torch but {yours} with yours. {rule}")
    if len(mine) < len(theirs):
        ib = theirs[len(mine)][0]
        nb = case.node_of[ib]
        raise CheckFailure(f"on {where}, torch also calls {case.about[ib]} (on {nb}), which "
                           f"yours never calls.{_missing(ib, case, theirs)}")
    if len(mine) > len(theirs):
        ia = mine[len(theirs)][0]
        na = case.node_of[ia]
        if ia in {e[0] for e in theirs}:
            raise CheckFailure(f"on {where}, yours calls {case.about[ia]} (on {na}) more often "
                               "than torch: a node runs once, and its hooks fire once, when it "
                               "runs.")
        raise CheckFailure(f"on {where}, yours calls {case.about[ia]} (on {na}), which torch "
                           f"never calls.{_pruned(na, ran, case.inputs)}")


def _compare_grads(mine: dict, theirs, where) -> None:
    for name, t in theirs.tensors.items():
        a = mine[name]
        b = probes._hook_grad(t)
        why = _differs(a, b, "has")
        if not why:
            continue
        if t.grad_fn is None:
            rule = ("AccumulateGrad adds into an existing .grad; a leaf whose AccumulateGrad "
                    "does not run (unreachable, or pruned by inputs=) keeps its .grad.")
        elif b is None:
            rule = ("Torch leaves .grad of a non-leaf None unless it is retained (retain_grad(), "
                    "or listed in inputs=).")
        else:
            rule = ("A retained non-leaf (retain_grad(), or a non-leaf listed in inputs=: "
                    "torch/csrc/autograd/python_engine.cpp: THPEngine_run_backward calls "
                    "retain_grad on it) gets the gradient its slot received, after the tensor "
                    "hooks of its node.")
        raise CheckFailure(f"on {where}, after backward {name}.grad is {why}. {rule}")


# --------------------------------------------------------------------------- what came back
def _garbled():
    return CheckFailure("what came back from your backward_with_hooks is not the probe's report.")


def _snap(value, what):
    """A gradient argument as the probe reported it (rebuilt): None or a plain tensor."""
    if value is None or type(value) is torch.Tensor:
        return value
    if isinstance(value, Shown) and value.base == "Tensor":
        exact_shown(value, torch.Tensor, what)
    raise CheckFailure(f"{what} is a {type_name(value)}; torch passes a tensor (or None "
                       "for a slot that received no gradient).")


def _snap_tuple(value, what):
    exact_shown(value, tuple, what)
    return tuple(_snap(v, f"item {k} of {what}") for k, v in enumerate(value))


def _events(raw, case) -> list:
    """The answer's hook calls (:class:`labs.autograd.probes.HookCase`), checked in order: what
    a hook was passed must be what torch passes (a tensor or None, tuples for Node hooks)."""
    if type(raw) is not list:
        raise _garbled()
    out = []
    for e in raw:
        if type(e) is not list or len(e) != 3 or type(e[0]) is not int \
                or not 0 <= e[0] < len(case.hooks):
            raise _garbled()
        i, args, own = e[0], rebuilt(e[1]), rebuilt(e[2])
        kind, about = case.hooks[i][0], case.about[i]
        if kind == "post_accumulate_grad" and type(args) is list and len(args) == 2:
            name = case.name_of(case.hooks[i][1])
            raise CheckFailure(
                f"{about} was called with a {args[1]} that is not {name}: a "
                "post-accumulate-grad hook gets the leaf tensor itself "
                "(AccumulateGrad.variable), whose .grad it can read.")
        n_args = {"tensor": 1, "pre": 1, "post": 2, "post_accumulate_grad": 0}.get(kind)
        if type(args) is not tuple or len(args) != n_args:
            raise _garbled()
        if kind == "tensor":
            args = (_snap(args[0], f"the gradient passed to {about}"),)
        elif kind == "pre":
            args = (_snap_tuple(args[0], f"the grad_outputs passed to {about}"),)
        elif kind == "post":
            args = (_snap_tuple(args[0], f"the grad_inputs passed to {about}"),
                    _snap_tuple(args[1], f"the grad_outputs passed to {about}"))
        if kind in ("pre", "post"):
            if own != _NA:
                raise _garbled()
            own = _NA
        else:
            own = _snap(own, f".grad of the tensor of {about}")
        out.append((i, args, own))
    return out


def _grads(raw, case) -> dict:
    """Each tensor's ``.grad`` after the answer's backward, by name."""
    if type(raw) is not list:
        raise _garbled()
    out = {}
    try:
        for name, entry in zip(case.tensors, raw, strict=True):
            if type(entry) is not list or len(entry) != 2 or entry[0] != name:
                raise _garbled()
            out[name] = _snap(rebuilt(entry[1]), f".grad of the tensor of {name}")
    except ValueError:
        raise _garbled() from None
    return out


def _verify(got, build, case_seed: int, where: str) -> None:
    """Judge what the probe saw of one case against torch running its own copy."""
    import warnings

    if type(got) is not dict:
        raise _garbled()
    if got.get("used_engine") is not False:
        if got.get("used_engine") is not True:
            raise _garbled()
        raise CheckFailure(f"on {where}, your backward_with_hooks ran torch's engine "
                           "(backward(), torch.autograd.grad or the like ran a node of the "
                           "graph). Run the nodes yourself with node(*grads), and call the hooks "
                           "of `hooks` yourself.")
    theirs = probes.hook_case(build, case_seed)
    mine_events = _events(got.get("events"), theirs)
    if "raised" in got:
        if type(got["raised"]) is not dict:
            raise _garbled()
        raise AnswerRaised(got["raised"])
    mine_grads = _grads(got.get("grads"), theirs)

    theirs.register()
    order = []
    for n in theirs.nodes():
        n.register_prehook(lambda grads, n=n: order.append(n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.autograd.backward(theirs.output, theirs.grad_output, inputs=theirs.inputs)

    ties = _ties(order, theirs)
    ran = {theirs.node_names[n] for n in order if n in theirs.node_names}
    _compare_traces(_canonical(mine_events, theirs, ties),
                    _canonical([tuple(e) for e in theirs.events], theirs, ties),
                    theirs, ran, where)
    _compare_grads(mine_grads, theirs, where)


def _judge(backward_with_hooks, name: str, seed: int) -> None:
    cases = probes.hook_cases(name, seed)
    reply = backward_with_hooks.probe(probes.hook_runs, name, seed)
    for (build, case_seed, where), got in paired(cases, reply, "cases"):
        _verify(got, build, case_seed, where)


# --------------------------------------------------------------------------- checks
@check(EXERCISE)
def one_node(backward_with_hooks, ctx):
    """fires every kind of hook on one node in torch's order, with their effects"""
    _judge(backward_with_hooks, "one_node", ctx.seed)


@check(EXERCISE)
def across_nodes(backward_with_hooks, ctx):
    """fires hooks node by node in the ready queue's order, a multi-output node included"""
    _judge(backward_with_hooks, "across_nodes", ctx.seed)


@check(EXERCISE)
def inputs_prune(backward_with_hooks, ctx):
    """with inputs=, fires only the hooks of nodes that lead to an input"""
    _judge(backward_with_hooks, "inputs_prune", ctx.seed)


@check(EXERCISE, hidden=True)
def random_graphs(backward_with_hooks, ctx):
    """matches torch's hook calls and .grad on seeded random graphs with random hooks"""
    _judge(backward_with_hooks, "random_graphs", ctx.seed)


@check(EXERCISE, hidden=True)
def edge_cases(backward_with_hooks, ctx):
    """a root that is an output of a split, a 0-d leaf, x * x, a node with a None edge"""
    _judge(backward_with_hooks, "edge_cases", ctx.seed)
