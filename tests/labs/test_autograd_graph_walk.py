"""autograd.graph-walk: plausible wrong walks fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import collections
import functools

import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import LyingDict, LyingList

EX = "autograd.graph-walk"
ACC_SEQ = 2**64 - 1


# ------------------------------------------------------------------ plausible wrong answers
def _topological_rank(root):
    """{node: position} in one topological order of the graph below root (Kahn's algorithm)."""
    deps, seen, stack = collections.Counter(), {root}, [root]
    while stack:
        for nxt, _ in stack.pop().next_functions:
            if nxt is not None:
                deps[nxt] += 1
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
    rank, ready = {}, [root]
    while ready:
        node = ready.pop()
        rank[node] = len(rank)
        for nxt, _ in node.next_functions:
            if nxt is not None:
                deps[nxt] -= 1
                if deps[nxt] == 0:
                    ready.append(nxt)
    return rank


ORDERS = {
    "topological": lambda root: _topological_rank(root).__getitem__,
    "by sequence number": lambda root: lambda n: -n._sequence_nr(),
    # by sequence number, AccumulateGrad last: right on any graph built by one thread
    "by sequence number, AccumulateGrad last": lambda root: lambda n: (
        1 if n._sequence_nr() == ACC_SEQ else 0, -n._sequence_nr()),
    "as walked": None,
}


def _walk(*, dedup="identity", keep_dup_edges=True, into_leaves=True, order="topological",
          skip_none=True):
    """An iterative walk with one deliberate flaw, chosen by the keywords (``order`` names how
    the nodes are ordered, one of ORDERS)."""
    def walk_graph(output):
        root = output.grad_fn
        nodes, edges = [], []
        key = (lambda n: n.name()) if dedup == "name" else (lambda n: n)
        seen, stack = {key(root)}, [root]
        while stack:
            node = stack.pop()
            nodes.append(node)
            for nxt, nr in node.next_functions:
                if nxt is None and skip_none:
                    continue
                if not into_leaves and hasattr(nxt, "variable"):
                    continue
                edges.append((node, nxt, nr))
                if nxt is None:
                    continue
                if dedup is None or key(nxt) not in seen:
                    seen.add(key(nxt))
                    stack.append(nxt)
        if ORDERS[order] is not None:
            nodes.sort(key=ORDERS[order](root))
        if not keep_dup_edges:
            edges = list({(id(a), id(b), nr): (a, b, nr) for a, b, nr in edges}.values())
        return {"nodes": nodes, "edges": edges,
                "leaves": [n.variable for n in nodes if hasattr(n, "variable")]}
    return walk_graph


def _recursive_walk(output):
    """Right answer, written recursively (reversed post-order): fails on deep graphs."""
    post, edges, seen = [], [], set()

    def visit(node):
        seen.add(node)
        for nxt, nr in node.next_functions:
            if nxt is not None:
                edges.append((node, nxt, nr))
                if nxt not in seen:
                    visit(nxt)
        post.append(node)

    visit(output.grad_fn)
    nodes = post[::-1]
    return {"nodes": nodes, "edges": edges, "leaves": [n.variable for n in nodes if hasattr(n, "variable")]}


def _reversed_postorder(output):
    """Another valid design: an iterative DFS whose reversed post-order is a topological order."""
    root = output.grad_fn
    post, edges, seen, stack = [], [], {root}, [(root, iter(root.next_functions))]
    while stack:
        node, it = stack[-1]
        step = next(it, None)
        if step is None:
            stack.pop()
            post.append(node)
            continue
        nxt, nr = step
        if nxt is None:
            continue
        edges.append((node, nxt, nr))
        if nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(nxt.next_functions)))
    nodes = post[::-1]
    return {"nodes": nodes, "edges": edges, "leaves": [n.variable for n in nodes if hasattr(n, "variable")]}


