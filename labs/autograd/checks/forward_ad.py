"""Checks of ``autograd.forward-ad``: the learner's ``ForwardAD``, a class holding

- ``LogSumExp``, a ``torch.autograd.Function`` (``LogSumExp.apply(x, dim)``) with ``forward``,
  ``setup_context``, ``jvp`` and ``backward``: values against ``torch.logsumexp``; its jvp, run
  on dual tensors the check makes, against ``torch.func.jvp`` of ``torch.logsumexp`` (with tangents
  of random scale, and inputs of magnitude ~1e4); its jvp against its own backward
  (``<w, J u>`` both ways) and that backward against ``torch.autograd.grad`` of
  ``torch.logsumexp``; and ``torch.func.jvp`` run through it (which needs ``setup_context``);
- ``jvp(fn, primals, tangents)``: against ``torch.func.jvp`` (values and tangents, a tensor or a
  tuple as ``fn`` returns, zeros for an output that does not depend on the inputs);
- ``jacobian(fn, x)``: against ``torch.func.jacfwd`` (not ``jacrev``: its first call imports
  ``torch._dynamo``, seconds in a fresh process, and the two agree).

The programs ``fn`` mix torch ops with the learner's ``LogSumExp``; the oracle runs their twin,
with ``torch.logsumexp`` in its place. Public: fixed programs on seeded values; hidden: seeded
random chains of ops (matmuls that change the shape, reductions, 0-d inputs and outputs, float32).

Forward mode by design: every program checks what it is called with, and refuses a tensor that
carries no tangent at the current forward level (finite differences, values alone), that
requires grad (a graph for reverse mode), or that a ``torch.func`` transform wrapped; ``jvp``
must call ``fn`` once. While the answer runs, a call of torch's own derivatives from the answer's
code (``torch.func`` jvp/vjp/jacfwd/jacrev/grad/linearize, ``torch.autograd.grad``/``backward``,
``torch.autograd.functional``), and of ``make_dual`` from inside ``LogSumExp``, is seen with
``sys.setprofile`` and refused. (torch/autograd/forward_ad.py: make_dual, unpack_dual,
dual_level; torch/autograd/function.py: Function.jvp, save_for_forward, setup_context.)
"""
from __future__ import annotations

import contextlib
import inspect
import sys

import torch
import torch.autograd.forward_ad as fwAD
import torch.autograd.functional as _functional
from torch._functorch import eager_transforms as _transforms

from grader.checks import CheckFailure, check, exact, plain_tensor
from labs.autograd.checks._nodes import recorded_by

EXERCISE = "autograd.forward-ad"

# ---------------------------------------------------------------- torch's own derivatives, refused
_ORACLES = {inspect.unwrap(f).__code__: name for f, name in (
    (_transforms._jvp_with_argnums, "torch.func.jvp (or jacfwd)"),
    (_transforms._vjp_with_argnums, "torch.func.vjp (or jacrev)"),
    (_transforms.grad_and_value_impl, "torch.func.grad"),
    (_transforms.linearize, "torch.func.linearize"),
    (torch.autograd.grad, "torch.autograd.grad"),
    (torch.autograd.backward, "torch.autograd.backward (Tensor.backward)"),
    (_functional.jacobian, "torch.autograd.functional.jacobian"),
    (_functional.hessian, "torch.autograd.functional.hessian"),
    (_functional.jvp, "torch.autograd.functional.jvp"),
    (_functional.vjp, "torch.autograd.functional.vjp"),
    (_functional.hvp, "torch.autograd.functional.hvp"),
    (_functional.vhp, "torch.autograd.functional.vhp"),
)}
_MAKE_DUAL = fwAD.make_dual.__code__
_HERE = __file__
_setprofile, _getprofile = sys.setprofile, sys.getprofile  # (as they were when the lab loaded)


class _Refused(Exception):
    """Raised by the profile hook into the answer at a refused call, before its body runs."""


