"""Checks of ``dispatcher.privateuse1``: the learner's ``register_backend(lib)``, which registers a toy
backend's kernels for the PrivateUse1 dispatch key on the ``torch.library.Library("aten", "IMPL")``
it is given.

Oracle: the same programs on CPU tensors. Every check runs on a fresh Library and destroys it
afterwards, so registrations never leak from one check (or one answer) to the next.

The backend's name is whatever PrivateUse1 is called in the checking process ("privateuseone",
the default, in the notebook's kernel and under pytest). A name can be given once per process
(c10/core/DeviceType.cpp: ``register_privateuse1_backend``) and makes PrivateUse1 the process's
accelerator (``torch.accelerator.current_accelerator()``), which would change how other code in
the same process (other labs' checks under pytest) picks its device; so the hidden check that
makes sure no name is hard-coded renames the backend in a forked child process
(``labs/dispatcher/forked.py``), to a name drawn from the run's seed, and runs the programs there.
What the checks need besides the kernels, a device module ``torch.<name>`` and the PrivateUse1
hooks, they register only when absent and leave dormant afterwards (the module removed again, the
hooks reporting "not available").
"""
from __future__ import annotations

import contextlib
import random

from grader.checks import AnswerError, CheckFailure, check, learner_line, plain_tensor
from labs.dispatcher.forked import ChildError, run_forked

EXERCISE = "dispatcher.privateuse1"

_STATE = {"hooks": None}


def _ri(g, lo: int, hi: int) -> int:
    """A seeded integer in [lo, hi]."""
    import torch

    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _hooks():
    """PrivateUse1 hooks and a device guard, registered once per process (a second registration is
    refused by torch and returns False); available only while a check runs."""
    import torch

    if _STATE["hooks"] is None:
        class Hooks(torch._C._acc.PrivateUse1Hooks):
            active = False

            def is_available(self):
                return Hooks.active

            def has_primary_context(self, device_index):
                return True

            def is_built(self):
                return True

        class Guard(torch._C._acc.DeviceGuard):
            def type_(self):
                return torch._C._autograd.DeviceType.PrivateUse1

        _STATE["hooks"] = (Hooks, Hooks(), Guard())
        torch._C._acc.register_python_privateuseone_hook(_STATE["hooks"][1])
        torch._C._acc.register_python_privateuseone_device_guard(_STATE["hooks"][2])
    return _STATE["hooks"][0]


class _DeviceModule:
    """The minimal ``torch.<backend>`` module torch asks a PrivateUse1 backend for."""

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def is_initialized():
        return True

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def _is_in_bad_fork():
        return False

    @staticmethod
    def manual_seed_all(seed):
        pass


@contextlib.contextmanager
def _backend(register_backend):
    """Make the PrivateUse1 backend usable, register the answer's kernels on a fresh Library, yield
    the device name; afterwards destroy the Library and undo what this context set up."""
    import sys

    import torch

    name = torch._C._get_privateuse1_backend_name()
    added_module = not hasattr(torch, name)
    if added_module:
        torch._register_device_module(name, _DeviceModule())
    Hooks = _hooks()
    was_active, Hooks.active = Hooks.active, True
    lib = torch.library.Library("aten", "IMPL")
    try:
        result = register_backend(lib)
        if result is not None and not isinstance(result, torch.library.Library):
            raise CheckFailure(f"register_backend(lib) returned {type(result).__name__}; it should register "
                               "kernels on lib and return None.")
        if not lib._op_impls:
            raise CheckFailure(
                "register_backend(lib) registered nothing on the Library it was given. Register each kernel "
                "with lib.impl(\"<op>\", kernel, \"PrivateUse1\") on that lib (not a Library of your own, and not "
                "with @torch.library.impl), so that the checks can remove the registrations afterwards.")
        yield name
    finally:
        lib._destroy()
        Hooks.active = was_active
        if added_module:
            delattr(torch, name)
            sys.modules.pop(f"torch.{name}", None)


_SUGGEST = {"aten::add.out": "add.Tensor", "aten::copy_": "_copy_from"}


