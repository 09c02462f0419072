"""Checks of ``dispatcher.custom-op``: the learner's ``register_op(qualname)``, which registers
``smooth_max(x, temperature) = temperature * logsumexp(x / temperature, dim=-1)`` as a custom
operator named ``qualname``, with a fake kernel and an autograd formula, and returns it.

Oracles: the torch-composed reference ``t * torch.logsumexp(x / t, -1)`` and its autograd for
values and gradients; ``torch.library.opcheck`` for the registration; ``gradcheck``; the real
kernel's outputs for what the fake kernel must report; ``torch.compile`` with a counting backend
for graph capture. Every check registers the operator under a fresh name and removes it after.
"""
from __future__ import annotations

import contextlib
import itertools
import warnings

from grader.checks import CheckFailure, check, exact, plain_tensor
from labs.dispatcher.checks._numbers import mismatch

EXERCISE = "dispatcher.custom-op"
_NAMESPACE = "course_checks"
_COUNTER = itertools.count()


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (opcheck's and dynamo's are long), with the next
    one when the first only announces it ("backend='...' raised:")."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] + (" " + lines[1] if lines[0].endswith(":") and len(lines) > 1 else "")
    return text[:300]


@contextlib.contextmanager
def _quiet():
    """Silence what torch prints about failures a check reports itself: anomaly-mode warnings and
    FakeTensor's error log."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        logger.setLevel(level)


def _reference(x, temperature):
    """What the operator must compute, composed from torch ops (the oracle)."""
    import torch

    return temperature * torch.logsumexp(x / temperature, dim=-1)


def _temperature(g) -> float:
    """A seeded temperature in [0.2, 3], rounded so that messages can quote it."""
    import torch

    return round(float(torch.empty(()).uniform_(0.2, 3.0, generator=g)), 3)


@contextlib.contextmanager
def _registered(register_op):
    """Call ``register_op`` with a fresh qualified name; yield (returned object, OpOverload);
    afterwards reset dynamo's caches and remove the registration."""
    import torch

    name = f"smooth_max_{next(_COUNTER)}"
    qualname = f"{_NAMESPACE}::{name}"
    try:
        returned = register_op(qualname)
        packet = getattr(getattr(torch.ops, _NAMESPACE), name, None)
        if packet is None or "default" not in packet.overloads():
            raise CheckFailure(
                f"register_op({qualname!r}) registered no operator named {qualname}. Pass the "
                "qualname you are given to torch.library.custom_op(qualname, mutates_args=()), so "
                f"that the operator is reachable as torch.ops.{_NAMESPACE}.{name}.")
        if not callable(returned):
            raise CheckFailure(f"register_op returned {type(returned).__name__}; return the operator "
                               "that torch.library.custom_op gives you (a CustomOpDef, callable as op(x, t)).")
        op = packet.default
        schema = op._schema
        kinds = [str(a.type) for a in schema.arguments]
        if kinds[:2] != ["Tensor", "float"] or len(schema.returns) != 1 or str(schema.returns[0].type) != "Tensor":
            raise CheckFailure(
                f"the operator's schema is {schema}; it must take (Tensor x, float temperature) and "
                "return one Tensor. custom_op infers the schema from the type hints: annotate "
                "x: torch.Tensor, temperature: float and the return as torch.Tensor.")
        if schema.is_mutable:
            raise CheckFailure(f"the schema {schema} says the operator mutates an input; smooth_max "
                               "mutates nothing: pass mutates_args=().")
        yield returned, op
    finally:
        torch._dynamo.reset()
        lib = torch._library.custom_ops.OPDEF_TO_LIB.pop(qualname, None)
        if lib is not None:
            lib._destroy()


