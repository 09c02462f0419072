"""Checks of ``dispatcher.op-trace``: ``OpTrace``, a ``TorchDispatchMode`` whose ``ops`` list
records every ``OpOverload`` that reaches the mode (aten operators, in practice) while it is
active, in call order, forward and backward, and whose ``nodes`` list records, for each of them,
the name of the autograd Node whose backward issued it (``torch._C._current_autograd_node()``),
or None.

The oracle is the dispatcher itself, observed by a minimal reference mode
(``probes.recording_mode``): each program (``probes.program``) is built twice from the same seed,
run once under the reference mode in the grader's process and once under the answer's mode in the
learner's kernel (``probes.traces``, which returns the overloads' names, the node names and the
program's results as plain data), and the two sequences of overloads are compared, as are the
values the program computed (a tracing mode must not change what runs). Nested modes are checked
both ways round (``probes.nested_traces``): a mode that runs ``func`` with torch dispatch disabled
hides the ops from the modes below it.
"""
from __future__ import annotations

import random

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.dispatcher import probes
from labs.dispatcher.checks._plain import refuse, tensor

EXERCISE = "dispatcher.op-trace"


# ------------------------------------------------------------------------ the oracle
def _reference(spec: list, seed: int):
    """(the reference mode after the program ran under it, the program's results)."""
    ref = probes.recording_mode()
    body = probes.program(spec, seed)
    with ref:
        values = body()
    return ref, values


# ------------------------------------------------------------------------ comparing
def _not_a_mode(seen: dict) -> None:
    """The answer must be a TorchDispatchMode class (the probe says when it is not). What it
    keeps, and how, is the answer's design; only what it shows after a run (``ops`` and
    ``nodes``) is checked."""
    if seen["not_a_mode"]:
        raise CheckFailure(
            f"OpTrace is {seen['not_a_mode']}; it must be a class that subclasses "
            "torch.utils._python_dispatch.TorchDispatchMode (a TorchFunctionMode sees torch "
            "API calls, not the OpOverloads the dispatcher runs).")


def _recorded(seen: dict, where: str) -> tuple[list, list]:
    """(ops, nodes) of a mode after a run, as the probe read them: each exactly a list, every
    entry of nodes exactly a str or None (a subclass could lie about its items or what it
    equals)."""
    for attr in ("ops", "nodes"):
        listing = seen[attr]
        if not listing["list"]:
            raise CheckFailure(f"on {where}, after the `with` block your mode's `{attr}` is "
                               f"{listing['type']}, not a list; the contract asks for two lists, "
                               "`ops` and `nodes`, one entry per op that reached the mode.")
        if listing["items"] is None:
            refuse(listing["type"], True, f"on {where}, your mode's `{attr}`", "list")
    nodes = seen["nodes"]["items"]
    for i, node in enumerate(nodes):
        if type(node) is dict:
            if node["str"]:
                refuse(node["type"], True, f"on {where}, nodes[{i}]", "str")
            raise CheckFailure(f"on {where}, nodes[{i}] has type {node['type']}, not a str or "
                               "NoneType.")
    return list(seen["ops"]["items"]), list(nodes)


def _name(op) -> str:
    return str(op)


def _check_items(ops, where: str) -> list[str]:
    """The names of the recorded OpOverloads (each entry as :func:`probes.op_entry` gives it)."""
    for i, op in enumerate(ops):
        if op[0] == "overload":
            continue
        if op[0] == "packet":
            raise CheckFailure(
                f"on {where}, entry {i} of ops is the OpOverloadPacket {op[1]}; record `func` "
                "itself, the OpOverload (e.g. aten.add.Tensor, aten.mm.default): one packet "
                "(aten.add) groups several overloads with different schemas, and the dispatcher "
                "runs exactly one of them.")
        raise CheckFailure(
            f"on {where}, entry {i} of ops is {op[2]} ({op[1]}); record the OpOverload "
            "object `func` that __torch_dispatch__ receives, not its name or anything else.")
    return [op[1] for op in ops]


def _close(a, b) -> bool:
    """Equal up to float rounding (two runs of a matmul need not agree to the last bit)."""
    import torch

    if a.is_floating_point() or a.is_complex():
        return torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    return torch.equal(a, b)


