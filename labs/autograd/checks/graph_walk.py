"""Checks of ``autograd.graph-walk``: the learner's ``walk_graph(output)`` against torch's own graph.

The oracle is the graph the forward pass recorded: every expectation is read from
``grad_fn`` / ``next_functions`` / ``AccumulateGrad.variable`` of graphs built from seeded random
inputs, some of them by two threads (``random_graph``'s ``worker``), where descending
``_sequence_nr()`` is not a topological order.

The answer walks its graph in the kernel (the probe :func:`labs.autograd.probes.walks`), which
names each Node it returned by its ``_sequence_nr()`` (an AccumulateGrad by its leaf); the judge
builds the same graphs here with the same builders (``labs.autograd.probes.walk_cases``), maps
those names onto its own Nodes (sequence numbers shifted by where each graph's numbering started)
and compares with torch's graph.
"""
from __future__ import annotations

from collections import Counter

from grader.checks import AnswerRaised, CheckFailure, check
from labs.autograd import probes
from labs.autograd.checks._plain import DICTS, Shown, exact_shown, is_a, rebuilt, type_name
from labs.autograd.probes import Worker, crossed_graph, mlp, random_graph  # noqa: F401
from labs.autograd.probes import ri as _ri  # noqa: F401  (shared with the other checks)

EXERCISE = "autograd.graph-walk"
_KEYS = ("nodes", "edges", "leaves")


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


class ForeignNode:
    """A Node the answer returned that is none of this graph's (made elsewhere, or a stand-in):
    its type's name and its sequence number, as the probe read them."""

    def __init__(self, type_name: str, seq: int):
        self.type_name, self.seq = type_name, seq

    def __repr__(self):
        return f"{self.type_name} (_sequence_nr() {self.seq})"


def describe(node) -> str:
    """A node as a learner can find it: its type, and its sequence number or its leaf's shape."""
    if node is None:
        return "None"
    if isinstance(node, (ForeignNode, Shown)):
        return repr(node)
    if hasattr(node, "variable"):
        return f"AccumulateGrad (of a leaf of shape {tuple(node.variable.shape)})"
    try:
        return f"{type(node).__name__} (_sequence_nr() {node._sequence_nr()})"
    except Exception:
        return repr(node)


def resolver(nodes: list, leaves: list, kernel_base: int, base: int):
    """A ``resolve`` for :func:`rebuilt` that maps what :func:`labs.autograd.probes.graph_ref`
    named in the kernel onto this process's copy of the graph: a Node by its ``_sequence_nr()``
    (numbers from ``kernel_base`` up count from ``base`` here; lower ones, a worker thread's,
    are the same in both) and its type, an AccumulateGrad and a leaf by the leaf's index in
    ``leaves``; anything else becomes a :class:`ForeignNode` or a tensor of its own."""
    by_seq = {n._sequence_nr(): n for n in nodes if not hasattr(n, "variable")}
    accumulators = {id(n.variable): n for n in nodes if hasattr(n, "variable")}
    foreign: dict = {}   # one stand-in per foreign Node, however often it is named

    def resolve(ref: dict):
        kind = ref.get("?")
        if kind == "node":
            seq, leaf = ref.get("seq"), ref.get("leaf")
            if type(leaf) is int and 0 <= leaf < len(leaves):
                if id(leaves[leaf]) in accumulators:
                    return accumulators[id(leaves[leaf])]
            elif type(seq) is int:
                mine = by_seq.get(seq - kernel_base + base if seq >= kernel_base else seq)
                if mine is not None and type(mine).__name__ == ref.get("type"):
                    return mine
            key = (str(ref.get("type")), seq, leaf)
            return foreign.setdefault(key, ForeignNode(key[0], seq))
        if kind == "leaf" and type(ref.get("index")) is int and 0 <= ref["index"] < len(leaves):
            return leaves[ref["index"]]
        if kind == "tensor":
            return ref.get("value")
        return None

    return resolve


