"""autograd.saved-tensor-hooks: plausible wrong answers fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import collections
import functools

import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected, load_answer

EX = "autograd.saved-tensor-hooks"


@functools.lru_cache(maxsize=1)
def _reference():
    return load_answer(EX)


# ------------------------------------------------------------------ plausible wrong answers
def never_restores_dtype(dtype=torch.bfloat16):
    """Packs in the small dtype but hands the small tensor back to backward."""
    return torch.autograd.graph.saved_tensors_hooks(
        lambda t: t.to(dtype) if t.is_floating_point() else t.detach(), lambda p: p)


def casts_integers_too(dtype=torch.bfloat16):
    """Compresses every saved tensor, indices included, and casts back on unpack."""
    return torch.autograd.graph.saved_tensors_hooks(
        lambda t: (t.to(dtype), t.dtype), lambda p: p[0].to(p[1]))


def compresses_nothing(dtype=torch.bfloat16):
    """A correct pair of hooks that does not compress."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda p: p)


def keeps_the_original_too(dtype=torch.bfloat16):
    """Stores the compressed copy AND the original (saves no memory)."""
    def pack(t):
        return (t.to(dtype), t.detach()) if t.is_floating_point() else (t.detach(), t.detach())
    return torch.autograd.graph.saved_tensors_hooks(pack, lambda p: p[1])


def recasts_narrow_floats(dtype=torch.bfloat16):
    """Casts every floating tensor, float16 ones included, to dtype."""
    def pack(t):
        return (t.to(dtype), t.dtype, t.device) if t.is_floating_point() else t.detach()

    def unpack(p):
        return p[0].to(device=p[2], dtype=p[1]) if isinstance(p, tuple) else p
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def returns_the_pair(dtype=torch.bfloat16):
    """Returns (pack, unpack) instead of a saved_tensors_hooks object."""
    return (lambda t: (t.to(dtype), t.dtype), lambda p: p[0].to(p[1]))


def forgets_the_device(dtype=torch.bfloat16):
    """Stores on the CPU and leaves it there (invisible on CPU runs, so it must not break them)."""
    def pack(t):
        return (t.to("cpu", dtype), t.dtype) if t.is_floating_point() and t.element_size() > 2 \
            else t.detach()

    def unpack(p):
        return p[0].to(p[1]) if isinstance(p, tuple) else p
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def keeps_the_saved_tensor_itself(dtype=torch.bfloat16):
    """Compresses right, but keeps the tensors it does not compress as `t`, not `t.detach()`: a
    node's own saved output then keeps that node, and the whole graph, alive."""
    def pack(t):
        if t.is_floating_point() and t.element_size() > dtype.itemsize:
            return (t.to(dtype), t.dtype, t.device)
        return t

    def unpack(p):
        return p[0].to(device=p[2], dtype=p[1]) if isinstance(p, tuple) else p
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class _Holder:
    """A plain object holding what was packed."""

    def __init__(self, t):
        self.t = t


def keeps_outputs_in_an_object(dtype=torch.bfloat16):
    """Compresses right, but wraps each uncompressed tensor itself in a plain object."""
    def pack(t):
        if t.is_floating_point() and t.element_size() > dtype.itemsize:
            return (t.to(dtype), t.dtype, t.device)
        return _Holder(t)

    def unpack(p):
        return p[0].to(device=p[2], dtype=p[1]) if isinstance(p, tuple) else p.t
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def detaches_only_non_leaves(dtype=torch.bfloat16):
    """Detaches what a node computed, but keeps leaves (parameters, inputs) as they are: no cycle,
    but the contract asks for no tensor that requires grad."""
    def pack(t):
        if t.is_floating_point() and t.element_size() > dtype.itemsize:
            return (t.to(dtype), t.dtype, t.device)
        return t if t.is_leaf else t.detach()

    def unpack(p):
        return p[0].to(device=p[2], dtype=p[1]) if isinstance(p, tuple) else p
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


@pytest.mark.parametrize("wrong", [never_restores_dtype, casts_integers_too, compresses_nothing,
                                   keeps_the_original_too, recasts_narrow_floats, returns_the_pair])
def test_wrong_answers_fail(wrong):
    assert_rejected(EX, wrong)


@pytest.mark.parametrize("wrong", [keeps_the_saved_tensor_itself, keeps_outputs_in_an_object])
def test_keeping_the_saved_tensor_itself_fails_as_a_leak(wrong):
    """It scored full marks once: the graph it keeps alive is now looked for."""
    v = assert_rejected(EX, wrong, "reference cycle")
    assert "dropped without backward is still alive" in v.message


def test_a_leak_is_real():
    """What the check looks for: with the tensor itself packed, a dropped graph survives gc."""
    import gc
    import weakref

    refs = []
    for answer in (keeps_the_saved_tensor_itself, _reference()):
        a = torch.randn(4, dtype=torch.float16, requires_grad=True)
        with answer(torch.bfloat16):
            y = a.exp()
        refs.append(weakref.ref(y))
        del y
        gc.collect()
    assert refs[0]() is not None and refs[1]() is None


def test_keeping_leaves_that_require_grad_is_refused():
    v = assert_rejected(EX, detaches_only_non_leaves, "holds a tensor that requires grad")
    assert v.message.startswith("hidden check")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed):
    v = run_checks(EX, _reference(), seed=seed, hidden=True)
    assert v.status == "passed", v.message


def test_a_cpu_only_answer_passes_on_cpu():
    # on a CPU run the device is never lost; the same checks on a CUDA run would catch it
    assert run_checks(EX, forgets_the_device, seed=0, hidden=True).status == "passed"


