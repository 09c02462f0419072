"""dispatcher.functionalize: plausible wrong functionalize(fn) answers fail, called directly
through run_checks. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map_only

from grader.checks import run_checks
from labs.dispatcher.checks import functionalize as checks
from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import lying

EX = "dispatcher.functionalize"
aten = torch.ops.aten


def _functionalize(*, write_back="mutated", views="track", regenerate=True, contiguous=True,
                   mode=True, wrap=lambda t: t):
    """functionalize built like the reference, with one part replaced by a plausible mistake."""

    class Storage:
        def __init__(self, value):
            self.value = value.contiguous() if contiguous else value
            self.generation, self.written = 0, False

    class Functional(torch.Tensor):
        @staticmethod
        def __new__(cls, storage, meta):
            return torch.Tensor._make_wrapper_subclass(
                cls, meta.shape, strides=meta.stride(), storage_offset=meta.storage_offset(),
                dtype=meta.dtype, device=storage.value.device)

        def __init__(self, storage, meta):
            self.storage, self.meta, self.value, self.generation = storage, meta, None, -1
            self.whole = (meta.shape == storage.value.shape and meta.is_contiguous()
                          and meta.storage_offset() == 0)

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return NotImplemented

        @classmethod
        def fresh(cls, value):
            return cls(Storage(value), torch.empty(value.shape, dtype=value.dtype, device="meta"))

        def read(self):
            s, m = self.storage, self.meta
            stale = self.generation != s.generation if regenerate else self.value is None
            if stale:
                self.value = s.value if self.whole else aten.as_strided_copy(
                    s.value, m.shape, m.stride(), m.storage_offset())
                self.generation = s.generation
            return self.value

        def write(self, new):
            s, m = self.storage, self.meta
            new = new if new.dtype == self.dtype else new.to(self.dtype)
            s.value = new.contiguous() if self.whole else aten.as_strided_scatter(
                s.value, new, m.shape, m.stride(), m.storage_offset())
            s.generation, s.written = s.generation + 1, True
            self.value, self.generation = (new, s.generation) if not regenerate else (None, -1)

    def handle(func, args, kwargs, inputs):
        kwargs = kwargs or {}
        schema = func._schema
        if schema.is_mutable:
            twin = getattr(getattr(aten, schema.name.split("::")[1][:-1]), func._overloadname)
            values = tree_map_only(Functional, Functional.read, (args, kwargs))
            args[0].write(twin(*values[0], **values[1]))
            if write_back == "each write":
                for a, w in inputs:
                    if w.storage is args[0].storage:
                        a.copy_(w.storage.value)
            return args[0]
        if any(r.alias_info is not None for r in schema.returns):
            base = args[0] if isinstance(args[0], Functional) else Functional.fresh(args[0])
            if views == "track":
                metas = func(base.meta, *args[1:], **kwargs)
                return tree_map_only(torch.Tensor, lambda m: Functional(base.storage, m), metas)
            if views == "alias":      # the view of the value itself: it aliases below
                out = func(base.read(), *args[1:], **kwargs)
            else:                     # views == "copy": a fresh copy, cut off from its base
                name, overload = schema.name.split("::")[1], func._overloadname
                out = getattr(getattr(aten, name + "_copy"), overload)(base.read(), *args[1:],
                                                                        **kwargs)
            return tree_map_only(torch.Tensor, Functional.fresh, out)
        values = tree_map_only(Functional, Functional.read, (args, kwargs))
        return tree_map_only(torch.Tensor, Functional.fresh, func(*values[0], **values[1]))

    class Mode(TorchDispatchMode):
        def __init__(self, inputs):
            super().__init__()
            self.inputs = inputs

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return handle(func, args, kwargs, self.inputs)

    if not mode:     # the wrapper's own __torch_dispatch__ does the work
        Functional.__torch_dispatch__ = classmethod(
            lambda cls, func, types, args=(), kwargs=None: handle(func, args, kwargs, []))

    def functionalize(fn):
        def g(*args):
            wrapped = [Functional.fresh(a) for a in args]
            if mode:
                with Mode(list(zip(args, wrapped))):
                    out = fn(*wrapped)
            else:
                out = fn(*wrapped)
            for a, w in zip(args, wrapped):
                if write_back == "mutated" and w.storage.written or write_back == "all":
                    a.copy_(w.storage.value)
            return tree_map_only(Functional, lambda t: wrap(t.read()), out)
        return g

    return functionalize


# ------------------------------------------------------------------ the reference
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed):
    v = run_checks(EX, load_answer(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message


def test_built_like_the_reference_passes():
    v = run_checks(EX, _functionalize(), seed=3, hidden=True)
    assert v.status == "passed", v.message


def test_the_oracle_is_eager_because_torchs_pass_aliases_a_copy_of_a_transpose():
    """Why the checks compare with eager fn, not torch.func.functionalize: on 2.13, under
    remove="mutations_and_views", `x.t().contiguous()` aliases x, so torch's pass writes into an
    argument that eager leaves alone; the hidden programs include this one."""
    source = next(s for s, _ in checks._HIDDEN if ".contiguous()" in s)
    fn = checks._compile(source)
    x = torch.randn(3, 4)
    eager, functional = x.clone(), x.clone()
    fn(eager)
    torch.func.functionalize(fn, remove="mutations_and_views")(functional)
    assert torch.equal(eager, x) and not torch.equal(functional, x)


# ------------------------------------------------------------------ plausible wrong answers
def test_eager_passthrough_names_the_inplace_op():
    assert_rejected(EX, lambda fn: fn, "aten.add_.Tensor ran below your mode: it writes into")


def test_no_write_back_to_inputs():
    assert_rejected(EX, _functionalize(write_back="none"),
                    "argument x after g returned is")


def test_views_cut_off_from_their_base():
    assert_rejected(EX, _functionalize(views="copy"),
                    "A write through a view must show in its base and in every other view")


def test_views_that_alias_below():
    assert_rejected(EX, _functionalize(views="alias"), "returns a view of its input")


def test_stale_views_after_a_write_to_the_base():
    v = assert_rejected(EX, _functionalize(regenerate=False),
                        "including views taken before the write")
    assert "fn(x):\n    y = x.clone()\n    row, col" in v.message


def test_input_layout_taken_for_the_base_layout():
    """Views described against a contiguous layout, applied to a non-contiguous input as it is."""
    assert_rejected(EX, _functionalize(contiguous=False), "not contiguous (a transpose)")


def test_writes_back_every_input():
    assert_rejected(EX, _functionalize(write_back="all"),
                    "copy_ into argument b ran 1 time(s); fn never writes into b")


def test_writes_back_at_every_mutation():
    assert_rejected(EX, _functionalize(write_back="each write"), "ran 2 time(s)")


def test_torch_func_functionalize_is_refused():
    def functionalize(fn):
        return torch.func.functionalize(fn, remove="mutations_and_views")
    assert_rejected(EX, functionalize,
                    "torch.func.functionalize is PyTorch's own functionalization")


def test_functional_tensor_mode_is_refused():
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    def functionalize(fn):
        def g(*args):
            with FunctionalTensorMode():
                out = fn(*[FunctionalTensor.to_functional(a) for a in args])
            return tree_map_only(FunctionalTensor, torch._from_functional_tensor, out)
        return g
    assert_rejected(EX, functionalize, "FunctionalTensorMode is PyTorch's own functionalization")


def test_raw_functional_tensors_are_refused():
    def functionalize(fn):
        def g(*args):
            wrapped = [torch._to_functional_tensor(a) for a in args]
            torch._enable_functionalization(reapply_views=False)
            try:
                out = fn(*wrapped)
            finally:
                torch._disable_functionalization()
            return tree_map_only(torch.Tensor, torch._from_functional_tensor, out)
        return g
    assert_rejected(EX, functionalize, "torch._to_functional_tensor is PyTorch's own")


def test_computed_out_of_sight():
    """Runs fn eagerly on clones with the modes disabled, then copies the results back."""
    def functionalize(fn):
        def g(*args):
            with _disable_current_modes():
                clones = [a.clone() for a in args]
                out = fn(*clones)
            for a, c in zip(args, clones):
                a.copy_(c)
            return tree_map_only(torch.Tensor, torch.clone, out)
        return g
    assert_rejected(EX, functionalize, "computed out of sight")


def test_subclass_without_a_mode_misses_factories():
    """All the work in the wrapper's own __torch_dispatch__, no mode: a tensor that a factory
    makes inside fn (torch.zeros) stays plain, so its views and in-place ops run below as they
    are. The public programs make theirs with zeros_like from a wrapper, which works."""
    answer = _functionalize(mode=False)
    assert run_checks(EX, answer, seed=0, hidden=False).status == "passed"
    assert_rejected(EX, answer, "ran below your mode and returns a view of its input")


def test_lying_outputs_are_refused():
    assert_rejected(EX, _functionalize(wrap=lying), "has type LyingTensor, a subclass of Tensor")


def test_functionalize_key_switched_on_by_hand_is_refused():
    """The C++ pass driven through a reference taken before the check switched it off."""
    to_functional = torch._to_functional_tensor

    def functionalize(fn):
        def g(*args):
            wrapped = [to_functional(a) for a in args]
            torch._enable_functionalization(reapply_views=False)
            try:
                out = fn(*wrapped)
            finally:
                torch._disable_functionalization()
            for a, w in zip(args, wrapped):
                torch._functionalize_sync(w)
                a.copy_(torch._from_functional_tensor(w))
            return tree_map_only(torch.Tensor, torch._from_functional_tensor, out)
        return g
    assert_rejected(EX, functionalize,
                    "ran with the Functionalize key on: that key is PyTorch's own")
