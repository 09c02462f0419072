"""Checks of ``dispatcher.privateuse1``: the learner's ``register_backend(lib)``, which registers
a toy backend's kernels for the PrivateUse1 dispatch key on the
``torch.library.Library("aten", "IMPL")`` it is given.

Oracle: the same programs on CPU tensors, run by the judge in the grader's process. The programs
run on the device in the learner's kernel (``probes.backend_programs``): the judge sends each as
a list of steps over CPU tensors it drew from the run's seed (``x.to(device)``, ``a + b``,
``d.copy_(x)``, ``t.cpu()``, ...); the probe makes the device usable, calls
``register_backend`` on a fresh Library, runs the steps, destroys the Library, and returns what
each step gave as plain data: the type of each result, a plain tensor's device, shape and dtype,
the values of what ``.cpu()`` gave, and what raised. The judge decides.

The backend's name is whatever PrivateUse1 is called in the learner's kernel ("privateuseone",
the default, in the notebook's kernel and under pytest). A name can be given once per process
(c10/core/DeviceType.cpp: ``register_privateuse1_backend``) and makes PrivateUse1 the process's
accelerator (``torch.accelerator.current_accelerator()``), which would change how other code in
the same process picks its device; so the hidden check that makes sure no name is hard-coded has
the probe rename the backend in a forked child process (``labs/dispatcher/forked.py``), to a
name drawn from the run's seed, and run the programs of the other checks there. What the probe
needs besides the kernels, a device module ``torch.<name>`` and the PrivateUse1 hooks, it
registers only when absent and leaves dormant afterwards (the module removed again, the hooks
reporting "not available").
"""
from __future__ import annotations

import random

from grader.checks import AnswerError, AnswerRaised, CheckFailure, check, explain, paired
from labs.dispatcher import probes
from labs.dispatcher.checks._plain import refuse

EXERCISE = "dispatcher.privateuse1"
_SHIPPED = "the grader's probe did not run as shipped (answers must not modify the grader)"


def _ri(g, lo: int, hi: int) -> int:
    """A seeded integer in [lo, hi]."""
    import torch

    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _random(g, shape, dtype):
    """A seeded CPU tensor of any dtype."""
    import torch

    x = torch.randn(shape, generator=g) * 4
    if dtype == torch.bool:
        return x > 0
    if not dtype.is_floating_point:
        return x.round().to(dtype) if dtype != torch.uint8 else x.abs().round().to(dtype)
    return x.to(dtype)


# --------------------------------------------------------------------------- what raised
_SUGGEST = {"aten::add.out": "add.Tensor", "aten::copy_": "_copy_from"}


def _raised(record: dict, where: str):
    """Raise what a step's exception (a probe's record) means, saying which program failed: a
    missing kernel, endless recursion, or an error of the answer's kernels."""
    ename, text, line = record["ename"], record["evalue"], record["where"]
    if ename == "NotImplementedError":
        if text == EXERCISE:
            raise AnswerRaised(record)
        if "Could not run" in text and "'" in text:
            op = text.split("'")[1]
            name = _SUGGEST.get(op, op.replace("aten::", ""))
            raise CheckFailure(
                f"{where}: the dispatcher found no PrivateUse1 kernel for {op}. Register one "
                f"on lib (lib.impl(\"{name}\", kernel, \"PrivateUse1\")).")
        raise CheckFailure(f"{where}: raised NotImplementedError: "
                           f"{(text.splitlines() or [''])[0][:200]}{line}")
    if ename == "RecursionError":
        raise CheckFailure(
            f"{where}: your kernels call each other endlessly{line}. Inside a PrivateUse1 "
            "kernel, an op on a device tensor (dst.copy_(...), a + b) dispatches to your "
            "kernels again: work on the CPU tensors that hold the device tensors' values "
            "instead.")
    first = (text.strip().splitlines() or [""])[0][:200]
    hint = (" Python numbers reach add.Tensor's kernel as Python scalars (ints, floats), not as "
            "tensors." if ename == "TypeError" else "")
    raise CheckFailure(f"{where}: raised {ename}: {first}{line}.{hint}")


