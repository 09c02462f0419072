"""autograd.custom-function: plausible wrong Softplus Functions fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from tests.conftest import assert_rejected
from tests.labs._liars import LyingTensor, fools_allclose, lying

EX = "autograd.custom-function"


# ------------------------------------------------------------------ plausible wrong answers
def _stable(x, beta):
    z = x * beta
    return (z.clamp(min=0) + torch.log1p(torch.exp(-z.abs()))) / beta


class NaiveForward(torch.autograd.Function):
    """log(1 + exp(beta x)) / beta, literally: overflows."""

    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.beta = beta
        ctx.save_for_backward(x)
        return torch.log(1 + torch.exp(beta * x)) / beta

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.sigmoid(ctx.beta * x), None


class OnceDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.beta = beta
        ctx.save_for_backward(x)
        return _stable(x, beta)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.sigmoid(ctx.beta * x), None


class DetachedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.beta = beta
        ctx.save_for_backward(x)
        return _stable(x, beta)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.sigmoid(ctx.beta * x.detach()), None


class NaiveSigmoid(torch.autograd.Function):
    """Stable forward, but sigmoid written as exp(z) / (1 + exp(z)): nan for large z."""

    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.beta = beta
        ctx.save_for_backward(x)
        return _stable(x, beta)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        e = torch.exp(ctx.beta * x)
        return grad_out * e / (1 + e), None


class ForgetsBeta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.save_for_backward(x)
        return _stable(x, beta)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.sigmoid(x), None


class SavesOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.beta, ctx.x = beta, x
        return _stable(x, beta)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out * torch.sigmoid(ctx.beta * ctx.x), None


class JustFSoftplus(torch.autograd.Function):
    """Not a custom node at all: apply is F.softplus."""

    apply = staticmethod(F.softplus)


WRONG = {
    "naive forward overflows": (NaiveForward, "overflows"),
    "@once_differentiable backward": (OnceDifferentiable, "differentiate"),
    "backward detaches": (DetachedBackward, "differentiated again"),
    "naive sigmoid in backward": (NaiveSigmoid, "sigmoid"),
    "gradient forgets beta": (ForgetsBeta, "gradcheck"),
    "tensor stored as a ctx attribute": (SavesOnCtx, "save_for_backward"),
    "F.softplus instead of a custom node": (JustFSoftplus, "grad_fn"),
    "a function, not a Function class": (lambda x, beta: F.softplus(x, beta), "torch.autograd.Function"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=0)


# ------------------------------------------------------------------ lying answers
class ZerosClaimingClose(torch.autograd.Function):
    """forward returns zeros as a tensor subclass that claims to be close to anything."""

    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.beta = beta
        ctx.save_for_backward(x)
        return lying(torch.zeros_like(x))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.sigmoid(ctx.beta * x), None


class GradientClaimingClose(torch.autograd.Function):
    """Right values, but backward returns gradient * 0 as a tensor that claims to be close."""

    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.beta = beta
        ctx.save_for_backward(x)
        return _stable(x, beta)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return lying(grad_out * torch.sigmoid(ctx.beta * x) * 0), None


LYING = {
    "forward returns zeros that claim to be close": (ZerosClaimingClose, "subclass of Tensor"),
    "backward returns zeros that claim to be close": (GradientClaimingClose, "subclass of Tensor"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    out = ZerosClaimingClose.apply(x, 2.0)
    assert type(out) is LyingTensor and fools_allclose(out, F.softplus(x, 2.0))
    (grad,) = torch.autograd.grad(GradientClaimingClose.apply(x, 2.0).sum(), x)
    assert type(grad) is LyingTensor and fools_allclose(grad, torch.sigmoid(2.0 * x))


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=0)