class _Watch:
    """A profile hook refusing each call of ``_ORACLES`` made from the answer's code (the innermost
    frame outside the installed libraries is not this module's), and each ``make_dual`` made
    under one of ``LogSumExp``'s own methods (``function_codes``): it records the call in
    ``used`` and raises ``_Refused`` into it (which also unsets the hook, so ``used`` is what
    counts, should the answer catch the exception)."""

    def __init__(self, function_codes):
        self.function_codes, self.used = function_codes, []

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        name = _ORACLES.get(code)
        if name is None and code is not _MAKE_DUAL:
            return
        f = frame.f_back
        while f is not None and f.f_code.co_filename != _HERE:
            if name is None and f.f_code in self.function_codes:
                self.used.append(("fwAD.make_dual", f.f_code.co_qualname))
                raise _Refused
            if name is not None and "/lib/python" not in f.f_code.co_filename:
                self.used.append((name, f.f_code.co_qualname))
                raise _Refused
            f = f.f_back


@contextlib.contextmanager
def _refusing_oracles(function_cls):
    """Run the body with ``_Watch`` installed; raise CheckFailure afterwards (even when the body
    raised) when the answer called one of torch's derivatives."""
    own = [k for k in function_cls.__mro__ if k not in torch.autograd.Function.__mro__]
    codes = {inspect.unwrap(v.__func__ if isinstance(v, staticmethod) else v).__code__
             for k in own for v in vars(k).values()
             if inspect.isfunction(v) or isinstance(v, staticmethod)}
    watch, before = _Watch(codes), _getprofile()
    _setprofile(watch)
    try:
        yield
    finally:  # (replaces what the refused call raised into the answer, if anything)
        _setprofile(before)
        if watch.used:
            name, where = watch.used[0]
            raise CheckFailure(
                f"{where} called {name}. The answer must compute derivatives in forward mode "
                "itself: dual tensors (make_dual / unpack_dual inside fwAD.dual_level) for jvp "
                "and jacobian, and your own formulas in LogSumExp.jvp and backward. torch's "
                "ready-made derivatives (torch.func transforms, torch.autograd.grad, backward, "
                "torch.autograd.functional) are refused while your answer runs.") from None


# ---------------------------------------------------------------- the answer's parts
def _parts(ForwardAD):
    """(LogSumExp, jvp, jacobian) of the answer, with the structure every check relies on."""
    if not isinstance(ForwardAD, type):
        raise CheckFailure(f"ForwardAD is a {type(ForwardAD).__name__}; define it as a class "
                           "holding LogSumExp, jvp and jacobian.")
    missing = [n for n in ("LogSumExp", "jvp", "jacobian") if not hasattr(ForwardAD, n)]
    if missing:
        raise CheckFailure(f"ForwardAD has no {', '.join(missing)}; it holds LogSumExp (a "
                           "Function), jvp and jacobian (static methods).")
    L = ForwardAD.LogSumExp
    Function = torch.autograd.Function
    if not (isinstance(L, type) and issubclass(L, Function)):
        raise CheckFailure("ForwardAD.LogSumExp must be a class deriving from "
                           f"torch.autograd.Function (got {type(L).__name__}).")
    if inspect.getattr_static(L, "apply") is not inspect.getattr_static(Function, "apply"):
        raise CheckFailure("LogSumExp overrides apply; keep Function.apply, which runs your "
                           "forward, setup_context and jvp.")
    if L.jvp is Function.jvp:
        raise CheckFailure(
            "LogSumExp has no jvp. Forward-mode AD calls the Function's jvp(ctx, *input "
            "tangents) during apply; the default one raises NotImplementedError. Define jvp.")
    if L.setup_context is Function.setup_context:
        raise CheckFailure(
            "LogSumExp has no setup_context. torch.func transforms (jvp, jacfwd, vmap) run a "
            "Function only when forward(x, dim) takes no ctx and setup_context(ctx, inputs, "
            "output) saves what jvp and backward need.")
    if L.backward is Function.backward and L.vjp is Function.vjp:
        raise CheckFailure("LogSumExp has no backward; define it too, so that reverse mode "
                           "agrees with your jvp.")
    return L, ForwardAD.jvp, ForwardAD.jacobian


