"""autograd.per-sample-grads: plausible wrong answers fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import collections

import pytest
import torch
from torch.func import functional_call, grad, vmap

from grader.checks import run_checks
from tests.conftest import assert_rejected
from tests.labs._liars import LyingDict, LyingStr, fools_allclose, lying

EX = "autograd.per-sample-grads"


# ------------------------------------------------------------------ plausible wrong answers
def _trainable(model):
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def full_batch_gradient(model, loss_fn, inputs, targets):
    """The gradient of the batch loss, repeated for every example."""
    params = _trainable(model)
    grads = torch.autograd.grad(loss_fn(model(inputs), targets), list(params.values()))
    return {n: g.expand(len(inputs), *g.shape).clone() for n, g in zip(params, grads)}


def summed_over_the_batch(model, loss_fn, inputs, targets):
    """Per-sample gradients, then summed: shape param.shape instead of (batch, *param.shape)."""
    params = {n: p.detach() for n, p in _trainable(model).items()}
    one = lambda p, x, t: loss_fn(functional_call(model, p, (x[None],)), t[None])  # noqa: E731
    return {n: g.sum(0) for n, g in vmap(grad(one), in_dims=(None, 0, 0))(params, inputs, targets).items()}


def loop_with_backward(model, loss_fn, inputs, targets):
    """Right numbers from a per-example loop of .backward(): B forward passes, .grad clobbered."""
    rows = []
    for i in range(len(inputs)):
        model.zero_grad()
        loss_fn(model(inputs[i:i + 1]), targets[i:i + 1]).backward()
        rows.append({n: p.grad.clone() for n, p in _trainable(model).items()})
    return {n: torch.stack([r[n] for r in rows]) for n in rows[0]}


def differentiates_everything(model, loss_fn, inputs, targets):
    """Treats frozen parameters as trainable (and ignores buffers: the module's own are used)."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    one = lambda p, x, t: loss_fn(functional_call(model, p, (x[None],)), t[None])  # noqa: E731
    return vmap(grad(one), in_dims=(None, 0, 0))(params, inputs, targets)


def mean_loss_over_the_batch(model, loss_fn, inputs, targets):
    """vmap over examples, but each example's loss is divided by the batch size."""
    params = {n: p.detach() for n, p in _trainable(model).items()}
    one = lambda p, x, t: loss_fn(functional_call(model, p, (x[None],)), t[None]) / len(inputs)  # noqa: E731
    return vmap(grad(one), in_dims=(None, 0, 0))(params, inputs, targets)


def loop_of_autograd_grad(model, loss_fn, inputs, targets):
    """Right numbers from a loop of torch.autograd.grad, one model run per example."""
    named = _trainable(model)
    rows = [torch.autograd.grad(loss_fn(model(inputs[i:i + 1]), targets[i:i + 1]),
                                list(named.values())) for i in range(len(inputs))]
    return {n: torch.stack([r[j] for r in rows]) for j, n in enumerate(named)}


@pytest.mark.parametrize("wrong", [full_batch_gradient, summed_over_the_batch, loop_with_backward,
                                   differentiates_everything, mean_loss_over_the_batch])
def test_wrong_answers_fail(wrong):
    assert_rejected(EX, wrong)


def test_a_loop_of_model_runs_breaks_the_contract():
    assert_rejected(EX, loop_of_autograd_grad, "one run of the model per call")


# ------------------------------------------------------------------ other designs the contract allows
def one_forward_then_a_backward_per_example(model, loss_fn, inputs, targets):
    """One run of the model on the batch, then one torch.autograd.grad per example's loss."""
    named = _trainable(model)
    out = model(inputs)
    rows = [torch.autograd.grad(loss_fn(out[i:i + 1], targets[i:i + 1]), list(named.values()),
                                retain_graph=True) for i in range(len(inputs))]
    return {n: torch.stack([r[j] for r in rows]) for j, n in enumerate(named)}


def batched_grad_outputs(model, loss_fn, inputs, targets):
    """One run of the model, one backward vmapped over one-hot grad_outputs (is_grads_batched)."""
    named = _trainable(model)
    out = model(inputs)
    losses = torch.stack([loss_fn(out[i:i + 1], targets[i:i + 1]) for i in range(len(inputs))])
    eye = torch.eye(len(inputs), dtype=losses.dtype)
    grads = torch.autograd.grad(losses, list(named.values()), eye, is_grads_batched=True)
    return dict(zip(named, grads))


@pytest.mark.parametrize("design", [one_forward_then_a_backward_per_example, batched_grad_outputs])
def test_designs_other_than_vmap_of_grad_pass(design):
    """The spec states the contract (one model run, per-example gradients), not vmap(grad(...))."""
    v = run_checks(EX, design, seed=0, hidden=True)
    assert v.status == "passed", v.message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(reference, seed):
    v = run_checks(EX, reference(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message


# ------------------------------------------------------------------ lying answers
def batch_gradient_claiming_close(model, loss_fn, inputs, targets):
    """The batch gradient for every example (wrong), as tensors that claim to be close to anything."""
    return {n: lying(g) for n, g in full_batch_gradient(model, loss_fn, inputs, targets).items()}


def zeros_claiming_close(model, loss_fn, inputs, targets):
    """Zeros of the right shapes, as tensors that claim to be close to anything."""
    return {n: lying(torch.zeros(len(inputs), *p.shape, dtype=p.dtype))
            for n, p in _trainable(model).items()}


def _names_that_equal_anything(model, loss_fn, inputs, targets):
    """Per-sample gradients of every parameter, frozen ones included (wrong), keyed by str subclasses
    that claim to equal any name."""
    return {LyingStr(n): g for n, g in differentiates_everything(model, loss_fn, inputs, targets).items()}


def _in_a_lying_dict(model, loss_fn, inputs, targets):
    """The batch gradient for every example (wrong), in a dict subclass that equals anything."""
    return LyingDict(full_batch_gradient(model, loss_fn, inputs, targets))


LYING = {
    "zeros that claim to be close": (zeros_claiming_close, "subclass of Tensor"),
    "batch gradients that claim to be close": (batch_gradient_claiming_close, "subclass of Tensor"),
    "names that equal anything": (_names_that_equal_anything, "subclass of str"),
    "a dict subclass": (_in_a_lying_dict, "subclass of dict"),
}


def test_lying_answers_would_fool_a_naive_comparison(reference):
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    want = reference(EX)(model, torch.nn.functional.mse_loss, x, y)
    got = zeros_claiming_close(model, torch.nn.functional.mse_loss, x, y)
    assert list(got) == list(want) and all(fools_allclose(got[n], want[n]) for n in want)
    names = _names_that_equal_anything(model, torch.nn.functional.mse_loss, x, y)
    assert all(name == "any name" for name in names)


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase)


def test_an_ordered_dict_still_passes(reference):
    """Exact types are required, but an OrderedDict (what vmap(grad(...)) returns for an OrderedDict
    of parameters) is not refused."""
    per_sample_grads = reference(EX)
    v = run_checks(EX, lambda *args: collections.OrderedDict(per_sample_grads(*args)), seed=0, hidden=True)
    assert v.status == "passed", v.message
