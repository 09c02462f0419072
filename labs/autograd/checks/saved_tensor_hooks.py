"""Checks of ``autograd.saved-tensor-hooks``: ``compressed_saved_tensors(dtype=torch.bfloat16)``
returns a ``torch.autograd.graph.saved_tensors_hooks`` whose pack hook stores wide floating-point
saved tensors as ``dtype`` and whose unpack hook restores their dtype and device.

The oracle is autograd itself: the same seeded model run with every wide floating saved tensor
rounded to ``dtype`` (and, to show that compression happened, run without hooks). What the pack
hook stores is inspected by wrapping the answer's own ``pack_hook`` / ``unpack_hook`` in a spy pair:
it must hold no tensor that requires grad, and a graph built under the hooks and dropped without
backward must be freed (a weak reference to its outputs dies), since a packed output of the node
that saves it would make a reference cycle that only backward breaks.
"""
from __future__ import annotations

import gc
import types
import weakref

import torch
import torch.nn as nn

from grader.checks import CheckFailure, check, exact, plain_tensor
from labs.autograd.checks._plain import DICTS, plain_namedtuple

EXERCISE = "autograd.saved-tensor-hooks"


# ---------------------------------------------------------------- helpers
# What a subclass of saved_tensors_hooks may not redefine: the checks run the hooks the object
# stores (pack_hook / unpack_hook, set by saved_tensors_hooks.__init__) through its own __enter__.
_FIXED = ("__enter__", "__exit__", "__getattribute__", "__getattr__", "__dict__")


def _data_descriptor(value) -> bool:
    """Whether a class attribute takes precedence over the instance's own (a property does; a
    method does not: the pack_hook that __init__ stores on the instance wins over it)."""
    return hasattr(type(value), "__set__") or hasattr(type(value), "__delete__")


def _hooks(answer, dtype):
    """Call the answer and insist on a saved_tensors_hooks object whose hooks are what it runs."""
    base = torch.autograd.graph.saved_tensors_hooks
    hooks = answer(dtype)
    if not isinstance(hooks, base):
        raise CheckFailure(
            f"compressed_saved_tensors({dtype}) returned {type(hooks).__name__}; return a "
            "torch.autograd.graph.saved_tensors_hooks(pack, unpack) object (or an instance of a "
            "subclass of it, as torch.autograd.graph.save_on_cpu is).")
    own = [k for k in type(hooks).__mro__ if k not in (base, object)]
    redefined = [name for name in _FIXED if any(name in vars(k) for k in own)] + [
        name for name in ("pack_hook", "unpack_hook")
        if any(name in vars(k) and _data_descriptor(vars(k)[name]) for k in own)]
    if redefined:
        raise CheckFailure(
            f"compressed_saved_tensors({dtype}) returned a {type(hooks).__name__}, a subclass of "
            f"saved_tensors_hooks that redefines {', '.join(redefined)}. Keep saved_tensors_hooks's own "
            "machinery: pass your two functions to its __init__ (super().__init__(pack, unpack)), as "
            "torch.autograd.graph.save_on_cpu does.")
    stored = object.__getattribute__(hooks, "__dict__")
    if not (callable(stored.get("pack_hook")) and callable(stored.get("unpack_hook"))):
        raise CheckFailure(
            f"compressed_saved_tensors({dtype}) returned a saved_tensors_hooks without its pack_hook and "
            "unpack_hook functions: construct it as saved_tensors_hooks(pack, unpack) (in a subclass, "
            "call super().__init__(pack, unpack)).")
    return hooks


def _narrow(original: torch.dtype, target: torch.dtype) -> bool:
    """Whether a tensor of dtype ``original`` must be stored as ``target``."""
    return original.is_floating_point and original.itemsize > target.itemsize