def _guard(where: str, fn):
    """Run fn() (which calls into the answer's kernels through torch) and turn what goes wrong into
    a message that says which program failed: a missing kernel, endless recursion, or an error."""
    try:
        return fn()
    except CheckFailure:
        raise
    except NotImplementedError as exc:
        if exc.args == (EXERCISE,):
            raise
        text = str(exc)
        if "Could not run" in text and "'" in text:
            op = text.split("'")[1]
            name = _SUGGEST.get(op, op.replace("aten::", ""))
            raise CheckFailure(
                f"{where}: the dispatcher found no PrivateUse1 kernel for {op}. Register one on lib "
                f"(lib.impl(\"{name}\", kernel, \"PrivateUse1\")).") from None
        raise CheckFailure(f"{where}: raised NotImplementedError: {text.splitlines()[0][:200]}{learner_line(exc)}") from None
    except RecursionError as exc:
        raise CheckFailure(
            f"{where}: your kernels call each other endlessly{learner_line(exc)}. Inside a PrivateUse1 kernel, an "
            "op on a device tensor (dst.copy_(...), a + b) dispatches to your kernels again: work on the CPU "
            "tensors that hold the device tensors' values instead.") from None
    except Exception as exc:  # the answer's kernels raised while torch ran them
        text = (str(exc).strip().splitlines() or [""])[0][:200]
        hint = (" Python numbers reach add.Tensor's kernel as Python scalars (ints, floats), not as tensors."
                if isinstance(exc, TypeError) else "")
        raise CheckFailure(f"{where}: raised {type(exc).__name__}: {text}{learner_line(exc)}.{hint}") from None


def _on_device(t, name: str, where: str):
    """t must be a tensor on the backend's device."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise CheckFailure(f"{where}: got {type(t).__name__}, not a tensor.")
    # a plain tensor: a subclass could claim any device, shape or dtype (__torch_function__)
    plain_tensor(t, f"{where}: the tensor your kernels made")
    if t.device.type != name:
        raise CheckFailure(f"{where}: the result is on {t.device}, not on the {name} device. Build device "
                           "tensors with torch._C._acc.create_empty_tensor(shape, dtype).")


def _to_cpu(t, name: str, where: str):
    """t.cpu(), checked to be a CPU tensor of t's shape and dtype."""
    import torch

    if isinstance(t, torch.Tensor):
        plain_tensor(t, f"{where}: the tensor your kernels made")
    out = _guard(where + " then .cpu()", t.cpu)
    if isinstance(out, torch.Tensor):
        plain_tensor(out, f"{where}: what .cpu() gave")
    if not isinstance(out, torch.Tensor) or out.device.type != "cpu":
        raise CheckFailure(f"{where}: .cpu() did not give a CPU tensor.")
    if out.shape != t.shape or out.dtype != t.dtype:
        raise CheckFailure(f"{where}: .cpu() gave shape {tuple(out.shape)}, dtype {out.dtype} for a device tensor "
                           f"of shape {tuple(t.shape)}, dtype {t.dtype}.")
    return out


def _same(got, want, where: str, why: str = ""):
    """A CPU result against the CPU oracle: shape, dtype, values; ``why`` says what a difference
    in values likely means."""
    import torch

    if got.shape != want.shape or got.dtype != want.dtype:
        raise CheckFailure(f"{where}: shape {tuple(got.shape)}, dtype {got.dtype}; on CPU torch gives shape "
                           f"{tuple(want.shape)}, dtype {want.dtype}.")
    if not torch.equal(got, want):
        diff = (got != want).nonzero()
        i = tuple(diff[0].tolist()) if len(diff) else ()
        raise CheckFailure(f"{where}: element {i} is {got[i].item()}; on CPU torch gives "
                           f"{want[i].item()}{f': {why}' if why else ''}.")


def _random(g, shape, dtype):
    """A seeded CPU tensor of any dtype."""
    import torch

    x = torch.randn(shape, generator=g) * 4
    if dtype == torch.bool:
        return x > 0
    if not dtype.is_floating_point:
        return x.round().to(dtype) if dtype != torch.uint8 else x.abs().round().to(dtype)
    return x.to(dtype)


# --------------------------------------------------------------------------- checks


@check(EXERCISE)
def empty(register_backend, ctx):
    """torch.empty on the device gives a tensor of the asked shape and dtype there"""
    import torch

    with _backend(register_backend) as name:
        for shape, dtype in (((3,), None), ((2, 3), torch.float64), ((), torch.int64), ((0, 4), torch.float32)):
            where = f"torch.empty({shape}, dtype={dtype}, device={name!r})"
            t = _guard(where, lambda: torch.empty(shape, dtype=dtype, device=name))
            _on_device(t, name, where)
            if tuple(t.shape) != shape or t.dtype != (dtype or torch.get_default_dtype()):
                raise CheckFailure(f"{where} gave shape {tuple(t.shape)}, dtype {t.dtype}.")


