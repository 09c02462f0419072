"""Checks of ``autograd.engine``: the learner's ``run_backward(output, grad_output)`` against torch's
own engine.

Oracles: ``torch.autograd.grad`` for the gradients, and torch's engine for which nodes run, how
often and in what order. Calls are observed through saved-tensor hooks: every call of a node
unpacks what it saved, so the sequence of unpacks is the sequence of node calls. The same graph is
run by the answer first and by ``torch.autograd.grad`` second (with pre-hooks that name the node
doing each unpack), and the two sequences are compared. Some graphs are built by two threads:
sequence numbers count per thread, so there descending ``_sequence_nr()`` is not a valid schedule
and only dependency counting gives torch's order.
"""
from __future__ import annotations

from collections import Counter

from grader.checks import CheckFailure, check, exact, plain_tensor
from labs.autograd.checks._plain import DICTS
from labs.autograd.checks.graph_walk import (
    Worker,
    _ri,
    crossed_graph,
    describe,
    random_graph,
    torch_graph,
)

EXERCISE = "autograd.engine"


class _Recorder:
    """Saved-tensor hooks that log each unpack, attributed to the node torch's engine is running."""

    def __init__(self):
        self.log: list[int] = []
        self.owner: dict[int, object] = {}
        self.current = None
        self._tokens = 0

    def pack(self, tensor):
        """Pack a saved tensor with a fresh token."""
        self._tokens += 1
        return (self._tokens, tensor)

    def unpack(self, packed):
        """Log the token (and the node torch is running, if any)."""
        token, tensor = packed
        self.log.append(token)
        if self.current is not None:
            self.owner[token] = self.current
        return tensor

    def hooks(self):
        """The saved_tensors_hooks context manager for this recorder."""
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def entering(self, node):
        """A pre-hook that marks `node` as the one torch's engine is running."""
        def prehook(grad_outputs):
            self.current = node
        return prehook


def _build(builder):
    """Run ``builder(rec)`` -> (leaves, output) under a fresh recorder ``rec``; return
    (recorder, leaves, output)."""
    rec = _Recorder()
    with rec.hooks():
        leaves, out = builder(rec)
    return rec, leaves, out


def _calls(rec: _Recorder, tokens: list[int]) -> list:
    """The node calls behind a sequence of unpacks (consecutive unpacks of one node = one call)."""
    calls, last = [], None
    for tok in tokens:
        node = rec.owner.get(tok)
        if node is not last or node is None:
            calls.append(node)
        last = node
    return calls