class _Seen:
    """What the probe saw of one program: each step's value (as ``probes._device_seen`` gives
    it), up to the step that raised."""

    def __init__(self, entry, steps: int):
        self.raised = None
        if type(entry) is dict and "raised" in entry and type(entry.get("steps")) is list:
            self.steps, self.raised = entry["steps"], entry["raised"]
        elif type(entry) is list and len(entry) == steps:
            self.steps = entry
        else:
            raise CheckFailure(f"what came back from your answer is not a program's record: "
                               f"{_SHIPPED}.")

    def __call__(self, k: int, where: str) -> dict:
        """What step ``k`` gave; when it raised, CheckFailure saying so for ``where``."""
        if k < len(self.steps):
            return self.steps[k]
        if self.raised is not None:
            _raised(self.raised, where)
        raise CheckFailure(f"what came back from your answer misses a step: {_SHIPPED}.")


# --------------------------------------------------------------------------- comparing
def _on_device(t: dict, name: str, where: str) -> None:
    """The step's value must be a plain tensor on the backend's device."""
    if not t["tensor"]:
        raise CheckFailure(f"{where}: got {t['type']}, not a tensor.")
    # a plain tensor: a subclass could claim any device, shape or dtype (__torch_function__)
    if not t["plain"]:
        refuse(t["type"], True, f"{where}: the tensor your kernels made", "Tensor")
    if t["device_type"] != name:
        raise CheckFailure(f"{where}: the result is on {t['device']}, not on the {name} device. "
                           "Build device tensors with torch._C._acc.create_empty_tensor(shape, "
                           "dtype).")


def _to_cpu(seen: _Seen, src: dict, k: int, where: str):
    """The values of step ``k``, ``.cpu()`` of ``src`` (an earlier step's value): a plain CPU
    tensor of src's shape and dtype."""
    if src["tensor"] and not src["plain"]:
        refuse(src["type"], True, f"{where}: the tensor your kernels made", "Tensor")
    out = seen(k, where + " then .cpu()")
    if out["tensor"] and not out["plain"]:
        refuse(out["type"], True, f"{where}: what .cpu() gave", "Tensor")
    if not out["tensor"] or out["device_type"] != "cpu":
        raise CheckFailure(f"{where}: .cpu() did not give a CPU tensor.")
    if out["shape"] != src["shape"] or out["dtype"] != src["dtype"]:
        raise CheckFailure(f"{where}: .cpu() gave shape {tuple(out['shape'])}, dtype "
                           f"{out['dtype']} for a device tensor of shape {tuple(src['shape'])}, "
                           f"dtype {src['dtype']}.")
    return out["value"]


def _same(got, want, where: str, why: str = ""):
    """A CPU result against the CPU oracle: shape, dtype, values; ``why`` says what a difference
    in values likely means."""
    import torch

    if got.shape != want.shape or got.dtype != want.dtype:
        raise CheckFailure(f"{where}: shape {tuple(got.shape)}, dtype {got.dtype}; on CPU torch "
                           f"gives shape {tuple(want.shape)}, dtype {want.dtype}.")
    if not torch.equal(got, want):
        diff = (got != want).nonzero()
        i = tuple(diff[0].tolist()) if len(diff) else ()
        raise CheckFailure(f"{where}: element {i} is {got[i].item()}; on CPU torch gives "
                           f"{want[i].item()}{f': {why}' if why else ''}.")


# --------------------------------------------------------------------------- programs
class _Program:
    """Steps for ``probes.backend_programs`` over CPU tensors ``args``, and ``judge(seen, name)``
    that compares what they gave with torch on CPU."""

    def __init__(self, steps: list, args: list, judge):
        self.steps, self.args, self.judge = steps, args, judge


def _arg(i: int) -> list:
    return ["arg", i]


