"""dispatcher.privateuse1: plausible wrong toy backends fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py; this file
also checks that the checks leave the process as they found it (no accelerator, no device module)."""
import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected, load_answer

EX = "dispatcher.privateuse1"


# ------------------------------------------------------------------ plausible wrong answers
def _backend(*, empty="right", copy="right", add="right", alpha=True, promote=True, scalars=True,
             register=("empty.memory_format", "empty_strided", "_copy_from", "add.Tensor"), own_library=False,
             name=None):
    """A register_backend like the reference, with one part replaced by a plausible mistake. ``name``:
    the backend's name as a fixed string instead of asking torch when the kernels are registered."""

    def register_backend(lib):
        backend = torch._C._get_privateuse1_backend_name() if name is None else name

        def on_device(v):
            return isinstance(v, torch.Tensor) and v.device.type == backend

        def wrap(cpu, shape=None):
            t = torch._C._acc.create_empty_tensor(tuple(cpu.shape if shape is None else shape), cpu.dtype)
            t.cpu_data = cpu
            return t

        def cpu_value(v):
            return v.cpu_data if on_device(v) else v

        def empty_kernel(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
            return wrap(torch.zeros(size, dtype=dtype) if empty == "zeros" else torch.empty(size, dtype=dtype))

        def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
            return empty_kernel(size, dtype=dtype)

        def copy_from(src, dst, non_blocking=False):
            if copy == "alias" and on_device(dst) and not on_device(src):
                dst.cpu_data = src                       # keeps a reference to the CPU tensor
            elif copy == "new_tensor" and on_device(dst):
                return wrap(cpu_value(src).clone())      # a new device tensor; dst is never written
            elif copy == "to_cpu_only":
                dst.copy_(cpu_value(src))                # forgets that dst may be the device tensor
            else:
                (dst.cpu_data if on_device(dst) else dst).copy_(cpu_value(src))
            return dst

        def add_kernel(a, b, alpha_=1):
            A, B = cpu_value(a), cpu_value(b)
            if not scalars and not isinstance(b, torch.Tensor):
                raise TypeError("expected a tensor")
            out = torch.add(A, B, alpha=alpha_ if alpha else 1)
            if not promote:
                out = out.to(A.dtype)
            if add == "first_shape":                     # sizes the result like the first operand
                return wrap(out, shape=A.shape)
            return wrap(out)

        def add_entry(a, b, alpha=1):
            return add_kernel(a, b, alpha)

        kernels = {"empty.memory_format": empty_kernel, "empty_strided": empty_strided,
                   "_copy_from": copy_from, "add.Tensor": add_entry}
        target = torch.library.Library("aten", "IMPL") if own_library else lib
        if own_library:
            _LEAKED.append(target)
        for op in register:
            target.impl(op, kernels[op], "PrivateUse1")

    return register_backend


_LEAKED = []


def _fake_device_tensor(lib):
    """Registers nothing useful: kernels return CPU tensors instead of device tensors."""
    lib.impl("empty.memory_format",
             lambda size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None:
             torch.empty(size, dtype=dtype), "PrivateUse1")


WRONG = {
    ".to() keeps an alias of the CPU tensor": (_backend(copy="alias"), "the device tensor shares memory with a CPU tensor"),
    "_copy_from makes a new tensor, device data stays zeros": (_backend(copy="new_tensor", empty="zeros"),
                                                              "element"),
    "_copy_from only handles copies to CPU": (_backend(copy="to_cpu_only"), "endlessly"),
    "add ignores broadcasting (result sized like a)": (_backend(add="first_shape"), "shape"),
    "add ignores alpha": (_backend(alpha=False), "alpha"),
    "add keeps the first operand's dtype": (_backend(promote=False), "promotion"),
    "add rejects Python numbers": (_backend(scalars=False), "Python number"),
    "no empty_strided kernel": (_backend(register=("empty.memory_format", "_copy_from", "add.Tensor")),
                                "empty_strided"),
    "no add kernel": (_backend(register=("empty.memory_format", "empty_strided", "_copy_from")), "add.Tensor"),
    "registers on a Library of its own": (_backend(own_library=True), "registered nothing"),
    "empty returns a CPU tensor": (_fake_device_tensor, "not on the"),
    # the name this process's PrivateUse1 has, typed in (as "toy" was when the notebook renamed it)
    "hard-codes the backend's name": (_backend(name="privateuseone"), "depend on the backend's name"),
    # read once, when the cell ran (as the notebook's BACKEND global is), not when the kernels run
    "the name read before the checks run": (_backend(name=torch._C._get_privateuse1_backend_name()),
                                            "depend on the backend's name"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name):
    answer, phrase = WRONG[name]
    v = run_checks(EX, answer, seed=0, hidden=True)
    while _LEAKED:
        _LEAKED.pop()._destroy()
    assert v.status in ("failed", "error"), (name, v.message)
    assert phrase in v.message, (name, v.message)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed):
    v = run_checks(EX, load_answer(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"  # renamed only in the child


def test_a_process_that_renamed_the_backend_is_told_why_the_check_cannot_run(monkeypatch):
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "toy")
    from grader.checks import CheckContext, CheckFailure, LocalAnswer
    from labs.dispatcher.checks.privateuse1 import renamed_backend

    with pytest.raises(CheckFailure, match="rename_privateuse1_backend call"):
        renamed_backend(LocalAnswer(load_answer(EX), EX), CheckContext())


def test_checks_leave_no_backend_behind(reference):
    """After the checks, PrivateUse1 is not the accelerator and has no device module or kernels."""
    name = torch._C._get_privateuse1_backend_name()
    had_module = hasattr(torch, name)
    v = run_checks(EX, reference(EX), seed=0, hidden=True)
    assert v.status == "passed", v.message
    assert hasattr(torch, name) == had_module
    if name == "privateuseone":
        assert torch._C._get_accelerator().type == "cpu"
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", "PrivateUse1")


# ------------------------------------------------------------------ lying answers
class _ClaimsDevice(torch.Tensor):
    """A CPU tensor whose __torch_function__ says it is on the PrivateUse1 device."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.device.__get__:
            return torch.device(torch._C._get_privateuse1_backend_name(), 0)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _cpu_backend_claiming_the_device(lib):
    """Keeps every "device" tensor a CPU tensor that claims to be on the device."""
    def claim(t):
        return t.as_subclass(_ClaimsDevice)

    def plain(v):
        return v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else v

    def copy_from(self, dst, non_blocking=False):
        with torch._C.DisableTorchFunctionSubclass():
            plain(dst).copy_(plain(self))
        return dst

    lib.impl("empty.memory_format", lambda size, dtype=None, layout=None, device=None, pin_memory=None,
             memory_format=None: claim(torch.empty(size, dtype=dtype)), "PrivateUse1")
    lib.impl("empty_strided", lambda size, stride, dtype=None, layout=None, device=None, pin_memory=None:
             claim(torch.empty(size, dtype=dtype)), "PrivateUse1")
    lib.impl("_copy_from", copy_from, "PrivateUse1")
    lib.impl("add.Tensor", lambda a, b, alpha=1: claim(torch.add(plain(a), plain(b), alpha=alpha)), "PrivateUse1")


def test_lying_answers_would_fool_a_naive_comparison():
    from labs.dispatcher.probes import backend_usable

    with backend_usable() as name:
        lib = torch.library.Library("aten", "IMPL")
        try:
            _cpu_backend_claiming_the_device(lib)
            t = torch.empty(2, 3, device=name)
            assert t.device.type == name and t.as_subclass(torch.Tensor).device.type == "cpu"
        finally:
            lib._destroy()


def test_lying_answers_are_refused_for_their_type():
    assert_rejected(EX, _cpu_backend_claiming_the_device, "subclass of Tensor")
