"""Checks of ``autograd.graph-walk``: the learner's ``walk_graph(output)`` against torch's own graph.

The oracle is the graph the forward pass recorded: every expectation is read from
``grad_fn`` / ``next_functions`` / ``AccumulateGrad.variable`` of graphs built here from seeded
random inputs, some of them by two threads (:func:`random_graph`'s ``worker``), where descending
``_sequence_nr()`` is not a topological order. :func:`random_graph` is shared with the engine's
checks.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
from collections import Counter

from grader.checks import CheckFailure, check, exact
from labs.autograd.checks._plain import DICTS

EXERCISE = "autograd.graph-walk"
_KEYS = ("nodes", "edges", "leaves")


# --------------------------------------------------------------------------- graphs to walk


def _ri(g, lo: int, hi: int) -> int:
    """A seeded integer in [lo, hi]."""
    import torch

    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _twice_function():
    """A tiny custom autograd.Function (its node is a Python ``...Backward`` node)."""
    import torch

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    return Twice


def random_graph(g, n_ops: int = 20, *, custom_function: bool = False, worker=None):
    """A seeded random DAG of float64 vector ops with fan-out, reuse, constants and splits.

    Returns ``(leaves, output)``: the leaves that require grad (some may end up unused) and a
    non-leaf output (a vector, summed to a scalar half of the time). ``custom_function`` mixes in
    a custom ``autograd.Function`` node (not callable as ``node(*grads)``: walk-only graphs).
    ``worker``: a :class:`Worker`; then the calling thread and the worker's thread take turns
    building the ops, so nodes the worker makes late carry lower sequence numbers than the
    calling thread's nodes they point to.
    """
    import torch

    n = _ri(g, 1, 5)
    leaves = [torch.randn(n, generator=g, dtype=torch.float64).requires_grad_() for _ in range(_ri(g, 2, 4))]
    consts = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(2)]
    pool = list(leaves) + consts
    twice = _twice_function() if custom_function else None

    def pick():
        if _ri(g, 0, 2) == 0:                      # anything made so far: fan-out and reuse
            return pool[_ri(g, 0, len(pool) - 1)]
        return pool[max(0, len(pool) - 1 - _ri(g, 0, 3))]   # something recent: depth

    def make(kind, a, b):
        """The tensors op ``kind`` makes from ``a`` and ``b``."""
        if kind == 0:
            new = [torch.mul(a, b)]
        elif kind == 1:
            new = [torch.add(a, b)]
        elif kind == 2:
            new = [torch.tanh(a)]
        elif kind == 3:
            new = [torch.mul(torch.sin(a), a)]
        elif kind == 4:
            new = [torch.mul(a, a)]                 # the same tensor twice: two equal edges
        elif kind == 5:
            new = [torch.sub(a, b)]
        elif kind == 6:
            new = [torch.mul(a, consts[_ri(g, 0, 1)])]   # an input without grad: a None edge
        elif kind == 7:                                 # a multi-output node, outputs used or not
            parts = torch.split(torch.cat([a, b]), n)
            new = [p for p, keep in zip(parts, (_ri(g, 0, 1), 1)) if keep]
        elif kind == 8:
            new = [torch.sum(torch.stack([a, b, a]), 0)]
        elif kind == 9 and twice is not None:
            new = [twice.apply(a)]
        else:
            new = [torch.mul(torch.sigmoid(a), b)]
        return new

    in_worker = False
    for _ in range(n_ops):
        kind, a, b = _ri(g, 0, 10), pick(), pick()
        if worker is not None and _ri(g, 0, 2) == 0:   # runs of ops on either thread
            in_worker = not in_worker
        new = worker.run(make, kind, a, b) if in_worker else make(kind, a, b)
        pool.extend(t for t in new if t.requires_grad)
    made = [t for t in pool if t.grad_fn is not None]
    if not made:
        made = [torch.mul(leaves[0], leaves[-1])]
    picked = made[-_ri(g, 1, min(4, len(made))):]
    if _ri(g, 0, 2) == 0 and len(made) > len(picked):
        picked.append(made[_ri(g, 0, len(made) - 1)])
    out = functools.reduce(torch.add, picked)
    if _ri(g, 0, 1):
        out = torch.sum(out)
    return leaves, out


class Worker:
    """A second thread that builds parts of a graph; use as ``with Worker() as w: w.run(fn, *args)``.

    Sequence numbers are per thread (``aten/src/ATen/SequenceNumber.h``: a ``thread_local``
    counter, which ``torch/csrc/autograd/node.h: Node::Node`` reads), and the worker's counts from
    0. Entering moves the calling thread's counter to at least ``reserve`` (more numbers than the
    worker will use), so that no two nodes of the graph share a number: among equal numbers the
    ready queue's order is its heap's, which no answer could replay. ``context``: a callable
    returning a context manager to enter around each job in the worker (saved-tensor hooks and
    grad mode are thread-local too).
    """

    def __init__(self, reserve: int = 1000, context=None):
        self.reserve, self.context = reserve, context or contextlib.nullcontext

    def __enter__(self):
        import torch

        leaf = torch.zeros((), requires_grad=True)
        while (leaf * 1).grad_fn._sequence_nr() < self.reserve:   # one node per turn
            pass
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)   # one thread throughout
        return self

    def __exit__(self, *exc):
        self._pool.shutdown(wait=True)

    def run(self, fn, *args):
        """``fn(*args)``, run on the worker thread."""
        def job():
            with self.context():
                return fn(*args)
        return self._pool.submit(job).result()


def crossed_graph(g, worker):
    """The smallest graph where descending ``_sequence_nr()`` is no schedule: ``h = x.sin()`` here,
    ``k = (h * w).exp()`` on ``worker`` (numbered from 0, below ``h``'s node), then
    ``(k + h).sum()`` here. Returns ``([x, w], output)``; float64 leaves of a seeded shape."""
    import torch

    n = _ri(g, 1, 5)
    x, w = (torch.randn(n, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    h = torch.sin(x)
    k = worker.run(lambda: torch.exp(torch.mul(h, w)))
    return [x, w], torch.sum(torch.add(k, h))


def mlp(g):
    """A two-layer perceptron with hand-made parameters: (params, loss)."""
    import torch

    x = torch.randn(5, 3, generator=g)
    w1 = (torch.randn(4, 3, generator=g) * 0.5).requires_grad_()
    b1 = torch.randn(4, generator=g).requires_grad_()
    w2 = (torch.randn(2, 4, generator=g) * 0.5).requires_grad_()
    b2 = torch.randn(2, generator=g).requires_grad_()
    hidden = torch.tanh(x @ w1.T + b1)
    loss = ((hidden @ w2.T + b2) ** 2).mean()
    return [w1, b1, w2, b2], loss


# --------------------------------------------------------------------------- the oracle


def torch_graph(output):
    """(nodes, edges, leaves) of torch's graph behind ``output``, read iteratively."""
    root = output.grad_fn
    nodes, edges, leaves, seen, stack = [], [], [], {id(root)}, [root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        if hasattr(node, "variable"):
            leaves.append(node.variable)
        for nxt, input_nr in node.next_functions:
            if nxt is None:
                continue
            edges.append((node, nxt, input_nr))
            if id(nxt) not in seen:
                seen.add(id(nxt))
                stack.append(nxt)
    return nodes, edges, leaves


def describe(node) -> str:
    """A node as a learner can find it: its type, and its sequence number or its leaf's shape."""
    if node is None:
        return "None"
    if hasattr(node, "variable"):
        return f"AccumulateGrad (of a leaf of shape {tuple(node.variable.shape)})"
    try:
        return f"{type(node).__name__} (_sequence_nr() {node._sequence_nr()})"
    except Exception:
        return repr(node)


def _compare(walk_graph, output, where: str) -> None:
    """Run the answer on ``output`` and compare with torch's graph; raise CheckFailure on a miss."""
    nodes, edges, leaves = torch_graph(output)
    try:
        got = walk_graph(output)
    except RecursionError:
        raise CheckFailure(
            f"on {where}, your walk hit Python's recursion limit. Backward graphs can be thousands "
            "of nodes deep; walk them with an explicit stack (a list you push to and pop from), "
            "as Engine::compute_dependencies does.") from None
    if not isinstance(got, dict):
        raise CheckFailure(f"walk_graph must return a dict with keys {list(_KEYS)}; got {type(got).__name__}.")
    # Plain types only, before anything is compared: a subclass could lie (__contains__, __iter__).
    exact(got, DICTS, "the value walk_graph returned")
    for k in got:
        if isinstance(k, str):
            exact(k, str, f"the key {str.__repr__(k)} of walk_graph's dict")
    if any(k not in got for k in _KEYS):
        raise CheckFailure(f"walk_graph must return a dict with keys {list(_KEYS)}; got "
                           f"{type(got).__name__} with keys {list(got)}.")
    g_nodes, g_edges, g_leaves = (
        list(exact(got[k], (list, tuple), f"walk_graph(output)[{k!r}]")) for k in _KEYS)

    # nodes: each distinct node once, in a topological order
    if any(n is None for n in g_nodes):
        raise CheckFailure(f"on {where}, 'nodes' contains None. A (None, 0) entry of next_functions "
                           "means that input does not require grad: there is no node there; skip it.")
    counts = Counter(id(n) for n in g_nodes)
    dup = next((n for n in g_nodes if counts[id(n)] > 1), None)
    if dup is not None:
        raise CheckFailure(
            f"on {where}, {describe(dup)} appears {counts[id(dup)]} times in 'nodes'. A node reached "
            "along several paths is still one node: keep a visited set keyed by the node object itself "
            "(two different nodes can share a name, so don't key by name()).")
    want = {id(n): n for n in nodes}
    missing = [n for n in nodes if id(n) not in counts]
    if missing:
        kinds = Counter(type(n).__name__ for n in missing)
        raise CheckFailure(
            f"on {where}, 'nodes' misses {len(missing)} of the {len(nodes)} reachable nodes "
            f"({', '.join(f'{v}x {k}' for k, v in kinds.most_common(4))}), e.g. {describe(missing[0])}. "
            "Follow every non-None entry of next_functions, down to and including the leaves' "
            "AccumulateGrad nodes, and don't merge distinct nodes that share a name.")
    extra = [n for n in g_nodes if id(n) not in want]
    if extra:
        raise CheckFailure(f"on {where}, 'nodes' contains {describe(extra[0])}, which is not reachable "
                           "from output.grad_fn through next_functions.")
    position = {id(n): i for i, n in enumerate(g_nodes)}
    late = next(((s, d) for s, d, _ in edges if position[id(s)] > position[id(d)]), None)
    if late is not None:
        s, d = late
        numbers = [n._sequence_nr() for n in g_nodes]
        ops = [k for n, k in zip(g_nodes, numbers) if not hasattr(n, "variable")]
        if hasattr(d, "variable") and numbers == sorted(numbers, reverse=True):
            by_number = (" (Every AccumulateGrad carries _sequence_nr() UINT64_MAX: a priority for "
                         "the ready queue, which only ever holds nodes already fed, not a place "
                         "in the graph.)")
        elif s._sequence_nr() < d._sequence_nr() and ops == sorted(ops, reverse=True):
            by_number = (" Sorting by _sequence_nr() does not give such an order here: the numbers "
                         "count per thread, and this graph was built by two threads.")
        else:
            by_number = ""
        raise CheckFailure(
            f"on {where}, 'nodes' lists {describe(d)} before {describe(s)}, although "
            f"{describe(s)} has an edge to it (it sends it a gradient). List every node before "
            "all the nodes its edges point to: an order in which backward could run them, each "
            f"node after every node that feeds it.{by_number}")

    # edges: one per non-None next_functions entry, duplicates kept
    for i, edge in enumerate(g_edges):
        if not isinstance(edge, (tuple, list)) or len(edge) != 3:
            raise CheckFailure("'edges' must be a list of (node, next_node, input_nr) triples.")
        exact(edge, (tuple, list), f"edge #{i} of 'edges'")
        if not isinstance(edge[2], int):
            raise CheckFailure("'edges' must be a list of (node, next_node, input_nr) triples; input_nr is "
                               f"an int, the second element of a next_functions pair (edge #{i} has "
                               f"{type(edge[2]).__name__}).")
        exact(edge[2], int, f"the input_nr of edge #{i} of 'edges'")
    got_edges = Counter((id(s), id(d), nr) for s, d, nr in g_edges)
    want_edges = Counter((id(s), id(d), nr) for s, d, nr in edges)
    if got_edges != want_edges:
        by_key = {(id(s), id(d), nr): (s, d, nr) for s, d, nr in edges}
        lacking = want_edges - got_edges
        surplus = got_edges - want_edges
        if lacking:
            key = next(iter(lacking))
            s, d, nr = by_key[key]
            times = want_edges[key]
            raise CheckFailure(
                f"on {where}, 'edges' has the edge {describe(s)} -> {describe(d)} with input_nr {nr} "
                f"{got_edges.get(key, 0)} time(s), but next_functions lists it {times} time(s). Keep one "
                "edge per non-None next_functions entry, duplicates included (x * x has two equal edges).")
        key = next(iter(surplus))
        if key[1] == id(None):
            raise CheckFailure(f"on {where}, 'edges' contains an edge to None: skip (None, 0) entries.")
        raise CheckFailure(
            f"on {where}, 'edges' has {sum(surplus.values())} edge(s) that torch's graph does not, or "
            "with a different input_nr; input_nr is the second element of each next_functions pair.")

    # leaves: the .variable of each AccumulateGrad, once each
    if any(not hasattr(t, "requires_grad") for t in g_leaves):
        raise CheckFailure("'leaves' must hold the leaf tensors themselves (AccumulateGrad.variable).")
    got_leaves = Counter(id(t) for t in g_leaves)
    if any(c > 1 for c in got_leaves.values()):
        raise CheckFailure(f"on {where}, a leaf appears more than once in 'leaves'; list each leaf once.")
    if set(got_leaves) != {id(t) for t in leaves}:
        raise CheckFailure(
            f"on {where}, 'leaves' holds {len(got_leaves)} tensors but {len(leaves)} leaves are reachable. "
            "A leaf is reached through its AccumulateGrad node; its .variable is the leaf tensor itself.")


# --------------------------------------------------------------------------- checks


@check(EXERCISE)
def small_mlp(walk_graph, ctx):
    """matches torch's graph for a two-layer perceptron's loss"""
    _, loss = mlp(ctx.generator(0))
    _compare(walk_graph, loss, "the MLP loss ((tanh(x @ w1.T + b1) @ w2.T + b2) ** 2).mean()")


@check(EXERCISE)
def shared_subexpression(walk_graph, ctx):
    """one node per subexpression, however many paths reach it; x * x gives two edges"""
    import torch

    g = ctx.generator(1)
    x = torch.randn(3, generator=g).requires_grad_()
    w = torch.randn(3, generator=g).requires_grad_()
    c = torch.randn(3, generator=g)
    h = x * w
    out = (h.sin() + h * c + x * x).sum()
    _compare(walk_graph, out, "(h.sin() + h * c + x * x).sum() with h = x * w and c constant")


@check(EXERCISE, hidden=True)
def random_graphs(walk_graph, ctx):
    """matches torch's graph on seeded random DAGs with fan-out, reuse and split outputs"""
    g = ctx.generator(2)
    for i in range(6):
        n_ops = _ri(g, 3, 30)
        _, out = random_graph(g, n_ops, custom_function=bool(i % 2))
        _compare(walk_graph, out, f"random graph #{i} ({n_ops} ops, seed {ctx.seed})")


@check(EXERCISE, hidden=True)
def graphs_built_by_two_threads(walk_graph, ctx):
    """graphs built by two threads, where descending _sequence_nr() is not a topological order"""
    g = ctx.generator(5)
    with Worker() as worker:
        _, out = crossed_graph(g, worker)
    _compare(walk_graph, out, "h = x.sin() built on one thread, k = (h * w).exp() on a second, "
             "then (k + h).sum() on the first")
    for i in range(3):
        n_ops = _ri(g, 8, 30)
        with Worker() as worker:
            _, out = random_graph(g, n_ops, custom_function=bool(i % 2), worker=worker)
        _compare(walk_graph, out, f"random graph #{i} built by two threads ({n_ops} ops, seed "
                 f"{ctx.seed})")


@check(EXERCISE, hidden=True)
def edge_cases(walk_graph, ctx):
    """a 0-d leaf, leaves used along many paths, a split, no-grad inputs, a two-node graph"""
    import torch

    g = ctx.generator(3)
    s = torch.randn((), generator=g).requires_grad_()
    m = torch.randn(2, 3, generator=g).requires_grad_()
    k = torch.randn(3, 2, generator=g)
    y = (m * s) @ k @ (m * s)             # the same leaves reached along four paths
    parts = torch.cat([y.flatten(), m.flatten()]).split(3)
    root = parts[_ri(g, 0, len(parts) - 1)] * s * s
    _compare(walk_graph, root, "a graph built from a 0-d leaf s, a 2x3 leaf m and a split")
    lone = torch.randn(4, generator=g).requires_grad_()
    _compare(walk_graph, lone.exp(), "lone.exp() for a leaf `lone` (two nodes, one edge)")


@check(EXERCISE, hidden=True)
def deep_chain(walk_graph, ctx):
    """handles a chain of thousands of ops without recursion"""
    import torch

    g = ctx.generator(4)
    x = torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()
    y = x
    for i in range(4000 + _ri(g, 0, 500)):
        y = y * 0.999 if i % 2 else y + x
    _compare(walk_graph, y, "a chain of about 4000 ops")