def _slot(k: int) -> list:
    return ["slot", k]


def _result(steps: list, args: list, want, label, check_meta: bool = False) -> _Program:
    """A program whose last step makes a device tensor (step ``len(steps) - 1``), then reads it
    back with ``.cpu()``: it must be on the device and hold ``want``. ``label(name)`` is the
    program in words; with ``check_meta`` its shape and dtype are checked first."""
    last = len(steps) - 1

    def judge(seen: _Seen, name: str) -> None:
        where = label(name)
        t = seen(last, where)
        _on_device(t, name, where)
        if check_meta and (t["dtype"] != want.dtype or tuple(t["shape"]) != tuple(want.shape)):
            raise CheckFailure(f"{where} gave shape {tuple(t['shape'])}, dtype {t['dtype']}.")
        _same(_to_cpu(seen, t, last + 1, where), want, where + " then .cpu()")

    return _Program([*steps, ["cpu", _slot(last)]], args, judge)


def _empty_programs(ctx) -> list[_Program]:
    import torch

    programs = []
    for shape, dtype in (((3,), None), ((2, 3), torch.float64), ((), torch.int64),
                         ((0, 4), torch.float32)):
        def judge(seen, name, shape=shape, dtype=dtype):
            where = f"torch.empty({shape}, dtype={dtype}, device={name!r})"
            t = seen(0, where)
            _on_device(t, name, where)
            if tuple(t["shape"]) != shape or t["dtype"] != (dtype or torch.float32):
                raise CheckFailure(f"{where} gave shape {tuple(t['shape'])}, dtype "
                                   f"{t['dtype']}.")
        programs.append(_Program([["empty", list(shape), dtype]], [], judge))
    return programs


def _round_trip_programs(ctx) -> list[_Program]:
    import torch

    g = ctx.generator(80)
    x = torch.randn(3, 4, generator=g)
    steps = [["to", _arg(0), None],              # 0: t = x.to(device)
             ["cpu", _slot(0)],                  # 1: back = t.cpu()
             ["inplace", _arg(0), "add_", 1.0],  # 2: x.add_(1.0) on the CPU
             ["cpu", _slot(0)],                  # 3: t.cpu()
             ["inplace", _slot(1), "mul_", 0.0],  # 4: back.mul_(0.0)
             ["cpu", _slot(0)]]                  # 5: t.cpu() again

    def judge(seen, name):
        where = f"x.to({name!r}) for x of shape (3, 4)"
        t = seen(0, where)
        _on_device(t, name, where)
        _same(_to_cpu(seen, t, 1, where), x, where + " then .cpu()")
        seen(2, f"x.add_(1.0) on CPU after t = x.to({name!r})")
        alias = ("the device tensor shares memory with a CPU tensor: copy the values in "
                 "_copy_from, do not keep a reference to them")
        _same(_to_cpu(seen, t, 3, where), x,
              f"t = x.to({name!r}) for x of shape (3, 4), then x.add_(1) on CPU, then t.cpu()",
              alias)
        seen(4, f"b.mul_(0) for b = t.cpu(), t = x.to({name!r})")
        _same(_to_cpu(seen, t, 5, where), x,
              f"b = t.cpu() for t = x.to({name!r}), then b.mul_(0), then t.cpu() again", alias)

    return [_Program(steps, [x], judge)]


def _add_programs(ctx) -> list[_Program]:
    import torch

    g = ctx.generator(81)
    programs = []
    for sa, sb in (((3, 4), (3, 4)), ((2, 3), (3,)), ((3, 1), (1, 4))):
        a, b = torch.randn(sa, generator=g), torch.randn(sb, generator=g)
        programs.append(_result(
            [["to", _arg(0), None], ["to", _arg(1), None], ["add", _slot(0), _slot(1), None]],
            [a, b], a + b,
            lambda name, sa=sa, sb=sb: f"a + b on {name} for shapes {sa} and {sb}"))
    return programs