def _same_values(got, want, where: str) -> None:
    if len(got) != len(want):
        raise CheckFailure(f"on {where}, the program returned a different number of results "
                           "under your mode: it must not change what the program does.")
    for i, (a, b) in enumerate(zip(got, want)):
        if (a is None) != (b is None):
            raise CheckFailure(f"on {where}, result #{i} is {'None' if a is None else 'a tensor'} "
                               "under your mode but not under a plain recording mode.")
        if a is None:
            continue
        # what ran under the mode must be a plain tensor: a subclass could fake allclose, shape
        # or dtype
        a = tensor(a, f"on {where}, result #{i} of the program under your mode (a tracing mode "
                      "returns func's result unchanged)")
        if a.dtype != b.dtype or a.shape != b.shape or not _close(a, b):
            what = (f"dtype {a.dtype} instead of {b.dtype}" if a.dtype != b.dtype
                    else f"shape {tuple(a.shape)} instead of {tuple(b.shape)}"
                    if a.shape != b.shape else "different values")
            raise CheckFailure(
                f"on {where}, result #{i} has {what} under your mode. A tracing mode must be "
                "transparent: call func(*args, **kwargs), keyword arguments included (dtype=, "
                "alpha=, ...), and return its result unchanged.")


def _diff_nodes(ops, nodes, ref, where: str) -> None:
    """ops agree; now the nodes list (plain, see _recorded), entry by entry."""
    if len(nodes) != len(ref.nodes):
        raise CheckFailure(
            f"on {where}, `nodes` has {len(nodes)} entries but `ops` has {len(ops)}; append "
            "one entry to `nodes` for every op you record.")
    for i, (a, b) in enumerate(zip(nodes, ref.nodes)):
        if a != b:
            raise CheckFailure(
                f"on {where}, nodes[{i}] (for {_name(ref.ops[i])}) is {a!r}; torch says {b!r}. "
                "Use torch._C._current_autograd_node(): None outside the backward pass, else the "
                "Node the engine is running; record its name() (a string such as "
                "'MulBackward0').")


def _diff(got: list[str], want: list[str], where: str) -> None:
    """Compare two traces (OpOverload names, in order)."""
    if got == want:
        return
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    before = ", ".join(want[max(0, i - 3):i]) or "(the start)"
    yours = got[i] if i < len(got) else "(the end of your trace)"
    theirs = want[i] if i < len(want) else "(the end of torch's trace)"
    msg = (f"on {where}, your trace has {len(got)} ops and torch's has {len(want)}; they first "
           f"differ at position {i}, after {before}: you recorded {yours}, torch ran {theirs}.")
    defensive = {"aten.detach.default", "aten.clone.default", "aten.copy_.default",
                 "aten.new_empty_strided.default"}
    if not got:
        msg += " Your mode recorded nothing."
    elif len(got) < len(want) and got == want[:len(got)]:
        msg += (" Everything from there on is missing: the backward pass (the engine calling "
                "the derivative formulas) dispatches its ops too, with grad mode off; record "
                "every call that reaches __torch_dispatch__.")
    elif len(set(got)) == len(got) < len(want) and len(set(want)) < len(want):
        msg += (" Your trace has no repeats, torch's has: record every call, not each distinct "
                "overload once.")
    elif {yours, theirs} & defensive:
        msg += (" Does your mode keep references to tensors (args or outputs)? The autograd "
                "engine and AccumulateGrad reuse a tensor only when nothing else holds it (else "
                "they detach or copy it), so holding tensors changes which ops run. Record only "
                "the overloads (and node names).")
    elif len(got) > len(want):
        msg += (" Record each call once, when __torch_dispatch__ receives it, and run it exactly "
                "as it came, func(*args, **kwargs): a changed call changes what runs after it.")
    else:
        msg += (" Record every call, in the order __torch_dispatch__ receives them, and run each "
                "exactly as it came, func(*args, **kwargs): a changed call changes what runs "
                "after it.")
    raise CheckFailure(msg)


