"""Checks of ``extensions.cpp-autograd``: ``mul_tanh_autograd_source()``, which returns a C++
source that defines ``mul_tanh(Tensor x, Tensor y) -> Tensor`` (``x * tanh(y)``) with its CPU
and Meta kernels and a kernel of its own for the Autograd key: a ``torch::autograd::Function``
whose backward gives ``grad * tanh(y)`` to x and ``grad * x * (1 - tanh(y)^2)`` to y
(torch/csrc/autograd/custom_function.h: Function, AutogradContext).

Oracles: the composite ``x * torch.tanh(y)`` and its gradients by ``torch.autograd.grad``,
computed here; ``torch.autograd.gradcheck`` in the kernel (finite differences against the
backward); the dispatcher's ``_dispatch_has_kernel_for_dispatch_key(op, "Autograd")``. Public:
one seeded float64 pair. Hidden: seeded shapes, a non-contiguous pair, and a call under
``no_grad`` that must record no graph."""
from __future__ import annotations

from grader.checks import CheckFailure, check
from labs.extensions import probes
from labs.extensions.checks._common import built, first_lines, results, tensor

EXERCISE = "extensions.cpp-autograd"


def _judge(source, cases) -> None:
    import torch

    seen = built(source.probe(probes.cpp_autograd, cases), EXERCISE, "mul_tanh")
    if not seen.get("autograd_kernel"):
        raise CheckFailure(
            "mul_tanh has no kernel of its own for the Autograd key: register one with "
            "TORCH_LIBRARY_IMPL(TORCH_EXTENSION_NAME, Autograd, m) { m.impl(\"mul_tanh\", ...); } "
            "that calls your torch::autograd::Function's apply.")
    found = results(seen, cases)
    for (x, y, grad), got in zip(cases, found):
        where = f"x {tuple(x.shape)}" + ("" if x.is_contiguous() else " (non-contiguous)")
        if "error" in got:
            raise CheckFailure(f"for {where} the forward or backward raised: "
                               f"{first_lines(got['error']['text'])}")
        if got.get("grad_fn") is None:
            raise CheckFailure(f"for {where}, inputs that require grad, mul_tanh's output has no "
                               "grad_fn: the Autograd kernel must return MulTanh::apply(x, y), "
                               "which records the node.")
        leaves = [x.clone().requires_grad_(), y.clone().requires_grad_()]
        want = leaves[0] * torch.tanh(leaves[1])
        grads = torch.autograd.grad(want, leaves, grad)
        if not torch.allclose(tensor(got["out"], "mul_tanh's output"), want.detach()):
            raise CheckFailure(f"for {where} the forward's values differ from x * tanh(y).")
        mine = got.get("grads") or [None, None]
        for name, g_mine, g_want in zip(("x", "y"), mine, grads):
            if g_mine is None:
                raise CheckFailure(f"for {where} the backward returned no gradient for {name}: "
                                   "return one gradient per input of forward, in order.")
            g_mine = tensor(g_mine, f"the gradient of {name}")
            if g_mine.shape != g_want.shape or not torch.allclose(g_mine, g_want, rtol=1e-7,
                                                                   atol=1e-9):
                raise CheckFailure(
                    f"for {where} the gradient of {name} differs from torch.autograd.grad of "
                    f"x * tanh(y) (d/dx = grad * tanh(y); d/dy = grad * x * (1 - tanh(y)^2)).")
        if got.get("gradcheck") is not True:
            why = got.get("gradcheck")
            raise CheckFailure(f"torch.autograd.gradcheck failed for {where}: "
                               f"{first_lines(why.get('text') if type(why) is dict else why)}")
        if got.get("no_grad_fn"):
            raise CheckFailure("under torch.no_grad() mul_tanh's output still has a grad_fn: the "
                               "Autograd kernel must record a node only when grad mode is on "
                               "(torch::autograd::Function's apply does this for you).")


def _case(g, shape, transposed: bool = False):
    import torch

    if transposed:
        x = torch.randn(*reversed(shape), generator=g, dtype=torch.float64).t()
    else:
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
    y = torch.randn(*shape, generator=g, dtype=torch.float64)
    return [x, y, torch.randn(*shape, generator=g, dtype=torch.float64)]


@check(EXERCISE)
def gradients_and_gradcheck(mul_tanh_autograd_source, ctx):
    """gradients against torch.autograd.grad of the composite, and gradcheck"""
    _judge(mul_tanh_autograd_source, [_case(ctx.generator(), (3, 4))])


@check(EXERCISE, hidden=True)
def seeded_shapes_and_strides(mul_tanh_autograd_source, ctx):
    """seeded shapes, a non-contiguous input, and no graph under no_grad"""
    import torch

    g = ctx.generator(1)
    rows, cols = (int(v) for v in torch.randint(1, 7, (2,), generator=g))
    _judge(mul_tanh_autograd_source, [_case(g, (rows, cols)), _case(g, (cols, rows), True),
                                      _case(g, (rows,))])
