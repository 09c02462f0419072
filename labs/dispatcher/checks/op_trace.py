"""Checks of ``dispatcher.op-trace``: ``OpTrace``, a ``TorchDispatchMode`` whose ``ops`` list records
every ``OpOverload`` that reaches the mode (aten operators, in practice) while it is active,
in call order, forward and backward, and whose ``nodes`` list records, for each of them, the name of
the autograd Node whose backward issued it (``torch._C._current_autograd_node()``), or None.

The oracle is the dispatcher itself, observed by a minimal reference mode of these checks: each
program is built twice from the same seed, run once under the reference mode and once under the
answer's mode, and the two sequences of overloads are compared, as are the values the program
computed (a tracing mode must not change what runs). Nested modes are checked both ways round:
a mode that runs ``func`` with torch dispatch disabled hides the ops from the modes below it.
"""
from __future__ import annotations

import random

from grader.checks import CheckFailure, check, exact, plain_tensor

EXERCISE = "dispatcher.op-trace"


# ------------------------------------------------------------------------ the oracle
def _reference_mode():
    """A minimal recording mode: the dispatcher's own account of which overloads run."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reference(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.nodes = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            node = torch._C._current_autograd_node()
            self.ops.append(func)
            self.nodes.append(None if node is None else node.name())
            return func(*args, **(kwargs or {}))

    return Reference()


# ------------------------------------------------------------------------ programs
# A program is ``build(g) -> body``: ``build`` makes the inputs (outside any mode) from a seeded
# generator; ``body()`` runs forward and backward and returns the tensors to compare.

def _mlp(g):
    import torch
    import torch.nn.functional as F

    x = torch.randn(5, 3, generator=g)
    w1 = (torch.randn(4, 3, generator=g) * 0.5).requires_grad_()
    b1 = torch.randn(4, generator=g).requires_grad_()
    w2 = (torch.randn(2, 4, generator=g) * 0.5).requires_grad_()

    def body():
        hidden = torch.tanh(F.linear(x, w1, b1))
        loss = (hidden @ w2.T).pow(2).mean()
        return [loss, *torch.autograd.grad(loss, [w1, b1, w2])]
    return body


def _views_inplace(g):
    import torch

    a = torch.randn(4, 3, generator=g).requires_grad_()

    def body():
        b = a.clone()
        b[1:3].mul_(2)                      # an in-place op on a view: CopySlices in backward
        c = b.t().exp()
        return [c, *torch.autograd.grad(c.sum(), a)]
    return body


def _accumulate_and_kwargs(g):
    """.backward() into leaves (AccumulateGrad), factories and ops whose kwargs matter."""
    import torch

    x = torch.randn(3, 4, generator=g).requires_grad_()
    w = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()

    def body():
        z = torch.zeros(3, 4, dtype=torch.float64)
        y = torch.add(z, x.to(torch.float64), alpha=3)      # kwargs: dtype, alpha
        s = (y * w).sum(dim=1, dtype=torch.float64)
        out = torch.softmax(s, dim=0)[0] + torch.ones((), dtype=torch.float64)
        out.backward()
        return [out, x.grad, w.grad]
    return body


def _random_program(g, rng, n_ops: int):
    """A seeded random program over (n, m) tensors: pointwise ops, matmul, views, reductions,
    in-place ops on clones, dtype round trips; then gradients of a sum."""
    import torch

    n, m = rng.randint(1, 4), rng.randint(1, 4)
    leaves = [torch.randn(n, m, generator=g).requires_grad_() for _ in range(rng.randint(1, 3))]
    square = torch.randn(m, m, generator=g).requires_grad_()
    const = torch.randn(n, m, generator=g)
    plan = [rng.randrange(16) for _ in range(n_ops)]
    picks = [(rng.random(), rng.random()) for _ in range(n_ops)]
    use_backward = rng.random() < 0.5

    def body():
        pool = list(leaves) + [const]

        def pick(u):
            return pool[int(u * len(pool))]

        for kind, (u, v) in zip(plan, picks):
            a, b = pick(u), pick(v)
            if kind == 0:
                r = a + b
            elif kind == 1:
                r = torch.mul(a, b)
            elif kind == 2:
                r = torch.sin(a) * torch.sigmoid(b)
            elif kind == 3:
                r = a @ square
            elif kind == 4:
                r = a.t().contiguous().t() * 2           # a view, a copy and a view back
            elif kind == 5:
                r = a.sum(dim=1, keepdim=True).expand(n, m) - b
            elif kind == 6:
                r = torch.softmax(a, dim=-1)
            elif kind == 7:
                c = a.clone()
                c.mul_(b)                                # in-place on a fresh clone
                r = c
            elif kind == 8:
                r = torch.cat([a, b], dim=0)[::2][:n]    # cat, slicing with a step
                if r.shape[0] < n:
                    r = torch.cat([r, b[: n - r.shape[0]]], dim=0)
            elif kind == 9:
                r = torch.where(a > 0, a, b * 0.5)
            elif kind == 10:
                r = a.to(torch.float64).exp().to(torch.float32)
            elif kind == 11:
                r = torch.relu(a) + torch.clamp(b, min=-0.5)
            elif kind == 12:
                r = a.unsqueeze(0).mean(dim=0)
            elif kind == 13:
                r = torch.tanh(a).pow(2)
            elif kind == 14:
                r = a.reshape(-1).flip(0).reshape(n, m)
            else:
                r = torch.add(a, b, alpha=-0.5)
            pool.append(r)
        out = pool[-1].sum()
        for t in pool[-3:-1]:
            out = out + t.sum()
        if not out.requires_grad:
            out = out + leaves[0].sum()
        if use_backward:
            out.backward()
            return [out] + [t.grad for t in leaves + [square]]
        return [out, *torch.autograd.grad(out, leaves + [square], allow_unused=True)]
    return body


def _no_ops(g):
    """Only Python-level reads: no operator reaches the dispatcher."""
    import torch

    x = torch.randn(2, 3, generator=g)

    def body():
        _ = x.shape, x.dtype, x.dim(), x.requires_grad, x.is_contiguous()
        return []
    return body


def _no_grad_and_ints(g):
    """Ops under no_grad (no backward), integer tensors, a factory with a generator."""
    import torch

    x = torch.randn(3, generator=g).requires_grad_()

    def body():
        with torch.no_grad():
            y = x * 2
        idx = torch.arange(3).flip(0)
        r = torch.randn(3, generator=torch.Generator().manual_seed(7))
        return [y, idx, r, y[idx] + r]
    return body


# ------------------------------------------------------------------------ comparing
def _mode(OpTrace):
    """Instantiate the answer, which must be a TorchDispatchMode class. What it keeps, and how, is
    the answer's design; only what it shows after a run (``ops`` and ``nodes``) is checked."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if not (isinstance(OpTrace, type) and issubclass(OpTrace, TorchDispatchMode)):
        raise CheckFailure(
            f"OpTrace is {OpTrace!r}; it must be a class that subclasses "
            "torch.utils._python_dispatch.TorchDispatchMode (a TorchFunctionMode sees torch "
            "API calls, not the OpOverloads the dispatcher runs).")
    return OpTrace()