def compare(OpTrace, cases: list) -> None:
    """Run each ``(spec, seed, where)`` of ``cases`` under the reference mode here and under the
    answer's mode in its kernel (one probe for all); compare, case by case."""
    seen = OpTrace.probe(probes.traces, [[spec, seed] for spec, seed, _ in cases])
    _not_a_mode(seen)
    for (spec, seed, where), run in paired(cases, seen["runs"], "programs"):
        ref, want_values = _reference(spec, seed)
        if "raised" in run:
            raise AnswerRaised(run["raised"])
        if run["left_on_stack"]:
            raise CheckFailure("after `with OpTrace():` the mode is still on the dispatch-mode "
                               "stack; don't override __enter__/__exit__ (or call super()'s).")
        ops, nodes = _recorded(run, where)
        names = _check_items(ops, where)
        _same_values(run["values"], want_values, where)
        want = [str(op) for op in ref.ops]
        if len(names) > len(want) and names[len(names) - len(want):] == want:
            raise CheckFailure(
                f"on {where}, your trace holds {len(names) - len(want)} ops before the ones this "
                "`with` block ran: a new OpTrace() must start with empty lists of its own (lists "
                "made once for the class, e.g. class attributes, are shared by every instance).")
        _diff(names, want, where)
        _diff_nodes(names, nodes, ref, where)


def _rng(ctx, offset: int) -> random.Random:
    return random.Random(f"{EXERCISE}:{ctx.seed}:{offset}")


# ------------------------------------------------------------------------ checks
@check(EXERCISE)
def mlp_forward_backward(OpTrace, ctx):
    """records the overloads of an MLP's forward and backward, in order, with their nodes"""
    compare(OpTrace, [(["mlp"], ctx.seed, "a two-layer MLP, loss and torch.autograd.grad")])


@check(EXERCISE)
def views_and_inplace(OpTrace, ctx):
    """records views, an in-place op on a view, and the backward that undoes it"""
    compare(OpTrace, [(["views_inplace"], ctx.seed + 1, "b = a.clone(); b[1:3].mul_(2); "
                       "c = b.t().exp(); torch.autograd.grad(c.sum(), a)")])


@check(EXERCISE, hidden=True)
def random_programs(OpTrace, ctx):
    """matches the dispatcher's record on seeded random programs, forward and backward"""
    rng = _rng(ctx, 2)
    cases = []
    for i in range(8):
        n_ops, plan_seed = rng.randint(2, 10), rng.random()
        cases.append((["random", plan_seed, n_ops], ctx.seed + 100 + i,
                      f"random program #{i} ({n_ops} ops, seed {ctx.seed})"))
    compare(OpTrace, cases)


@check(EXERCISE, hidden=True)
def backward_into_leaves_and_kwargs(OpTrace, ctx):
    """.backward() into leaves, factory functions and keyword arguments"""
    compare(OpTrace, [(["accumulate_and_kwargs"], ctx.seed + 3, "zeros(dtype=float64), "
                       "add(alpha=3), sum(dtype=float64), softmax, then out.backward()")])


@check(EXERCISE, hidden=True)
def nested_modes(OpTrace, ctx):
    """nested modes: each mode on the stack sees every op, yours inside or outside another"""
    seed = ctx.seed + 4
    seen = OpTrace.probe(probes.nested_traces, ["mlp"], seed)
    _not_a_mode(seen)
    ref, want_values = _reference(["mlp"], seed)
    want = [str(op) for op in ref.ops]
    for order, run in paired(list(probes.NESTINGS), seen["runs"], "nestings"):
        if "raised" in run:
            raise AnswerRaised(run["raised"])
        where = f"the MLP program with {order}"
        _same_values(run["values"], want_values, where)
        for label in ("inner", "outer"):
            ops, nodes = _recorded(run[label], f"{where} (the {label} mode)")
            names = _check_items(ops, where)
            if names != want:
                hint = ""
                if label == "outer" and not names:
                    hint = (" The outer mode saw nothing: while __torch_dispatch__ runs, the mode "
                            "is already popped off the stack, so calling func(*args, **kwargs) "
                            "reaches the next mode down; disabling torch dispatch around it "
                            "(torch._C._DisableTorchDispatch) hides the op from every other mode.")
                try:
                    _diff(names, want, f"{where} (the {label} mode)")
                except CheckFailure as exc:
                    raise CheckFailure(str(exc) + hint) from None
            _diff_nodes(names, nodes, ref, f"{where} (the {label} mode)")


@check(EXERCISE, hidden=True)
def edge_cases(OpTrace, ctx):
    """a program with no operator calls; no_grad, integer tensors and a seeded factory"""
    compare(OpTrace, [
        (["no_ops"], ctx.seed + 5, "a program that only reads x.shape, x.dtype, x.dim()"),
        (["no_grad_and_ints"], ctx.seed + 6,
         "y = x * 2 under no_grad, torch.arange(3).flip(0), randn with a generator, indexing")])