def _compare_values(op, x, temperature, where):
    """The operator's output against the reference: shape, dtype and values."""
    import torch

    want = _reference(x, temperature)
    before = x.clone()
    got = op(x, temperature)
    if not torch.equal(x, before):
        raise CheckFailure(f"{where}: the operator modified its input x. It must compute a new tensor and "
                           "leave x alone (mutates_args=() promises exactly that).")
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"{where}: the operator returned {type(got).__name__}, not a tensor.")
    plain_tensor(got, f"{where}: the operator's output")   # a subclass could fake allclose/shape/dtype
    if got.shape != want.shape or got.dtype != want.dtype:
        raise CheckFailure(
            f"{where}: for x of shape {tuple(x.shape)} and dtype {x.dtype} the operator returned shape "
            f"{tuple(got.shape)}, dtype {got.dtype}; expected shape {tuple(want.shape)} (x.shape[:-1]: "
            f"the last dimension is reduced) and dtype {want.dtype}.")
    tol = dict(rtol=1e-5, atol=1e-5) if x.dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)
    if not torch.isfinite(got).all() and torch.isfinite(want).all():
        raise CheckFailure(
            f"{where}: the operator returned inf or nan for temperature {temperature} where "
            "temperature * logsumexp(x / temperature) is finite: exp(x / temperature) overflows. Use "
            "torch.logsumexp, or subtract the row maximum before exponentiating.")
    if not torch.allclose(got, want, **tol):
        i, mine, ref, note = mismatch(got, want)
        raise CheckFailure(
            f"{where}: for x of shape {tuple(x.shape)} and temperature {temperature}, output element {i} "
            f"is {mine}; temperature * logsumexp(x / temperature, dim=-1) gives {ref}{note}")


def _vjp(fn, x, temperature, v):
    """d/dx <fn(x, t), v> computed by autograd, or None if x gets no gradient."""
    import torch

    t = x.detach().clone().requires_grad_()
    out = fn(t, temperature)
    if not isinstance(out, torch.Tensor):
        raise CheckFailure(f"the operator returned {type(out).__name__}, not a tensor.")
    plain_tensor(out, "the operator's output")
    if out.grad_fn is None:
        return out, None
    (gx,) = torch.autograd.grad(out, t, v, allow_unused=True)
    if gx is not None:
        plain_tensor(gx, "the gradient your backward formula returns for x")
    return out, gx


def _plain_outputs(op, x, temperature):
    """Before opcheck / gradcheck compare what the operator returns: its output and the gradient of
    its backward must be plain tensors (a subclass could answer their comparisons as it likes).
    Anything else that goes wrong is left for opcheck / gradcheck to report."""
    import torch

    try:
        t = x.detach().clone().requires_grad_(x.requires_grad)
        out = op(t, temperature)
    except Exception:
        return
    if not isinstance(out, torch.Tensor):
        return
    plain_tensor(out, "the operator's output")
    if out.grad_fn is None:
        return
    try:
        (gx,) = torch.autograd.grad(out, t, torch.ones_like(out), allow_unused=True)
    except Exception:
        return
    if gx is not None:
        plain_tensor(gx, "the gradient your backward formula returns for x")


def _check_grads(op, x, temperature, where, g):
    """The gradient with respect to x (a vector-Jacobian product with a seeded vector) against the
    reference's autograd."""
    import torch

    v = torch.randn(x.shape[:-1], generator=g, dtype=x.dtype)
    _, want = _vjp(_reference, x, temperature, v)
    out, mine = _vjp(op, x, temperature, v)
    if out.grad_fn is None:
        raise CheckFailure(f"{where}: the operator's output has no grad_fn although x requires grad. "
                           "Register a backward formula with op.register_autograd(backward, "
                           "setup_context=setup_context).")
    if mine is None:
        raise CheckFailure(f"{where}: backward gave no gradient for x. The backward function must return "
                           "one value per input of the operator: (gradient for x, None for temperature).")
    if mine.shape != want.shape:
        raise CheckFailure(f"{where}: the gradient for x has shape {tuple(mine.shape)}, not x's shape "
                           f"{tuple(want.shape)}. grad has the output's shape x.shape[:-1]: unsqueeze it "
                           "to broadcast along the reduced dimension.")
    tol = dict(rtol=1e-5, atol=1e-6) if x.dtype == torch.float32 else dict(rtol=1e-7, atol=1e-9)
    if not torch.allclose(mine, want, **tol):
        i, got, ref, note = mismatch(mine, want)
        raise CheckFailure(
            f"{where}: for x of shape {tuple(x.shape)} and temperature {temperature}, element {i} of the "
            f"gradient is {got}; torch's autograd of the reference gives {ref}{note} "
            "d/dx [t * logsumexp(x / t)] = softmax(x / t) along the last dimension, times grad (unsqueezed).")


