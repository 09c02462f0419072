"""Checks of ``autograd.custom-function``: the learner's ``Softplus`` (a ``torch.autograd.Function``
called as ``Softplus.apply(x, beta)``).

Oracles: ``F.softplus`` for values, its autograd (first and second order) for derivatives, and
gradcheck's comparison of the answer's own backward with finite differences of its own forward
(``torch.autograd.gradcheck`` / ``gradgradcheck``), all on seeded random inputs, with magnitudes
where a naive ``exp(beta * x)`` overflows. The answer runs in the kernel (the probe
:func:`labs.autograd.probes.softplus_runs`, which reports its outputs, gradients and Jacobians as
plain tensors); everything is compared here.
"""
from __future__ import annotations

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.autograd import probes
from labs.autograd.checks._plain import Shown, rebuilt

EXERCISE = "autograd.custom-function"


_HUGE = (-1e4, -1000.0, -100.0, -30.0, 30.0, 100.0, 1000.0, 1e4)
#: gradcheck's defaults (torch/autograd/gradcheck.py: gradcheck), with the checks' atol
_EPS, _RTOL, _ATOL = 1e-6, 1e-3, 1e-5


def _runs(Softplus, requests: list) -> list:
    """What :func:`labs.autograd.probes.softplus_runs` gave for ``requests`` (one result each),
    after the structural check every use needs."""
    seen = Softplus.probe(probes.softplus_runs, requests)
    if type(seen) is not dict or type(seen.get("results")) is not list:
        raise CheckFailure("what came back from your Softplus is not the probe's report.")
    if seen.get("function") is not True:
        raise CheckFailure("Softplus must be a class deriving from torch.autograd.Function "
                           f"(got {seen.get('type')}).")
    if len(seen["results"]) != len(requests) or any(type(r) is not dict
                                                    for r in seen["results"]):
        raise CheckFailure("what came back from your Softplus is not the probe's report.")
    return seen["results"]


def _applied(result: dict) -> None:
    """The checks of every ``Softplus.apply(x, beta)`` call a request made: a plain tensor of
    x's shape and dtype, recorded by the answer's own node when x requires grad."""
    for seen in result.get("applied") or []:
        kind = seen.get("type")
        if kind not in ("Tensor", "Parameter"):
            if seen.get("base") != "Tensor":
                raise CheckFailure(f"Softplus.apply(x, beta) returned {kind}, not a tensor.")
            raise CheckFailure(f"the output of Softplus.apply(x, beta) has type {kind}, a "
                               "subclass of Tensor; return a plain Tensor.")
        shape, dtype = tuple(seen.get("input_shape") or ()), seen.get("input_dtype")
        if tuple(seen.get("shape") or ()) != shape or seen.get("dtype") != dtype:
            raise CheckFailure(
                f"Softplus.apply(x, beta) for x of shape {shape} and dtype {dtype} returned shape "
                f"{tuple(seen.get('shape') or ())}, dtype {seen.get('dtype')}: keep x's shape "
                "and dtype.")
        if seen.get("recording") and not seen.get("own_node"):
            raise CheckFailure(
                f"the output's grad_fn is {seen.get('grad_fn')}, not your Function's node. "
                "Compute the result in Softplus.forward (it runs with grad mode off) so that "
                "apply() records your backward in the graph.")


def _tensor(value, what: str):
    """A tensor the answer gave, refused when it was a subclass (it could fake allclose)."""
    import torch

    value = rebuilt(value)
    if isinstance(value, Shown):
        if value.base == "Tensor":
            raise CheckFailure(f"{what} has type {value.type_name}, a subclass of Tensor; return "
                               "a plain Tensor.")
        raise CheckFailure(f"{what} has type {value.type_name}, not a Tensor.")
    if value is not None and type(value) is not torch.Tensor:
        raise CheckFailure(f"{what} has type {type(value).__name__}, not a Tensor.")
    return value


def _plain_gradients(result: dict, where: str) -> None:
    """Make sure the gradient (and, when it could be taken, the second derivative) the answer's
    backward returned in a ``derivatives`` request are plain tensors before gradcheck compares
    them: a tensor subclass could answer comparisons with whatever it likes. What it raised is
    left to the check that follows."""
    _applied(result)
    if "grad" in result:
        _tensor(result["grad"], f"{where}: the gradient your backward returns")
    if result.get("hvp") is not None:
        _tensor(result["hvp"], f"{where}: the second derivative (the gradient of your backward)")


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


