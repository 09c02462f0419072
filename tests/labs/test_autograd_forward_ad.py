"""autograd.forward-ad: plausible wrong ForwardAD classes fail, called directly through run_checks
(milliseconds each). The stub is tested for every exercise in test_exercise_contract.py; the
reference is graded here on seeds 0-2."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD

from grader.checks import run_checks
from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import LyingTensor, fools_allclose, lying

EX = "autograd.forward-ad"


# ------------------------------------------------------------------ a right answer to vary
def _softmax(x, y, dim):
    return (x - y.unsqueeze(dim)).exp()


class RightLSE(torch.autograd.Function):
    @staticmethod
    def forward(x, dim):
        m = x.amax(dim, keepdim=True)
        return (x - m).exp().sum(dim).log() + m.squeeze(dim)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.dim = inputs[1]
        ctx.save_for_forward(inputs[0], output)
        ctx.save_for_backward(inputs[0], output)

    @staticmethod
    def jvp(ctx, x_t, dim_t):
        x, y = ctx.saved_tensors
        return (_softmax(x, y, ctx.dim) * x_t).sum(ctx.dim)

    @staticmethod
    def backward(ctx, grad_out):
        x, y = ctx.saved_tensors
        return grad_out.unsqueeze(ctx.dim) * _softmax(x, y, ctx.dim), None


def _unpack(out):
    outs = out if isinstance(out, tuple) else (out,)
    pairs = [fwAD.unpack_dual(o) for o in outs]
    values = tuple(p for p, _ in pairs)
    tans = tuple(torch.zeros_like(p) if t is None else t for p, t in pairs)
    return (values, tans) if isinstance(out, tuple) else (values[0], tans[0])


class Right:
    """Right; jacobian is a classmethod here so that a variant's jvp is the one it uses."""

    LogSumExp = RightLSE

    @staticmethod
    def jvp(fn, primals, tangents):
        with fwAD.dual_level():
            return _unpack(fn(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents))))

    @classmethod
    def jacobian(cls, fn, x):
        basis = torch.eye(x.numel(), dtype=x.dtype)
        columns = [cls.jvp(fn, (x,), (e.view_as(x),))[1] for e in basis]
        return torch.stack(columns, -1).reshape(columns[0].shape + x.shape)


def variant(name, **members):
    return type(name, (Right,), members)


def lse_variant(name, **members):
    return variant(name, LogSumExp=type(name + "LSE", (RightLSE,), members))


def test_the_right_answer_passes():
    for seed in range(3):
        v = run_checks(EX, Right, seed=seed, hidden=True)
        assert v.status == "passed", v.message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed):
    v = run_checks(EX, load_answer(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message


# ------------------------------------------------------------------ wrong dual-tensor handling
def _tangent_read_after_the_level(fn, primals, tangents):
    with fwAD.dual_level():
        out = fn(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))
    pairs = [fwAD.unpack_dual(o) for o in (out if isinstance(out, tuple) else (out,))]
    values, tans = tuple(p for p, _ in pairs), tuple(t for _, t in pairs)
    return (values, tans) if isinstance(out, tuple) else (values[0], tans[0])


def _primal_taken_for_the_tangent(fn, primals, tangents):
    with fwAD.dual_level():
        out = fn(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))
        outs = out if isinstance(out, tuple) else (out,)
        values = tuple(fwAD.unpack_dual(o)[0] for o in outs)
        tans = tuple(fwAD.unpack_dual(o)[0].clone() for o in outs)
    return (values, tans) if isinstance(out, tuple) else (values[0], tans[0])


def _unit_tangents(fn, primals, tangents):
    """A directional derivative along the unit vector: ignores the tangent's scale."""
    with fwAD.dual_level():
        return _unpack(fn(*(fwAD.make_dual(p, t / t.norm()) for p, t in zip(primals, tangents))))


def _none_for_constant_outputs(fn, primals, tangents):
    with fwAD.dual_level():
        out = fn(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))
        pairs = [fwAD.unpack_dual(o) for o in (out if isinstance(out, tuple) else (out,))]
        values, tans = tuple(p for p, _ in pairs), tuple(t for _, t in pairs)
    return (values, tans) if isinstance(out, tuple) else (values[0], tans[0])


def _value_from_a_plain_call(fn, primals, tangents):
    """Runs fn once on plain tensors for the outputs, then again on duals for the tangents."""
    fn(*primals)
    return Right.jvp(fn, primals, tangents)


def _twice_on_duals(fn, primals, tangents):
    Right.jvp(fn, primals, tangents)
    return Right.jvp(fn, primals, tangents)


def _transposed_jacobian(fn, x):
    basis = torch.eye(x.numel(), dtype=x.dtype)
    rows = [Right.jvp(fn, (x,), (e.view_as(x),))[1] for e in basis]
    return torch.stack(rows, 0).reshape(x.shape + rows[0].shape)


def _finite_differences(fn, x, eps=1e-6):
    out = fn(x)
    cols = []
    for e in torch.eye(x.numel(), dtype=x.dtype):
        e = e.view_as(x)
        cols.append((fn(x + eps * e) - fn(x - eps * e)) / (2 * eps))
    return torch.stack(cols, -1).reshape(out.shape + x.shape)


