"""autograd.engine: plausible wrong engines fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import collections
import heapq
import itertools

import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected
from tests.labs._liars import LyingDict, fools_allclose, lying

EX = "autograd.engine"


# ------------------------------------------------------------------ plausible wrong answers
def _fit(grad, node, input_nr):
    meta = node._input_metadata[input_nr]
    if tuple(grad.shape) != tuple(meta.shape):
        grad = grad.sum_to_size(meta.shape)
    return grad.to(meta.dtype)


def _engine(*, accumulate="add", queue="heap", root_slot=True, fit=True,
            no_grad=True, call_accumulate_grad=False):
    """A dependency-counting engine with one deliberate flaw, chosen by the keywords."""
    def run_backward(output, grad_output=None):
        if grad_output is None:
            grad_output = torch.ones_like(output)
        root = output.grad_fn
        deps, seen, stack = collections.Counter(), {root}, [root]
        while stack:
            node = stack.pop()
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    deps[nxt] += 1
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append(nxt)
        buffers = {root: [None] * len(root._input_metadata)}
        buffers[root][output.output_nr if root_slot else 0] = grad_output
        tie = itertools.count()
        ready = [(-root._sequence_nr(), next(tie), root)]
        grads = {}

        def put(slots, i, g):
            if slots[i] is None or accumulate == "overwrite":
                slots[i] = g
            elif accumulate == "inplace":
                slots[i] += g
            else:
                slots[i] = slots[i] + g

        def pop():
            if queue == "heap":
                return heapq.heappop(ready)[2]
            return ready.pop(0)[2] if queue == "fifo" else ready.pop()[2]

        def push(node):
            if queue == "heap":
                heapq.heappush(ready, (-node._sequence_nr(), next(tie), node))
            else:
                ready.append((None, None, node))

        mode = torch.no_grad() if no_grad else torch.enable_grad()
        with mode:
            while ready:
                node = pop()
                outs = node(*buffers.pop(node))
                outs = outs if isinstance(outs, tuple) else (outs,)
                for (nxt, nr), g in zip(node.next_functions, outs):
                    if nxt is None:
                        continue
                    if g is not None and fit:
                        g = _fit(g, nxt, nr)
                    if hasattr(nxt, "variable"):
                        if g is not None:
                            if call_accumulate_grad:
                                nxt(g)
                            leaf = [nxt.variable]
                            slot = [grads.get(nxt.variable)]
                            put(slot, 0, g)
                            grads[leaf[0]] = slot[0]
                        continue
                    slots = buffers.setdefault(nxt, [None] * len(nxt._input_metadata))
                    if g is not None:
                        put(slots, nr, g)
                    deps[nxt] -= 1
                    if deps[nxt] == 0:
                        push(nxt)
        return grads
    return run_backward


def _eager_engine(output, grad_output=None):
    """No dependency counting: a node runs again for every gradient that reaches it."""
    grad_output = torch.ones_like(output) if grad_output is None else grad_output
    root = output.grad_fn
    slots = [None] * len(root._input_metadata)
    slots[output.output_nr] = grad_output
    tasks, grads = [(root, slots)], {}
    with torch.no_grad():
        while tasks:
            node, slots = tasks.pop()
            outs = node(*slots)
            outs = outs if isinstance(outs, tuple) else (outs,)
            for (nxt, nr), g in zip(node.next_functions, outs):
                if nxt is None or g is None:
                    continue
                g = _fit(g, nxt, nr)
                if hasattr(nxt, "variable"):
                    grads[nxt.variable] = grads[nxt.variable] + g if nxt.variable in grads else g
                    continue
                slots = [None] * len(nxt._input_metadata)
                slots[nr] = g
                tasks.append((nxt, slots))
    return grads


def _send(node, buffers, grads):
    """Run ``node`` on its buffer and hand each gradient on: into ``grads`` for a leaf, else into
    the next node's buffer (created if missing); returns the non-leaf nodes that got one."""
    outs = node(*buffers[node])
    outs = outs if isinstance(outs, tuple) else (outs,)
    reached = []
    for (nxt, nr), g in zip(node.next_functions, outs):
        if nxt is None or g is None:
            continue
        g = _fit(g, nxt, nr)
        if hasattr(nxt, "variable"):
            grads[nxt.variable] = grads[nxt.variable] + g if nxt.variable in grads else g
            continue
        slots = buffers.setdefault(nxt, [None] * len(nxt._input_metadata))
        slots[nr] = g if slots[nr] is None else slots[nr] + g
        reached.append(nxt)
    return reached


def _first_come_engine(output, grad_output=None):
    """No dependency counting: each node runs once, as soon as the first gradient reaches it."""
    grad_output = torch.ones_like(output) if grad_output is None else grad_output
    root = output.grad_fn
    buffers = {root: [None] * len(root._input_metadata)}
    buffers[root][output.output_nr] = grad_output
    queue, done, grads = [root], set(), {}
    with torch.no_grad():
        while queue:
            node = queue.pop(0)
            if node in done:
                continue
            done.add(node)
            queue.extend(_send(node, buffers, grads))
    return grads


