"""Checks of ``dispatcher.subclass``: the learner's ``ScaledTensor(inner, scale)``, a
``__torch_dispatch__`` wrapper subclass whose value is ``inner * scale``.

Oracle: every program runs twice, once on ScaledTensors and once on the dense tensors
``inner * scale`` they stand for; torch's results on the dense tensors (values, and gradients from
its autograd) are what the ScaledTensor results must equal. Floating-point outputs must come back
as ScaledTensors, other outputs (bool and integer tensors, Python numbers) as plain values.
"""
from __future__ import annotations

from grader.checks import CheckFailure, check, exact, learner_line, plain_tensor
from labs.dispatcher.checks._numbers import mismatch

EXERCISE = "dispatcher.subclass"


# --------------------------------------------------------------------------- helpers
def _ri(g, lo: int, hi: int) -> int:
    """A seeded integer in [lo, hi]."""
    import torch

    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _pick(g, options):
    """A seeded choice from a list."""
    return options[_ri(g, 0, len(options) - 1)]


def _scale(g) -> float:
    """A seeded nonzero scale in +-[0.25, 2.5], rounded so that messages can quote it."""
    import torch

    s = round(float(torch.empty(()).uniform_(0.25, 2.5, generator=g)), 3)
    return -s if _ri(g, 0, 2) == 0 else s


def _validate_class(ScaledTensor):
    """The structural checks every use needs: a torch.Tensor subclass with its own __torch_dispatch__."""
    import torch

    if not (isinstance(ScaledTensor, type) and issubclass(ScaledTensor, torch.Tensor)):
        raise CheckFailure("ScaledTensor must be a class deriving from torch.Tensor "
                           f"(got {type(ScaledTensor).__name__}).")
    if ScaledTensor.__torch_dispatch__ is torch.Tensor.__torch_dispatch__:
        raise CheckFailure("ScaledTensor does not define __torch_dispatch__ (it inherits torch.Tensor's). "
                           "Define it as a classmethod __torch_dispatch__(cls, func, types, args=(), kwargs=None).")


def _make(ScaledTensor, inner, scale):
    """ScaledTensor(inner, scale), with its attributes and metadata checked."""
    t = ScaledTensor(inner, scale)
    if not isinstance(t, ScaledTensor):
        raise CheckFailure(f"ScaledTensor(inner, scale) returned a {type(t).__name__}, not a ScaledTensor.")
    _parts(ScaledTensor, t, "ScaledTensor(inner, scale)", scales=(float,))
    shape, dtype, device = _meta(t)
    if shape != tuple(inner.shape) or dtype != inner.dtype or device != inner.device:
        raise CheckFailure(
            f"ScaledTensor(inner, scale) for inner of shape {tuple(inner.shape)}, {inner.dtype} has shape "
            f"{shape}, dtype {dtype}, device {device}: pass inner's shape, strides, dtype and "
            "device to torch.Tensor._make_wrapper_subclass.")
    return t


# What the answer's class says about its own objects is not trusted: its __torch_function__ may
# answer .shape, .dtype, allclose or equal with anything. The checks read a wrapper's metadata with
# torch functions disabled for subclasses, require .inner to be a plain tensor (or, nested, a
# ScaledTensor) and .scale a plain float, and compute inner * scale themselves on plain tensors.

def _meta(t):
    """(shape, dtype, device) of a tensor as its TensorImpl records them, without asking the
    class's __torch_function__."""
    import torch

    with torch._C.DisableTorchFunctionSubclass():
        return tuple(t.shape), t.dtype, t.device


def _parts(ScaledTensor, t, what: str, depth: int = 0, scales=(float, int)):
    """(inner, scale) of ``t``, which must be exactly a ScaledTensor (not a subclass of it), with
    .inner a plain tensor or a ScaledTensor and .scale exactly one of ``scales`` (a Python float; an
    int is tolerated in results, as inner * scale means the same)."""
    import torch

    if type(t) is not ScaledTensor:
        raise CheckFailure(f"{what} is a {type(t).__name__}, a subclass of ScaledTensor; results must be "
                           "ScaledTensors themselves (cls(inner, scale) in __torch_dispatch__).")
    inner, scale = getattr(t, "inner", None), getattr(t, "scale", None)
    if not (isinstance(inner, torch.Tensor) and isinstance(scale, scales) and not isinstance(scale, bool)):
        raise CheckFailure("ScaledTensor(inner, scale) must store the tensor as .inner and the scale as a "
                           "Python float .scale.")
    exact(scale, scales, f"the .scale of {what}")
    if type(inner) is ScaledTensor:
        if depth > 8:
            raise CheckFailure(f"{what} nests ScaledTensors more than 8 deep in .inner; keep .inner a "
                               "plain tensor.")
    else:
        plain_tensor(inner, f"the .inner of {what}")
    return inner, scale