def _raise_if_raised(result: dict) -> None:
    """Re-raise here what the answer raised in the kernel while the request ran."""
    if "raised" in result:
        raise AnswerRaised(result["raised"])


def _value_request(x, beta, where: str):
    """``(request, judge)``: the values of ``Softplus.apply(x, beta)`` against F.softplus:
    finite, and close for the dtype."""
    import torch
    import torch.nn.functional as F

    def judge(result: dict) -> None:
        _applied(result)
        _raise_if_raised(result)
        got = _tensor(result.get("out"), "the output of Softplus.apply(x, beta)")
        if got is None or got.shape != x.shape or got.dtype != x.dtype:
            raise CheckFailure("what came back from your Softplus is not the probe's report.")
        want = F.softplus(x, beta)
        if not torch.isfinite(got).all():
            bad = x[~torch.isfinite(got)][0].item()
            raise CheckFailure(
                f"{where}: Softplus.apply(x, {beta}) is {got[~torch.isfinite(got)][0].item()} at "
                f"x = {bad:g} (F.softplus gives a finite value). exp(beta * x) overflows for "
                "large beta * x: rewrite log(1 + exp(z)) as max(z, 0) + log1p(exp(-|z|)).")
        if not torch.allclose(got, want, rtol=1e-5 if x.dtype == torch.float32 else 1e-7,
                              atol=1e-6):
            i = (got - want).abs().argmax()
            raise CheckFailure(
                f"{where}: Softplus.apply(x, {beta}) at x = {x.flatten()[i].item():g} is "
                f"{got.flatten()[i].item():.6g}; F.softplus gives "
                f"{want.flatten()[i].item():.6g}. softplus(x, beta) = log(1 + exp(beta * x)) / "
                "beta.")

    return ["value", x, beta], judge


