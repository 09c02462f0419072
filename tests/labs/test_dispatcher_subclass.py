"""dispatcher.subclass: plausible wrong ScaledTensor classes fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch
from torch.utils._pytree import tree_map_only

from grader.checks import run_checks
from tests.conftest import assert_rejected
from tests.labs._liars import LyingTensor, lying

EX = "dispatcher.subclass"
aten = torch.ops.aten


def _scaled_tensor(*, rewrap=True, matmul="right", views=True, write_back=True, wrap_all=False,
                   offset=True):
    """A ScaledTensor built like the reference, with one part replaced by a plausible mistake."""

    class ScaledTensor(torch.Tensor):
        @staticmethod
        def __new__(cls, inner, scale):
            return torch.Tensor._make_wrapper_subclass(
                cls, inner.shape, strides=inner.stride(),
                storage_offset=inner.storage_offset() if offset else 0,
                dtype=inner.dtype, device=inner.device, requires_grad=False)

        def __init__(self, inner, scale):
            self.inner = inner
            self.scale = float(scale)

        def __repr__(self):
            return f"ScaledTensor(scale={self.scale}, inner={self.inner!r})"

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (aten.mm.default, aten.bmm.default) and all(isinstance(t, cls) for t in args[:2]):
                a, b = args[:2]
                if matmul == "right":
                    return cls(func(a.inner, b.inner), a.scale * b.scale)
                if matmul == "twice":                 # dense product, then the scales again
                    return cls(func(a.inner * a.scale, b.inner * b.scale), a.scale * b.scale)
                if matmul == "one_scale":             # forgets the second operand's scale
                    return cls(func(a.inner, b.inner), a.scale)
            if views and func.is_view and isinstance(args[0], cls):
                a = args[0]
                rest, kw = tree_map_only(cls, lambda t: t.inner * t.scale, (args[1:], kwargs))
                out = func(a.inner, *rest, **kw)
                return tree_map_only(torch.Tensor, lambda o: cls(o, a.scale), out)
            dense_args, dense_kwargs = tree_map_only(cls, lambda t: t.inner * t.scale, (args, kwargs))
            out = func(*dense_args, **dense_kwargs)
            mutated = []
            for i, arg in enumerate(func._schema.arguments):
                if arg.alias_info is None or not arg.alias_info.is_write:
                    continue
                target, result = (args[i], dense_args[i]) if i < len(args) else (kwargs.get(arg.name),
                                                                                  dense_kwargs.get(arg.name))
                if isinstance(target, cls) and write_back:
                    target.inner.copy_(result / target.scale)
                mutated.append(target)
            if mutated and write_back:
                return mutated[0]
            if not rewrap:
                return out
            if wrap_all:
                return tree_map_only(torch.Tensor, lambda o: cls(o, 1.0), out)
            return tree_map_only(torch.Tensor, lambda o: cls(o, 1.0) if o.is_floating_point() else o, out)

    return ScaledTensor


class AboveAutograd(torch.Tensor):
    """Does the work in __torch_function__ on the dense values and wraps fresh, detached results:
    above autograd, so nothing is recorded for the ScaledTensor leaves."""

    @staticmethod
    def __new__(cls, inner, scale):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                   storage_offset=inner.storage_offset(),
                                                   dtype=inner.dtype, device=inner.device)

    def __init__(self, inner, scale):
        self.inner = inner
        self.scale = float(scale)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.requires_grad_ or getattr(func, "__name__", "") in ("__get__", "__set__"):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        dense_args, dense_kwargs = tree_map_only(cls, lambda t: t.inner * t.scale, (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*dense_args, **dense_kwargs)
        for a, d in zip(args, dense_args):           # in-place methods: write the result back
            if isinstance(a, cls) and isinstance(d, torch.Tensor):
                a.inner.copy_(d / a.scale)
        return tree_map_only(torch.Tensor, lambda o: cls(o.detach(), 1.0) if o.is_floating_point() else o, out)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        dense_args, dense_kwargs = tree_map_only(cls, lambda t: t.inner * t.scale, (args, kwargs or {}))
        out = func(*dense_args, **dense_kwargs)
        return tree_map_only(torch.Tensor, lambda o: cls(o, 1.0) if o.is_floating_point() else o, out)


class PlainSubclass(torch.Tensor):
    """Not a wrapper: a plain subclass holding the dense value, with no __torch_dispatch__."""

    def __new__(cls, inner, scale):
        t = (inner * scale).as_subclass(cls)
        t.inner, t.scale = inner, float(scale)
        return t


WRONG = {
    "forgets to rewrap outputs": (_scaled_tensor(rewrap=False), "as ScaledTensors"),
    "matmul applies the scales twice": (_scaled_tensor(matmul="twice"), "dense autograd gives"),
    "matmul keeps one scale": (_scaled_tensor(matmul="one_scale"), "on dense tensors gives"),
    "views copy instead of aliasing": (_scaled_tensor(views=False), "alias"),
    "in-place ops not written back": (_scaled_tensor(write_back=False), "after"),
    "bool and integer outputs wrapped too": (_scaled_tensor(wrap_all=True), "plain tensors"),
    "the wrapper without inner's storage offset": (
        _scaled_tensor(offset=False), "(1, 6), storage offset 8) has strides (1, 6) and storage "
                                      "offset 0: pass inner's strides and storage_offset"),
    "works above autograd (detaches)": (AboveAutograd, "does not require grad"),
    "not a wrapper subclass": (PlainSubclass, "__torch_dispatch__"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=0)



# ------------------------------------------------------------------ lying answers
_Reference = _scaled_tensor()


class InnerClaimsClose(_Reference):
    """Wraps every floating-point result around zeros held in a tensor subclass that claims to be close
    to anything, so that inner * scale "equals" whatever it is compared with."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func.is_view or func._schema.is_mutable:
            return out

        def liar(o):
            if type(o) is cls and not isinstance(o.inner, LyingTensor):
                return cls(lying(torch.zeros_like(o.inner)), o.scale)
            return o
        return tree_map_only(torch.Tensor, liar, out)