def _is_scaled(v) -> bool:
    """Whether v looks like a ScaledTensor (any class with .inner and .scale): for describing the
    checks' own inputs only."""
    import torch

    return isinstance(v, torch.Tensor) and type(v) is not torch.Tensor and hasattr(v, "inner") and hasattr(v, "scale")


def _dense(ScaledTensor, v, what: str, depth: int = 0):
    """The plain tensor ``v`` stands for, computed here on plain tensors: inner * scale for a
    ScaledTensor (inner itself may be scaled), ``v`` itself for a plain tensor; anything else (a
    subclass that could lie about its values) is refused."""
    if isinstance(v, ScaledTensor):
        inner, scale = _parts(ScaledTensor, v, what, depth)
        return _dense(ScaledTensor, inner, f"the .inner of {what}", depth + 1) * scale
    return plain_tensor(v, what)


def _describe(x) -> str:
    """A short description of a program input or output, for messages."""
    import torch

    if isinstance(x, torch.Tensor):
        kind = f"ScaledTensor(scale={x.scale})" if _is_scaled(x) else "tensor"
        return f"{kind} of shape {tuple(x.shape)}, {str(x.dtype)[6:]}"
    return repr(x)


def _tolerance(want):
    """rtol, atol for comparing with a dense result (atol grows with its magnitude)."""
    import torch

    big = float(want.detach().abs().max()) if want.numel() and want.is_floating_point() else 0.0
    if want.dtype == torch.float64:
        return 1e-7, 1e-9 * (1.0 + big)
    return 1e-4, 1e-5 * (1.0 + big)


def _match(ScaledTensor, got, want, where: str) -> None:
    """got (from ScaledTensors) against want (from dense tensors): structure, types and values."""
    import torch
    from torch.utils._pytree import tree_flatten

    flat_got, _ = tree_flatten(got)
    flat_want, _ = tree_flatten(want)
    if len(flat_got) != len(flat_want):
        raise CheckFailure(f"{where}: returned {len(flat_got)} value(s); on dense tensors torch returns "
                           f"{len(flat_want)}. Return the op's outputs in the same structure (tree_map over them).")
    for k, (a, b) in enumerate(zip(flat_got, flat_want)):
        which = f"{where}, output {k}" if len(flat_want) > 1 else where
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise CheckFailure(f"{which}: returned {type(a).__name__}, expected a tensor.")
            if b.is_floating_point():
                if not isinstance(a, ScaledTensor):
                    raise CheckFailure(
                        f"{which}: returned a plain {type(a).__name__}; floating-point results must come back "
                        "as ScaledTensors. Wrap every floating-point tensor that func returns "
                        "(tree_map_only over the outputs) before returning from __torch_dispatch__.")
                value = _dense(ScaledTensor, a, which)      # checks a's type, .inner and .scale first
                shape, dtype, _ = _meta(a)
                if shape != tuple(b.shape) or dtype != b.dtype:
                    raise CheckFailure(
                        f"{which}: the ScaledTensor says shape {shape}, dtype {dtype}; torch gives "
                        f"shape {tuple(b.shape)}, dtype {b.dtype} on the dense tensors.")
                if value.shape != b.shape:
                    raise CheckFailure(f"{which}: the result's inner has shape {tuple(value.shape)}, but the "
                                       f"ScaledTensor says {tuple(b.shape)}: build the wrapper from inner's shape.")
                rtol, atol = _tolerance(b)
                if not torch.allclose(value.detach(), b.detach(), rtol=rtol, atol=atol, equal_nan=True):
                    i, mine, ref, note = mismatch(value, b)
                    raise CheckFailure(
                        f"{which}: value element {i} is {mine} (inner * scale); the same program on dense "
                        f"tensors gives {ref}{note}")
            else:
                if type(a) is not torch.Tensor:
                    raise CheckFailure(
                        f"{which}: a {b.dtype} result came back as {type(a).__name__}; only floating-point "
                        "results are ScaledTensors. Return bool and integer tensors as plain tensors.")
                if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
                    raise CheckFailure(f"{which}: the {b.dtype} result differs from torch's on the dense tensors.")
        elif isinstance(b, (bool, int, float)):
            if isinstance(a, torch.Tensor):
                raise CheckFailure(f"{which}: returned a tensor; torch gives {b!r} on the dense tensors.")
            if isinstance(a, (bool, int, float)) and type(a) not in (bool, int, float):
                exact(a, (int, float), which)         # a subclass could claim to equal anything
            if type(a) not in (bool, int, float) or not (a == b or abs(a - b) <= 1e-5 * (1 + abs(b))):
                shown = repr(a) if type(a) in (bool, int, float) else f"a {type(a).__name__}"
                raise CheckFailure(f"{which}: returned {shown}; torch gives {b!r} on the dense tensors.")