def _tensor(value, what, like=None):
    """``value`` as a plain tensor (refusing subclasses), with ``like``'s shape and dtype."""
    if not isinstance(value, torch.Tensor):
        raise CheckFailure(f"{what} is {type(value).__name__}, not a tensor.")
    plain_tensor(value, what)
    if like is not None and (value.shape != like.shape or value.dtype != like.dtype):
        raise CheckFailure(f"{what} has shape {tuple(value.shape)} and dtype {value.dtype}; "
                           f"expected shape {tuple(like.shape)} and dtype {like.dtype}.")
    return value


def _close(got, want, what, hint=""):
    """CheckFailure naming the first differing element when ``got`` is not close to ``want``."""
    tol = 1e-4 if want.dtype == torch.float32 else 1e-7
    if torch.allclose(got, want, rtol=tol, atol=tol, equal_nan=False):
        return
    bad = ~torch.isclose(got, want, rtol=tol, atol=tol)
    i = tuple(int(k) for k in bad.nonzero()[0]) if got.dim() else ()
    raise CheckFailure(f"{what} at index {list(i)} is {got[i].item():.6g}; expected "
                       f"{want[i].item():.6g}.{' ' + hint if hint else ''}")


# ---------------------------------------------------------------- programs that insist on duals
class _Program:
    """``fn(*tensors)`` for the answer: ``body(lse, *tensors)`` with the answer's LogSumExp,
    after checking every argument: a dual tensor at the current forward level, not requiring
    grad, not wrapped by a torch.func transform. ``twin`` is the same body with torch.logsumexp,
    for the oracle; ``calls`` counts the answer's calls."""

    def __init__(self, body, L, who):
        self.body, self.who, self.calls = body, who, 0
        self.lse = lambda t, dim: L.apply(t, dim)

    def __call__(self, *args):
        self.calls += 1
        for a in args:
            if not isinstance(a, torch.Tensor):
                raise CheckFailure(f"{self.who} called fn with a {type(a).__name__}; call it "
                                   "with the dual tensors, one per primal.")
            if torch._C._functorch.is_functorch_wrapped_tensor(a):
                raise CheckFailure(
                    f"{self.who} called fn inside a torch.func transform. Build the dual "
                    "tensors yourself: fwAD.make_dual(primal, tangent) inside fwAD.dual_level().")
            if a.requires_grad:
                raise CheckFailure(
                    f"{self.who} called fn with a tensor that requires grad: that records a "
                    "graph for reverse mode. Forward mode needs no graph: call fn on dual "
                    "tensors (fwAD.make_dual) that do not require grad.")
            if fwAD.unpack_dual(a).tangent is None:
                raise CheckFailure(
                    f"{self.who} called fn with a tensor that carries no tangent at the current "
                    "forward level. Every call of fn must be on dual tensors, made with "
                    "fwAD.make_dual(primal, tangent) inside `with fwAD.dual_level():`; the "
                    "value and its tangent come out of that one forward pass (get shapes "
                    "from it too).")
        return self.body(self.lse, *args)

    def twin(self, *args):
        return self.body(torch.logsumexp, *args)


def _dual_jvp(L, x, u, dim):
    """(value, tangent) of LogSumExp.apply(x, dim) on the check's own dual tensor, with the
    errors a wrong jvp makes in torch turned into what to fix."""
    with fwAD.dual_level():
        try:
            out = L.apply(fwAD.make_dual(x, u), dim)
        except RuntimeError as exc:
            if "different size" not in str(exc):
                raise
            raise CheckFailure(
                f"for x of shape {tuple(x.shape)} and dim = {dim}, torch refused the tangent "
                f"your LogSumExp.jvp returned: {str(exc).splitlines()[0]} jvp maps the input's "
                "tangent u (shaped like x) to the output's tangent J u (shaped like the "
                "output, dim reduced); backward goes the other way (J^T w, shaped like x)."
            ) from None
        except (ValueError, IndexError) as exc:
            if "unpack" not in str(exc) and "index" not in str(exc):
                raise
            raise CheckFailure(
                f"LogSumExp raised {type(exc).__name__}: {exc} while forward-mode AD ran it. In "
                "jvp, ctx.saved_tensors holds what ctx.save_for_forward saved (not what "
                "save_for_backward saved): save the tensors jvp needs with save_for_forward."
            ) from None
        value, tangent = fwAD.unpack_dual(out)
    _tensor(value, f"LogSumExp.apply(x, {dim}) for x of shape {tuple(x.shape)}")
    if tangent is None:
        raise CheckFailure("LogSumExp.apply on a dual tensor gave an output with no tangent: "
                           "jvp must return the output's tangent.")
    return value, _tensor(tangent, "the tangent your LogSumExp.jvp returned")


