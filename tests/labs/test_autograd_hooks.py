"""autograd.hooks: plausible wrong engines fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import heapq
import itertools

import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected
from tests.labs._liars import lying

EX = "autograd.hooks"


# ------------------------------------------------------------------ plausible wrong answers
def _engine(*, pre_first=False, retain_first=False, prune=True, post_acc_first=False,
            use_returns=True, per_tensor=True, swap_post=False, retain_inputs=True,
            skip_pruned=True, queue="heap", none_hooks=True, add_grad=True, tuples=True,
            wrap=None):
    """A hook-firing engine with one deliberate flaw, chosen by the keywords."""
    def slot_of(t):
        edge = torch.autograd.graph.get_gradient_edge(t)
        return edge.node, edge.output_nr

    def run(fns, value, *rest):
        for fn in fns:
            new = fn(value, *rest) if not swap_post or not rest else fn(rest[0], value)
            if new is not None and use_returns:
                value = new if not isinstance(new, (tuple, list)) else tuple(new)
        return value

    def backward_with_hooks(output, grad_output, hooks, inputs=None):
        root = output.grad_fn
        deps, parents, seen, stack = {}, {}, {root}, [root]
        while stack:
            node = stack.pop()
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    deps[nxt] = deps.get(nxt, 0) + 1
                    parents.setdefault(nxt, []).append(node)
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append(nxt)
        tensor_hooks, retained, pre, post, post_acc = {}, {}, {}, {}, {}
        for kind, target, fn in hooks:
            if kind == "tensor":
                node, slot = slot_of(target)
                key = slot if per_tensor else len(tensor_hooks.get(node, {}))
                tensor_hooks.setdefault(node, {}).setdefault(key, [slot]).append(fn)
            elif kind == "retain_grad":
                node, slot = slot_of(target)
                retained.setdefault(node, {})[slot] = target
            elif kind in ("pre", "post"):
                (pre if kind == "pre" else post).setdefault(target, []).append(fn)
            else:
                post_acc.setdefault(slot_of(target)[0], []).append(fn)
        needed = None
        if inputs is not None and prune:
            needed, stack = set(), []
            for t in inputs:
                node, slot = slot_of(t)
                stack.append(node)
                if t.grad_fn is not None and retain_inputs:
                    retained.setdefault(node, {})[slot] = t
            while stack:
                node = stack.pop()
                if node not in needed:
                    needed.add(node)
                    stack.extend(parents.get(node, ()))
        buffers = {root: [None] * len(root._input_metadata)}
        buffers[root][output.output_nr] = grad_output
        tie = itertools.count()
        ready = [(-root._sequence_nr(), next(tie), root)]

        def tensor_phase(node, grads):
            def retain():
                for slot, t in retained.get(node, {}).items():
                    if grads[slot] is not None:
                        t.retain_grad()
                        t.grad = grads[slot].clone() if t.grad is None else t.grad + grads[slot]
            if retain_first:
                retain()
            for slot, *fns in tensor_hooks.get(node, {}).values():
                if grads[slot] is not None or none_hooks:
                    grads[slot] = run(fns, grads[slot])
            if not retain_first:
                retain()
            return grads

        def pre_phase(node, grads):
            grads = tuple(grads)
            return run(pre.get(node, ()), grads if tuples else list(grads))

        with torch.no_grad():
            while ready:
                node = (heapq.heappop(ready) if queue == "heap" else ready.pop(0))[2]
                grads = buffers.pop(node)
                if pre_first:
                    grads = list(tensor_phase(node, list(pre_phase(node, grads))))
                    grads = tuple(grads)
                else:
                    grads = pre_phase(node, tensor_phase(node, grads))
                if hasattr(node, "variable"):
                    leaf = node.variable
                    if grads[0] is not None:
                        if post_acc_first:
                            run(post_acc.get(node, ()), leaf)
                        leaf.grad = (wrap or (lambda g: g))(
                            grads[0].clone() if leaf.grad is None or not add_grad
                            else leaf.grad + grads[0])
                        if not post_acc_first:
                            run(post_acc.get(node, ()), leaf)
                    results = ()
                else:
                    results = node(*grads)
                    results = list(results) if isinstance(results, tuple) else [results]
                    for i, ((nxt, nr), g) in enumerate(zip(node.next_functions, results)):
                        if nxt is None or g is None:
                            continue
                        if needed is not None and nxt not in needed and skip_pruned:
                            results[i] = None
                            continue
                        meta = nxt._input_metadata[nr]
                        g = g.sum_to_size(meta.shape) if g.shape != meta.shape else g
                        results[i] = g.to(meta.dtype)
                    results = tuple(results)
                results = run(post.get(node, ()), results, grads)
                for (nxt, nr), g in zip(node.next_functions, results):
                    if nxt is None:
                        continue
                    deps[nxt] -= 1
                    if needed is not None and nxt not in needed:
                        continue
                    buffer = buffers.setdefault(nxt, [None] * len(nxt._input_metadata))
                    if g is not None:
                        buffer[nr] = g if buffer[nr] is None else buffer[nr] + g
                    if deps[nxt] == 0:
                        item = (-nxt._sequence_nr(), next(tie), nxt)
                        if queue == "heap":
                            heapq.heappush(ready, item)
                        else:
                            ready.append(item)
    return backward_with_hooks


def _torch_engine(output, grad_output, hooks, inputs=None):
    """Registers the hooks for real and lets torch's engine run them."""
    for kind, target, fn in hooks:
        if kind == "retain_grad":
            target.retain_grad()
        elif kind == "pre":
            target.register_prehook(fn)
        elif kind == "post_accumulate_grad":
            target.register_post_accumulate_grad_hook(fn)
        else:
            target.register_hook(fn)
    torch.autograd.backward(output, grad_output, inputs=inputs)