def _run_case(ScaledTensor, g, label, shapes, fn, *, dtype=None, scaled=None):
    """Run fn on ScaledTensor inputs and on the dense tensors they stand for; compare the results
    and the inputs afterwards (in-place ops must update the ScaledTensor's value)."""
    import torch

    dtype = dtype or torch.float64
    scaled = scaled if scaled is not None else [True] + [_ri(g, 0, 1) == 1 for _ in shapes[1:]]
    ins, dense = [], []
    for shape, is_scaled in zip(shapes, scaled):
        inner = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        s = _scale(g)
        value = inner * s
        dense.append(value.clone())
        ins.append(_make(ScaledTensor, inner.clone(), s) if is_scaled else value.clone())
    where = f"{label} with " + ", ".join(_describe(x) for x in ins)
    want = fn(*dense)
    try:
        got = fn(*ins)
    except (CheckFailure, AssertionError):
        raise
    except Exception as exc:
        if isinstance(exc, NotImplementedError) and exc.args == (EXERCISE,):
            raise
        text = (str(exc).strip().splitlines() or [""])[0][:200]
        raise CheckFailure(f"{where}: raised {type(exc).__name__}: {text}{learner_line(exc)}; on dense tensors "
                           "torch computes it without error.") from None
    _match(ScaledTensor, got, want, where)
    for k, (x, d) in enumerate(zip(ins, dense)):
        if _is_scaled(x):
            _match(ScaledTensor, x, d, f"{where}: afterwards, input {k}")


# --------------------------------------------------------------------------- op catalogue
def _pointwise(g):
    import torch
    import torch.nn.functional as F

    n, m = _ri(g, 1, 4), _ri(g, 1, 5)
    other = _pick(g, [(n, m), (m,), (n, 1), (1, m), ()])
    binary = [("a + b", lambda a, b: a + b), ("a - b", lambda a, b: a - b), ("a * b", lambda a, b: a * b),
              ("a / (b.abs() + 0.5)", lambda a, b: a / (b.abs() + 0.5)),
              ("torch.maximum(a, b)", torch.maximum),
              ("torch.where(a > b, a, b)", lambda a, b: torch.where(a > b, a, b)),
              ("torch.lerp(a, b, 0.3)", lambda a, b: torch.lerp(a, b, 0.3)),
              ("a * 2.5 - b / 4", lambda a, b: a * 2.5 - b / 4)]
    unary = [("a.exp().tanh()", lambda a: a.exp().tanh()), ("torch.sigmoid(a)", torch.sigmoid),
             ("F.relu(a)", F.relu), ("-a", lambda a: -a), ("a.abs().sqrt()", lambda a: a.abs().sqrt()),
             ("a.pow(2)", lambda a: a.pow(2)), ("1 / (a.abs() + 1)", lambda a: 1 / (a.abs() + 1)),
             ("a.clamp(-0.5, 0.7)", lambda a: a.clamp(-0.5, 0.7)), ("F.gelu(a)", F.gelu),
             ("torch.sin(a) + 3", lambda a: torch.sin(a) + 3)]
    if _ri(g, 0, 1):
        label, fn = _pick(g, binary)
        return label, [(n, m), other], fn
    label, fn = _pick(g, unary)
    return label, [_pick(g, [(n, m), (), (n,)])], fn