def _random_round_trip_programs(ctx) -> list[_Program]:
    import torch

    g = ctx.generator(82)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
              torch.int64, torch.uint8, torch.bool]
    programs = []
    shapes = [(), (0,), (0, 3), (_ri(g, 1, 7),), (_ri(g, 1, 4), _ri(g, 1, 4), _ri(g, 2, 5))]
    for shape in shapes:
        for dtype in dtypes:
            x = _random(g, shape, dtype)
            programs.append(_result(
                [["to", _arg(0), None]], [x], x,
                lambda name, shape=shape, dtype=dtype:
                    f"x.to({name!r}) for x of shape {shape}, {dtype}", check_meta=True))
    x = torch.randn(4, 5, generator=g)

    def transposed(seen, name, x=x):
        where = f"x.to({name!r}) for a transposed (non-contiguous) x of shape (5, 4)"
        t = seen(1, where)
        _same(_to_cpu(seen, t, 2, where), x.t(), where + " then .cpu()")

    programs.append(_Program([["t", _arg(0)], ["to", _slot(0), None], ["cpu", _slot(1)]], [x],
                             transposed))
    x = torch.randn(3, 4, generator=g)

    def with_dtype(seen, name, x=x):
        where = f"x.to({name!r}, dtype=torch.float64) for a float32 x"
        t = seen(0, where)
        _same(_to_cpu(seen, t, 1, where), x.double(), where + " then .cpu()")

    programs.append(_Program([["to", _arg(0), torch.float64], ["cpu", _slot(0)]], [x],
                             with_dtype))
    programs.append(_result(
        [["to", _arg(0), None], ["astype", _slot(0), torch.float16]], [x], x.half(),
        lambda name: f"t.to(torch.float16) for t = x.to({name!r}) (a copy from device to "
                     "device)"))
    return programs


def _random_add_programs(ctx) -> list[_Program]:
    import torch

    g = ctx.generator(83)
    n, m = _ri(g, 1, 5), _ri(g, 1, 5)
    a, b = torch.randn(n, m, generator=g), torch.randn(m, generator=g)
    i, j = _random(g, (n, m), torch.int64), _random(g, (n, 1), torch.int64)
    to0, to1 = ["to", _arg(0), None], ["to", _arg(1), None]
    two = [to0, to1]
    cases = [
        ("torch.add(a, b, alpha=0.5)", [a, b], [*two, ["add", _slot(0), _slot(1), 0.5]],
         torch.add(a, b, alpha=0.5)),
        ("int64 a + int64 b with alpha=3", [i, j], [*two, ["add", _slot(0), _slot(1), 3]],
         torch.add(i, j, alpha=3)),
        ("int64 a + float32 b (type promotion)", [i, a],
         [*two, ["add", _slot(0), _slot(1), None]], i + a),
        ("a + 2.5 (a Python number)", [a], [to0, ["add", _slot(0), ["num", 2.5], None]],
         a + 2.5),
        ("int64 a + 2 (a Python int)", [i], [to0, ["add", _slot(0), ["num", 2], None]], i + 2),
        ("a + torch.tensor(1.5) (a 0-d CPU tensor)", [a, torch.tensor(1.5)],
         [to0, ["add", _slot(0), _arg(1), None]], a + torch.tensor(1.5)),
        ("float64 a + float32 b", [a.double(), b], [*two, ["add", _slot(0), _slot(1), None]],
         a.double() + b),
        ("(a + b) + a (a chain)", [a, b],
         [*two, ["add", _slot(0), _slot(1), None], ["to", _arg(0), None],
          ["add", _slot(2), _slot(3), None]], (a + b) + a),
        ("empty a + empty b", [a[:0], b], [*two, ["add", _slot(0), _slot(1), None]],
         a[:0] + b),
    ]
    shapes = f"shapes {tuple(a.shape)} / {tuple(b.shape)}"
    return [_result(steps, args, want, lambda name, label=label: f"{label} on {name}, {shapes}")
            for label, args, steps, want in cases]