def _tensors_in(obj, where: str, depth: int = 0) -> list[torch.Tensor]:
    """The tensors held by a packed object (a tensor, tuples/lists/dicts, an object's attributes, a
    function's closure). Tensors must be plain, and containers exactly tuple, list or dict (or the
    standard library's OrderedDict, defaultdict, or a namedtuple that redefines none of tuple's
    dunders): a subclass could hide what it holds (__iter__, values()) or lie about a tensor's dtype
    (__torch_function__). ``where`` names the saved tensor, for the message."""
    what = f"{where}, {'what' if depth == 0 else 'an object inside what'} your pack hook returned"
    if isinstance(obj, torch.Tensor):
        return [plain_tensor(obj, what)]
    if depth > 4:
        return []
    if plain_namedtuple(obj):
        items = list(tuple.__iter__(obj))
    elif isinstance(obj, (tuple, list, dict)):
        exact(obj, (tuple, list) + DICTS, what)
        items = list(dict.values(obj)) if isinstance(obj, dict) else list(obj)
    elif isinstance(obj, types.FunctionType):
        items = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        attributes = exact(object.__getattribute__(obj, "__dict__"), dict,
                           f"{where}, the __dict__ of an object your pack hook returned")
        items = list(attributes.values())
    else:
        return []
    return [t for item in items for t in _tensors_in(item, where, depth + 1)]


def _filled(cell) -> bool:
    """Whether a closure cell holds a value."""
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _desc(t_dtype, shape) -> str:
    return f"a tensor of dtype {str(t_dtype).replace('torch.', '')} and shape {tuple(shape)}"