def _reductions(g):
    import torch
    import torch.nn.functional as F

    n, m = _ri(g, 1, 4), _ri(g, 2, 5)
    options = [("a.sum()", lambda a: a.sum()), ("a.sum(dim=1)", lambda a: a.sum(dim=1)),
               ("a.mean(0, keepdim=True)", lambda a: a.mean(0, keepdim=True)),
               ("a.amax(dim=-1)", lambda a: a.amax(dim=-1)), ("a.max(dim=1)", lambda a: a.max(dim=1)),
               ("a.norm()", lambda a: a.norm()), ("a.var(dim=1)", lambda a: a.var(dim=1)),
               ("F.softmax(a, dim=-1)", lambda a: F.softmax(a, dim=-1)),
               ("F.log_softmax(a, dim=0)", lambda a: F.log_softmax(a, dim=0)),
               ("a.cumsum(1)", lambda a: a.cumsum(1)), ("torch.sort(a, dim=1)", lambda a: torch.sort(a, dim=1)),
               ("a.topk(2, dim=1)", lambda a: a.topk(2, dim=1)), ("a.logsumexp(1)", lambda a: a.logsumexp(1)),
               ("a.argmax(dim=1)", lambda a: a.argmax(dim=1)), ("a.sum().item()", lambda a: a.sum().item()),
               ("(a > 0).sum()", lambda a: (a > 0).sum())]
    label, fn = _pick(g, options)
    return label, [(n, m)], fn


def _matmuls(g):
    import torch
    import torch.nn.functional as F

    n, k, m, b = _ri(g, 1, 4), _ri(g, 1, 5), _ri(g, 1, 4), _ri(g, 1, 3)
    options = [("a @ b", [(n, k), (k, m)], lambda a, c: a @ c), ("torch.mm(a, b)", [(n, k), (k, m)], torch.mm),
               ("torch.bmm(a, b)", [(b, n, k), (b, k, m)], torch.bmm),
               ("a @ b (batched @ matrix)", [(b, n, k), (k, m)], lambda a, c: a @ c),
               ("torch.mv(a, b)", [(n, k), (k,)], torch.mv),
               ("F.linear(a, w)", [(n, k), (m, k)], lambda a, w: F.linear(a, w)),
               ("torch.outer(a, b)", [(n,), (m,)], torch.outer),
               ("torch.einsum('ij,kj->ik', a, b)", [(n, k), (m, k)], lambda a, c: torch.einsum("ij,kj->ik", a, c))]
    return _pick(g, options)


def _views(g):
    n, m = _ri(g, 2, 4), _ri(g, 2, 5)
    options = [("a.t()", lambda a: a.t()), ("a.transpose(0, 1) * 2", lambda a: a.transpose(0, 1) * 2),
               ("a.reshape(-1)", lambda a: a.reshape(-1)), ("a.view(m, n)", lambda a: a.view(m, n)),
               ("a.unsqueeze(1)", lambda a: a.unsqueeze(1)), ("a[1:, ::2]", lambda a: a[1:, ::2]),
               ("a[0]", lambda a: a[0]), ("a.narrow(1, 1, 1)", lambda a: a.narrow(1, 1, 1)),
               ("a.split(1, dim=0)", lambda a: a.split(1, dim=0)), ("a.unbind(1)", lambda a: a.unbind(1)),
               ("a.expand(3, n, m).sum(0)", lambda a: a.unsqueeze(0).expand(3, n, m).sum(0)),
               ("a.diagonal()", lambda a: a.diagonal()), ("a.flatten()", lambda a: a.flatten()),
               ("a.t().contiguous()", lambda a: a.t().contiguous()), ("a.mT.flip(0)", lambda a: a.mT.flip(0))]
    label, fn = _pick(g, options)
    return label, [(n, m)], fn


def _indexing(g):
    import torch

    n, m = _ri(g, 2, 5), _ri(g, 2, 4)
    idx = torch.randint(0, n, (_ri(g, 1, 4),), generator=g)
    cols = torch.randint(0, m, (n, 2), generator=g)
    mask = torch.rand(n, m, generator=g) > 0.5
    options = [("a[idx]", lambda a: a[idx]), ("a[mask]", lambda a: a[mask]),
               ("a.index_select(0, idx)", lambda a: a.index_select(0, idx)),
               ("a.gather(1, cols)", lambda a: a.gather(1, cols)),
               ("a.masked_fill(mask, 0.5)", lambda a: a.masked_fill(mask, 0.5)),
               ("a[idx, 0]", lambda a: a[idx, 0])]
    label, fn = _pick(g, options)
    return label, [(n, m)], fn