def _copy_into_programs(ctx) -> list[_Program]:
    import torch

    g = ctx.generator(84)
    n, m = _ri(g, 1, 4), _ri(g, 2, 5)
    x, y = torch.randn(n, m, generator=g), torch.randn(1, m, generator=g)
    steps = [["empty", [n, m], None],               # 0: d
             ["copy_", _slot(0), _arg(0)],          # 1: d.copy_(x)
             ["cpu", _slot(0)],                     # 2
             ["copy_", _slot(0), _arg(1)],          # 3: d.copy_(y), broadcast
             ["cpu", _slot(0)],                     # 4
             ["empty", [n, m], torch.float64],      # 5: e
             ["copy_", _slot(5), _slot(0)],         # 6: e.copy_(d)
             ["cpu", _slot(5)],                     # 7
             ["copy_", _slot(0), _arg(0)],          # 8: d.copy_(x) again
             ["cpu", _slot(5)]]                     # 9

    def judge(seen, name):
        d = seen(0, "torch.empty")
        out = seen(1, f"d.copy_(x) for d on {name}")
        if not out.get("same"):
            raise CheckFailure("d.copy_(x) returned another tensor than d.")
        _same(_to_cpu(seen, d, 2, "d.copy_(x)"), x,
              f"after d.copy_(x) (d on {name}, x on CPU), d.cpu()")
        seen(3, "d.copy_(y) with broadcasting")
        _same(_to_cpu(seen, d, 4, "d.copy_(y)"), y.expand(n, m),
              f"after d.copy_(y) for y of shape (1, {m}), d.cpu()")
        e = seen(5, "torch.empty")
        seen(6, f"e.copy_(d) for e and d on {name}")
        _same(_to_cpu(seen, e, 7, "e.copy_(d)"), y.expand(n, m).double(),
              f"after e.copy_(d) (both on {name}, e float64), e.cpu()")
        seen(8, "d.copy_(x)")
        _same(_to_cpu(seen, e, 9, "e"), y.expand(n, m).double(),
              "after writing d again, e (a copy of d made earlier) changed: copies must not "
              "alias; e.cpu()")

    return [_Program(steps, [x, y], judge)]


# --------------------------------------------------------------------------- running them
def _judge(reply, programs: list[_Program], name: str | None = None) -> None:
    """Judge the probe's ``reply`` for ``programs``: what register_backend did with the Library,
    then each program in order. ``name``: the name the backend must have (the renamed check's);
    else the kernel's, as the reply says, which must not be one of torch's own devices."""
    import torch

    if type(reply) is not dict or type(reply.get("name")) is not str:
        raise CheckFailure(f"what came back from your answer is not the probe's reply: "
                           f"{_SHIPPED}.")
    if name is not None and reply["name"] != name:
        raise CheckFailure(f"the device was called {reply['name']!r}, not {name!r}: {_SHIPPED}.")
    if reply["name"] != probes.DEFAULT_BACKEND_NAME:
        try:
            torch.device(reply["name"])
        except RuntimeError:
            pass
        else:
            raise CheckFailure(f"the device was called {reply['name']!r}, a device of torch's "
                               f"own: {_SHIPPED}.")
    if "raised" in reply:
        raise AnswerRaised(reply["raised"])
    returned = reply["returned"]
    if returned is not None and not returned["library"]:
        raise CheckFailure(f"register_backend(lib) returned {returned['type']}; it should "
                           "register kernels on lib and return None.")
    if not reply["registered"]:
        raise CheckFailure(
            "register_backend(lib) registered nothing on the Library it was given. Register "
            "each kernel with lib.impl(\"<op>\", kernel, \"PrivateUse1\") on that lib (not a "
            "Library of your own, and not with @torch.library.impl), so that the checks can "
            "remove the registrations afterwards.")
    for program, entry in paired(programs, reply["programs"], "programs"):
        program.judge(_Seen(entry, len(program.steps)), reply["name"])


