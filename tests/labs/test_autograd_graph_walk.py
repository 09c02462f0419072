"""autograd.graph-walk: plausible wrong walks fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest

from tests.conftest import assert_rejected

EX = "autograd.graph-walk"


# ------------------------------------------------------------------ plausible wrong answers
def _walk(*, dedup="identity", keep_dup_edges=True, into_leaves=True, sort=True, skip_none=True):
    """An iterative walk with one deliberate flaw, chosen by the keywords."""
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
        if sort:
            nodes.sort(key=lambda n: n._sequence_nr(), reverse=True)
        if not keep_dup_edges:
            edges = list({(id(a), id(b), nr): (a, b, nr) for a, b, nr in edges}.values())
        return {"nodes": nodes, "edges": edges,
                "leaves": [n.variable for n in nodes if hasattr(n, "variable")]}
    return walk_graph


def _recursive_walk(output):
    """Right answer, written recursively: fails on deep graphs."""
    nodes, edges, seen = [], [], set()

    def visit(node):
        seen.add(node)
        nodes.append(node)
        for nxt, nr in node.next_functions:
            if nxt is not None:
                edges.append((node, nxt, nr))
                if nxt not in seen:
                    visit(nxt)

    visit(output.grad_fn)
    nodes.sort(key=lambda n: n._sequence_nr(), reverse=True)
    return {"nodes": nodes, "edges": edges, "leaves": [n.variable for n in nodes if hasattr(n, "variable")]}


WRONG = {
    "no visited set (nodes repeated)": (_walk(dedup=None), "appears"),
    "dedup by name()": (_walk(dedup="name"), "misses"),
    "duplicate edges merged": (_walk(keep_dup_edges=False), "duplicates included"),
    "stops before AccumulateGrad": (_walk(into_leaves=False), "AccumulateGrad"),
    "not sorted by sequence number": (_walk(sort=False), "sorted"),
    "None edges kept": (_walk(skip_none=False), "None"),
    "recursive walk": (_recursive_walk, "recursion"),
    "returns a list": (lambda output: [output.grad_fn], "dict"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=0)