# ------------------------------------------------------------------ reverse mode and oracles
def _torch_func_jvp(fn, primals, tangents):
    return torch.func.jvp(fn, primals, tangents)


def _jacrev(fn, x):
    return torch.func.jacrev(fn)(x)


def _rows_by_autograd_grad(fn, x):
    """Reverse mode by hand: one torch.autograd.grad per output element."""
    leaf = x.detach().requires_grad_()
    out = fn(leaf)
    rows = [torch.autograd.grad(o, leaf, retain_graph=True)[0] for o in out.reshape(-1)]
    return torch.stack(rows).reshape(out.shape + x.shape)


def _jvp_by_torch_func(ctx, x_t, dim_t):
    x, _ = ctx.saved_tensors
    return torch.func.jvp(lambda t: torch.logsumexp(t, ctx.dim), (x,), (x_t,))[1]


def _jvp_by_torch_forward_ad(ctx, x_t, dim_t):
    """torch's logsumexp_jvp through a dual tensor made inside jvp (forward grad re-enabled)."""
    x, _ = ctx.saved_tensors
    with fwAD._set_fwd_grad_enabled(True):
        dual = fwAD.make_dual(x.detach().clone(), x_t)
        return fwAD.unpack_dual(torch.logsumexp(dual, ctx.dim)).tangent


def _jvp_trying_torch_func(ctx, x_t, dim_t):
    """Tries torch.func.jvp, and falls back to the right formula when it is refused."""
    try:
        return _jvp_by_torch_func(ctx, x_t, dim_t)
    except Exception:
        return RightLSE.jvp(ctx, x_t, dim_t)


def _fn_called_on_lists(fn, primals, tangents):
    fn(*(p.tolist() for p in primals))
    return Right.jvp(fn, primals, tangents)


def _backward_by_autograd_grad(ctx, grad_out):
    x, _ = ctx.saved_tensors
    with torch.enable_grad():
        leaf = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(torch.logsumexp(leaf, ctx.dim), leaf, grad_out)
    return g, None


# ------------------------------------------------------------------ wrong LogSumExp
class NoJvpLSE(torch.autograd.Function):
    forward, setup_context, backward = RightLSE.forward, RightLSE.setup_context, RightLSE.backward


class CtxForwardLSE(torch.autograd.Function):
    """Old style: forward(ctx, x, dim), no setup_context; fine for dual tensors, not torch.func."""

    @staticmethod
    def forward(ctx, x, dim):
        out = torch.logsumexp(x, dim)
        ctx.dim = dim
        ctx.save_for_forward(x, out)
        ctx.save_for_backward(x, out)
        return out

    jvp, backward = RightLSE.jvp, RightLSE.backward


def _jvp_shaped_like_x(ctx, x_t, dim_t):
    """The vjp's shape: softmax * x_t, never summed over dim."""
    x, y = ctx.saved_tensors
    return _softmax(x, y, ctx.dim) * x_t


def _sign_of_tangent(ctx, x_t, dim_t):
    """Right for basis tangents (0 and 1), wrong for any other scale."""
    x, y = ctx.saved_tensors
    return (_softmax(x, y, ctx.dim) * x_t.sign()).sum(ctx.dim)


def _naive_softmax(ctx, x_t, dim_t):
    x, _ = ctx.saved_tensors
    e = x.exp()
    return (e / e.sum(ctx.dim, keepdim=True) * x_t).sum(ctx.dim)


def _saved_for_backward_only(ctx, inputs, output):
    ctx.dim = inputs[1]
    ctx.save_for_backward(inputs[0], output)


def _naive_forward(x, dim):
    return x.exp().sum(dim).log()


def _backward_without_grad_out(ctx, grad_out):
    x, y = ctx.saved_tensors
    return _softmax(x, y, ctx.dim), None