class _Spy:
    """A saved_tensors_hooks pair wrapping the answer's hooks, recording what was packed and
    what came back."""

    def __init__(self, hooks):
        self.pack_hook, self.unpack_hook = hooks.pack_hook, hooks.unpack_hook
        self.records: list[dict] = []

    def pack(self, t):
        packed = self.pack_hook(t)
        self.records.append({"dtype": t.dtype, "shape": tuple(t.shape), "device": t.device,
                             "value": t.detach().clone(), "packed": packed, "out": None})
        return len(self.records) - 1

    def unpack(self, i):
        rec = self.records[i]
        out = self.unpack_hook(rec["packed"])
        rec["out"] = out
        return out

    def context(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def verify(self, target: torch.dtype) -> None:
        """Every packed object holds the right representation; every unpack restored it."""
        if not self.records:
            raise CheckFailure("your hooks were never called: was the forward pass run inside "
                               "`with compressed_saved_tensors(): ...`?")
        eps = torch.finfo(target).eps
        for rec in self.records:
            what = _desc(rec["dtype"], rec["shape"])
            held = _tensors_in(rec["packed"], f"for {what}")
            if any(t.requires_grad for t in held):
                raise CheckFailure(
                    f"for {what}, your packed object holds a tensor that requires grad (the saved "
                    "tensor itself, or something computed from it with grad mode on). When a node "
                    f"saves its own output, that is a reference cycle: {_CYCLE}. Keep detached "
                    "tensors only (t.detach()).")
            if _narrow(rec["dtype"], target):
                small = [t for t in held if t.dtype == target and t.numel() == rec["value"].numel()]
                if not small:
                    raise CheckFailure(
                        f"for {what}, your pack hook stored no {target} tensor of the same number "
                        f"of elements; it should keep `t.to({target})` (plus whatever you need to "
                        "restore the original dtype and device).")
                wide = [t for t in held if t.dtype == rec["dtype"] and t.numel() == rec["value"].numel()]
                if wide:
                    raise CheckFailure(
                        f"for {what}, your packed object still holds a {rec['dtype']} copy of the "
                        "tensor, so nothing is saved: keep only the compressed copy.")
            else:
                same = [t for t in held if t.dtype == rec["dtype"] and tuple(t.shape) == rec["shape"]]
                if not same:
                    raise CheckFailure(
                        f"{what} was saved, and your pack hook did not keep it as it is: only "
                        f"floating-point tensors wider than {target} are to be compressed; store "
                        "integer, bool and already-narrow tensors unchanged (e.g. `t.detach()`).")
            out = rec["out"]
            if out is None:
                continue  # never unpacked (backward did not need it)
            if not isinstance(out, torch.Tensor):
                raise CheckFailure(f"for {what}, your unpack hook returned {type(out).__name__}, "
                                   "not a tensor.")
            plain_tensor(out, f"for {what}, the tensor your unpack hook returned")
            if out.dtype != rec["dtype"] or tuple(out.shape) != rec["shape"] or out.device != rec["device"]:
                raise CheckFailure(
                    f"{what} on {rec['device']} came back from your unpack hook as "
                    f"{_desc(out.dtype, out.shape)} on {out.device}; unpack must restore the "
                    "original dtype, shape and device.")
            if _narrow(rec["dtype"], target):
                torch.testing.assert_close(
                    out, rec["value"], rtol=eps, atol=1e-6,
                    msg=lambda m: f"for {what}, unpack(pack(t)) is further from t than one "
                                  f"rounding to {target}: {m}")
            elif not torch.equal(out, rec["value"]):
                raise CheckFailure(f"{what} came back from unpack with different values; tensors "
                                   "you do not compress must come back exactly.")


_CYCLE = ("output -> grad_fn -> SavedVariable -> your packed object -> output, which only a "
          "backward pass breaks (release_variables), so a graph dropped without backward is never "
          "freed")


def _grads(run, tensors):
    """Run ``run()`` (a forward returning a scalar loss) and backward; return the .grad's."""
    for t in tensors:
        t.grad = None
    loss = run()
    try:
        loss.backward()
    except RuntimeError as exc:
        raise CheckFailure(f"backward failed under your hooks with RuntimeError: {exc}\nThe tensor "
                           "your unpack hook returns must have the original dtype, shape and "
                           "device of the tensor that was packed.") from None
    missing = [i for i, t in enumerate(tensors) if t.grad is None]
    if missing:
        raise CheckFailure("with your hooks active, some leaf tensors got no .grad at all: the "
                           "tensor your unpack hook returns must be usable by backward.")
    return [plain_tensor(t.grad, "a .grad computed under your hooks (from what your unpack hook "
                         "returned)").clone() for t in tensors]


def _rounded(target):
    """The oracle's hooks: autograd with each wide floating saved tensor rounded to ``target``."""
    def pack(t):
        return (t.to(target), t.dtype) if _narrow(t.dtype, target) else (t.detach(), None)

    def unpack(packed):
        data, dtype = packed
        return data if dtype is None else data.to(dtype)
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def _under(hooks, forward):
    def run():
        with hooks:
            return forward()
    return run


def _compare(got, want, target, label):
    tol = torch.finfo(target).eps
    for i, (g, w) in enumerate(zip(got, want)):
        if g.dtype != w.dtype or g.shape != w.shape:
            raise CheckFailure(f"{label}: gradient {i} has dtype {g.dtype} / shape {tuple(g.shape)}, "
                               f"expected {w.dtype} / {tuple(w.shape)} as without hooks.")
        if not torch.isfinite(g).all():
            raise CheckFailure(f"{label}: gradient {i} has NaN or inf values.")
        err = ((g - w).norm() / w.norm().clamp_min(1e-12)).item()
        if err > tol:
            raise CheckFailure(
                f"{label}: gradient {i} differs by a relative error of {err:.3g} from autograd's "
                f"own gradient with the same saved tensors rounded once to {target}. Check that "
                "unpack returns the tensor that was packed, converted back to its original dtype.")


def _mlp(gen, dims, dtype, device):
    layers = []
    acts = [nn.Tanh, nn.GELU, nn.Sigmoid, nn.SiLU]
    for i in range(len(dims) - 1):
        with torch.random.fork_rng(devices=[]):   # nn.Linear's default init draws from the global RNG
            lin = nn.Linear(dims[i], dims[i + 1])
        with torch.no_grad():
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) / dims[i] ** 0.5)
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen) * 0.1)
        layers += [lin, acts[i % len(acts)]()]
    return nn.Sequential(*layers).to(device=device, dtype=dtype)