def _recorded(mode, where: str) -> tuple[list, list]:
    """(ops, nodes) of a mode after a run, read once, each exactly a list, with every entry of
    nodes exactly a str or None: a subclass could lie about its items or what it equals."""
    ops, nodes = getattr(mode, "ops", None), getattr(mode, "nodes", None)
    for attr, value in (("ops", ops), ("nodes", nodes)):
        if not isinstance(value, list):
            raise CheckFailure(f"on {where}, after the `with` block your mode's `{attr}` is "
                               f"{type(value).__name__}, not a list; the contract asks for two lists, "
                               "`ops` and `nodes`, one entry per op that reached the mode.")
        exact(value, list, f"on {where}, your mode's `{attr}`")
    for i, node in enumerate(nodes):
        exact(node, (str, type(None)), f"on {where}, nodes[{i}]")
    return list(ops), list(nodes)


def _name(op) -> str:
    return str(op)


def _check_items(ops, where: str) -> None:
    import torch

    for i, op in enumerate(ops):
        if isinstance(op, torch._ops.OpOverload):
            continue
        if isinstance(op, torch._ops.OpOverloadPacket):
            raise CheckFailure(
                f"on {where}, entry {i} of ops is the OpOverloadPacket {op}; record `func` itself, "
                "the OpOverload (e.g. aten.add.Tensor, aten.mm.default): one packet (aten.add) "
                "groups several overloads with different schemas, and the dispatcher runs exactly "
                "one of them.")
        raise CheckFailure(
            f"on {where}, entry {i} of ops is {op!r} ({type(op).__name__}); record the OpOverload "
            "object `func` that __torch_dispatch__ receives, not its name or anything else.")


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
        # what ran under the mode must be a plain tensor: a subclass could fake allclose/shape/dtype
        plain_tensor(a, f"on {where}, result #{i} of the program under your mode (a tracing mode "
                        "returns func's result unchanged)")
        if a.dtype != b.dtype or a.shape != b.shape or not _close(a, b):
            what = (f"dtype {a.dtype} instead of {b.dtype}" if a.dtype != b.dtype else
                    f"shape {tuple(a.shape)} instead of {tuple(b.shape)}" if a.shape != b.shape else
                    "different values")
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
                f"on {where}, nodes[{i}] (for {_name(ref.ops[i])}) is {a!r}; torch says {b!r}. Use "
                "torch._C._current_autograd_node(): None outside the backward pass, else the Node "
                "the engine is running; record its name() (a string such as 'MulBackward0').")


