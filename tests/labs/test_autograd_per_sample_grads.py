"""autograd.per-sample-grads: plausible wrong answers fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch
from torch.func import functional_call, grad, vmap

from tests.conftest import assert_rejected

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


@pytest.mark.parametrize("wrong", [full_batch_gradient, summed_over_the_batch, loop_with_backward,
                                   differentiates_everything, mean_loss_over_the_batch])
def test_wrong_answers_fail(wrong):
    assert_rejected(EX, wrong)