def _ask(register_backend, programs: list[_Program], rename: str | None = None):
    """The probe's reply for ``programs`` (in a child with PrivateUse1 renamed to ``rename``)."""
    return register_backend.probe(probes.backend_programs,
                                  [[p.steps, p.args] for p in programs], rename)


def _check(register_backend, programs: list[_Program]) -> None:
    _judge(_ask(register_backend, programs), programs)


# --------------------------------------------------------------------------- checks
@check(EXERCISE)
def empty(register_backend, ctx):
    """torch.empty on the device gives a tensor of the asked shape and dtype there"""
    _check(register_backend, _empty_programs(ctx))


@check(EXERCISE)
def round_trip(register_backend, ctx):
    """x.to(device).cpu() gives x back, and the device tensor is a copy, not an alias"""
    _check(register_backend, _round_trip_programs(ctx))


@check(EXERCISE)
def add(register_backend, ctx):
    """a + b on the device matches CPU add, with broadcasting"""
    _check(register_backend, _add_programs(ctx))


@check(EXERCISE, hidden=True)
def random_round_trips(register_backend, ctx):
    """round trips for random shapes and dtypes, non-contiguous sources and dtype changes"""
    _check(register_backend, _random_round_trip_programs(ctx))


@check(EXERCISE, hidden=True)
def random_adds(register_backend, ctx):
    """add with alpha, type promotion, Python scalars and 0-d CPU tensors matches CPU"""
    _check(register_backend, _random_add_programs(ctx))


@check(EXERCISE, hidden=True)
def copy_into(register_backend, ctx):
    """copy_ into an existing device tensor updates it in place, from CPU and from the device"""
    _check(register_backend, _copy_into_programs(ctx))


#: names the hidden check gives PrivateUse1 in its child process (one per run, from the seed)
_NAMES = ("acme", "nova", "zeta", "orca", "lynx", "kiwi")


@check(EXERCISE, hidden=True)
def renamed_backend(register_backend, ctx):
    """the same programs with PrivateUse1 under another name: nothing depends on the name"""
    name = random.Random(f"{EXERCISE}:{ctx.seed}").choice(_NAMES)
    programs = [p for make in (_empty_programs, _round_trip_programs, _add_programs,
                               _random_add_programs, _copy_into_programs) for p in make(ctx)]
    reply = _ask(register_backend, programs, name)
    if type(reply) is dict and "renamed_already" in reply:
        raise CheckFailure(
            f"PrivateUse1 was renamed to {reply['renamed_already']!r} in your kernel: a name can "
            "be given once per process and a child process inherits it, so these checks cannot "
            "run your kernels under another name. Remove the "
            "torch.utils.rename_privateuse1_backend call from your notebook (the lab's cells "
            "rename only in a child process), restart and run again.")
    if type(reply) is dict and "rename_failed" in reply:
        raise AnswerError(f"PrivateUse1 could not be renamed to {name!r} (was torch.utils "
                          "replaced?)")
    if type(reply) is dict and "child_error" in reply:
        raise AnswerError(f"with PrivateUse1 renamed to {name!r} in a child process, the "
                          f"programs did not finish: {reply['child_error']}")
    text = (f"with PrivateUse1 renamed to {name!r} (in a child process: device strings are now "
            f"{name!r} and '{name}:0'), the programs that pass under the name "
            f"{probes.DEFAULT_BACKEND_NAME!r} fail. Your kernels depend on the backend's name: "
            "read it while they run, with torch._C._get_privateuse1_backend_name(), never from "
            "a string or a global set earlier. What failed: ")
    try:
        _judge(reply, programs, name)
    except CheckFailure as exc:
        raise CheckFailure(text + str(exc)) from None
    except AnswerRaised as exc:
        raise AnswerError(text + explain(exc.ename, exc.evalue) + exc.record.get("where", "")
                          ) from None