def _sequence_order_engine(output, grad_output=None):
    """No dependency counting: runs every reachable node once, in global descending
    _sequence_nr() order. Right on any graph built by one thread, where that order is a
    topological one; wrong on a graph built by two threads."""
    grad_output = torch.ones_like(output) if grad_output is None else grad_output
    root = output.grad_fn
    nodes, seen, stack = [], {root}, [root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    nodes.sort(key=lambda n: n._sequence_nr(), reverse=True)
    buffers = {n: [None] * len(n._input_metadata) for n in nodes}
    buffers[root][output.output_nr] = grad_output
    grads = {}
    with torch.no_grad():
        for node in nodes:
            if not hasattr(node, "variable"):
                _send(node, buffers, grads)
    return grads


def _torch_engine(output, grad_output=None):
    """Lets torch do the work."""
    leaves = []
    stack, seen = [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if hasattr(node, "variable"):
            leaves.append(node.variable)
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return dict(zip(leaves, torch.autograd.grad(output, leaves, grad_output)))


def _ids_as_keys(output, grad_output=None):
    grads = _engine()(output, grad_output)
    return {id(k): v for k, v in grads.items()}


WRONG = {
    "overwrites fan-out gradients": (_engine(accumulate="overwrite"), "differs"),
    "no dependency counting (runs a node per incoming gradient)": (_eager_engine, "time(s)"),
    "no dependency counting (runs a node at first arrival)": (_first_come_engine, "order"),
    "no dependency counting (global descending _sequence_nr())": (_sequence_order_engine,
                                                                  "count per thread"),
    "FIFO ready queue": (_engine(queue="fifo"), "order"),
    "LIFO ready queue": (_engine(queue="lifo"), "order"),
    "accumulates in place": (_engine(accumulate="inplace"), "RuntimeError"),
    "root gradient always in slot 0": (_engine(root_slot=False), "output_nr"),
    "no validate_outputs (broadcast gradients kept)": (_engine(fit=False), "sum_to_size"),
    "runs nodes with grad mode on": (_engine(no_grad=False), "no_grad"),
    "calls AccumulateGrad": (_engine(call_accumulate_grad=True), "AccumulateGrad"),
    "uses torch's engine": (_torch_engine, "torch's own engine"),
    "keys by id()": (_ids_as_keys, "keys"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=0)


def test_a_sequence_order_schedule_only_fails_on_graphs_built_by_two_threads():
    """On graphs built by one thread descending _sequence_nr() is a valid schedule (it scored full
    marks once); the hidden graphs built by two threads are what refuses it, on every seed."""
    assert run_checks(EX, _sequence_order_engine, seed=0, hidden=False).status == "passed"
    for seed in (1, 2):
        v = assert_rejected(EX, _sequence_order_engine, "dependency count reaches zero", seed=seed)
        assert v.message.startswith("hidden check") and "built by two threads" in v.message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(reference, seed):
    v = run_checks(EX, reference(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message


# ------------------------------------------------------------------ lying answers
def _overwrites_but_claims_close(output, grad_output=None):
    """Overwrites fan-out gradients (wrong values) and returns them as tensors whose
    __torch_function__ claims they are close to anything."""
    return {leaf: lying(g) for leaf, g in _engine(accumulate="overwrite")(output, grad_output).items()}


def _zeros_claiming_close(output, grad_output=None):
    """No engine at all: zeros of the right shapes and dtypes, claiming to be close."""
    return {leaf: lying(torch.zeros_like(g)) for leaf, g in _engine()(output, grad_output).items()}


def _overwrites_in_a_lying_dict(output, grad_output=None):
    """Overwrites fan-out gradients, in a dict subclass that equals anything and claims every key."""
    return LyingDict(_engine(accumulate="overwrite")(output, grad_output))


LYING = {
    "zeros that claim to be close": (_zeros_claiming_close, "subclass of Tensor"),
    "wrong gradients that claim to be close": (_overwrites_but_claims_close, "subclass of Tensor"),
    "wrong gradients in a dict subclass": (_overwrites_in_a_lying_dict, "subclass of dict"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    x = torch.randn(3, requires_grad=True)
    out = (x * x.sin()).sum()
    want = torch.autograd.grad(out, x, retain_graph=True)[0]
    got = _zeros_claiming_close(out)[x]
    assert fools_allclose(got, want) and not torch.equal(got.as_subclass(torch.Tensor), want)


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=0)


def test_honest_variants_of_the_result_still_pass(reference):
    """A defaultdict or an OrderedDict of plain tensors is as good as a dict."""
    run_backward = reference(EX)
    for kind in (collections.OrderedDict, lambda d: collections.defaultdict(lambda: None, d)):
        v = run_checks(EX, lambda *args, kind=kind: kind(run_backward(*args)), seed=0, hidden=True)
        assert v.status == "passed", v.message