def _mlp_case(answer, gen, dims, batch, dtype, target, device, label):
    model = _mlp(gen, dims, dtype, device)
    x = torch.randn(batch, dims[0], generator=gen, dtype=dtype).to(device).requires_grad_()
    leaves = [x, *model.parameters()]
    forward = lambda: (model(x) ** 2).sum()  # noqa: E731
    want = _grads(_under(_rounded(target), forward), leaves)
    spy = _Spy(_hooks(answer, target))
    got = _grads(_under(spy.context(), forward), leaves)
    spy.verify(target)
    _compare(got, want, target, label)


# ---------------------------------------------------------------- public checks
@check(EXERCISE)
def gradients_close_to_uncompressed(answer, ctx):
    """gradients of a small MLP under your hooks stay within bfloat16 rounding of plain autograd"""
    gen = ctx.generator(0)
    model = _mlp(gen, [6, 8, 5], torch.float32, ctx.device)
    x = torch.randn(4, 6, generator=gen).to(ctx.device).requires_grad_()
    leaves = [x, *model.parameters()]
    forward = lambda: (model(x) ** 2).sum()  # noqa: E731
    plain = _grads(forward, leaves)
    want = _grads(_under(_rounded(torch.bfloat16), forward), leaves)
    got = _grads(_under(_hooks(answer, torch.bfloat16), forward), leaves)
    if all(torch.equal(g, w) for g, w in zip(got, plain)):
        raise CheckFailure("the gradients are bit-identical to the uncompressed run, so backward "
                           "used the original float32 values: the pack hook should keep only "
                           "`t.to(dtype)`, and unpack should rebuild the tensor from that copy.")
    _compare(got, want, torch.bfloat16, "small MLP, dtype=torch.bfloat16")


@check(EXERCISE)
def packs_narrow_and_restores(answer, ctx):
    """float32 saved tensors are packed as bfloat16 and come back with their dtype, shape and device"""
    _mlp_case(answer, ctx.generator(1), [5, 7, 3], 3, torch.float32, torch.bfloat16, ctx.device,
              "small MLP, dtype=torch.bfloat16")


@check(EXERCISE)
def dropped_graph_is_freed(answer, ctx):
    """a graph built under your hooks and dropped without backward is freed"""
    gen = ctx.generator(5)
    hooks = _hooks(answer, torch.bfloat16)
    a = torch.randn(6, generator=gen).to(device=ctx.device, dtype=torch.float16).requires_grad_()
    with hooks:                                   # float16 under bfloat16: nothing is compressed
        y = torch.exp(a * 0.5)                    # ExpBackward0 saves its own output, y
        z = torch.tanh(y)                         # TanhBackward0 saves its own output, z
        loss = (z * y).sum()
    alive = [weakref.ref(y), weakref.ref(z)]
    del y, z, loss
    if any(ref() is not None for ref in alive):
        gc.collect()                              # (slow: only when reference counts did not do)
    if any(ref() is not None for ref in alive):
        raise CheckFailure(
            "a graph of float16 ops (y = exp(a * 0.5), z = tanh(y), (z * y).sum()) built under your "
            "hooks with dtype=torch.bfloat16 and dropped without backward is still alive: what your "
            "pack hook keeps holds the saved tensor itself. exp and tanh save their own outputs, "
            f"so that makes a reference cycle {_CYCLE}. Keep a detached tensor (t.detach()).")


