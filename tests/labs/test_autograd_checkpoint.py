"""autograd.checkpoint: plausible wrong answers fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch

from tests.conftest import assert_rejected
from tests.labs._liars import fools_allclose, lying

EX = "autograd.checkpoint"


# ------------------------------------------------------------------ plausible wrong answers
def _make(*, save_output=False, restore_rng=True, fork=True, grad_wrt_inputs_only=False):
    """A checkpoint with one deliberate flaw."""
    def checkpoint(fn, *args):
        class Ckpt(torch.autograd.Function):
            @staticmethod
            def forward(ctx, fn, *args):
                ctx.fn, ctx.rng = fn, torch.get_rng_state()
                ctx.pos = [i for i, a in enumerate(args) if torch.is_tensor(a)]
                ctx.others = [None if torch.is_tensor(a) else a for a in args]
                out = fn(*args)
                ctx.save_for_backward(*(args[i] for i in ctx.pos), *((out,) if save_output else ()))
                return out

            @staticmethod
            def backward(ctx, grad_out):
                args = list(ctx.others)
                for i, t in zip(ctx.pos, ctx.saved_tensors):
                    args[i] = t.detach().requires_grad_(t.requires_grad)
                with torch.random.fork_rng(devices=[], enabled=fork):
                    if restore_rng:
                        torch.set_rng_state(ctx.rng)
                    with torch.enable_grad():
                        out = ctx.fn(*args)
                if grad_wrt_inputs_only:
                    wanted = [a for a in args if torch.is_tensor(a) and a.requires_grad]
                    got = iter(torch.autograd.grad(out, wanted, grad_out))
                    return (None, *(next(got) if torch.is_tensor(a) and a.requires_grad else None
                                    for a in args))
                torch.autograd.backward(out, grad_out)
                return (None, *(a.grad if torch.is_tensor(a) else None for a in args))
        return Ckpt.apply(fn, *args)
    return checkpoint


def keeps_the_graph(fn, *args):
    """Runs fn with grad enabled in forward and back-propagates through that graph: no recompute,
    every activation saved."""
    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, fn, *args):
            ctx.args = [a.detach().requires_grad_(a.requires_grad) if torch.is_tensor(a) else a
                        for a in args]
            with torch.enable_grad():
                ctx.out = fn(*ctx.args)
            return ctx.out.detach()

        @staticmethod
        def backward(ctx, grad_out):
            torch.autograd.backward(ctx.out, grad_out)
            return (None, *(a.grad if torch.is_tensor(a) else None for a in ctx.args))
    return Keep.apply(fn, *args)


WRONG = {
    "saves inputs and the output": _make(save_output=True),
    "does not restore the RNG state": _make(restore_rng=False),
    "restores the RNG state without fork_rng": _make(fork=False),
    "autograd.grad w.r.t. the inputs only (parameters get no grad)": _make(grad_wrt_inputs_only=True),
    "keeps the forward graph instead of recomputing": keeps_the_graph,
    "no checkpointing at all": lambda fn, *args: fn(*args),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_fail(name):
    assert_rejected(EX, WRONG[name])


# ------------------------------------------------------------------ lying answers
def rng_not_restored_claiming_close(fn, *args):
    """Does not restore the RNG state (dropout draws another mask in the recompute), and returns its
    output as a tensor subclass that claims to be close to anything."""
    return lying(_make(restore_rng=False)(fn, *args))


def no_graph_claiming_close(fn, *args):
    """No checkpointing and no graph: fn's no-grad output as a tensor subclass that claims to be close
    to anything."""
    with torch.no_grad():
        return lying(fn(*args))


LYING = {
    "a flawed checkpoint whose output claims to be close": (rng_not_restored_claiming_close,
                                                             "subclass of Tensor"),
    "no graph, output claims to be close": (no_graph_claiming_close, "subclass of Tensor"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    x = torch.randn(2, 3, requires_grad=True)
    out = no_graph_claiming_close(torch.tanh, x)
    assert not out.requires_grad and fools_allclose(out, torch.zeros(2, 3))


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase)