def _verify(run_backward, builder, where: str, *, grad_output: str = "random",
            counts: bool = True, order: bool = True) -> None:
    """Build a graph, run the answer then torch's engine on it, and compare.

    ``grad_output``: ``"random"`` (seeded by the builder's generator via ``builder.g``) or
    ``"default"`` (the answer is called without one; torch's ``ones_like`` is the oracle's).
    """
    note = (" This graph was built by two threads: sequence numbers count per thread, so a node "
            "made later can carry a lower number than a node it sends gradients to, and ordering "
            "by _sequence_nr() alone runs that node too early. Run a node only when its dependency "
            "count reaches zero." if builder.two_threads else "")
    import torch

    rec, leaves, out = _build(builder)
    if grad_output == "default":
        go, args = torch.ones_like(out), (out,)
    else:
        go = torch.randn(out.shape, generator=builder.g, dtype=out.dtype)
        args = (out, go)
    go_before = go.clone()

    used_engine = []
    handle = out.grad_fn.register_prehook(lambda grads: used_engine.append(True))
    try:
        result = run_backward(*args)
    except RecursionError:
        raise CheckFailure(
            f"on {where}, your engine hit Python's recursion limit. Graphs can be thousands of nodes "
            "deep: count dependencies with an explicit stack and drive execution from a ready queue "
            "(a loop), not by recursion.") from None
    finally:
        handle.remove()
    mine = list(rec.log)
    if used_engine:
        raise CheckFailure("your run_backward ran torch's own engine (backward() or torch.autograd.grad). "
                           "Call the nodes yourself: node(*grads) runs one node's backward.")
    if any(leaf.grad is not None for leaf in leaves):
        raise CheckFailure("after your run_backward a leaf has a .grad: an AccumulateGrad node was called. "
                           "Don't call AccumulateGrad nodes: read the leaf from node.variable and put the "
                           "gradient in the dict you return.")
    if not torch.equal(go, go_before):
        raise CheckFailure(
            "your run_backward modified grad_output in place. A node may return the very tensor it was "
            "given (AddBackward0 passes its gradient through to both inputs), so accumulate out of place "
            "(a + b), as InputBuffer::add does when a gradient may be shared.")

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
    if not isinstance(result, dict):
        raise CheckFailure(f"run_backward must return a dict {{leaf tensor: gradient}}; got {type(result).__name__}.")
    # Plain types only, before anything is compared: a dict or tensor subclass could lie about its
    # contents (__iter__, __torch_function__ answering allclose/shape/dtype).
    exact(result, DICTS, "the value run_backward returned")
    if any(not isinstance(k, torch.Tensor) for k in result):
        raise CheckFailure("the dict's keys must be the leaf tensors themselves (AccumulateGrad.variable), "
                           f"not {type(next(k for k in result if not isinstance(k, torch.Tensor))).__name__}s.")
    for k in result:
        plain_tensor(k, "a key of the dict run_backward returned")
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
        if not isinstance(g, torch.Tensor):
            raise CheckFailure(f"on {where}, the gradient of {label} is a {type(g).__name__}, not a tensor.")
        plain_tensor(g, f"on {where}, the gradient of {label}")
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


class _Builder:
    """A graph builder with the seeded generator it draws from (grad_output is drawn from it too).
    With ``two_threads``, ``fn(g, worker)`` gets a :class:`Worker` whose jobs run under the
    recorder's hooks (saved-tensor hooks are thread-local)."""

    def __init__(self, g, fn, two_threads: bool = False):
        self.g, self.fn, self.two_threads = g, fn, two_threads

    def __call__(self, rec):
        """Build the graph: (leaves, output)."""
        if not self.two_threads:
            return self.fn(self.g)
        with Worker(context=rec.hooks) as worker:
            return self.fn(self.g, worker)


# --------------------------------------------------------------------------- checks


def _fan_out(g):
    """x (3,) and w (2, 3): h = x * w used twice, x used three times, a constant c."""
    import torch

    x = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(2, 3, generator=g, dtype=torch.float64).requires_grad_()
    c = torch.randn(2, 3, generator=g, dtype=torch.float64)
    h = x * w                                     # x is broadcast to (2, 3)
    return [x, w], (h.sin() + h * c + x * x).sum()


def _diamonds(g):
    """Five diamonds in a row: an engine without dependency counting runs nodes many times."""
    import torch

    x = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()
    h = x * w
    for _ in range(5):
        h = torch.tanh(h) * h                     # h feeds two nodes: a diamond per layer
    return [x, w], h


def _two_branches(g):
    """Two branches built interleaved: FIFO or LIFO queues run them in another order than torch."""
    import torch

    x = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    a = x.sin()
    b = w.tanh()
    a2 = a * x
    b2 = b * w
    return [x, w], (a2 * b2.exp() + b2.sigmoid()).sum()


@check(EXERCISE)
def fan_out(run_backward, ctx):
    """gradients match torch.autograd.grad with fan-out, reuse and broadcasting"""
    _verify(run_backward, _Builder(ctx.generator(10), _fan_out),
            "(h.sin() + h * c + x * x).sum() with x of shape (3,), h = x * w of shape (2, 3), c constant "
            "(called without grad_output)",
            grad_output="default", counts=False, order=False)


@check(EXERCISE)
def each_node_once(run_backward, ctx):
    """calls every node exactly once, when all its gradients have arrived"""
    _verify(run_backward, _Builder(ctx.generator(11), _diamonds),
            "five layers of h = tanh(h) * h (a vector output)", order=False)


