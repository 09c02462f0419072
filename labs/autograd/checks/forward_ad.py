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

The answer runs in the kernel (the probe :func:`labs.autograd.probes.forward_ad_runs`, which
builds each case with :func:`labs.autograd.probes.forward_ad_cases`, watches for torch's own
derivatives and reports what the answer returned as plain data); the oracle runs here, on the
same cases built here.
"""
from __future__ import annotations

import torch

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.autograd import probes
from labs.autograd.checks._plain import Shown, exact_shown, rebuilt, type_name

EXERCISE = "autograd.forward-ad"


# ---------------------------------------------------------------- what the probe reported
def _runs(ForwardAD, name: str, seed: int) -> list:
    """The cases of check ``name`` paired with what the probe saw of each, after the checks of
    the answer's structure and of torch's derivatives it called."""
    reply = ForwardAD.probe(probes.forward_ad_runs, name, seed)
    if type(reply) is not dict or type(reply.get("parts")) is not dict \
            or type(reply.get("cases")) is not list:
        raise CheckFailure("what came back from your ForwardAD is not the probe's report.")
    _parts(reply["parts"])
    refused = reply.get("refused")
    if refused is not None:
        if type(refused) is not list or len(refused) != 2:
            raise CheckFailure("what came back from your ForwardAD is not the probe's report.")
        name_, where = refused
        raise CheckFailure(
            f"{where} called {name_}. The answer must compute derivatives in forward mode "
            "itself: dual tensors (make_dual / unpack_dual inside fwAD.dual_level) for jvp "
            "and jacobian, and your own formulas in LogSumExp.jvp and backward. torch's "
            "ready-made derivatives (torch.func transforms, torch.autograd.grad, backward, "
            "torch.autograd.functional) are refused while your answer runs.")
    pairs = paired(probes.forward_ad_cases(name, seed), reply["cases"], "cases")
    if any(type(got) is not dict for _, got in pairs):
        raise CheckFailure("what came back from your ForwardAD is not the probe's report.")
    return pairs


def _parts(parts: dict) -> None:
    """The structure every check relies on (:func:`labs.autograd.probes._fad_parts`)."""
    if parts.get("class") is not True:
        raise CheckFailure(f"ForwardAD is a {parts.get('type')}; define it as a class "
                           "holding LogSumExp, jvp and jacobian.")
    missing = parts.get("missing")
    if type(missing) is not list:
        raise CheckFailure("what came back from your ForwardAD is not the probe's report.")
    if missing:
        raise CheckFailure(f"ForwardAD has no {', '.join(map(str, missing))}; it holds LogSumExp "
                           "(a Function), jvp and jacobian (static methods).")
    if parts.get("function") is not True:
        raise CheckFailure("ForwardAD.LogSumExp must be a class deriving from "
                           f"torch.autograd.Function (got {parts.get('lse_type')}).")
    if parts.get("apply") is not True:
        raise CheckFailure("LogSumExp overrides apply; keep Function.apply, which runs your "
                           "forward, setup_context and jvp.")
    if parts.get("jvp") is not True:
        raise CheckFailure(
            "LogSumExp has no jvp. Forward-mode AD calls the Function's jvp(ctx, *input "
            "tangents) during apply; the default one raises NotImplementedError. Define jvp.")
    if parts.get("setup_context") is not True:
        raise CheckFailure(
            "LogSumExp has no setup_context. torch.func transforms (jvp, jacfwd, vmap) run a "
            "Function only when forward(x, dim) takes no ctx and setup_context(ctx, inputs, "
            "output) saves what jvp and backward need.")
    if parts.get("backward") is not True:
        raise CheckFailure("LogSumExp has no backward; define it too, so that reverse mode "
                           "agrees with your jvp.")


def _tensor(value, what, like=None):
    """``value`` (rebuilt) as a plain tensor (refusing subclasses), with ``like``'s shape and
    dtype."""
    if isinstance(value, Shown) and value.base == "Tensor":
        exact_shown(value, torch.Tensor, what)
    if type(value) not in (torch.Tensor, torch.nn.Parameter):
        raise CheckFailure(f"{what} is {type_name(value)}, not a tensor.")
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


def _raised(got: dict, case: dict) -> None:
    """What the answer raised in ``case``, as what to fix where it is a known mistake; else
    AnswerRaised."""
    record = got.get("raised")
    if record is None:
        return
    if type(record) is not dict:
        raise CheckFailure("what came back from your ForwardAD is not the probe's report.")
    ename, evalue = str(record.get("ename")), str(record.get("evalue"))
    if case["kind"] in ("lse", "backward"):
        x, dim = case["x"], case["dim"]
        if ename == "RuntimeError" and "different size" in evalue:
            raise CheckFailure(
                f"for x of shape {tuple(x.shape)} and dim = {dim}, torch refused the tangent "
                f"your LogSumExp.jvp returned: {evalue.splitlines()[0]} jvp maps the input's "
                "tangent u (shaped like x) to the output's tangent J u (shaped like the "
                "output, dim reduced); backward goes the other way (J^T w, shaped like x).")
        if ename in ("ValueError", "IndexError") and ("unpack" in evalue or "index" in evalue):
            raise CheckFailure(
                f"LogSumExp raised {ename}: {evalue} while forward-mode AD ran it. In "
                "jvp, ctx.saved_tensors holds what ctx.save_for_forward saved (not what "
                "save_for_backward saved): save the tensors jvp needs with save_for_forward.")
    raise AnswerRaised(record)


_WHO = {"jvp": "ForwardAD.jvp", "jacobian": "ForwardAD.jacobian"}


def _misuse(got: dict, kind: str) -> None:
    """The program's report (:class:`labs.autograd.probes._Program`) as what to fix."""
    misuse = got.get("misuse")
    if misuse is None:
        return
    who = _WHO[kind]
    why, name = (misuse + [None, None])[:2] if type(misuse) is list else (None, None)
    if why == "not a tensor":
        raise CheckFailure(f"{who} called fn with a {name}; call it with the dual tensors, one "
                           "per primal.")
    if why == "wrapped":
        raise CheckFailure(
            f"{who} called fn inside a torch.func transform. Build the dual tensors yourself: "
            "fwAD.make_dual(primal, tangent) inside fwAD.dual_level().")
    if why == "requires grad":
        raise CheckFailure(
            f"{who} called fn with a tensor that requires grad: that records a graph for "
            "reverse mode. Forward mode needs no graph: call fn on dual tensors "
            "(fwAD.make_dual) that do not require grad.")
    if why == "no tangent":
        raise CheckFailure(
            f"{who} called fn with a tensor that carries no tangent at the current forward "
            "level. Every call of fn must be on dual tensors, made with "
            "fwAD.make_dual(primal, tangent) inside `with fwAD.dual_level():`; the value and "
            "its tangent come out of that one forward pass (get shapes from it too).")
    raise CheckFailure("what came back from your ForwardAD is not the probe's report.")


