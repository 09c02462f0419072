"""The kernel's guard, in this process with the toy lab: seals, the snapshot that names what a
notebook replaced, and the threads and processes an answer leaves running."""
import builtins
import dataclasses
import functools
import gc
import subprocess
import threading
import time

import pytest
import torch

from grader import checks
from grader.kernel import guard, selfcheck


@pytest.fixture
def in_kernel(monkeypatch):
    """The toy lab as if its exercises were still judged in the kernel: the guard's case (it
    watches the checks of those exercises only)."""
    from grader import labs

    real = labs.load_lab

    def load_lab(lab_id):
        lab = real(lab_id)
        if lab_id != "toy":
            return lab
        return dataclasses.replace(lab, exercises=tuple(
            dataclasses.replace(e, judged_in_kernel=True) for e in lab.exercises))

    monkeypatch.setattr(labs, "load_lab", load_lab)


@pytest.fixture
def armed(tmp_path, monkeypatch, in_kernel):
    monkeypatch.chdir(tmp_path)
    (tmp_path / guard.KEY_FILE).write_bytes(b"k" * 32)
    guard.arm("toy")
    yield
    guard._STATE.clear()


def test_a_seal_holds_only_for_the_same_payload_and_key():
    payload = {"exercise": "toy.add", "status": "failed", "seed": 3}
    mark = guard.seal(payload, b"key")
    assert guard.sealed(payload | {"seal": mark}, b"key") == payload
    assert guard.sealed(payload | {"status": "passed", "seal": mark}, b"key") is None
    assert guard.sealed(payload | {"seal": mark}, b"other key") is None
    assert guard.sealed(payload, b"key") is None


def test_arm_takes_the_key_and_deletes_its_file(armed, tmp_path):
    assert guard.armed() and guard.key() == b"k" * 32
    assert not (tmp_path / guard.KEY_FILE).exists()


def test_arm_outside_a_grading_run_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="only in a grading kernel"):
        guard.arm("toy")


def test_nothing_touched_means_no_tampering(armed):
    assert guard.tampering("toy.add") == []


def test_tampering_pauses_the_collector_and_leaves_it_as_it_found_it(armed):
    collecting = []

    def entries(lab_id):  # what tampering() walks, noting whether the collector runs meanwhile
        collecting.append(gc.isenabled())
        return guard._entries(lab_id)

    try:
        assert guard.tampering("toy.add", _entries=entries) == [] and gc.isenabled()
        gc.disable()
        assert guard.tampering("toy.add", _entries=entries) == [] and not gc.isenabled()
    finally:
        gc.enable()
    assert collecting == [False, False]


@pytest.mark.parametrize("target, name", [
    (selfcheck, "run_checks"), (checks, "_blame"), (torch, "allclose"), (builtins, "divmod"),
    (torch.testing, "assert_close")])
def test_a_replaced_function_is_named(armed, monkeypatch, target, name):
    monkeypatch.setattr(target, name, lambda *a, **k: True)
    label = {selfcheck: "grader.kernel.selfcheck", checks: "grader.checks", builtins: "builtins"}.get(
        target, getattr(target, "__name__", ""))
    assert f"{label}.{name}" in guard.tampering("toy.add")


def test_a_lying_comparison_added_to_tensor_is_named(armed, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "__eq__", lambda self, other: True, raising=False)
    assert "torch.Tensor.__eq__" in guard.tampering("toy.add")


def test_replaced_registered_checks_are_named(armed, monkeypatch):
    monkeypatch.setitem(checks._REGISTRY, "toy.add", [])
    assert guard.tampering("toy.add") == ["the registered checks of toy.add"]


def test_a_hidden_check_defined_before_a_public_one_is_not_tampering(tmp_path, monkeypatch,
                                                                    in_kernel):
    # the snapshot keeps the registration order, which checks_for() (public first) does not
    monkeypatch.setitem(checks._REGISTRY, "toy.mul", list(checks._REGISTRY["toy.mul"]))
    checks.check("toy.mul", hidden=True)(lambda mul, ctx: None)
    checks.check("toy.mul")(lambda mul, ctx: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / guard.KEY_FILE).write_bytes(b"k" * 32)
    guard.arm("toy")
    try:
        assert guard.tampering("toy.mul") == []
    finally:
        guard._STATE.clear()


def test_a_wrapper_from_the_notebook_is_tampering_even_if_it_wraps_the_original(armed, monkeypatch):
    @functools.wraps(torch.allclose)
    def agreeable(*args, **kwargs):
        return True
    monkeypatch.setattr(torch, "allclose", agreeable)
    assert "torch.allclose" in guard.tampering("toy.add")


def test_threads_running_notebook_code_are_reported_once_library_threads_never(armed):
    stop = threading.Event()

    def spin():  # defined here, like a notebook's function
        stop.wait()

    mine = threading.Thread(target=spin, name="mine")
    timer = threading.Timer(60, lambda: None)
    sleeper = threading.Thread(target=time.sleep, args=(0.5,), name="sleeper")  # a builtin
    library = threading.Thread(target=threading.Event().wait, args=(0.5,), name="library")
    for t in (mine, timer, sleeper, library):
        t.start()
    try:
        threads, procs = guard.strays()
        assert sorted(threads) == sorted(["'mine'", "'sleeper'", f"'{timer.name}'"])
        assert procs == []
        assert guard.strays() == ([], [])
    finally:
        stop.set()
        timer.cancel()


def test_child_processes_are_reported_and_killed(armed):
    child = subprocess.Popen(["sleep", "3611"])
    _, procs = guard.strays()
    assert len(procs) == 1 and f"pid {child.pid}" in procs[0] and "sleep 3611" in procs[0]
    assert child.wait(timeout=5) < 0  # killed


@pytest.mark.parametrize("setting", ["set_default_dtype", "set_default_tensor_type"])
def test_torch_rebinding_its_own_names_under_another_default_dtype_is_not_tampering(
        armed, setting):
    if setting == "set_default_dtype":
        torch.set_default_dtype(torch.float64)
    else:
        with pytest.warns(UserWarning):
            torch.set_default_tensor_type(torch.DoubleTensor)
    try:
        assert "torch.Storage" in guard.tampering("toy.add")  # what torch itself rebinds...
        with checks.torch_defaults():
            assert guard.tampering("toy.add") == []  # ...is torch's own, under its defaults
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