def _diff(got, want, where: str) -> None:
    if [*map(id, got)] == [*map(id, want)]:
        return
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a is not b), min(len(got), len(want)))
    before = ", ".join(_name(o) for o in want[max(0, i - 3):i]) or "(the start)"
    yours = _name(got[i]) if i < len(got) else "(the end of your trace)"
    theirs = _name(want[i]) if i < len(want) else "(the end of torch's trace)"
    msg = (f"on {where}, your trace has {len(got)} ops and torch's has {len(want)}; they first "
           f"differ at position {i}, after {before}: you recorded {yours}, torch ran {theirs}.")
    defensive = {"aten.detach.default", "aten.clone.default", "aten.copy_.default",
                 "aten.new_empty_strided.default"}
    if not got:
        msg += " Your mode recorded nothing."
    elif len(got) < len(want) and [*map(id, got)] == [*map(id, want[:len(got)])]:
        msg += (" Everything from there on is missing: the backward pass (the engine calling the "
                "derivative formulas) dispatches its ops too, with grad mode off; record every call "
                "that reaches __torch_dispatch__.")
    elif len(set(map(id, got))) == len(got) < len(want) and len(set(map(id, want))) < len(want):
        msg += (" Your trace has no repeats, torch's has: record every call, not each distinct "
                "overload once.")
    elif {yours, theirs} & defensive:
        msg += (" Does your mode keep references to tensors (args or outputs)? The autograd engine "
                "and AccumulateGrad reuse a tensor only when nothing else holds it (else they "
                "detach or copy it), so holding tensors changes which ops run. Record only the "
                "overloads (and node names).")
    elif len(got) > len(want):
        msg += (" Record each call once, when __torch_dispatch__ receives it, and run it exactly as "
                "it came, func(*args, **kwargs): a changed call changes what runs after it.")
    else:
        msg += (" Record every call, in the order __torch_dispatch__ receives them, and run each "
                "exactly as it came, func(*args, **kwargs): a changed call changes what runs after it.")
    raise CheckFailure(msg)


def compare(OpTrace, build, seed: int, where: str) -> None:
    """Run ``build``'s program under the reference mode and under the answer's mode; compare."""
    import torch

    ref = _reference_mode()
    body = build(torch.Generator().manual_seed(seed))
    with ref:
        want_values = body()
    mode = _mode(OpTrace)
    body = build(torch.Generator().manual_seed(seed))
    with mode:
        got_values = body()
    if torch._C._len_torch_dispatch_stack():
        raise CheckFailure("after `with OpTrace():` the mode is still on the dispatch-mode stack; "
                           "don't override __enter__/__exit__ (or call super()'s).")
    ops, nodes = _recorded(mode, where)
    _check_items(ops, where)
    _same_values(got_values, want_values, where)
    if len(ops) > len(ref.ops) and [*map(id, ops[len(ops) - len(ref.ops):])] == [*map(id, ref.ops)]:
        raise CheckFailure(
            f"on {where}, your trace holds {len(ops) - len(ref.ops)} ops before the ones this "
            "`with` block ran: a new OpTrace() must start with empty lists of its own (lists "
            "made once for the class, e.g. class attributes, are shared by every instance).")
    _diff(ops, ref.ops, where)
    _diff_nodes(ops, nodes, ref, where)