# ---------------------------------------------------------------- judging one case
def _dual(got: dict, key: str, what: str, value=None):
    """The tangent the probe reported under ``key`` (and the value when ``value`` names it)."""
    if value is not None:
        _tensor(rebuilt(got.get("value")), value)
    tangent = rebuilt(got.get(key))
    if tangent is None:
        raise CheckFailure("LogSumExp.apply on a dual tensor gave an output with no tangent: "
                           "jvp must return the output's tangent.")
    return _tensor(tangent, what)


def _judge_logsumexp(case, got):
    """Values, the jvp (dual tensors) and torch.func.jvp through L against torch.logsumexp."""
    x, dim, u, where = case["x"], case["dim"], case["u"], case["where"]
    want, want_t = torch.func.jvp(lambda t: torch.logsumexp(t, dim), (x,), (u,))
    tangent = _dual(got, "tangent", "the tangent your LogSumExp.jvp returned",
                    f"LogSumExp.apply(x, {dim}) for x of shape {tuple(x.shape)}")
    value = _tensor(rebuilt(got.get("value")), f"{where}: LogSumExp.apply(x, {dim})", want)
    if not torch.isfinite(value).all():
        raise CheckFailure(f"{where}: LogSumExp.apply(x, {dim}) is not finite for inputs up to "
                           f"{x.abs().max().item():g}; subtract the max along dim before exp.")
    _close(value, want, f"{where}: LogSumExp.apply(x, {dim})",
           "logsumexp(x, dim) = m + log(sum(exp(x - m), dim)), m = x.amax(dim, keepdim=True).")
    tangent = _tensor(tangent, f"{where}: the tangent of LogSumExp.apply(x, {dim})", want_t)
    _close(tangent, want_t, f"{where}: the tangent your LogSumExp.jvp gives for dim = {dim}",
           "It should equal torch.func.jvp(torch.logsumexp)'s: sum(softmax(x, dim) * u, dim), "
           "linear in the tangent u (its scale included) and finite for huge inputs.")
    theirs = rebuilt(got.get("func_jvp"))
    _close(_tensor(theirs, f"{where}: torch.func.jvp through LogSumExp", want_t), want_t,
           f"{where}: torch.func.jvp through your LogSumExp (dim = {dim})")


