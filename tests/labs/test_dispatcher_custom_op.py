"""dispatcher.custom-op: plausible wrong register_op answers fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import re

import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import LyingTensor, fools_allclose, lying

EX = "dispatcher.custom-op"


# ------------------------------------------------------------------ plausible wrong answers
def _smooth_max(x, temperature):
    return temperature * torch.logsumexp(x / temperature, dim=-1)


def _register(qualname, *, kernel=_smooth_max, fake="right", backward="right", autograd=True,
              mutates_args=()):
    """A custom op built like the reference, with one part replaced by a plausible mistake."""
    @torch.library.custom_op(qualname, mutates_args=mutates_args)
    def smooth_max(x: torch.Tensor, temperature: float) -> torch.Tensor:
        return kernel(x, temperature)

    if fake == "right":
        smooth_max.register_fake(lambda x, t: x.new_empty(x.shape[:-1]))
    elif fake == "empty_like":                      # the input's shape, not the reduced one
        smooth_max.register_fake(lambda x, t: torch.empty_like(x))
    elif fake == "float32":                         # forgets the input's dtype
        smooth_max.register_fake(lambda x, t: torch.empty(x.shape[:-1], device=x.device))
    elif fake == "default_device":                  # forgets the input's device: cpu, also for meta
        smooth_max.register_fake(lambda x, t: torch.empty(x.shape[:-1], dtype=x.dtype))
    elif fake == "reads_values":                    # a data-dependent fake kernel
        smooth_max.register_fake(lambda x, t: _smooth_max(x, t) * (x.max().item() > -1e9))

    def setup_context(ctx, inputs, output):
        x, temperature = inputs
        ctx.save_for_backward(x)
        ctx.temperature = temperature

    def right(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad.unsqueeze(-1) * torch.softmax(x / ctx.temperature, dim=-1), None

    def forgets_temperature(ctx, grad):             # softmax(x) instead of softmax(x / t)
        (x,) = ctx.saved_tensors
        return grad.unsqueeze(-1) * torch.softmax(x, dim=-1), None

    def divides_by_temperature(ctx, grad):          # an extra 1/t from the chain rule
        (x,) = ctx.saved_tensors
        return grad.unsqueeze(-1) * torch.softmax(x / ctx.temperature, dim=-1) / ctx.temperature, None

    def ignores_grad(ctx, grad):                    # drops the incoming gradient
        (x,) = ctx.saved_tensors
        return torch.softmax(x / ctx.temperature, dim=-1), None

    if autograd:
        formulas = {"right": right, "forgets_temperature": forgets_temperature,
                    "divides_by_temperature": divides_by_temperature, "ignores_grad": ignores_grad}
        smooth_max.register_autograd(formulas[backward], setup_context=setup_context)
    return smooth_max


def _naive_kernel(x, temperature):
    return temperature * torch.log(torch.exp(x / temperature).sum(-1))


def _amax_shortcut_kernel(x, temperature):
    """The maximum itself for small temperatures, where the two 'look' the same."""
    return x.amax(-1) if temperature <= 0.05 else temperature * torch.logsumexp(x / temperature, -1)


def _float32_kernel(x, temperature):
    """Computes in float32 and casts back: float64 inputs lose precision."""
    return (temperature * torch.logsumexp(x.float() / temperature, -1)).to(x.dtype)


def _mutating_kernel(x, temperature):
    x.div_(temperature)                             # scales the input in place to save a copy
    return temperature * torch.logsumexp(x, dim=-1)


def _plain_function(qualname):
    """No custom op at all: a Python function composed of torch ops."""
    return _smooth_max


def _fixed_name(qualname):
    """Ignores the qualname it is given."""
    return _register("course_wrong::smooth_max")


WRONG = {
    "no fake kernel": (lambda q: _register(q, fake=None), "fake"),
    "fake kernel keeps the input's shape": (lambda q: _register(q, fake="empty_like"), "test_faketensor"),
    "fake kernel ignores the dtype": (lambda q: _register(q, fake="float32"), "test_faketensor"),
    "fake kernel ignores the device": (lambda q: _register(q, fake="default_device"),
                                       "a meta input must give a meta output"),
    "fake kernel reads values": (lambda q: _register(q, fake="reads_values"), "opcheck"),
    "no autograd formula": (lambda q: _register(q, autograd=False), "autograd"),
    "backward forgets the temperature": (lambda q: _register(q, backward="forgets_temperature"), "gradcheck"),
    "backward divides by the temperature": (lambda q: _register(q, backward="divides_by_temperature"),
                                            "gradcheck"),
    "backward ignores grad": (lambda q: _register(q, backward="ignores_grad"), "gradcheck"),
    "kernel overflows for large inputs": (lambda q: _register(q, kernel=_naive_kernel), "overflows"),
    "amax shortcut for small temperatures": (lambda q: _register(q, kernel=_amax_shortcut_kernel),
                                             "entries within a few temperatures of each other"),
    "kernel computes in float32": (lambda q: _register(q, kernel=_float32_kernel), "float32 rounding"),
    "kernel mutates its input": (lambda q: _register(q, kernel=_mutating_kernel), "modified its input"),
    "a plain function, not an operator": (_plain_function, "registered no operator"),
    "ignores the qualname": (_fixed_name, "registered no operator"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    state = torch.get_rng_state()
    assert_rejected(EX, answer, phrase, seed=0)
    assert torch.equal(torch.get_rng_state(), state)


def test_value_messages_quote_distinct_numbers():
    """A float64 answer that lost precision in float32: the message quotes two different numbers, their
    difference, and says where the precision went."""
    v = run_checks(EX, WRONG["kernel computes in float32"][0], seed=0, hidden=True)
    found = re.search(r"is (\S+); temperature \* logsumexp\(x / temperature, dim=-1\) gives (\S+) \(difference",
                      v.message)
    assert found, v.message
    mine, ref = found.groups()
    assert mine != ref and float(mine) != float(ref), v.message
    assert "Compute in the input's dtype" in v.message, v.message


# ------------------------------------------------------------------ lying answers
def _max_claiming_close(x, temperature):
    """The row maximum (wrong for every temperature), as a tensor that claims to be close to anything."""
    return lying(x.amax(-1))


def _backward_claiming_close(qualname):
    """The right kernel, and a backward that forgets the temperature but returns its gradient as a
    tensor that claims to be close to anything."""
    op = _register(qualname)

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return lying(grad.unsqueeze(-1) * torch.softmax(x, dim=-1)), None

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.temperature = inputs[1]

    op.register_autograd(backward, setup_context=setup_context)
    return op


class _ClaimsToBeTheOp:
    """Registers the right operator but returns a stand-in whose results claim to equal anything."""

    def __init__(self, op):
        self.op = op

    def __call__(self, x, temperature):
        return lying(torch.zeros(x.shape[:-1], dtype=x.dtype))


LYING = {
    "kernel returns a tensor that claims to be close": (lambda q: _register(q, kernel=_max_claiming_close),
                                                        "subclass of Tensor"),
    "backward returns a gradient that claims to be close": (_backward_claiming_close, "subclass of Tensor"),
    "returns a stand-in whose results claim to be close": (lambda q: _ClaimsToBeTheOp(_register(q)),
                                                           "subclass of Tensor"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    op = _register("course_lying::smooth_max", kernel=_max_claiming_close)
    try:
        x = torch.randn(3, 5)
        got = op(x, 0.5)
        assert type(got) is LyingTensor and fools_allclose(got, _smooth_max(x, 0.5))
    finally:
        torch._library.custom_ops.OPDEF_TO_LIB.pop("course_lying::smooth_max")._destroy()


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=0)


# ------------------------------------------------------------------ the contract, not a recipe
def _low_level(qualname):
    """Another design the contract allows: torch.library's functions on a schema written by hand,
    returning the OpOverload (no CustomOpDef)."""
    torch.library.define(qualname, "(Tensor x, float temperature) -> Tensor")
    torch.library.impl(qualname, "CompositeExplicitAutograd", func=_smooth_max)
    torch.library.register_fake(qualname, lambda x, t: x.new_empty(x.shape[:-1]))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.temperature = inputs[1]

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad.unsqueeze(-1) * torch.softmax(x / ctx.temperature, dim=-1), None

    torch.library.register_autograd(qualname, backward, setup_context=setup_context)
    namespace, name = qualname.split("::")
    return getattr(getattr(torch.ops, namespace), name).default


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed):
    v = run_checks(EX, load_answer(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message


def test_another_design_passes():
    v = run_checks(EX, _low_level, seed=0, hidden=True)
    assert v.status == "passed", v.message