_OPCHECK_HINTS = {
    "test_schema": "the kernel does not behave as the schema says: it must not modify x and must "
                   "return a new tensor (not x or a view of x), as mutates_args=() promises",
    "test_autograd_registration": "the autograd formula must be registered with "
                                  "op.register_autograd(backward, setup_context=...)",
    "test_faketensor": "the fake kernel (op.register_fake) must return an empty tensor with the real "
                       "output's shape x.shape[:-1], dtype and device, using only x's metadata "
                       "(x.new_empty(...)), never its values",
    "test_aot_dispatch_dynamic": "AOTAutograd could not trace forward and backward with symbolic shapes: "
                                 "the fake kernel must derive the shape from x.shape, setup_context must "
                                 "save what backward needs, and backward must return (gradient for x, "
                                 "None) computed with torch ops",
}


def _opcheck(op, args, where):
    """torch.library.opcheck on one input; the first failing test is reported with a hint."""
    import torch

    _plain_outputs(op, *args)
    with _quiet():
        result = torch.library.opcheck(op, args, raise_exception=False)
    for test, outcome in result.items():
        if outcome != "SUCCESS":
            raise CheckFailure(f"torch.library.opcheck failed {test} {where}: {_first_line(outcome)}. "
                               f"Hint: {_OPCHECK_HINTS.get(test, '')}.")


# --------------------------------------------------------------------------- checks


@check(EXERCISE)
def values(register_op, ctx):
    """registers an operator under the given name computing temperature * logsumexp(x / temperature, -1)"""
    import torch

    g = ctx.generator(40)
    with _registered(register_op) as (returned, op):
        for shape, dtype in (((7,), torch.float32), ((3, 5), torch.float64), ((2, 3, 4), torch.float32)):
            x = torch.randn(shape, generator=g, dtype=dtype) * 2
            _compare_values(op, x, _temperature(g), "calling the registered operator")
        x = torch.randn(4, 6, generator=g, dtype=torch.float64)
        t = _temperature(g)
        mine, theirs = returned(x, t), op(x, t)
        for what, value in (("what the object register_op returned gives", mine),
                            ("what the registered operator gives", theirs)):
            if not isinstance(value, torch.Tensor):
                raise CheckFailure(f"calling the operator: {what} is {type(value).__name__}, not a tensor.")
            plain_tensor(value, f"calling the operator: {what}")
        if not torch.equal(mine, theirs):
            raise CheckFailure("the object register_op returned computes something else than the registered "
                               "operator: return what torch.library.custom_op gives you.")


@check(EXERCISE)
def passes_opcheck(register_op, ctx):
    """torch.library.opcheck passes: schema, fake kernel, autograd registration, AOT dispatch"""
    import torch

    g = ctx.generator(41)
    with _registered(register_op) as (_, op):
        x = (torch.randn(4, 6, generator=g, dtype=torch.float64) * 2).requires_grad_()
        _opcheck(op, (x, _temperature(g)), "for x of shape (4, 6), float64, requiring grad")
        y = torch.randn(2, 3, 5, generator=g).requires_grad_()
        _opcheck(op, (y, _temperature(g)), "for x of shape (2, 3, 5), float32, requiring grad")