class ScaleClaimsAnything(_Reference):
    """mm / bmm forget the second scale, stored as a float subclass that claims to equal anything."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func in (aten.mm.default, aten.bmm.default) and all(type(t) is cls for t in args[:2]):
            out.scale = _AnyFloat(args[0].scale)
        return out


class _AnyFloat(float):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __sub__(self, other):
        return 0.0

    __hash__ = float.__hash__


LYING = {
    "results whose inner claims to be close": (InnerClaimsClose, "subclass of Tensor"),
    "a matmul scale that equals anything": (ScaleClaimsAnything, "subclass of float"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    a = InnerClaimsClose(torch.randn(2, 3), 2.0)
    out = a + 1
    naive_dense = out.inner * out.scale
    assert torch.allclose(naive_dense, a.inner * 2.0 + 1) and not out.inner.as_subclass(torch.Tensor).any()
    c, d = ScaleClaimsAnything(torch.randn(2, 3), 2.0), ScaleClaimsAnything(torch.randn(3, 2), 3.0)
    product = c @ d
    assert product.scale == 6.0 and abs(product.scale - 6.0) < 1e-9 and float(product.scale) == 2.0


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=0)


class IntScales(_Reference):
    """Honest: stores .scale as given, and its results of scale 1 carry the int 1."""

    def __init__(self, inner, scale):
        self.inner, self.scale = inner, scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)

        def int_scale(o):
            if type(o) is cls and o.scale == 1.0:
                o.scale = 1
            return o
        return tree_map_only(torch.Tensor, int_scale, out)


def test_honest_variants_still_pass():
    """Exact types are required, but an int scale (1 rather than 1.0) in results is not refused."""
    v = run_checks(EX, IntScales, seed=0, hidden=True)
    assert v.status == "passed", v.message