def _judge_backward(case, got):
    """<w, J u> from the jvp against <J^T w, u> from backward, then backward against torch."""
    x, dim, u, w, where = case["x"], case["dim"], case["u"], case["w"], case["where"]
    ju = _dual(got, "ju", "the tangent your LogSumExp.jvp returned",
               f"LogSumExp.apply(x, {dim}) for x of shape {tuple(x.shape)}")
    if got.get("own_node") is not True:
        raise CheckFailure(f"the output's grad_fn is {got.get('grad_fn')}, not your "
                           "LogSumExp's node: compute the value in forward, which apply runs.")
    jtw = _tensor(rebuilt(got.get("jtw")),
                  f"{where}: the gradient your LogSumExp.backward returns", x)
    leaf = x.detach().requires_grad_()
    (want,) = torch.autograd.grad(torch.logsumexp(leaf, dim), leaf, w)
    left, right = (w * ju).sum(), (jtw * u).sum()
    if not torch.isclose(left, right, rtol=1e-6, atol=1e-8):
        raise CheckFailure(
            f"{where}: your jvp and your backward disagree (dim = {dim}): <w, jvp(u)> = "
            f"{left.item():.6g} but <backward(w), u> = {right.item():.6g}. Both are the same "
            "Jacobian J, used as J u and as J^T w; fix whichever differs from torch.")
    _close(jtw, want, f"{where}: your LogSumExp.backward's gradient (dim = {dim})",
           "It should be grad_out.unsqueeze(dim) * softmax(x, dim).")


def _twin(body):
    return lambda *args: body(torch.logsumexp, *args)


def _calls(got, where):
    if got.get("calls") != 1:
        raise CheckFailure(f"{where}: ForwardAD.jvp called fn {got.get('calls')} times; one "
                           "forward pass on the dual tensors gives both the outputs and their "
                           "tangents.")