def _check_logsumexp(L, x, dim, gen, where):
    """Values, the jvp (dual tensors) and torch.func.jvp through L against torch.logsumexp."""
    u = torch.randn(x.shape, generator=gen, dtype=x.dtype) * (0.1 + 5 * torch.rand(
        (), generator=gen, dtype=x.dtype))
    want, want_t = torch.func.jvp(lambda t: torch.logsumexp(t, dim), (x,), (u,))
    value, tangent = _dual_jvp(L, x, u, dim)
    value = _tensor(value, f"{where}: LogSumExp.apply(x, {dim})", want)
    if not torch.isfinite(value).all():
        raise CheckFailure(f"{where}: LogSumExp.apply(x, {dim}) is not finite for inputs up to "
                           f"{x.abs().max().item():g}; subtract the max along dim before exp.")
    _close(value, want, f"{where}: LogSumExp.apply(x, {dim})",
           "logsumexp(x, dim) = m + log(sum(exp(x - m), dim)), m = x.amax(dim, keepdim=True).")
    tangent = _tensor(tangent, f"{where}: the tangent of LogSumExp.apply(x, {dim})", want_t)
    _close(tangent, want_t, f"{where}: the tangent your LogSumExp.jvp gives for dim = {dim}",
           "It should equal torch.func.jvp(torch.logsumexp)'s: sum(softmax(x, dim) * u, dim), "
           "linear in the tangent u (its scale included) and finite for huge inputs.")
    _, theirs = torch.func.jvp(lambda t: L.apply(t, dim), (x,), (u,))
    _close(_tensor(theirs, f"{where}: torch.func.jvp through LogSumExp", want_t), want_t,
           f"{where}: torch.func.jvp through your LogSumExp (dim = {dim})")


def _check_backward(L, x, dim, gen, where):
    """<w, J u> from the jvp against <J^T w, u> from backward, then backward against torch."""
    u = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    w = torch.randn(torch.logsumexp(x, dim).shape, generator=gen, dtype=x.dtype)
    _, ju = _dual_jvp(L, x, u, dim)
    leaf = x.detach().requires_grad_()
    out = L.apply(leaf, dim)
    if not recorded_by(out, L):
        raise CheckFailure(f"the output's grad_fn is {type(out.grad_fn).__name__}, not your "
                           "LogSumExp's node: compute the value in forward, which apply runs.")
    (jtw,) = torch.autograd.grad(out, leaf, w)
    jtw = _tensor(jtw, f"{where}: the gradient your LogSumExp.backward returns", x)
    (want,) = torch.autograd.grad(torch.logsumexp(leaf, dim), leaf, w)
    left, right = (w * ju).sum(), (jtw * u).sum()
    if not torch.isclose(left, right, rtol=1e-6, atol=1e-8):
        raise CheckFailure(
            f"{where}: your jvp and your backward disagree (dim = {dim}): <w, jvp(u)> = "
            f"{left.item():.6g} but <backward(w), u> = {right.item():.6g}. Both are the same "
            "Jacobian J, used as J u and as J^T w; fix whichever differs from torch.")
    _close(jtw, want, f"{where}: your LogSumExp.backward's gradient (dim = {dim})",
           "It should be grad_out.unsqueeze(dim) * softmax(x, dim).")