def _inplace(g):
    import torch

    n, m = _ri(g, 2, 4), _ri(g, 2, 5)
    idx = torch.randint(0, n, (1,), generator=g)
    mask = torch.rand(n, m, generator=g) > 0.5

    def setitem_row(a, b):
        a[idx] = b[0]
        return a

    def setitem_col(a, b):
        a[:, 0] = 3.0
        return a

    def view_then_inplace(a, b):
        a[1:].mul_(2.0)
        return a.sum()

    def transposed_add_(a, b):
        a.t().add_(b.t())
        return a

    options = [("a.add_(b)", [(n, m), (n, m)], lambda a, b: a.add_(b)),
               ("a.mul_(1.5)", [(n, m)], lambda a: a.mul_(1.5)), ("a.zero_()", [(n, m)], lambda a: a.zero_()),
               ("a.fill_(0.75)", [(n, m)], lambda a: a.fill_(0.75)),
               ("a.copy_(b)", [(n, m), (n, m)], lambda a, b: a.copy_(b)),
               ("a.clamp_(min=0)", [(n, m)], lambda a: a.clamp_(min=0)),
               ("a[i] = b[0]", [(n, m), (n, m)], setitem_row), ("a[:, 0] = 3.0", [(n, m), (n, m)], setitem_col),
               ("a[1:].mul_(2.0); a.sum()", [(n, m), (n, m)], view_then_inplace),
               ("a.t().add_(b.t())", [(n, m), (n, m)], transposed_add_),
               ("a.addcmul_(b, b, value=0.5)", [(n, m), (n, m)], lambda a, b: a.addcmul_(b, b, value=0.5)),
               ("a.masked_fill_(mask, 0.0)", [(n, m)], lambda a: a.masked_fill_(mask, 0.0))]
    return _pick(g, options)


def _structure(g):
    import torch

    n, m = _ri(g, 1, 4), _ri(g, 1, 4)
    options = [("torch.cat([a, b])", [(n, m), (n, m)], lambda a, b: torch.cat([a, b])),
               ("torch.stack([a, b], dim=1)", [(n, m), (n, m)], lambda a, b: torch.stack([a, b], dim=1)),
               ("a.clone()", [(n, m)], lambda a: a.clone()), ("a.to(torch.float32)", [(n, m)], lambda a: a.to(torch.float32)),
               ("a.double()", [(n, m)], lambda a: a.double()), ("a.long()", [(n, m)], lambda a: a.long()),
               ("a > b", [(n, m), (n, m)], lambda a, b: a > b), ("a.eq(a)", [(n, m)], lambda a: a.eq(a)),
               ("torch.zeros_like(a)", [(n, m)], torch.zeros_like), ("torch.ones_like(a) * a", [(n, m)], lambda a: torch.ones_like(a) * a),
               ("torch.allclose(a, b)", [(n, m), (n, m)], lambda a, b: torch.allclose(a, b)),
               ("a.new_zeros(3)", [(n, m)], lambda a: a.new_zeros(3))]
    return _pick(g, options)


# --------------------------------------------------------------------------- checks
@check(EXERCISE)
def construction(ScaledTensor, ctx):
    """ScaledTensor(inner, scale) is a wrapper tensor with inner's shape and dtype, standing for inner * scale"""
    import torch

    _validate_class(ScaledTensor)
    g = ctx.generator(60)
    inner = torch.randn(3, 4, generator=g)
    s = _scale(g)
    t = _make(ScaledTensor, inner, s)
    t_inner, t_scale = _parts(ScaledTensor, t, "ScaledTensor(inner, scale)")
    if t_inner is not inner or t_scale != s:
        raise CheckFailure("ScaledTensor(inner, scale) must keep the given tensor as .inner (not a copy) and "
                           "the scale as .scale.")
    with torch._C.DisableTorchFunctionSubclass():
        requires_grad = t.requires_grad
    if requires_grad:
        raise CheckFailure("a new ScaledTensor must not require grad (pass requires_grad=False to "
                           "_make_wrapper_subclass); callers use .requires_grad_().")
    keys = torch._C._dispatch_keys(t)
    if not keys.has(torch._C.DispatchKey.Python):
        raise CheckFailure(f"the ScaledTensor's dispatch keys are {keys}, without Python: create it with "
                           "torch.Tensor._make_wrapper_subclass so that aten ops reach __torch_dispatch__.")
    _run_case(ScaledTensor, g, "a + 1", [(3, 4)], lambda a: a + 1, scaled=[True])


