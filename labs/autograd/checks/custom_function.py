"""Checks of ``autograd.custom-function``: the learner's ``Softplus`` (a ``torch.autograd.Function``
called as ``Softplus.apply(x, beta)``).

Oracles: ``F.softplus`` for values, its autograd (first and second order) for derivatives, and
``torch.autograd.gradcheck`` / ``gradgradcheck`` for the answer's own consistency, all on seeded
random inputs, with magnitudes where a naive ``exp(beta * x)`` overflows.
"""
from __future__ import annotations


from grader.checks import CheckFailure, check, plain_tensor
from labs.autograd.checks._nodes import recorded_by

EXERCISE = "autograd.custom-function"


_HUGE = (-1e4, -1000.0, -100.0, -30.0, 30.0, 100.0, 1000.0, 1e4)


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (gradcheck's are long)."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _softplus(Softplus):
    """``f(x, beta)`` calling the answer, with the structural checks every use needs."""
    import torch

    if not (isinstance(Softplus, type) and issubclass(Softplus, torch.autograd.Function)):
        raise CheckFailure("Softplus must be a class deriving from torch.autograd.Function "
                           f"(got {type(Softplus).__name__}).")

    def f(x, beta):
        """Softplus.apply(x, beta), checked for type, shape, dtype and grad_fn."""
        out = Softplus.apply(x, beta)
        if not isinstance(out, torch.Tensor):
            raise CheckFailure(f"Softplus.apply(x, beta) returned {type(out).__name__}, not a tensor.")
        plain_tensor(out, "the output of Softplus.apply(x, beta)")   # a subclass could fake allclose
        if out.shape != x.shape or out.dtype != x.dtype:
            raise CheckFailure(f"Softplus.apply(x, beta) for x of shape {tuple(x.shape)} and dtype {x.dtype} "
                               f"returned shape {tuple(out.shape)}, dtype {out.dtype}: keep x's shape and dtype.")
        if x.requires_grad and torch.is_grad_enabled():
            if not recorded_by(out, Softplus):
                raise CheckFailure(
                    f"the output's grad_fn is {type(out.grad_fn).__name__}, not your Function's node. Compute the "
                    "result in Softplus.forward (it runs with grad mode off) so that apply() records "
                    "your backward in the graph.")
        return out

    return f


def _plain_gradients(f, x, beta, where):
    """Make sure the gradient (and, when it can be taken, the second derivative) the answer's backward
    returns are plain tensors before gradcheck / gradgradcheck compare them: a tensor subclass could
    answer their comparisons with whatever it likes. Errors are left to the check that follows."""
    import torch

    t = x.detach().clone().requires_grad_()
    try:
        (grad,) = torch.autograd.grad(f(t, beta), t, torch.ones_like(t), create_graph=True)
    except CheckFailure:
        raise
    except Exception:
        return
    plain_tensor(grad, f"{where}: the gradient your backward returns")
    if not grad.requires_grad:
        return
    try:
        (hvp,) = torch.autograd.grad(grad, t, torch.ones_like(t), allow_unused=True)
    except Exception:
        return
    if hvp is not None:
        plain_tensor(hvp, f"{where}: the second derivative (the gradient of your backward)")


def _inputs(g, dtype, n: int, spread: float = 4.0):
    """n seeded values: normal ones, the huge magnitudes of _HUGE and zero, shuffled."""
    import torch

    x = torch.cat([torch.randn(n, generator=g, dtype=torch.float64) * spread,
                   torch.tensor(_HUGE + (0.0,), dtype=torch.float64)])
    return x[torch.randperm(len(x), generator=g)].to(dtype)


def _beta(g) -> float:
    """A seeded beta in [0.25, 4], rounded so that messages can quote it."""
    import torch

    return round(float(torch.empty(()).uniform_(0.25, 4.0, generator=g)), 3)


def _compare_values(f, x, beta, where):
    """Values against F.softplus: finite, and close for the dtype."""
    import torch
    import torch.nn.functional as F

    got = f(x, beta)
    want = F.softplus(x, beta)
    if not torch.isfinite(got).all():
        bad = x[~torch.isfinite(got)][0].item()
        raise CheckFailure(
            f"{where}: Softplus.apply(x, {beta}) is {got[~torch.isfinite(got)][0].item()} at x = {bad:g} "
            "(F.softplus gives a finite value). exp(beta * x) overflows for large beta * x: rewrite "
            "log(1 + exp(z)) as max(z, 0) + log1p(exp(-|z|)).")
    if not torch.allclose(got, want, rtol=1e-5 if x.dtype == torch.float32 else 1e-7, atol=1e-6):
        i = (got - want).abs().argmax()
        raise CheckFailure(f"{where}: Softplus.apply(x, {beta}) at x = {x.flatten()[i].item():g} is "
                           f"{got.flatten()[i].item():.6g}; F.softplus gives {want.flatten()[i].item():.6g}. "
                           "softplus(x, beta) = log(1 + exp(beta * x)) / beta.")


def _compare_derivatives(f, x, beta, where):
    """First and second derivatives against F.softplus's autograd (a vector-Jacobian and a
    Hessian-vector product with seeded vectors)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(int(x.numel()) + 7)
    v = torch.randn(x.shape, generator=g, dtype=x.dtype)
    u = torch.randn(x.shape, generator=g, dtype=x.dtype)
    results = []
    for fn in (lambda t: f(t, beta), lambda t: F.softplus(t, beta)):
        t = x.detach().clone().requires_grad_()
        (grad,) = torch.autograd.grad(fn(t), t, v, create_graph=True)
        plain_tensor(grad, f"{where}: the gradient your backward returns")
        if not grad.requires_grad:
            raise CheckFailure(
                f"{where}: the gradient your backward returns does not require grad even with "
                "create_graph=True, so it cannot be differentiated again. Compute it with torch ops on "
                "the saved tensors, without .detach(), .item(), numpy or @once_differentiable.")
        (hvp,) = torch.autograd.grad(grad, t, u, allow_unused=True)
        if hvp is not None:
            plain_tensor(hvp, f"{where}: the second derivative (the gradient of your backward)")
        results.append((grad.detach(), hvp if hvp is not None else torch.zeros_like(t)))
    (g1, h1), (g2, h2) = results
    for name, a, b, hint in (("gradient", g1, g2, "d/dx softplus(x, beta) = sigmoid(beta * x); "
                              "torch.sigmoid is stable where exp(beta * x) / (1 + exp(beta * x)) is not"),
                             ("second derivative", h1, h2, "the second derivative is "
                              "beta * s * (1 - s) with s = sigmoid(beta * x): write backward with "
                              "differentiable torch ops and autograd derives it for you")):
        ok = torch.isfinite(a).all() and torch.allclose(a, b, rtol=1e-5, atol=1e-7)
        if not ok:
            i = ((a - b).abs().nan_to_num(float("inf"))).argmax()
            raise CheckFailure(f"{where}: the {name} at x = {x.flatten()[i].item():g} (beta = {beta}) is "
                               f"{a.flatten()[i].item():.6g}; torch gives {b.flatten()[i].item():.6g}. {hint}.")


# --------------------------------------------------------------------------- checks


@check(EXERCISE)
def values(Softplus, ctx):
    """forward matches F.softplus, including where exp(beta * x) overflows"""
    import torch

    f = _softplus(Softplus)
    g = ctx.generator(20)
    for dtype in (torch.float32, torch.float64):
        for beta in (1.0, _beta(g)):
            _compare_values(f, _inputs(g, dtype, 12), beta, f"for {dtype} inputs")


@check(EXERCISE)
def first_derivative(Softplus, ctx):
    """gradcheck passes and the gradient matches F.softplus's, also for huge inputs"""
    import torch

    from torch.autograd.gradcheck import GradcheckError

    f = _softplus(Softplus)
    g = ctx.generator(21)
    beta = _beta(g)
    x = (torch.randn(3, 4, generator=g, dtype=torch.float64) * 3).requires_grad_()
    _plain_gradients(f, x, beta, "first derivative check")
    try:
        torch.autograd.gradcheck(lambda t: f(t, beta), (x,), eps=1e-6, atol=1e-5)
    except GradcheckError as exc:
        raise CheckFailure(f"gradcheck failed for an input of shape (3, 4), beta = {beta}: your backward's "
                           f"gradient differs from finite differences ({_first_line(exc)}). "
                           "d/dx softplus(x, beta) = sigmoid(beta * x); multiply it by grad_out.") from None
    _compare_derivatives(f, _inputs(g, torch.float64, 8), beta, "first derivative check")


@check(EXERCISE)
def double_backward(Softplus, ctx):
    """gradgradcheck passes: the backward is itself differentiable"""
    import torch

    from torch.autograd.gradcheck import GradcheckError

    f = _softplus(Softplus)
    g = ctx.generator(22)
    beta = _beta(g)
    x = (torch.randn(5, generator=g, dtype=torch.float64) * 3).requires_grad_()
    _plain_gradients(f, x, beta, "double backward check")
    try:
        torch.autograd.gradgradcheck(lambda t: f(t, beta), (x,), eps=1e-6, atol=1e-5)
    except GradcheckError as exc:
        raise CheckFailure(
            f"gradgradcheck failed for beta = {beta} ({_first_line(exc)}). Differentiating your backward "
            "must give the second derivative: compute grad_out * sigmoid(beta * x) with torch ops on the "
            "saved x, without .detach() or no_grad().") from None
    except RuntimeError as exc:
        raise CheckFailure(
            f"gradgradcheck could not differentiate your backward ({_first_line(exc)}). A backward "
            "decorated with @once_differentiable, or one that detaches, cannot be differentiated; write it "
            "with differentiable torch ops on the saved tensors.") from None


@check(EXERCISE, hidden=True)
def random_shapes(Softplus, ctx):
    """values and first and second derivatives match torch on random shapes, dtypes and betas"""
    import torch

    f = _softplus(Softplus)
    g = ctx.generator(23)
    shapes = [(), (0, 3), (1,), (2, 1, 3), (int(torch.randint(2, 9, (1,), generator=g)), 5)]
    for shape in shapes:
        beta = _beta(g)
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 6
        where = f"for an input of shape {shape}"
        _compare_values(f, x, beta, where)
        _compare_values(f, x.float(), beta, where + " in float32")
        if x.numel():
            _compare_derivatives(f, x, beta, where)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64).t()          # not contiguous
    _compare_values(f, x, 1.5, "for a transposed (non-contiguous) input")
    _compare_derivatives(f, x, 1.5, "for a transposed (non-contiguous) input")


@check(EXERCISE, hidden=True)
def huge_inputs(Softplus, ctx):
    """first and second derivatives stay finite and correct where exp(beta * x) overflows"""
    import torch

    f = _softplus(Softplus)
    g = ctx.generator(24)
    for beta in (1.0, _beta(g), 10.0):
        _compare_derivatives(f, _inputs(g, torch.float64, 4, spread=300.0), beta, "for huge inputs")


@check(EXERCISE, hidden=True)
def saves_with_ctx(Softplus, ctx):
    """saves tensors with ctx.save_for_backward"""
    import torch

    f = _softplus(Softplus)
    packed = []
    x = torch.randn(3, generator=ctx.generator(25), dtype=torch.float64).requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t, lambda t: t):
        out = f(x, 2.0)
    if not packed:
        raise CheckFailure(
            "your Function saved no tensor with ctx.save_for_backward. Tensors stored as ctx attributes "
            "(ctx.x = x) skip the version-counter check that catches in-place changes, skip saved-tensor "
            "hooks, and can leak memory through a reference cycle; use ctx.save_for_backward(...) and "
            "ctx.saved_tensors.")
    out.sum().backward()