@check(EXERCISE)
def round_trip(register_backend, ctx):
    """x.to(device).cpu() gives x back, and the device tensor is a copy, not an alias"""
    import torch

    g = ctx.generator(80)
    with _backend(register_backend) as name:
        x = torch.randn(3, 4, generator=g)
        where = f"x.to({name!r}) for x of shape (3, 4)"
        t = _guard(where, lambda: x.to(name))
        _on_device(t, name, where)
        back = _to_cpu(t, name, where)
        _same(back, x, where + " then .cpu()")
        original = x.clone()
        x.add_(1.0)
        alias = ("the device tensor shares memory with a CPU tensor: copy the values in "
                 "_copy_from, do not keep a reference to them")
        _same(_to_cpu(t, name, where), original,
              f"t = x.to({name!r}) for x of shape (3, 4), then x.add_(1) on CPU, then t.cpu()",
              alias)
        back.mul_(0.0)
        _same(_to_cpu(t, name, where), original,
              f"b = t.cpu() for t = x.to({name!r}), then b.mul_(0), then t.cpu() again", alias)


@check(EXERCISE)
def add(register_backend, ctx):
    """a + b on the device matches CPU add, with broadcasting"""
    import torch

    g = ctx.generator(81)
    with _backend(register_backend) as name:
        for sa, sb in (((3, 4), (3, 4)), ((2, 3), (3,)), ((3, 1), (1, 4))):
            a, b = torch.randn(sa, generator=g), torch.randn(sb, generator=g)
            where = f"a + b on {name} for shapes {sa} and {sb}"
            out = _guard(where, lambda: a.to(name) + b.to(name))
            _on_device(out, name, where)
            _same(_to_cpu(out, name, where), a + b, where)


@check(EXERCISE, hidden=True)
def random_round_trips(register_backend, ctx):
    """round trips for random shapes and dtypes, non-contiguous sources and dtype changes"""
    import torch

    g = ctx.generator(82)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
              torch.uint8, torch.bool]
    with _backend(register_backend) as name:
        shapes = [(), (0,), (0, 3), (_ri(g, 1, 7),), (_ri(g, 1, 4), _ri(g, 1, 4), _ri(g, 2, 5))]
        for shape in shapes:
            for dtype in dtypes:
                x = _random(g, shape, dtype)
                where = f"x.to({name!r}) for x of shape {shape}, {dtype}"
                t = _guard(where, lambda: x.to(name))
                _on_device(t, name, where)
                if t.dtype != dtype or tuple(t.shape) != shape:
                    raise CheckFailure(f"{where} gave shape {tuple(t.shape)}, dtype {t.dtype}.")
                _same(_to_cpu(t, name, where), x, where + " then .cpu()")
        x = torch.randn(4, 5, generator=g).t()
        where = f"x.to({name!r}) for a transposed (non-contiguous) x of shape (5, 4)"
        _same(_to_cpu(_guard(where, lambda: x.to(name)), name, where), x, where + " then .cpu()")
        x = torch.randn(3, 4, generator=g)
        where = f"x.to({name!r}, dtype=torch.float64) for a float32 x"
        t = _guard(where, lambda: x.to(name, dtype=torch.float64))
        _same(_to_cpu(t, name, where), x.double(), where + " then .cpu()")
        where = f"t.to(torch.float16) for t = x.to({name!r}) (a copy from device to device)"
        t2 = _guard(where, lambda: x.to(name).to(torch.float16))
        _on_device(t2, name, where)
        _same(_to_cpu(t2, name, where), x.half(), where + " then .cpu()")


@check(EXERCISE, hidden=True)
def random_adds(register_backend, ctx):
    """add with alpha, type promotion, Python scalars and 0-d CPU tensors matches CPU"""
    import torch

    g = ctx.generator(83)
    with _backend(register_backend) as name:
        n, m = _ri(g, 1, 5), _ri(g, 1, 5)
        a, b = torch.randn(n, m, generator=g), torch.randn(m, generator=g)
        i, j = _random(g, (n, m), torch.int64), _random(g, (n, 1), torch.int64)
        cases = [
            ("torch.add(a, b, alpha=0.5)", lambda d: torch.add(d(a), d(b), alpha=0.5), torch.add(a, b, alpha=0.5)),
            ("int64 a + int64 b with alpha=3", lambda d: torch.add(d(i), d(j), alpha=3), torch.add(i, j, alpha=3)),
            ("int64 a + float32 b (type promotion)", lambda d: d(i) + d(a), i + a),
            ("a + 2.5 (a Python number)", lambda d: d(a) + 2.5, a + 2.5),
            ("int64 a + 2 (a Python int)", lambda d: d(i) + 2, i + 2),
            ("a + torch.tensor(1.5) (a 0-d CPU tensor)", lambda d: d(a) + torch.tensor(1.5), a + torch.tensor(1.5)),
            ("float64 a + float32 b", lambda d: d(a.double()) + d(b), a.double() + b),
            ("(a + b) + a (a chain)", lambda d: (d(a) + d(b)) + d(a), (a + b) + a),
            ("empty a + empty b", lambda d: d(a[:0]) + d(b), a[:0] + b),
        ]
        for label, program, want in cases:
            where = f"{label} on {name}, shapes {tuple(a.shape)} / {tuple(b.shape)}"
            out = _guard(where, lambda: program(lambda x: x.to(name)))
            _on_device(out, name, where)
            _same(_to_cpu(out, name, where), want, where)