def _check_jvp(jvp, body, L, primals, gen, where):
    """The answer's jvp(fn, primals, tangents) against torch.func.jvp of the twin."""
    tangents = tuple(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 3 for p in primals)
    fn = _Program(body, L, "ForwardAD.jvp")
    want_out, want_t = torch.func.jvp(fn.twin, primals, tangents)
    got = jvp(fn, primals, tangents)
    if fn.calls != 1:
        raise CheckFailure(f"{where}: ForwardAD.jvp called fn {fn.calls} times; one forward "
                           "pass on the dual tensors gives both the outputs and their tangents.")
    exact(got, tuple, f"{where}: the value ForwardAD.jvp returned")
    if len(got) != 2:
        raise CheckFailure(f"{where}: ForwardAD.jvp returned {len(got)} items; return a pair "
                           "(outputs, output tangents).")
    single = isinstance(want_out, torch.Tensor)
    outs, tans = ((got[0],), (got[1],)) if single else got
    wants, want_ts = ((want_out,), (want_t,)) if single else (want_out, want_t)
    for name, g in (("outputs", outs), ("tangents", tans)):
        if not single:
            exact(g, tuple, f"{where}: the {name} ForwardAD.jvp returned for a tuple-valued fn")
            if len(g) != len(wants):
                raise CheckFailure(f"{where}: fn returns {len(wants)} tensors; ForwardAD.jvp "
                                   f"returned {len(g)} {name}.")
    if all(t is None for t in tans):
        raise CheckFailure(
            f"{where}: ForwardAD.jvp returned None for the tangent. Read the tangents with "
            "fwAD.unpack_dual inside the dual_level: leaving it (exit_dual_level) clears every "
            "tangent of that level.")
    for k, (o, t, wo, wt) in enumerate(zip(outs, tans, wants, want_ts)):
        which = "the output" if single else f"output {k}"
        if t is None:
            raise CheckFailure(
                f"{where}: the tangent of {which} is None. An output that does not depend "
                "on the inputs has no tangent at the level: return zeros shaped like it, as "
                "torch.func.jvp does.")
        o = _tensor(o, f"{where}: {which}", wo)
        t = _tensor(t, f"{where}: the tangent of {which}", wt)
        _close(o, wo, f"{where}: {which}")
        if not torch.allclose(wo, wt) and torch.allclose(t, wo):
            raise CheckFailure(f"{where}: the tangent of {which} equals its value. "
                               "unpack_dual returns (primal, tangent): take the second.")
        _close(t, wt, f"{where}: the tangent of {which} (J u for the tangents passed)",
               "It should equal torch.func.jvp's: linear in the tangents, their scale "
               "included.")


def _check_jacobian(jacobian, body, L, x, where):
    """The answer's jacobian(fn, x) against torch.func.jacfwd of the twin."""
    fn = _Program(body, L, "ForwardAD.jacobian")
    want = torch.func.jacfwd(fn.twin)(x)
    got = _tensor(jacobian(fn, x), f"{where}: the Jacobian")
    out_shape = tuple(want.shape[: want.dim() - x.dim()])
    if tuple(got.shape) != tuple(want.shape):
        transposed = tuple(x.shape) + out_shape
        raise CheckFailure(
            f"{where}: the Jacobian has shape {tuple(got.shape)}; for fn(x) of shape "
            f"{out_shape} and x of shape {tuple(x.shape)} it is fn(x).shape + x.shape = "
            f"{tuple(want.shape)}."
            + (" Yours is transposed: J[i, j] = d out[i] / d x[j], so the jvp of the j-th "
               "basis tangent is column j (the last dims)." if tuple(got.shape) == transposed
               else ""))
    if got.dtype != want.dtype:
        raise CheckFailure(f"{where}: the Jacobian has dtype {got.dtype}; fn(x) has dtype "
                           f"{want.dtype} (make the basis tangents with x's dtype).")
    n, m = x.numel(), want.numel() // max(x.numel(), 1)
    if n == m and n > 1 and torch.allclose(got.reshape(m, n).T, want.reshape(m, n)) \
            and not torch.allclose(got, want):
        raise CheckFailure(f"{where}: your Jacobian is the transpose of torch.func.jacfwd's: "
                           "the jvp of the j-th basis tangent is column j, d out / d x[j].")
    _close(got, want, f"{where}: the Jacobian, against torch.func.jacfwd's")