WRONG = {
    "tangent read after leaving the dual level":
        (variant("AfterLevel", jvp=staticmethod(_tangent_read_after_the_level)),
         "inside the dual_level"),
    "unpack_dual's primal taken for the tangent":
        (variant("WrongUnpack", jvp=staticmethod(_primal_taken_for_the_tangent)),
         "unpack_dual returns (primal, tangent)"),
    "jvp ignores the tangent's scale (unit tangents)":
        (variant("UnitTangents", jvp=staticmethod(_unit_tangents)), "their scale included"),
    "constant output's tangent left None":
        (variant("NoneTangent", jvp=staticmethod(_none_for_constant_outputs)),
         "return zeros shaped like it"),
    "fn called on plain tensors for the value":
        (variant("PlainCall", jvp=staticmethod(_value_from_a_plain_call)), "carries no tangent"),
    "fn called twice":
        (variant("Twice", jvp=staticmethod(_twice_on_duals)), "called fn 2 times"),
    "Jacobian transposed (the vjp layout)":
        (variant("Transposed", jacobian=staticmethod(_transposed_jacobian)), "is transposed"),
    "Jacobian from finite differences":
        (variant("FiniteDifferences", jacobian=staticmethod(_finite_differences)),
         "carries no tangent"),
    "jvp from torch.func.jvp (refused)":
        (variant("TorchFuncJvp", jvp=staticmethod(_torch_func_jvp)), "called torch.func.jvp"),
    "Jacobian from torch.func.jacrev (reverse mode, refused)":
        (variant("Jacrev", jacobian=staticmethod(_jacrev)), "called torch.func.vjp (or jacrev)"),
    "Jacobian rows from torch.autograd.grad (reverse mode, refused)":
        (variant("Rows", jacobian=staticmethod(_rows_by_autograd_grad)), "requires grad"),
    "LogSumExp.jvp from torch.func.jvp (refused)":
        (lse_variant("OracleJvp", jvp=staticmethod(_jvp_by_torch_func)),
         "called torch.func.jvp"),
    "LogSumExp.jvp from torch's forward AD, make_dual inside (refused)":
        (lse_variant("TorchForwardAD", jvp=staticmethod(_jvp_by_torch_forward_ad)),
         "called fwAD.make_dual"),
    "LogSumExp.jvp tries torch.func.jvp, catching the refusal (refused)":
        (lse_variant("TryingJvp", jvp=staticmethod(_jvp_trying_torch_func)),
         "called torch.func.jvp"),
    "fn called on lists":
        (variant("Lists", jvp=staticmethod(_fn_called_on_lists)), "called fn with a list"),
    "LogSumExp.backward from torch.autograd.grad (refused)":
        (lse_variant("OracleBackward", backward=staticmethod(_backward_by_autograd_grad)),
         "called torch.autograd.grad"),
    "LogSumExp without jvp":
        (variant("NoJvp", LogSumExp=NoJvpLSE), "LogSumExp has no jvp"),
    "LogSumExp with forward(ctx, ...) and no setup_context":
        (variant("CtxForward", LogSumExp=CtxForwardLSE), "no setup_context"),
    "LogSumExp.jvp returns the vjp's shape (not summed over dim)":
        (lse_variant("XShaped", jvp=staticmethod(_jvp_shaped_like_x)),
         "jvp maps the input's tangent u"),
    "LogSumExp.jvp ignores the tangent's scale (sign)":
        (lse_variant("Sign", jvp=staticmethod(_sign_of_tangent)), "its scale included"),
    "LogSumExp.jvp with a naive softmax (nan for huge inputs)":
        (lse_variant("NaiveSoftmax", jvp=staticmethod(_naive_softmax)),
         "finite for huge inputs"),
    "LogSumExp saves for backward only":
        (lse_variant("BackwardOnly", setup_context=staticmethod(_saved_for_backward_only)),
         "save_for_forward"),
    "LogSumExp.forward overflows":
        (lse_variant("NaiveForward", forward=staticmethod(_naive_forward)), "subtract the max"),
    "LogSumExp.backward ignores grad_out":
        (lse_variant("NoGradOut", backward=staticmethod(_backward_without_grad_out)),
         "your jvp and your backward disagree"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=0)


def test_the_unit_tangent_jvp_passes_the_jacobian_check_alone():
    """Why the jvp checks draw tangents of random scale: basis tangents have norm 1."""
    x = torch.randn(2, 3, dtype=torch.float64)
    fn = lambda t: torch.logsumexp(t.sin(), 1)
    UnitTangents = WRONG["jvp ignores the tangent's scale (unit tangents)"][0]
    torch.testing.assert_close(UnitTangents.jacobian(fn, x), torch.func.jacfwd(fn)(x))


# ------------------------------------------------------------------ lying answers
def _lying_tangent(fn, primals, tangents):
    out, tangent = Right.jvp(fn, primals, tangents)
    if isinstance(out, tuple):
        return out, tuple(lying(t * 0) for t in tangent)
    return out, lying(tangent * 0)


def _lying_jacobian(fn, x):
    return lying(Right.jacobian(fn, x) * 0)


def _lying_function_tangent(ctx, x_t, dim_t):
    return lying(RightLSE.jvp(ctx, x_t, dim_t) * 0)


LYING = {
    "jvp's tangents are zeros that claim to be close":
        (variant("LyingJvp", jvp=staticmethod(_lying_tangent)), "subclass of Tensor"),
    "the Jacobian is zeros that claim to be close":
        (variant("LyingJacobian", jacobian=staticmethod(_lying_jacobian)), "subclass of Tensor"),
    "LogSumExp.jvp returns zeros that claim to be close":
        (lse_variant("LyingLSE", jvp=staticmethod(_lying_function_tangent)),
         "subclass of Tensor"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    x = torch.randn(2, 3, dtype=torch.float64)
    u = torch.randn(2, 3, dtype=torch.float64)
    fn = lambda t: torch.logsumexp(t, 1)
    want = torch.func.jvp(fn, (x,), (u,))[1]
    _, tangent = _lying_tangent(fn, (x,), (u,))
    assert type(tangent) is LyingTensor and fools_allclose(tangent, want)
    jac = _lying_jacobian(fn, x)
    assert type(jac) is LyingTensor and fools_allclose(jac, torch.func.jacfwd(fn)(x))


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=0)