@check(EXERCISE, hidden=True)
def copy_into(register_backend, ctx):
    """copy_ into an existing device tensor updates it in place, from CPU and from the device"""
    import torch

    g = ctx.generator(84)
    with _backend(register_backend) as name:
        n, m = _ri(g, 1, 4), _ri(g, 2, 5)
        x, y = torch.randn(n, m, generator=g), torch.randn(1, m, generator=g)
        d = _guard("torch.empty", lambda: torch.empty(n, m, device=name))
        out = _guard(f"d.copy_(x) for d on {name}", lambda: d.copy_(x))
        if out is not d:
            raise CheckFailure("d.copy_(x) returned another tensor than d.")
        _same(_to_cpu(d, name, "d.copy_(x)"), x, f"after d.copy_(x) (d on {name}, x on CPU), d.cpu()")
        _guard("d.copy_(y) with broadcasting", lambda: d.copy_(y))
        _same(_to_cpu(d, name, "d.copy_(y)"), y.expand(n, m), f"after d.copy_(y) for y of shape (1, {m}), d.cpu()")
        e = _guard("torch.empty", lambda: torch.empty(n, m, dtype=torch.float64, device=name))
        _guard(f"e.copy_(d) for e and d on {name}", lambda: e.copy_(d))
        _same(_to_cpu(e, name, "e.copy_(d)"), y.expand(n, m).double(),
              f"after e.copy_(d) (both on {name}, e float64), e.cpu()")
        _guard("d.copy_(x)", lambda: d.copy_(x))
        _same(_to_cpu(e, name, "e"), y.expand(n, m).double(),
              "after writing d again, e (a copy of d made earlier) changed: copies must not alias; e.cpu()")


#: names the hidden check gives PrivateUse1 in its child process (one per run, from the seed)
_NAMES = ("acme", "nova", "zeta", "orca", "lynx", "kiwi")
_DEFAULT_NAME = "privateuseone"


def _under_another_name(register_backend, ctx, name: str):
    """In the child process: rename PrivateUse1 to ``name`` and run the programs of the other
    checks. Returns ("passed", ""), ("failed", message) or ("error", message)."""
    import torch

    torch.set_num_threads(1)
    torch.utils.rename_privateuse1_backend(name)
    try:
        torch.device(name)  # (parsed by c10: the rename took effect)
    except RuntimeError:
        return "error", f"PrivateUse1 could not be renamed to {name!r} (was torch.utils replaced?)"
    try:
        for program in (empty, round_trip, add, random_adds, copy_into):
            program(register_backend, ctx)
    except CheckFailure as exc:
        return "failed", str(exc)
    except Exception as exc:  # the answer's own error, reported with its line
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return "error", f"{type(exc).__name__}: {first}{learner_line(exc)}"
    return "passed", ""


@check(EXERCISE, hidden=True)
def renamed_backend(register_backend, ctx):
    """the same programs with PrivateUse1 under another name: nothing depends on the name"""
    import torch

    current = torch._C._get_privateuse1_backend_name()
    if current != _DEFAULT_NAME:
        raise CheckFailure(
            f"PrivateUse1 was renamed to {current!r} in this process: a name can be given once per "
            "process and a child process inherits it, so these checks cannot run your kernels "
            "under another name. Remove the torch.utils.rename_privateuse1_backend call from your "
            "notebook (the lab's cells rename only in a child process), restart and run again.")
    name = random.Random(f"{EXERCISE}:{ctx.seed}").choice(_NAMES)
    try:
        status, message = run_forked(_under_another_name, register_backend, ctx, name)
    except ChildError as exc:
        raise AnswerError(f"with PrivateUse1 renamed to {name!r} in a child process, the programs "
                          f"did not finish: {exc}") from None
    if status == "passed":
        return
    text = (f"with PrivateUse1 renamed to {name!r} (in a child process: device strings are now "
            f"{name!r} and '{name}:0'), the programs that pass under the name {current!r} fail. "
            "Your kernels depend on the backend's name: read it while they run, with "
            "torch._C._get_privateuse1_backend_name(), never from a string or a global set "
            f"earlier. What failed: {message}")
    raise (CheckFailure if status == "failed" else AnswerError)(text)