# ---------------------------------------------------------------- programs
def _matrix(gen, rows, cols, dtype):
    return torch.randn(rows, cols, generator=gen, dtype=dtype) / rows ** 0.5


def _random_body(gen, shape, dtype):
    """A seeded chain of ops on one tensor of ``shape``, with at least one logsumexp: the body
    ``(lse, x) -> tensor`` of a program."""
    steps, dims = [], list(shape)
    n = int(torch.randint(2, 5, (1,), generator=gen))
    lse_at = int(torch.randint(0, n, (1,), generator=gen)) if dims else -1
    unary = [torch.sin, torch.tanh, torch.sigmoid, lambda t: t.sin().exp(), lambda t: t * t]
    # (no Python-scalar arithmetic: under jacfwd its decomposition imports torch._dynamo)
    for k in range(n):
        if k == lse_at or (dims and k == n - 1 and lse_at < 0):
            d = int(torch.randint(-len(dims), len(dims), (1,), generator=gen))
            steps.append(("lse", d))
            dims.pop(d)
            lse_at = -2
        elif dims and torch.rand((), generator=gen) < 0.4:
            cols = int(torch.randint(1, 5, (1,), generator=gen))
            steps.append(("mm", _matrix(gen, dims[-1], cols, dtype)))
            dims[-1] = cols
        else:
            steps.append(("op", unary[int(torch.randint(0, len(unary), (1,), generator=gen))]))

    def body(lse, x):
        for kind, arg in steps:
            x = lse(x, arg) if kind == "lse" else x @ arg if kind == "mm" else arg(x)
        return x

    return body


def _shape(gen, low=1, high=4):
    return tuple(int(s) for s in torch.randint(low, high + 1, (2,), generator=gen))


# ---------------------------------------------------------------- public checks
@check(EXERCISE)
def logsumexp_values_and_jvp(ForwardAD, ctx):
    """LogSumExp: values and the jvp on dual tensors match torch.logsumexp's, huge inputs too"""
    L, _, _ = _parts(ForwardAD)
    g = ctx.generator(80)
    with _refusing_oracles(L):
        x = torch.randn(3, 4, generator=g, dtype=torch.float64)
        for dim in (0, 1, -1):
            _check_logsumexp(L, x, dim, g, "x of shape (3, 4)")
        huge = torch.randn(2, 5, generator=g, dtype=torch.float64) * 1e4
        _check_logsumexp(L, huge, 1, g, "inputs of magnitude ~1e4")


@check(EXERCISE)
def logsumexp_jvp_agrees_with_backward(ForwardAD, ctx):
    """LogSumExp: <w, jvp(u)> equals <backward(w), u>, and backward matches torch"""
    L, _, _ = _parts(ForwardAD)
    g = ctx.generator(81)
    with _refusing_oracles(L):
        for dim in (1, 0):
            x = torch.randn(4, 3, generator=g, dtype=torch.float64) * 3
            _check_backward(L, x, dim, g, "x of shape (4, 3)")


@check(EXERCISE)
def jvp_matches_torch_func_jvp(ForwardAD, ctx):
    """ForwardAD.jvp matches torch.func.jvp on programs with two inputs and tuple outputs"""
    L, jvp, _ = _parts(ForwardAD)
    g = ctx.generator(82)
    w = _matrix(g, 4, 2, torch.float64)

    def one(lse, a):
        return lse(a.sin() @ w, 0)

    def two(lse, a, b):
        return (a * b.tanh(), lse(a @ w + b[:, :2], 1), torch.ones(3, dtype=a.dtype))

    a = torch.randn(3, 4, generator=g, dtype=torch.float64)
    b = torch.randn(3, 4, generator=g, dtype=torch.float64)
    with _refusing_oracles(L):
        _check_jvp(jvp, one, L, (a,), g, "fn(a) = logsumexp(a.sin() @ W, 0)")
        _check_jvp(jvp, two, L, (a, b), g,
                   "fn(a, b) = (a * b.tanh(), logsumexp(a @ W + b[:, :2], 1), ones(3))")