@check(EXERCISE)
def ready_queue_order(run_backward, ctx):
    """runs ready nodes in the order of torch's ReadyQueue"""
    _verify(run_backward, _Builder(ctx.generator(12), _two_branches),
            "two interleaved branches a = x.sin(), b = w.tanh(), a2 = a * x, b2 = b * w, "
            "then (a2 * b2.exp() + b2.sigmoid()).sum()")


@check(EXERCISE, hidden=True)
def random_graphs(run_backward, ctx):
    """matches torch's engine on seeded random DAGs with fan-out, reuse, constants and splits"""
    g = ctx.generator(13)
    for i in range(8):
        n_ops = _ri(g, 3, 30)
        _verify(run_backward, _Builder(g, lambda gen, n=n_ops: random_graph(gen, n)),
                f"random graph #{i} ({n_ops} ops, seed {ctx.seed})")


@check(EXERCISE, hidden=True)
def graphs_built_by_two_threads(run_backward, ctx):
    """graphs built by two threads, where descending _sequence_nr() is not a valid schedule"""
    g = ctx.generator(16)
    _verify(run_backward, _Builder(g, crossed_graph, two_threads=True),
            "h = x.sin() built on one thread, k = (h * w).exp() on a second, then (k + h).sum() "
            "on the first")
    for i in range(3):
        n_ops = _ri(g, 8, 30)
        _verify(run_backward,
                _Builder(g, lambda gen, worker, n=n_ops: random_graph(gen, n, worker=worker),
                         two_threads=True),
                f"random graph #{i} built by two threads ({n_ops} ops, seed {ctx.seed})")


def _split_root(g):
    """The root is output k of UnbindBackward0 (4 slots); a 0-d leaf and a constant matrix."""
    import torch

    s = torch.randn((), generator=g, dtype=torch.float64).requires_grad_()
    m = torch.randn(2, 3, generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(3, 2, generator=g, dtype=torch.float64)          # no grad: None edges
    y = (m * s) @ k @ (m * s)
    rows = torch.cat([y, m * s]).unbind(0)                            # a node with 4 outputs
    return [s, m], rows[1 + _ri(g, 0, 2)]                             # the root: output k of it


def _leaf_twice(g):
    """x * x (two equal edges to one AccumulateGrad) and a leaf the output does not use."""
    import torch

    x = torch.randn(_ri(g, 1, 4), generator=g, dtype=torch.float64).requires_grad_()
    unused = torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()
    return [x, unused], x * x


def _mixed_dtypes(g):
    """A float32 and a float64 leaf, broadcast together: gradients must be summed and cast back."""
    import torch

    x = torch.randn(3, 1, generator=g).requires_grad_()                       # float32
    y = torch.randn(1, 4, generator=g, dtype=torch.float64).requires_grad_()  # float64
    z = x * y                                      # promoted to float64, broadcast to (3, 4)
    return [x, y], (z.tanh() * x).sum()


@check(EXERCISE, hidden=True)
def edge_cases(run_backward, ctx):
    """a root that is output k of a multi-output node, a 0-d leaf, x * x, an unused leaf, mixed dtypes"""
    g = ctx.generator(14)
    _verify(run_backward, _Builder(g, _split_root),
            "a root taken from torch.cat(...).unbind(0), with a 0-d leaf and a constant matrix")
    _verify(run_backward, _Builder(g, _leaf_twice), "x * x, with another leaf left unused")
    _verify(run_backward, _Builder(g, _mixed_dtypes),
            "a float32 leaf of shape (3, 1) times a float64 leaf of shape (1, 4)")


def _chain(g):
    """A chain of 3000 ops (sin, add of x, scale): too deep for a recursive engine."""
    import torch

    x = torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()
    y = x
    for i in range(3000):
        y = y * 0.999 if i % 2 else torch.sin(y) + x
    return [x], y.sum()


@check(EXERCISE, hidden=True)
def deep_chain(run_backward, ctx):
    """runs a chain of thousands of nodes without recursion"""
    _verify(run_backward, _Builder(ctx.generator(15), _chain), "a chain of 3000 ops",
            counts=False, order=False)