def test_integer_casting_is_only_caught_by_the_hidden_checks():
    assert run_checks(EX, casts_integers_too, seed=0, hidden=False).status == "passed"
    v = run_checks(EX, casts_integers_too, seed=0, hidden=True)
    assert v.status == "failed" and v.message.startswith("hidden check")


# ------------------------------------------------------------------ lying answers
class _Hiding(tuple):
    """A tuple that also keeps a `secret`, which iterating over it (and len) does not show."""

    def __new__(cls, items, secret):
        self = super().__new__(cls, items)
        self.secret = secret
        return self


def hides_the_original(dtype=torch.bfloat16):
    """Restores from the compressed copy (right gradients), but also keeps the original tensor in a
    tuple subclass whose iteration hides it: no memory is saved."""
    def pack(t):
        if t.is_floating_point() and t.element_size() > dtype.itemsize:
            return _Hiding((t.to(dtype), t.dtype, t.device), secret=t.detach())
        return t.detach()

    def unpack(p):
        return p[0].to(device=p[2], dtype=p[1]) if isinstance(p, tuple) else p
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def wide_copy_claiming_narrow(dtype=torch.bfloat16):
    """Keeps the float32 tensor itself, as a tensor subclass that claims to be of dtype `dtype`, and
    rounds on unpack so that the gradients look compressed."""
    class Claims(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func == torch.Tensor.dtype.__get__:
                return dtype
            return super().__torch_function__(func, types, args, kwargs or {})

    def pack(t):
        if t.is_floating_point() and t.element_size() > dtype.itemsize:
            return (t.detach().as_subclass(Claims), t.dtype)
        return t.detach()

    def unpack(p):
        return p[0].as_subclass(torch.Tensor).to(dtype).to(p[1]) if isinstance(p, tuple) else p
    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


LYING = {
    "keeps the original in a tuple subclass that hides it": (hides_the_original, "subclass of tuple"),
    "keeps the original as a tensor that claims the small dtype": (wide_copy_claiming_narrow,
                                                                   "subclass of Tensor"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    packed = hides_the_original().pack_hook(torch.randn(3))
    assert len(packed) == 3 and all(t.dtype != torch.float32 for t in packed if torch.is_tensor(t))
    assert packed.secret.dtype == torch.float32
    packed = wide_copy_claiming_narrow().pack_hook(torch.randn(3))
    assert packed[0].dtype == torch.bfloat16 and packed[0].as_subclass(torch.Tensor).dtype == torch.float32


@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase)


Packed = collections.namedtuple("Packed", "data dtype device")


class Box:
    """A plain object holding the packed tensor, as in the notebook's demo."""

    def __init__(self, data, dtype, device):
        self.data, self.dtype, self.device = data, dtype, device


def _hooks_packing_into(make):
    """The reference's hooks, with the compressed tensor packed by `make(data, dtype, device)`."""
    def compressed_saved_tensors(dtype=torch.bfloat16):
        def pack(t):
            if t.is_floating_point() and t.element_size() > dtype.itemsize:
                return make(t.to(dtype), t.dtype, t.device)
            return t.detach()

        def unpack(p):
            if isinstance(p, torch.Tensor):
                return p
            if isinstance(p, dict):
                return p["data"].to(device=p["device"], dtype=p["dtype"])
            return p.data.to(device=p.device, dtype=p.dtype)
        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
    return compressed_saved_tensors


class _OnCompressed(torch.autograd.graph.saved_tensors_hooks):
    """A subclass of saved_tensors_hooks, as save_on_cpu is: only __init__ is its own."""

    def __init__(self, dtype=torch.bfloat16):
        hooks = _hooks_packing_into(Packed)(dtype)
        super().__init__(hooks.pack_hook, hooks.unpack_hook)


@pytest.mark.parametrize("answer", [_hooks_packing_into(Packed), _hooks_packing_into(Box),
                                    _hooks_packing_into(lambda d, t, v: {"data": d, "dtype": t, "device": v}),
                                    _OnCompressed])
def test_honest_variants_of_the_packed_object_still_pass(answer):
    """Exact types are required of containers, but a namedtuple, a plain object, a dict and a
    subclass of saved_tensors_hooks that only adds __init__ are not refused."""
    v = run_checks(EX, answer, seed=0, hidden=True)
    assert v.status == "passed", v.message


class _RedefinesEnter(torch.autograd.graph.saved_tensors_hooks):
    """Hands the spy the reference's hooks, but pushes hooks of its own (which compress nothing)."""

    def __init__(self, dtype=torch.bfloat16):
        hooks = _hooks_packing_into(Packed)(dtype)
        super().__init__(hooks.pack_hook, hooks.unpack_hook)

    def __enter__(self):
        torch._C._autograd._push_saved_tensors_default_hooks(lambda t: t.detach(), lambda t: t)


def test_a_subclass_that_runs_other_hooks_than_it_shows_is_refused():
    assert_rejected(EX, _RedefinesEnter, "redefines __enter__")


class _MethodsAsHooks(torch.autograd.graph.saved_tensors_hooks):
    """A subclass whose hooks are its own methods, passed to saved_tensors_hooks.__init__."""

    def __init__(self, dtype=torch.bfloat16):
        self.dtype = dtype
        super().__init__(self.pack_hook, self.unpack_hook)

    def pack_hook(self, t):
        if t.is_floating_point() and t.element_size() > self.dtype.itemsize:
            return Packed(t.to(self.dtype), t.dtype, t.device)
        return t.detach()

    def unpack_hook(self, p):
        return p if isinstance(p, torch.Tensor) else p.data.to(device=p.device, dtype=p.dtype)


def test_a_subclass_with_its_hooks_as_methods_still_passes():
    v = run_checks(EX, _MethodsAsHooks, seed=0, hidden=True)
    assert v.status == "passed", v.message