def _compare(got, output, leaves_made: list, kernel_base: int, base: int, where: str) -> None:
    """Compare what the answer's walk gave (a probe's entry, ``got``) with torch's graph behind
    ``output`` (built here, its own numbering starting at ``base``); raise CheckFailure on a
    miss."""
    nodes, edges, leaves = torch_graph(output)
    if "raised" in got:
        if got["raised"].get("ename") == "RecursionError":
            raise CheckFailure(
                f"on {where}, your walk hit Python's recursion limit. Backward graphs can be "
                "thousands of nodes deep; walk them with an explicit stack (a list you push to "
                "and pop from), as Engine::compute_dependencies does.")
        raise AnswerRaised(got["raised"])
    got = rebuilt(got["got"], resolver(nodes, leaves_made, kernel_base, base))
    if not is_a(got, dict):
        raise CheckFailure(f"walk_graph must return a dict with keys {list(_KEYS)}; got "
                           f"{type_name(got)}.")
    # Plain types only, before anything is compared: a subclass could lie (__contains__, __iter__).
    exact_shown(got, DICTS, "the value walk_graph returned")
    for k in got:
        if is_a(k, str):
            exact_shown(k, str, f"the key {str.__repr__(k) if type(k) is str else k!r} of "
                        "walk_graph's dict")
    if any(k not in got for k in _KEYS):
        raise CheckFailure(f"walk_graph must return a dict with keys {list(_KEYS)}; got "
                           f"{type_name(got)} with keys {list(got)}.")
    g_nodes, g_edges, g_leaves = (
        list(exact_shown(got[k], (list, tuple), f"walk_graph(output)[{k!r}]")) for k in _KEYS)

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
        kinds = Counter(type(n).__name__ for n in missing).most_common()
        listed = ", ".join(f"{v}x {k}" for k, v in kinds[:4])
        listed += f" and {len(kinds) - 4} more kind(s)" if len(kinds) > 4 else ""
        raise CheckFailure(
            f"on {where}, 'nodes' misses {len(missing)} of the {len(nodes)} reachable nodes "
            f"({listed}), e.g. {describe(missing[0])}. "
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
        if is_a(edge, (tuple, list)):
            exact_shown(edge, (tuple, list), f"edge #{i} of 'edges'")
        if not isinstance(edge, (tuple, list)) or len(edge) != 3:
            raise CheckFailure("'edges' must be a list of (node, next_node, input_nr) triples.")
        if not is_a(edge[2], int):
            raise CheckFailure("'edges' must be a list of (node, next_node, input_nr) triples; input_nr is "
                               f"an int, the second element of a next_functions pair (edge #{i} has "
                               f"{type_name(edge[2])}).")
        exact_shown(edge[2], int, f"the input_nr of edge #{i} of 'edges'")
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


def _judge(walk_graph, name: str, ctx) -> None:
    """Walk the graphs of check ``name`` in the kernel (one probe call) and compare each with the
    same graph built here, in order."""
    seen = walk_graph.probe(probes.walks, name, ctx.seed)
    if type(seen) is not list:
        raise CheckFailure("what came back from your walk is not the probe's report.")
    for i, (where, leaves, output, base) in enumerate(probes.walk_cases(name, ctx.seed)):
        got = seen[i] if i < len(seen) else None
        if type(got) is not dict or ("raised" not in got and type(got.get("base")) is not int):
            raise CheckFailure("what came back from your walk is not the probe's report.")
        _compare(got, output, leaves, got.get("base", 0), base, where)


@check(EXERCISE)
def small_mlp(walk_graph, ctx):
    """matches torch's graph for a two-layer perceptron's loss"""
    _judge(walk_graph, "small_mlp", ctx)


@check(EXERCISE)
def shared_subexpression(walk_graph, ctx):
    """one node per subexpression, however many paths reach it; x * x gives two edges"""
    _judge(walk_graph, "shared_subexpression", ctx)


@check(EXERCISE, hidden=True)
def random_graphs(walk_graph, ctx):
    """matches torch's graph on seeded random DAGs with fan-out, reuse and split outputs"""
    _judge(walk_graph, "random_graphs", ctx)


@check(EXERCISE, hidden=True)
def graphs_built_by_two_threads(walk_graph, ctx):
    """graphs built by two threads, where descending _sequence_nr() is not a topological order"""
    _judge(walk_graph, "graphs_built_by_two_threads", ctx)


@check(EXERCISE, hidden=True)
def edge_cases(walk_graph, ctx):
    """a 0-d leaf, leaves used along many paths, a split, no-grad inputs, a two-node graph"""
    _judge(walk_graph, "edge_cases", ctx)


@check(EXERCISE, hidden=True)
def deep_chain(walk_graph, ctx):
    """handles a chain of thousands of ops without recursion"""
    _judge(walk_graph, "deep_chain", ctx)