@check(EXERCISE)
def ops_match_dense(ScaledTensor, ctx):
    """pointwise ops, reductions, comparisons and indexing match the dense tensor"""
    import torch
    import torch.nn.functional as F

    _validate_class(ScaledTensor)
    g = ctx.generator(61)
    cases = [("a + b", [(3, 4), (3, 4)], lambda a, b: a + b, [True, True]),
             ("a * b", [(3, 4), (4,)], lambda a, b: a * b, [True, False]),
             ("a * 2.0 + 1", [(3, 4)], lambda a: a * 2.0 + 1, [True]),
             ("torch.tanh(a)", [(5,)], torch.tanh, [True]),
             ("a.sum(dim=0)", [(3, 4)], lambda a: a.sum(dim=0), [True]),
             ("F.softmax(a, dim=-1)", [(2, 5)], lambda a: F.softmax(a, dim=-1), [True]),
             ("a.max(dim=1)", [(3, 4)], lambda a: a.max(dim=1), [True]),
             ("a > b", [(3, 4), (3, 4)], lambda a, b: a > b, [True, True]),
             ("a.argmax()", [(3, 4)], lambda a: a.argmax(), [True]),
             ("a.sum().item()", [(3, 4)], lambda a: a.sum().item(), [True]),
             ("a[torch.tensor([2, 0])]", [(3, 4)], lambda a: a[torch.tensor([2, 0])], [True]),
             ("torch.cat([a, b])", [(2, 3), (1, 3)], lambda a, b: torch.cat([a, b]), [True, True]),
             ("a.to(torch.float64)", [(2, 2)], lambda a: a.to(torch.float64), [True])]
    for label, shapes, fn, scaled in cases:
        _run_case(ScaledTensor, g, label, shapes, fn, dtype=torch.float32, scaled=scaled)


def _autograd_case(ScaledTensor, g, label, shapes, kinds, program):
    """Run program on leaves (kind 's': ScaledTensor, 'd': plain tensor, both requiring grad) and on
    dense leaves; compare the output and the gradient of every leaf."""
    import torch

    leaves, dense_leaves = [], []
    for shape, kind in zip(shapes, kinds):
        inner = torch.randn(shape, generator=g, dtype=torch.float64)
        s = _scale(g) if kind == "s" else 1.0
        dense_leaves.append((inner * s).requires_grad_())
        leaf = _make(ScaledTensor, inner, s) if kind == "s" else inner * s
        with torch._C.DisableTorchFunctionSubclass():     # the leaf itself, whatever the class says
            leaf.requires_grad_()
        leaves.append(leaf)
    where = f"{label} with leaves " + ", ".join(_describe(x) for x in leaves)
    want = program(*dense_leaves)
    out = program(*leaves)
    _match(ScaledTensor, out, want, where)
    with torch._C.DisableTorchFunctionSubclass():
        recorded = out.requires_grad and out.grad_fn is not None
    if not recorded:
        raise CheckFailure(
            f"{where}: the result does not require grad although its leaves do, so autograd recorded nothing. "
            "__torch_dispatch__ runs below autograd: autograd records the graph on the ScaledTensors themselves "
            "as long as ScaledTensors flow out of your ops; do not unwrap in __torch_function__ or detach.")
    v = torch.randn(want.shape, generator=g, dtype=want.dtype)
    wants = torch.autograd.grad(want, dense_leaves, v, allow_unused=True)
    gots = torch.autograd.grad(out, leaves, v, allow_unused=True)
    for k, (mine, ref, leaf) in enumerate(zip(gots, wants, leaves)):
        name = f"the gradient of leaf {k} ({_describe(leaf)})"
        if ref is None:
            continue
        if mine is None:
            raise CheckFailure(f"{where}: {name} is None; dense autograd gives a gradient.")
        value = _dense(ScaledTensor, mine, f"{where}: {name}")
        rtol, atol = _tolerance(ref)
        if value.shape != ref.shape:
            raise CheckFailure(f"{where}: {name} has shape {tuple(value.shape)}; dense autograd's has "
                               f"{tuple(ref.shape)}.")
        if not torch.allclose(value.detach(), ref, rtol=rtol, atol=atol):
            i, got, want, note = mismatch(value, ref)
            raise CheckFailure(
                f"{where}: element {i} of {name} is {got} (as inner * scale); dense autograd gives {want}{note} "
                "The backward pass runs aten ops on "
                "ScaledTensors too (the incoming gradient is one): check the rules those ops hit in your "
                "__torch_dispatch__ (mm and bmm, views, in-place).")