def test_the_flawless_engine_passes():
    """The factory without a flaw is right: each wrong answer below differs by one flaw."""
    for seed in (0, 1):
        v = run_checks(EX, _engine(), seed=seed, hidden=True)
        assert v.status == "passed", v.message


WRONG = {
    "node pre-hooks before tensor hooks": (_engine(pre_first=True), "then the node's pre-hooks"),
    "retain_grad before the tensor hooks": (_engine(retain_first=True), "retain_grad's hook"),
    "inputs= does not prune": (_engine(prune=False), "will not run"),
    "post-accumulate-grad hook before .grad is set": (_engine(post_acc_first=True),
                                                      "then calls the post-accumulate-grad"),
    "a hook's returned value ignored": (_engine(use_returns=False), "returns a value replaces"),
    "tensor hooks in plain registration order": (_engine(per_tensor=False),
                                                 "each tensor's hooks together"),
    "post-hook arguments swapped": (_engine(swap_post=True), "hook(grad_inputs, grad_outputs)"),
    "non-leaf inputs not retained": (_engine(retain_inputs=False), "listed in inputs="),
    "pruned edges still computed": (_engine(skip_pruned=False), "task_should_compute_output"),
    "FIFO ready queue": (_engine(queue="fifo"), "highest _sequence_nr() first"),
    "no tensor hook call for a slot without gradient": (_engine(none_hooks=False), "with None"),
    "leaf .grad overwritten, not accumulated": (_engine(add_grad=False),
                                                "adding to what is there"),
    "pre-hooks get a list": (_engine(tuples=False), "not a tuple"),
    "uses torch's engine": (_torch_engine, "ran torch's engine"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=0)


# ------------------------------------------------------------------ lying answers
def _lying_grads(output, grad_output, hooks, inputs=None):
    """Passes every hook tensors whose __torch_function__ claims they are close to anything
    (and ignores what the hooks return)."""
    lied = [(kind, target, fn if kind in ("retain_grad", "post_accumulate_grad") else
             (lambda *a, fn=fn: fn(*(tuple(map(_lie, x)) if isinstance(x, tuple) else _lie(x)
                                     for x in a)) and None))
            for kind, target, fn in hooks]
    _engine()(output, grad_output, lied, inputs)


def _lie(x):
    return x if x is None else lying(x)


LYING = {
    "hook arguments that claim to be close": (_lying_grads, "subclass of Tensor"),
    ".grad values that claim to be close": (_engine(use_returns=False, wrap=lying),
                                            "subclass of Tensor"),
}


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=0)


# ------------------------------------------------------------------ hooks called with other things
def _calling(hook_kind, change):
    """The flawless engine, with each hook of ``hook_kind`` called on ``change(argument)``."""
    def backward_with_hooks(output, grad_output, hooks, inputs=None):
        changed = [(kind, target, (lambda *a, fn=fn: fn(*map(change, a))) if kind == hook_kind
                    else fn) for kind, target, fn in hooks]
        _engine()(output, grad_output, changed, inputs)
    return backward_with_hooks


ODD_CALLS = {
    "tensor hooks passed a list": (_calling("tensor", lambda g: g if g is None else g.tolist()),
                                   "is a list; torch passes a tensor"),
    "post-accumulate-grad hooks passed a copy of the leaf":
        (_calling("post_accumulate_grad", lambda t: t.detach()), "gets the leaf tensor itself"),
}


@pytest.mark.parametrize("name", list(ODD_CALLS))
def test_hooks_called_with_what_torch_never_passes_fail(name):
    """What a hook was passed comes back from the kernel as data; the judge names the mistake."""
    answer, phrase = ODD_CALLS[name]
    assert_rejected(EX, answer, phrase, seed=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes_on_seeds(reference, seed):
    v = run_checks(EX, reference(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message