WRONG = {
    "no visited set (nodes repeated)": (_walk(dedup=None), "appears"),
    "dedup by name()": (_walk(dedup="name"), "misses"),
    "duplicate edges merged": (_walk(keep_dup_edges=False), "duplicates included"),
    "stops before AccumulateGrad": (_walk(into_leaves=False), "AccumulateGrad"),
    "nodes in the order the walk met them": (_walk(order="as walked"), "before all the nodes"),
    "sorted by sequence number": (_walk(order="by sequence number"), "UINT64_MAX"),
    "sorted by sequence number, AccumulateGrad last": (
        _walk(order="by sequence number, AccumulateGrad last"), "built by two threads"),
    "None edges kept": (_walk(skip_none=False), "None"),
    "recursive walk": (_recursive_walk, "recursion"),
    "returns a list": (lambda output: [output.grad_fn], "dict"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=0)


def test_sorting_by_sequence_number_only_fails_on_graphs_built_by_two_threads():
    """Within one thread sequence numbers do decrease along the edges between op nodes; the
    hidden graphs built by two threads are what refuses the sort."""
    answer = _walk(order="by sequence number, AccumulateGrad last")
    assert run_checks(EX, answer, seed=0, hidden=False).status == "passed"
    for seed in (1, 2):
        v = assert_rejected(EX, answer, "count per thread", seed=seed)
        assert v.message.startswith("hidden check") and "two threads" in v.message


# ------------------------------------------------------------------ lying answers
@functools.lru_cache(maxsize=1)
def _reference_walk():
    return load_answer(EX)


def _claims_every_key(output):
    """The reference's walk, returned in a dict subclass that claims to contain every key and to
    equal anything."""
    return LyingDict(_reference_walk()(output))


def _hides_repeated_nodes(output):
    """No visited set, so 'nodes' repeats nodes; a list subclass hides the repeats from whoever
    iterates it (and claims the deduplicated length)."""
    nodes = _walk(dedup=None)(output)["nodes"]
    unique = list({id(n): n for n in nodes}.values())

    class Hiding(list):
        def __iter__(self):
            return iter(unique)

        def __len__(self):
            return len(unique)

    result = _walk()(output)
    result["nodes"] = Hiding(nodes)
    return result


def _edges_claiming_none(output):
    """The reference's walk, with 'edges' in a list subclass that equals anything and claims length 0."""
    result = _reference_walk()(output)
    result["edges"] = LyingList(result["edges"], claims=0)
    return result


LYING = {
    "a dict subclass that claims every key": (_claims_every_key, "subclass of dict"),
    "nodes repeated, hidden by a list subclass": (_hides_repeated_nodes, "subclass of list"),
    "edges in a list subclass that equals anything": (_edges_claiming_none, "subclass of list"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    x = torch.randn(3, requires_grad=True)
    out = (x * x).sum()
    got = _claims_every_key(out)
    assert "anything" in got and got == {}
    hiding = _hides_repeated_nodes(out)["nodes"]
    assert list.__len__(hiding) > len(hiding) == len(set(map(id, hiding)))   # it really holds repeats


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed):
    v = run_checks(EX, _reference_walk(), seed=seed, hidden=True)
    assert v.status == "passed", v.message


def test_another_topological_order_still_passes():
    v = run_checks(EX, _reversed_postorder, seed=0, hidden=True)
    assert v.status == "passed", v.message


def test_honest_variants_of_the_result_still_pass():
    """Exact types are required, but the usual honest spellings are not refused: tuples instead of
    lists, [node, next, nr] lists as edges, an OrderedDict."""
    walk = _reference_walk()

    def variant(output):
        got = walk(output)
        return collections.OrderedDict(nodes=tuple(got["nodes"]), edges=[list(e) for e in got["edges"]],
                                       leaves=tuple(got["leaves"]))
    v = run_checks(EX, variant, seed=0, hidden=True)
    assert v.status == "passed", v.message