@check(EXERCISE)
def jacobian_matches_jacfwd(ForwardAD, ctx):
    """ForwardAD.jacobian matches torch.func.jacfwd on a non-square program"""
    L, _, jacobian = _parts(ForwardAD)
    g = ctx.generator(83)
    w = _matrix(g, 3, 5, torch.float64)

    def body(lse, x):
        return lse(x.tanh() @ w, 0)  # (2, 3) -> (5,)

    with _refusing_oracles(L):
        x = torch.randn(2, 3, generator=g, dtype=torch.float64)
        _check_jacobian(jacobian, body, L, x, "fn(x) = logsumexp(x.tanh() @ W, 0), x (2, 3)")


# ---------------------------------------------------------------- hidden checks
@check(EXERCISE, hidden=True)
def random_programs(ForwardAD, ctx):
    """jvp and jacobian match torch.func on seeded random programs, float64 and float32"""
    L, jvp, jacobian = _parts(ForwardAD)
    g = ctx.generator(84)
    with _refusing_oracles(L):
        for dtype in (torch.float64, torch.float64, torch.float32):
            shape = _shape(g)
            body = _random_body(g, shape, dtype)
            x = torch.randn(shape, generator=g, dtype=dtype)
            where = f"a random program on x of shape {shape}, {dtype}"
            _check_jvp(jvp, body, L, (x,), g, where)
            _check_jacobian(jacobian, body, L, x, where)


@check(EXERCISE, hidden=True)
def zero_dim_and_several_inputs(ForwardAD, ctx):
    """0-d inputs and outputs, three inputs, an output that is an input, a constant output"""
    L, jvp, jacobian = _parts(ForwardAD)
    g = ctx.generator(85)
    k = int(torch.randint(2, 5, (1,), generator=g))

    def scalar_to_vector(lse, s):  # (no 0-d * tensor: under torch.func it imports torch._dynamo)
        return torch.stack([s.sin(), s.cos(), s.tanh()]).exp()

    def vector_to_scalar(lse, x):
        return lse(x * x, 0).sigmoid()

    def three(lse, a, b, c):
        return (lse(torch.stack([a, b * c]), 0), c, torch.zeros(2, dtype=a.dtype), a.tanh())

    s = torch.randn((), generator=g, dtype=torch.float64)
    x = torch.randn(k, generator=g, dtype=torch.float64)
    with _refusing_oracles(L):
        _check_jacobian(jacobian, scalar_to_vector, L, s, "a 0-d x, fn(x) of shape (3,)")
        _check_jacobian(jacobian, vector_to_scalar, L, x, f"x of shape ({k},), a 0-d fn(x)")
        _check_jvp(jvp, vector_to_scalar, L, (x,), g, f"x of shape ({k},), a 0-d fn(x)")
        abc = tuple(torch.randn(k, generator=g, dtype=torch.float64) for _ in range(3))
        _check_jvp(jvp, three, L, abc, g,
                   "fn(a, b, c) = (logsumexp(stack([a, b * c]), 0), c, zeros(2), a.tanh())")


@check(EXERCISE, hidden=True)
def logsumexp_random_shapes(ForwardAD, ctx):
    """LogSumExp on seeded shapes, dims and magnitudes, float32 too: values, jvp, backward"""
    L, _, _ = _parts(ForwardAD)
    g = ctx.generator(86)
    with _refusing_oracles(L):
        for dtype, scale in ((torch.float64, 1.0), (torch.float64, 300.0), (torch.float32, 30.0)):
            shape = (*_shape(g), int(torch.randint(1, 4, (1,), generator=g)))
            dim = int(torch.randint(-3, 3, (1,), generator=g))
            x = torch.randn(shape, generator=g, dtype=dtype) * scale
            where = f"x of shape {shape}, {dtype}, magnitudes ~{scale:g}"
            _check_logsumexp(L, x, dim, g, where)
            if dtype == torch.float64:
                _check_backward(L, x, dim, g, where)