def _rng(ctx, offset: int) -> random.Random:
    return random.Random(f"{EXERCISE}:{ctx.seed}:{offset}")


# ------------------------------------------------------------------------ checks
@check(EXERCISE)
def mlp_forward_backward(OpTrace, ctx):
    """records the overloads of an MLP's forward and backward, in order, with their nodes"""
    compare(OpTrace, _mlp, ctx.seed, "a two-layer MLP, loss and torch.autograd.grad")


@check(EXERCISE)
def views_and_inplace(OpTrace, ctx):
    """records views, an in-place op on a view, and the backward that undoes it"""
    compare(OpTrace, _views_inplace, ctx.seed + 1,
            "b = a.clone(); b[1:3].mul_(2); c = b.t().exp(); torch.autograd.grad(c.sum(), a)")


@check(EXERCISE, hidden=True)
def random_programs(OpTrace, ctx):
    """matches the dispatcher's record on seeded random programs, forward and backward"""
    rng = _rng(ctx, 2)
    for i in range(8):
        n_ops, plan_seed = rng.randint(2, 10), rng.random()
        compare(OpTrace, lambda g, s=plan_seed, k=n_ops: _random_program(g, random.Random(s), k),
                ctx.seed + 100 + i, f"random program #{i} ({n_ops} ops, seed {ctx.seed})")


@check(EXERCISE, hidden=True)
def backward_into_leaves_and_kwargs(OpTrace, ctx):
    """.backward() into leaves, factory functions and keyword arguments"""
    compare(OpTrace, _accumulate_and_kwargs, ctx.seed + 3,
            "zeros(dtype=float64), add(alpha=3), sum(dtype=float64), softmax, then out.backward()")


@check(EXERCISE, hidden=True)
def nested_modes(OpTrace, ctx):
    """nested modes: each mode on the stack sees every op, yours inside or outside another"""
    import torch

    build = _mlp
    ref = _reference_mode()
    body = build(torch.Generator().manual_seed(ctx.seed + 4))
    with ref:
        want = body()
    for order in ("yours inside a plain recording mode", "a plain recording mode inside yours",
                  "yours inside another of yours"):
        outer = _reference_mode() if order.startswith("yours inside a") else _mode(OpTrace)
        inner = _reference_mode() if order.startswith("a plain") else _mode(OpTrace)
        body = build(torch.Generator().manual_seed(ctx.seed + 4))
        with outer:
            with inner:
                got = body()
        where = f"the MLP program with {order}"
        _same_values(got, want, where)
        for label, m in (("inner", inner), ("outer", outer)):
            ops, nodes = _recorded(m, f"{where} (the {label} mode)")
            _check_items(ops, where)
            if [*map(id, ops)] != [*map(id, ref.ops)]:
                hint = ""
                if label == "outer" and not ops:
                    hint = (" The outer mode saw nothing: while __torch_dispatch__ runs, the mode "
                            "is already popped off the stack, so calling func(*args, **kwargs) "
                            "reaches the next mode down; disabling torch dispatch around it "
                            "(torch._C._DisableTorchDispatch) hides the op from every other mode.")
                try:
                    _diff(ops, ref.ops, f"{where} (the {label} mode)")
                except CheckFailure as exc:
                    raise CheckFailure(str(exc) + hint) from None
            _diff_nodes(ops, nodes, ref, f"{where} (the {label} mode)")


@check(EXERCISE, hidden=True)
def edge_cases(OpTrace, ctx):
    """a program with no operator calls; no_grad, integer tensors and a seeded factory"""
    compare(OpTrace, _no_ops, ctx.seed + 5, "a program that only reads x.shape, x.dtype, x.dim()")
    compare(OpTrace, _no_grad_and_ints, ctx.seed + 6,
            "y = x * 2 under no_grad, torch.arange(3).flip(0), randn with a generator, indexing")