@check(EXERCISE)
def gradients(register_op, ctx):
    """gradcheck passes in float64 and the gradient matches torch's autograd"""
    import torch
    from torch.autograd.gradcheck import GradcheckError

    g = ctx.generator(42)
    with _registered(register_op) as (_, op):
        t = _temperature(g)
        x = (torch.randn(3, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
        _plain_outputs(op, x, t)
        try:
            torch.autograd.gradcheck(lambda v: op(v, t), (x,), eps=1e-6, atol=1e-5)
        except GradcheckError as exc:
            raise CheckFailure(
                f"gradcheck failed for x of shape (3, 5), temperature {t}: your backward's gradient differs "
                f"from finite differences ({_first_line(exc)}). d/dx [t * logsumexp(x / t)] = softmax(x / t, "
                "dim=-1), times grad.unsqueeze(-1).") from None
        _check_grads(op, torch.randn(2, 4, 3, generator=g, dtype=torch.float64) * 3, t,
                     "gradient check", g)


@check(EXERCISE)
def compiles_to_one_graph(register_op, ctx):
    """torch.compile(fullgraph=True) captures one graph with the operator as one node, forward and backward"""
    import torch
    from torch._dynamo.backends.debugging import aot_eager
    from torch._subclasses.fake_tensor import FakeTensor

    g = ctx.generator(43)
    with _registered(register_op) as (_, op):
        t = _temperature(g)
        graphs = []

        def counting_backend(gm, example_inputs):
            graphs.append(gm)
            return aot_eager(gm, example_inputs)

        def program(x, w):
            return (op(x * w, t).sin() + 1).sum()

        x = torch.randn(3, 4, 6, generator=g, dtype=torch.float64).requires_grad_()
        w = torch.randn(6, generator=g, dtype=torch.float64).requires_grad_()
        torch._dynamo.reset()
        compiled = torch.compile(program, backend=counting_backend, fullgraph=True)
        try:
            with _quiet():
                out = compiled(x, w)
                out.backward()
        except Exception as exc:  # dynamo wraps the cause; report its first line
            raise CheckFailure(
                f"torch.compile(fullgraph=True) failed on (op(x * w, t).sin() + 1).sum(): {_first_line(exc)}. "
                "Dynamo and AOTAutograd run the operator on FakeTensors while tracing: register a fake "
                "kernel (op.register_fake) that returns x.new_empty(x.shape[:-1]), and an autograd "
                "formula that works with torch ops.") from None
        if len(graphs) != 1:
            raise CheckFailure(f"torch.compile made {len(graphs)} graphs of a program that needs one.")
        plain_tensor(out, "the compiled program's output")
        for name, grad in (("x", x.grad), ("w", w.grad)):
            if grad is not None:
                plain_tensor(grad, f"{name}.grad after backward through the compiled program")
        nodes = [n for n in graphs[0].graph.nodes if n.op == "call_function" and n.target is op]
        if len(nodes) != 1:
            raise CheckFailure(
                f"the captured graph has {len(nodes)} call(s) of {op} (expected one): "
                "a custom op must stay one opaque node in the graph.")
        real = _reference(x.detach() * w.detach(), t)
        traced = nodes[0].meta.get("example_value")
        if traced is not None:
            exact(traced, FakeTensor, "while tracing, what your fake kernel returned")
        if traced is not None and (tuple(traced.shape) != tuple(real.shape) or traced.dtype != real.dtype
                                   or traced.device != real.device):
            raise CheckFailure(
                f"while tracing, your fake kernel said the output has shape {tuple(traced.shape)}, dtype "
                f"{traced.dtype}, device {traced.device}; the real kernel returns shape {tuple(real.shape)}, "
                f"dtype {real.dtype}, device {real.device}. Return x.new_empty(x.shape[:-1]) from the fake kernel.")
        xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        want = (_reference(xs * ws, t).sin() + 1).sum()
        want.backward()
        if not torch.allclose(out.detach(), want.detach(), rtol=1e-7, atol=1e-9):
            _, got, ref, note = mismatch(out, want)
            raise CheckFailure(f"the compiled program returned {got}; eager torch gives {ref}{note}")
        for name, mine, ref in (("x", x.grad, xs.grad), ("w", w.grad, ws.grad)):
            if mine is None or not torch.allclose(mine, ref, rtol=1e-6, atol=1e-8):
                raise CheckFailure(
                    f"after backward through the compiled program, {name}.grad differs from eager torch's. "
                    "AOTAutograd traces your backward formula: check setup_context and backward.")


_DEVICE_HINT = ("The fake kernel must put the output on x's device: allocate it with "
                "x.new_empty(x.shape[:-1]), or pass device=x.device (and dtype=x.dtype) to torch.empty; "
                "torch.empty without device= allocates on the default device, cpu.")


def _run_fake(op, make_x, t, shape, dtype, where):
    """op on the FakeTensor that make_x() creates under a fresh FakeTensorMode: (fake x, output)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode() as mode:
        try:
            fx = make_x(mode)
            out = op(fx, t)
        except Exception as exc:
            raise CheckFailure(
                f"running the operator under FakeTensorMode failed for x of shape {shape}, dtype {dtype}"
                f"{where}: {_first_line(exc)}. The fake kernel may use only x's metadata "
                "(shape, dtype, device), never its values (.item(), .tolist(), numpy).") from None
    # exactly a FakeTensor: a subclass of it could report any shape, dtype or device
    exact(out, FakeTensor, f"under FakeTensorMode, for x of shape {shape}, dtype {dtype}{where}, the output "
                           "of your fake kernel")
    return fx, out


@check(EXERCISE, hidden=True)
def fake_kernel_metadata(register_op, ctx):
    """the fake kernel reports the real output's shape, dtype and device on random shapes"""
    import torch

    g = ctx.generator(44)

    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    shapes = [(1,), (ri(2, 9),), (0, ri(1, 5)), (ri(1, 4), 1), (ri(1, 4), ri(1, 4), ri(2, 6)),
              (1, 1, 1, ri(2, 5))]
    with _registered(register_op) as (_, op):
        for shape in shapes:
            for dtype in (torch.float32, torch.float64, torch.bfloat16):
                x = torch.randn(shape, generator=g).to(dtype)
                t = _temperature(g)
                real = plain_tensor(op(x, t), f"for x of shape {shape} and dtype {dtype}, the operator's output")
                _, fake = _run_fake(op, lambda mode: mode.from_tensor(x), t, shape, dtype, "")
                for what, mine, want in (("shape", tuple(fake.shape), tuple(real.shape)),
                                         ("dtype", fake.dtype, real.dtype), ("device", fake.device, real.device)):
                    if mine != want:
                        raise CheckFailure(
                            f"for x of shape {shape} and dtype {dtype}, the fake kernel says the output's "
                            f"{what} is {mine}; the real kernel's is {want}.")
                meta = plain_tensor(op(x.to("meta"), t),
                                    f"on a meta tensor of shape {shape}, dtype {dtype}, the operator's output")
                if tuple(meta.shape) != tuple(real.shape) or meta.dtype != real.dtype:
                    raise CheckFailure(
                        f"on a meta tensor of shape {shape} (register_fake also serves the Meta key), the "
                        f"operator returned shape {tuple(meta.shape)}, dtype {meta.dtype}; expected "
                        f"{tuple(real.shape)}, {real.dtype}.")
                if meta.device.type != "meta":
                    raise CheckFailure(
                        f"on a meta tensor of shape {shape}, dtype {dtype} (register_fake also serves the Meta "
                        f"key), the operator returned a tensor on {meta.device}; a meta input must give a meta "
                        f"output. {_DEVICE_HINT}")
            # A FakeTensor on another device than the real inputs' (fake tensors need no such device).
            other = "cpu" if real.device.type == "cuda" else "cuda"
            fx, fake = _run_fake(op, lambda mode: torch.empty(shape, dtype=dtype, device=other), t, shape,
                                 dtype, f" on the fake device {other}")
            if fake.device != fx.device:
                raise CheckFailure(
                    f"under FakeTensorMode, for a fake x on {fx.device} of shape {shape}, dtype {dtype}, the fake "
                    f"kernel says the output is on {fake.device}; it must be on x's device, {fx.device}. "
                    f"{_DEVICE_HINT}")


@check(EXERCISE, hidden=True)
def random_inputs(register_op, ctx):
    """values and gradients match torch on random shapes, temperatures (small ones too) and large inputs"""
    import torch

    g = ctx.generator(45)

    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    with _registered(register_op) as (_, op):
        cases = [((1,), 1.0), ((ri(2, 9),), 1.0), ((0, ri(1, 5)), 1.0), ((ri(2, 5), 1), 1.0),
                 ((ri(1, 4), ri(1, 4), ri(2, 7)), 1.0), ((ri(2, 5), ri(3, 8)), 300.0)]
        for shape, spread in cases:
            for dtype in (torch.float32, torch.float64):
                x = torch.randn(shape, generator=g, dtype=torch.float64).mul(spread).to(dtype)
                t = _temperature(g) if spread == 1.0 else 0.05
                where = f"for x of shape {shape}, {dtype}" + (" with entries in the hundreds" if spread > 1 else "")
                _compare_values(op, x, t, where)
                if dtype == torch.float64:
                    _check_grads(op, x, t, where, g)
        # Small temperatures on entries within a few temperatures of each other: there the result
        # is well above x.amax(-1) (by up to t * log(n)), so no shortcut through the maximum.
        for t in (0.05, 0.01, 0.001):
            shape = (ri(1, 4), ri(3, 9))
            x = torch.randn((), generator=g, dtype=torch.float64) * 3 + torch.randn(
                shape, generator=g, dtype=torch.float64) * t
            for dtype in (torch.float32, torch.float64):
                where = (f"{str(dtype)[6:]} x with entries within a few temperatures of each other, where the "
                         "result lies above x.amax(-1) by up to t * log(n)")
                _compare_values(op, x.to(dtype), t, where)
                if dtype == torch.float64:
                    _check_grads(op, x, t, where, g)
        x = torch.randn(5, 4, generator=g, dtype=torch.float64).t()          # not contiguous
        _compare_values(op, x, 0.7, "for a transposed (non-contiguous) x")
        _check_grads(op, x, 0.7, "for a transposed (non-contiguous) x", g)