_PROGRAMS = [
    ("((a @ w).tanh() * a.sum(-1, keepdim=True)).sum()", [(3, 4), (4, 2)], "sd",
     lambda a, w: ((a @ w).tanh() * a.sum(-1, keepdim=True)).sum()),
    ("(a * b).sum(0).pow(2).mean()", [(3, 4), (3, 4)], "ss", lambda a, b: (a * b).sum(0).pow(2).mean()),
    ("(a.t() @ a).sum()", [(3, 2)], "s", lambda a: (a.t() @ a).sum()),
    ("softmax(a, -1)[:, 1:].sum()", [(2, 5)], "s", lambda a: a.softmax(-1)[:, 1:].sum()),
    ("(0.1 * torch.bmm(a, b)).exp().mean()", [(2, 3, 2), (2, 2, 3)], "ss", lambda a, b: a.bmm(b).mul(0.1).exp().mean()),
]


@check(EXERCISE)
def autograd_flows(ScaledTensor, ctx):
    """gradients flow through ScaledTensor leaves and match dense autograd"""
    _validate_class(ScaledTensor)
    g = ctx.generator(64)
    for label, shapes, kinds, program in _PROGRAMS:
        _autograd_case(ScaledTensor, g, label, shapes, kinds, program)


@check(EXERCISE)
def matmul_multiplies_scales(ScaledTensor, ctx):
    """mm and bmm of two ScaledTensors multiply the inners and the scales; mixed matmuls match"""
    import torch

    _validate_class(ScaledTensor)
    g = ctx.generator(62)
    for label, sa, sb, fn in (("torch.mm(a, b)", (3, 4), (4, 2), torch.mm),
                              ("torch.bmm(a, b)", (2, 3, 4), (2, 4, 5), torch.bmm),
                              ("a @ b", (4, 3), (3, 3), lambda a, b: a @ b)):
        A, B = torch.randn(sa, generator=g, dtype=torch.float64), torch.randn(sb, generator=g, dtype=torch.float64)
        s1, s2 = _scale(g), _scale(g)
        out = fn(_make(ScaledTensor, A, s1), _make(ScaledTensor, B, s2))
        where = f"{label} for ScaledTensors of shapes {sa} (scale {s1}) and {sb} (scale {s2})"
        _match(ScaledTensor, out, fn(A * s1, B * s2), where)
        inner, scale = _parts(ScaledTensor, out, where)
        if abs(scale - s1 * s2) > 1e-9 * abs(s1 * s2) or not torch.allclose(
                _dense(ScaledTensor, inner, f"the .inner of {where}"), fn(A, B)):
            raise CheckFailure(
                f"{where}: the result has scale {scale!r}; expected inner = a.inner @ b.inner and scale = "
                f"a.scale * b.scale = {s1 * s2!r}. Handle aten.mm and aten.bmm on two ScaledTensors without "
                "forming the dense values: (s_a A) @ (s_b B) = (s_a s_b) (A @ B).")
    _run_case(ScaledTensor, g, "a @ w (w a plain tensor)", [(3, 4), (4, 2)], lambda a, w: a @ w, scaled=[True, False])
    _run_case(ScaledTensor, g, "w @ a (w a plain tensor)", [(2, 3), (3, 4)], lambda w, a: w @ a, scaled=[False, True])


