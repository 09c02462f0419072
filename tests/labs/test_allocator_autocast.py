"""allocator.autocast: plausible wrong MiniAutocast classes fail, called directly through
run_checks. Each is the reference answer with one rule changed. The reference and the stub are
tested for every exercise in test_exercise_contract.py."""
import pytest
import torch

from tests.conftest import assert_rejected, load_answer

EX = "allocator.autocast"


@pytest.fixture(scope="module")
def Ref():
    return load_answer(EX)


def _eligible(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def test_casting_without_a_cache_fails(Ref):
    class NoCache(Ref):
        def cast(self, value, dtype):
            return value.to(dtype) if _eligible(value) and value.dtype != dtype else value

    assert_rejected(EX, NoCache, "your casts, counted after each call: [7, 14]; "
                                 "torch.autocast's: [7, 11]")


def test_clearing_the_cache_when_any_region_ends_fails(Ref):
    class ClearsEachExit(Ref):
        def __exit__(self, *exc):
            super().__exit__(*exc)
            Ref.cache.clear()

    v = assert_rejected(EX, ClearsEachExit, "only when the outermost region ends")
    assert "a region nested in another" in v.message, v.message


def test_a_cache_keyed_by_storage_fails(Ref):
    """Keyed by data_ptr, W.t() (a view of W) gets W's cached copy: autocast never caches a
    view, and casts it at each use."""
    class ByStorage(Ref):
        def cast(self, value, dtype):
            if _eligible(value) and dtype == torch.bfloat16 and value.requires_grad and (
                    value.dtype == torch.float32):
                key = value.data_ptr()
                if key not in Ref.cache:
                    Ref.cache[key] = (value, value.to(dtype))
                return Ref.cache[key][1]
            return super().cast(value, dtype)

    assert_rejected(EX, ByStorage, "has autocast's dtype but other values")


def test_leaving_the_fp32_ops_alone_fails(Ref):
    class NoFp32(Ref):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("mse_loss", "prod", "cdist"):
                return func(*args, **(kwargs or {}))
            return super().__torch_function__(func, types, args, kwargs)

    assert_rejected(EX, NoFp32, "is on the fp32 list")


def test_casting_float64_too_fails(Ref):
    """A float64 tensor is never cast: cat then promotes to float64."""
    class Casts64(Ref):
        def cast(self, value, dtype):
            if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
                return value.to(dtype)
            return super().cast(value, dtype)

    assert_rejected(EX, Casts64, "the cat output is torch.bfloat16 under MiniAutocast, "
                                 "torch.float64 under torch.autocast")


def test_casting_with_a_detached_copy_fails_on_the_gradients(Ref):
    class Detached(Ref):
        def cast(self, value, dtype):
            out = super().cast(value, dtype)
            return out.detach().requires_grad_(out.requires_grad) if out is not value else out

    assert_rejected(EX, Detached, "the gradient of parameter 0 differs")


def test_the_real_autocast_wrapped_is_refused_for_what_it_is():
    """A context manager that is torch.autocast itself is no model of it: it would pass on the
    values, so the exercise names what it models (`models` in lab.toml) and the probe sees the
    call."""
    class Real:
        def __init__(self):
            self.inner = torch.autocast("cpu", dtype=torch.bfloat16)

        def __enter__(self):
            return self.inner.__enter__()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    assert_rejected(EX, Real, "torch.autocast")


def test_switching_on_torchs_autocast_key_is_refused():
    """From a red-team trial: the key taken out of the excluded set by hand (a C function the
    observer does not name), so that torch's own autocast kernels do the work."""
    import functools

    key = torch._C.DispatchKey.AutocastCPU
    switch = functools.partial(torch._C._dispatch_tls_set_dispatch_key_excluded, key)

    class KeyOn:
        depth = 0

        def __enter__(self):
            KeyOn.depth += 1
            switch(False)
            return self

        def __exit__(self, *exc):
            KeyOn.depth -= 1
            if KeyOn.depth == 0:
                switch(True)
                functools.partial(torch.clear_autocast_cache)()

    assert_rejected(EX, KeyOn, "torch's own AutocastCPU key on")