def _judge_jvp(case, got):
    """The answer's jvp(fn, primals, tangents) against torch.func.jvp of the twin."""
    where = case["where"]
    want_out, want_t = torch.func.jvp(_twin(case["body"]), case["primals"], case["tangents"])
    _calls(got, where)
    got = rebuilt(got.get("got"))
    exact_shown(got, tuple, f"{where}: the value ForwardAD.jvp returned")
    if len(got) != 2:
        raise CheckFailure(f"{where}: ForwardAD.jvp returned {len(got)} items; return a pair "
                           "(outputs, output tangents).")
    single = isinstance(want_out, torch.Tensor)
    outs, tans = ((got[0],), (got[1],)) if single else got
    wants, want_ts = ((want_out,), (want_t,)) if single else (want_out, want_t)
    for name, g in (("outputs", outs), ("tangents", tans)):
        if not single:
            exact_shown(g, tuple,
                        f"{where}: the {name} ForwardAD.jvp returned for a tuple-valued fn")
            if len(g) != len(wants):
                raise CheckFailure(f"{where}: fn returns {len(wants)} tensors; ForwardAD.jvp "
                                   f"returned {len(g)} {name}.")
    if all(t is None for t in tans):
        raise CheckFailure(
            f"{where}: ForwardAD.jvp returned None for the tangent. Read the tangents with "
            "fwAD.unpack_dual inside the dual_level: leaving it (exit_dual_level) clears every "
            "tangent of that level.")
    for k, (o, t, wo, wt) in enumerate(zip(outs, tans, wants, want_ts, strict=True)):
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


def _judge_jacobian(case, got):
    """The answer's jacobian(fn, x) against torch.func.jacfwd of the twin."""
    x, where = case["x"], case["where"]
    want = torch.func.jacfwd(_twin(case["body"]))(x)
    got = _tensor(rebuilt(got.get("got")), f"{where}: the Jacobian")
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


_JUDGES = {"lse": _judge_logsumexp, "backward": _judge_backward, "jvp": _judge_jvp,
           "jacobian": _judge_jacobian}


def _judge(ForwardAD, name: str, seed: int) -> None:
    """Every case of check ``name``, judged in order."""
    for case, got in _runs(ForwardAD, name, seed):
        if case["kind"] in _WHO:
            _misuse(got, case["kind"])
        _raised(got, case)
        _JUDGES[case["kind"]](case, got)


# ---------------------------------------------------------------- public checks
@check(EXERCISE)
def logsumexp_values_and_jvp(ForwardAD, ctx):
    """LogSumExp: values and the jvp on dual tensors match torch.logsumexp's, huge inputs too"""
    _judge(ForwardAD, "logsumexp_values_and_jvp", ctx.seed)


@check(EXERCISE)
def logsumexp_jvp_agrees_with_backward(ForwardAD, ctx):
    """LogSumExp: <w, jvp(u)> equals <backward(w), u>, and backward matches torch"""
    _judge(ForwardAD, "logsumexp_jvp_agrees_with_backward", ctx.seed)


@check(EXERCISE)
def jvp_matches_torch_func_jvp(ForwardAD, ctx):
    """ForwardAD.jvp matches torch.func.jvp on programs with two inputs and tuple outputs"""
    _judge(ForwardAD, "jvp_matches_torch_func_jvp", ctx.seed)


@check(EXERCISE)
def jacobian_matches_jacfwd(ForwardAD, ctx):
    """ForwardAD.jacobian matches torch.func.jacfwd on a non-square program"""
    _judge(ForwardAD, "jacobian_matches_jacfwd", ctx.seed)


# ---------------------------------------------------------------- hidden checks
@check(EXERCISE, hidden=True)
def random_programs(ForwardAD, ctx):
    """jvp and jacobian match torch.func on seeded random programs, float64 and float32"""
    _judge(ForwardAD, "random_programs", ctx.seed)


@check(EXERCISE, hidden=True)
def zero_dim_and_several_inputs(ForwardAD, ctx):
    """0-d inputs and outputs, three inputs, an output that is an input, a constant output"""
    _judge(ForwardAD, "zero_dim_and_several_inputs", ctx.seed)


@check(EXERCISE, hidden=True)
def logsumexp_random_shapes(ForwardAD, ctx):
    """LogSumExp on seeded shapes, dims and magnitudes, float32 too: values, jvp, backward"""
    _judge(ForwardAD, "logsumexp_random_shapes", ctx.seed)