@check(EXERCISE)
def views_and_inplace(ScaledTensor, ctx):
    """views keep the scale and alias the original; in-place ops update the value and return self"""
    import torch

    _validate_class(ScaledTensor)
    g = ctx.generator(63)
    for label, view in (("a.t()", lambda a: a.t()), ("a[1:]", lambda a: a[1:]), ("a.view(-1)", lambda a: a.view(-1)),
                        ("a.unsqueeze(0)", lambda a: a.unsqueeze(0)), ("a.select(1, 2)", lambda a: a.select(1, 2))):
        inner = torch.randn(3, 4, generator=g, dtype=torch.float64)
        s = _scale(g)
        a = _make(ScaledTensor, inner, s)
        v = view(a)
        where = f"{label} of a ScaledTensor of shape (3, 4), scale {s}"
        _match(ScaledTensor, v, view(inner * s), where)
        v_inner, v_scale = _parts(ScaledTensor, v, where)
        plain_tensor(v_inner, f"the .inner of {where}")
        shares = v_inner.untyped_storage().data_ptr() == inner.untyped_storage().data_ptr()
        if v_scale != s or not shares:
            raise CheckFailure(
                f"{where}: the view has scale {v_scale} and "
                f"{'shares' if shares else 'does not share'}"
                " the original's inner storage. A view op (func.is_view) must apply func to inner and keep the "
                "scale, so that the result aliases the original like a view of a dense tensor does.")
        dense = inner * s
        view(dense).mul_(-2.0)
        view(a).mul_(-2.0)
        _match(ScaledTensor, a, dense, f"after {label}.mul_(-2.0), the original")
    for label, fn in (("a.add_(b)", lambda a, b: a.add_(b)), ("a.mul_(b)", lambda a, b: a.mul_(b)),
                      ("a[0] = b[1]", lambda a, b: a.__setitem__(0, b[1]))):
        A, B = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)
        s1, s2 = _scale(g), _scale(g)
        dense, dense_b = A * s1, B * s2
        a, b = _make(ScaledTensor, A, s1), _make(ScaledTensor, B, s2)
        out = fn(a, b)
        fn(dense, dense_b)
        _match(ScaledTensor, a, dense, f"after {label}, a")
        if label != "a[0] = b[1]" and out is not a:
            raise CheckFailure(f"{label} returned a new object; in-place ops return their first argument "
                               "(return args[0] from __torch_dispatch__ after writing into its inner).")


@check(EXERCISE, hidden=True)
def random_sweep(ScaledTensor, ctx):
    """a seeded sweep of random ops and shapes (pointwise, matmul, reductions, views, indexing, in-place) matches"""
    import torch

    _validate_class(ScaledTensor)
    g = ctx.generator(65)
    families = [_pointwise, _reductions, _matmuls, _views, _indexing, _inplace, _structure]
    for i in range(70):
        label, shapes, fn = families[i % len(families)](g)
        dtype = torch.float32 if _ri(g, 0, 3) == 0 else torch.float64
        _run_case(ScaledTensor, g, f"sweep case {i}: {label}", shapes, fn, dtype=dtype)


@check(EXERCISE, hidden=True)
def random_autograd(ScaledTensor, ctx):
    """gradients match dense autograd on random differentiable programs, in-place and views included"""
    import torch

    _validate_class(ScaledTensor)
    g = ctx.generator(66)
    steps = [("tanh", lambda h, w: h.tanh()), ("* 0.7", lambda h, w: h * 0.7), ("sin", lambda h, w: h.sin()),
             ("@ w", lambda h, w: h @ w), ("+ h.t() @ h[:, :1]", lambda h, w: h + (h.t() @ h[:, :1]).t()[:, :1]),
             ("softmax", lambda h, w: h.softmax(-1)), ("[1:] padded", lambda h, w: torch.cat([h[1:], h[:1] * 2])),
             ("pow 2", lambda h, w: h.pow(2)), ("exp(-h^2)", lambda h, w: torch.exp(-h * h))]
    for case in range(6):
        n = _ri(g, 2, 4)
        chosen = [_pick(g, steps) for _ in range(_ri(g, 2, 5))]

        def program(a, w, chosen=chosen):
            h = a
            for _, step in chosen:
                h = step(h, w)
            return h.sum()

        label = "a -> " + " -> ".join(name for name, _ in chosen) + " -> sum"
        kinds = _pick(g, ["sd", "ss"])
        _autograd_case(ScaledTensor, g, f"random program {case}: {label}", [(n, n), (n, n)], kinds, program)

    def inplace_on_nonleaf(a, b):
        h = a * 1.0
        h[0] = b[1]
        h.mul_(2.0)
        h.t()[1:].add_(b.t()[1:])
        return (h * a).sum()

    _autograd_case(ScaledTensor, g, "h = a * 1; h[0] = b[1]; h.mul_(2); h.t()[1:].add_(b.t()[1:]); (h * a).sum()",
                   [(3, 3), (3, 3)], "ss", inplace_on_nonleaf)