# ---------------------------------------------------------------- hidden checks
@check(EXERCISE, hidden=True)
def integer_saved_tensors_untouched(answer, ctx):
    """integer saved tensors (embedding indices, max indices, gather index) are kept exactly"""
    gen = ctx.generator(2)
    rows = 1000 + int(torch.randint(0, 500, (1,), generator=gen))
    with torch.random.fork_rng(devices=[]):
        emb = nn.Embedding(rows, 6)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(rows, 6, generator=gen))
    emb = emb.to(ctx.device)
    idx = torch.randint(0, rows, (9, 4), generator=gen).to(ctx.device)
    pick = torch.randint(0, 6, (9, 4, 1), generator=gen).to(ctx.device)
    w = torch.randn(6, generator=gen).to(ctx.device).requires_grad_()

    def forward():
        h = emb(idx) * w                          # EmbeddingBackward0 saves the int64 indices
        top, _ = h.max(dim=-1)                    # MaxBackward0 saves int64 indices
        g = h.gather(-1, pick).squeeze(-1)        # GatherBackward0 saves the int64 index
        return (top.sigmoid() * g).sum()
    leaves = [emb.weight, w]
    want = _grads(_under(_rounded(torch.bfloat16), forward), leaves)
    spy = _Spy(_hooks(answer, torch.bfloat16))

    got = _grads(_under(spy.context(), forward), leaves)
    if not any(not r["dtype"].is_floating_point for r in spy.records):
        raise CheckFailure("no integer tensor went through your pack hook, yet this model saves "
                           "int64 indices: is the forward run inside your context manager?")
    spy.verify(torch.bfloat16)
    _compare(got, want, torch.bfloat16, f"embedding({rows} rows) + max + gather")


@check(EXERCISE, hidden=True)
def other_dtypes_and_random_shapes(answer, ctx):
    """float16 target, float64 models and seeded random shapes; 16-bit tensors are not re-cast"""
    gen = ctx.generator(3)
    for trial, (dtype, target) in enumerate([(torch.float32, torch.float16),
                                             (torch.float64, torch.bfloat16),
                                             (torch.float64, torch.float16)]):
        depth = int(torch.randint(2, 5, (1,), generator=gen))
        dims = [int(d) for d in torch.randint(1, 12, (depth + 1,), generator=gen)]
        batch = int(torch.randint(1, 8, (1,), generator=gen))
        _mlp_case(answer, gen, dims, batch, dtype, target, ctx.device,
                  f"random MLP {dims}, batch {batch}, {dtype} model, dtype={target}")
    # a float16 tensor saved under a bfloat16 target is already 2 bytes wide: keep it as is
    a = torch.randn(5, 3, generator=gen).to(device=ctx.device, dtype=torch.float16).requires_grad_()
    b = torch.randn(5, 3, generator=gen).to(device=ctx.device, dtype=torch.float16).requires_grad_()
    spy = _Spy(_hooks(answer, torch.bfloat16))
    with spy.context():
        loss = (a * b).sum()
    loss.backward()
    spy.verify(torch.bfloat16)
    plain_tensor(a.grad, "a .grad computed under your hooks (from what your unpack hook returned)")
    torch.testing.assert_close(a.grad, b.detach(), rtol=0, atol=0,
                               msg="float16 tensors must come back exactly under a bfloat16 target")


@check(EXERCISE, hidden=True)
def parameters_saved_directly(answer, ctx):
    """a parameter saved directly (x @ W, F.linear) still gets its .grad, and x gets the right one"""
    gen = ctx.generator(4)
    n, k, m = (int(d) for d in torch.randint(2, 9, (3,), generator=gen))
    W = nn.Parameter(torch.randn(k, m, generator=gen).to(ctx.device))
    V = nn.Parameter(torch.randn(m, k, generator=gen).to(ctx.device))
    x = torch.randn(n, k, generator=gen).to(ctx.device).requires_grad_()
    forward = lambda: (torch.tanh(x @ W) @ V).pow(2).sum()  # noqa: E731  (mm saves W and V themselves)
    want = _grads(_under(_rounded(torch.bfloat16), forward), [x, W, V])
    spy = _Spy(_hooks(answer, torch.bfloat16))

    got = _grads(_under(spy.context(), forward), [x, W, V])
    spy.verify(torch.bfloat16)
    _compare(got, want, torch.bfloat16, f"x @ W with W a Parameter ({n}x{k} @ {k}x{m})")