def _derivative_request(x, beta, where: str):
    """``(request, judge)``: first and second derivatives against F.softplus's autograd (a
    vector-Jacobian and a Hessian-vector product with seeded vectors)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(int(x.numel()) + 7)
    v = torch.randn(x.shape, generator=g, dtype=x.dtype)
    u = torch.randn(x.shape, generator=g, dtype=x.dtype)

    def judge(result: dict) -> None:
        _applied(result)
        if "grad" not in result:
            _raise_if_raised(result)
        grad = _tensor(result.get("grad"), f"{where}: the gradient your backward returns")
        if grad is None or grad.shape != x.shape:
            raise CheckFailure(f"{where}: the gradient your backward returns has shape "
                               f"{None if grad is None else tuple(grad.shape)}; x has shape "
                               f"{tuple(x.shape)}.")
        if result.get("grad_requires_grad") is not True:
            raise CheckFailure(
                f"{where}: the gradient your backward returns does not require grad even with "
                "create_graph=True, so it cannot be differentiated again. Compute it with torch "
                "ops on the saved tensors, without .detach(), .item(), numpy or "
                "@once_differentiable.")
        if "hvp" not in result:
            _raise_if_raised(result)
        hvp = _tensor(result.get("hvp"),
                      f"{where}: the second derivative (the gradient of your backward)")
        t = x.detach().clone().requires_grad_()
        (want_grad,) = torch.autograd.grad(F.softplus(t, beta), t, v, create_graph=True)
        (want_hvp,) = torch.autograd.grad(want_grad, t, u, allow_unused=True)
        results = [(grad, hvp if hvp is not None else torch.zeros_like(t)),
                   (want_grad.detach(), want_hvp if want_hvp is not None
                    else torch.zeros_like(t))]
        (g1, h1), (g2, h2) = results
        for name, a, b, hint in (
                ("gradient", g1, g2, "d/dx softplus(x, beta) = sigmoid(beta * x); torch.sigmoid "
                 "is stable where exp(beta * x) / (1 + exp(beta * x)) is not"),
                ("second derivative", h1, h2, "the second derivative is beta * s * (1 - s) with "
                 "s = sigmoid(beta * x): write backward with differentiable torch ops and "
                 "autograd derives it for you")):
            if a.shape != b.shape:
                raise CheckFailure(f"{where}: the {name} has shape {tuple(a.shape)}; x has shape "
                                   f"{tuple(b.shape)}.")
            a = a.to(b.dtype)
            ok = torch.isfinite(a).all() and torch.allclose(a, b, rtol=1e-5, atol=1e-7)
            if not ok:
                i = ((a - b).abs().nan_to_num(float("inf"))).argmax()
                raise CheckFailure(
                    f"{where}: the {name} at x = {x.flatten()[i].item():g} (beta = {beta}) is "
                    f"{a.flatten()[i].item():.6g}; torch gives {b.flatten()[i].item():.6g}. "
                    f"{hint}.")

    return ["derivatives", x, beta, v, u], judge


def _plain_gradient_request(x, beta, where: str):
    """``(request, judge)``: :func:`_plain_gradients` on a gradient and a second derivative
    taken with vectors of ones."""
    import torch

    ones = torch.ones_like(x)
    return ["derivatives", x.detach(), beta, ones, ones], lambda r: _plain_gradients(r, where)


def _mismatch(result: dict, inputs: int) -> int | None:
    """The index of the first input whose analytical Jacobian (the answer's backward) differs
    from the numerical one (finite differences of the answer's own forward) as gradcheck
    compares them (torch/autograd/gradcheck.py: _check_analytical_numerical_equal), or None."""
    import torch

    analytical, numerical = result.get("analytical"), result.get("numerical")
    if type(analytical) is not list or type(numerical) is not list or \
            len(analytical) != inputs or len(numerical) != inputs:
        raise CheckFailure("what came back from your Softplus is not the probe's report.")
    for k, (a, sides) in enumerate(zip(analytical, numerical, strict=True)):
        a = _tensor(a, "the gradient your backward returns")
        plus, minus = (_tensor(t, "the output of Softplus.apply(x, beta)") for t in sides)
        if any(type(t) is not torch.Tensor for t in (a, plus, minus)):
            raise CheckFailure("what came back from your Softplus is not the probe's report.")
        n = (plus - minus).reshape(plus.shape[0], -1).T / (2 * _EPS)
        if n.shape != a.shape or not torch.allclose(a, n.to(a.dtype), rtol=_RTOL, atol=_ATOL):
            return k
    return None


def _gradcheck_request(x, beta):
    """``(request, judge)``: gradcheck: the answer's backward against finite differences of its
    own forward, for an input of shape (3, 4)."""
    def judge(result: dict) -> None:
        _applied(result)
        _raise_if_raised(result)
        if _mismatch(result, 1) is not None:
            raise CheckFailure(
                f"gradcheck failed for an input of shape {tuple(x.shape)}, beta = {beta}: your "
                "backward's gradient differs from finite differences (Jacobian mismatch for "
                "output 0 with respect to input 0,). d/dx softplus(x, beta) = sigmoid(beta * x); "
                "multiply it by grad_out.")

    return ["jacobians", x.detach(), beta, _EPS, None], judge


def _gradgradcheck_request(x, beta, go):
    """``(request, judge)``: gradgradcheck: the answer's backward, as a function of x and
    grad_out, against finite differences of itself."""
    def judge(result: dict) -> None:
        _applied(result)
        if "raised" in result:
            if result.get("runtime_error") and result["raised"].get("ename") not in (
                    "NotImplementedError",):
                first = (str(result["raised"].get("evalue", "")).strip().splitlines()
                         or [str(result["raised"].get("ename"))])[0][:300]
                raise CheckFailure(
                    f"gradgradcheck could not differentiate your backward ({first}). A backward "
                    "decorated with @once_differentiable, or one that detaches, cannot be "
                    "differentiated; write it with differentiable torch ops on the saved "
                    "tensors.")
            _raise_if_raised(result)
        k = _mismatch(result, 2)
        if k is not None:
            raise CheckFailure(
                f"gradgradcheck failed for beta = {beta} (Jacobian mismatch for output 0 with "
                f"respect to input {k},). Differentiating your backward must give the second "
                "derivative: compute grad_out * sigmoid(beta * x) with torch ops on the saved x, "
                "without .detach() or no_grad().")

    return ["jacobians", x.detach(), beta, _EPS, go], judge


def _judge(Softplus, plan: list) -> None:
    """Send the requests of ``plan`` (``(request, judge)`` pairs) to the kernel in one probe
    call, then judge each result in order."""
    results = _runs(Softplus, [request for request, _ in plan])
    for (_, judge), result in paired(plan, results, "requests"):
        judge(result)


# --------------------------------------------------------------------------- checks


@check(EXERCISE)
def values(Softplus, ctx):
    """forward matches F.softplus, including where exp(beta * x) overflows"""
    import torch

    g = ctx.generator(20)
    plan = []
    for dtype in (torch.float32, torch.float64):
        for beta in (1.0, _beta(g)):
            plan.append(_value_request(_inputs(g, dtype, 12), beta, f"for {dtype} inputs"))
    _judge(Softplus, plan)


@check(EXERCISE)
def first_derivative(Softplus, ctx):
    """gradcheck passes and the gradient matches F.softplus's, also for huge inputs"""
    import torch

    g = ctx.generator(21)
    beta = _beta(g)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64) * 3
    _judge(Softplus, [_plain_gradient_request(x, beta, "first derivative check"),
                      _gradcheck_request(x, beta),
                      _derivative_request(_inputs(g, torch.float64, 8), beta,
                                          "first derivative check")])


@check(EXERCISE)
def double_backward(Softplus, ctx):
    """gradgradcheck passes: the backward is itself differentiable"""
    import torch

    g = ctx.generator(22)
    beta = _beta(g)
    x = torch.randn(5, generator=g, dtype=torch.float64) * 3
    go = torch.randn(5, generator=g, dtype=torch.float64)
    _judge(Softplus, [_plain_gradient_request(x, beta, "double backward check"),
                      _gradgradcheck_request(x, beta, go)])


@check(EXERCISE, hidden=True)
def random_shapes(Softplus, ctx):
    """values and first and second derivatives match torch on random shapes, dtypes and betas"""
    import torch

    g = ctx.generator(23)
    shapes = [(), (0, 3), (1,), (2, 1, 3), (int(torch.randint(2, 9, (1,), generator=g)), 5)]
    plan = []
    for shape in shapes:
        beta = _beta(g)
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 6
        where = f"for an input of shape {shape}"
        plan.append(_value_request(x, beta, where))
        plan.append(_value_request(x.float(), beta, where + " in float32"))
        if x.numel():
            plan.append(_derivative_request(x, beta, where))
    x = torch.randn(4, 3, generator=g, dtype=torch.float64).t()          # not contiguous
    plan.append(_value_request(x, 1.5, "for a transposed (non-contiguous) input"))
    plan.append(_derivative_request(x, 1.5, "for a transposed (non-contiguous) input"))
    _judge(Softplus, plan)


@check(EXERCISE, hidden=True)
def huge_inputs(Softplus, ctx):
    """first and second derivatives stay finite and correct where exp(beta * x) overflows"""
    import torch

    g = ctx.generator(24)
    _judge(Softplus, [_derivative_request(_inputs(g, torch.float64, 4, spread=300.0), beta,
                                          "for huge inputs") for beta in (1.0, _beta(g), 10.0)])


@check(EXERCISE, hidden=True)
def saves_with_ctx(Softplus, ctx):
    """saves tensors with ctx.save_for_backward"""
    import torch

    x = torch.randn(3, generator=ctx.generator(25), dtype=torch.float64)

    def judge(result: dict) -> None:
        _applied(result)
        if "packed" not in result:
            _raise_if_raised(result)
        if result.get("packed") == 0:
            raise CheckFailure(
                "your Function saved no tensor with ctx.save_for_backward. Tensors stored as ctx "
                "attributes (ctx.x = x) skip the version-counter check that catches in-place "
                "changes, skip saved-tensor hooks, and can leak memory through a reference "
                "cycle; use ctx.save_for_backward(...) and ctx.saved_tensors.")
        _raise_if_raised(result)

    _judge(Softplus, [(["saves", x, 2.0], judge)])
