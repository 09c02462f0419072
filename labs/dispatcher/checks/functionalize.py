"""Checks of ``dispatcher.functionalize``: ``functionalize(fn)`` returns ``g``, a functional twin
of ``fn``. For tensors ``args``, ``g(*args)`` must return what ``fn(*args)`` returns (same
structure, shapes, dtypes and values) and leave every argument holding what ``fn`` leaves in it,
while every operator that runs below the answer's machinery (on plain tensors) is functional:
no operator whose schema writes into an argument (``func._schema.is_mutable``: ``add_``,
``copy_``, ``index_put_``, out= variants) and none with an aliasing return (``alias_info``) whose
output shares memory with an input (``view``, ``t``, ``select``, ``slice``, ...; ``lift_fresh``,
which ``torch.func.functionalize`` leaves too, is allowed), except exactly one ``copy_`` into
each argument that ``fn`` mutates (and into no other), as ``torch.func.functionalize`` writes
mutated inputs back.

How: a recording ``TorchDispatchMode`` is entered before ``g`` runs, so it sits below any mode
the answer enters and sees what that mode's kernels run (an op with a tensor-subclass argument is
left to the subclass with ``NotImplemented``; what the subclass runs on plain tensors comes back
to the recorder). Operators on meta tensors compute no data and are not judged. Every tensor a
judged operator reads, and every tensor ``g`` returns, must be an argument of ``g`` or the output
of a recorded operator (constants of at most one element, such as the scalar that
``y[0] = 2.0`` lifts, are allowed): a value computed with the dispatch modes disabled is refused
by that rule. PyTorch's own functionalization is switched off while the answer runs
(``torch.func.functionalize``, ``torch._to_functional_tensor``, functorch's
``_wrap_functional_tensor``, ``FunctionalTensorMode``), and an operator that reaches the recorder
with ``Functionalize`` in the thread-local include set (the C++ pass, however entered) is refused.

The oracle is ``fn`` itself, run eagerly on clones of the same arguments: its outputs, its
arguments afterwards, and which arguments it wrote into (their version counters moved). Not
``torch.func.functionalize(fn, remove="mutations_and_views")``: on 2.13 its ``contiguous()`` and
``reshape()`` of a transposed view alias where eager copies, so it writes into an argument that
eager leaves alone (``y = x.t().contiguous(); y.add_(1)``). Public: in-place operators on intermediates and
inputs; writes through views (siblings, transposes, views of inputs). Hidden (seeded sizes and
values, float32/float64): seventeen programs covering expand, chained views with steps,
unbind/split, diagonal, masks and index_put, ``x[idx] += ...``, non-contiguous and 3-d inputs,
int64 tensors, factories, copy_ with broadcasting and dtype change, values read before a later
mutation, two mutated inputs, and copies (``contiguous``, ``reshape``) of transposed views.
(torch/_functorch/eager_transforms.py: functionalize; torch/_subclasses/functional_tensor.py:
FunctionalTensorMode; aten/src/ATen/FunctionalTensorWrapper.h: FunctionalTensorWrapper.)
"""
from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

from grader.checks import AnswerError, CheckFailure, check, explain, learner_line, plain_tensor
from labs.dispatcher.checks._numbers import mismatch

EXERCISE = "dispatcher.functionalize"
#: programs are compiled under this name, so tracebacks through them count as the check's own
_PROGRAM_FILE = str(Path(__file__).with_name("<program>"))
OFF = ("{what} is PyTorch's own functionalization, switched off while the check runs your "
       "answer: build the mechanism yourself (a TorchDispatchMode and a wrapper tensor whose "
       "value you swap).")


# --------------------------------------------------------------------------- programs
# (source, argument kinds). Kinds: x, b: float (n, m); xt: float (n, m), a transpose (not
# contiguous); x3: float (2, n, m); idx: int64 row indices without repeats; mask: bool (n, m);
# c: int64 (n, m). Sizes n, m are at least 3.
_INPLACE = [
    ("""def fn(x, b):
    y = x * 2
    y.add_(b)
    y.mul_(0.5)
    x.sub_(1.0)
    return y, x + 1""", "x b"),
    ("""def fn(x, idx):
    y = torch.zeros_like(x)
    y += x
    y[idx] = 1.0
    y.clamp_(max=0.8)
    return y""", "x idx"),
    ("""def fn(x):
    x.mul_(2)
    return x""", "x"),
]
_VIEWS = [
    ("""def fn(x):
    y = x.clone()
    row, col = y[0], y[:, 1]
    row.mul_(10)
    y.t()[2].zero_()
    return y, col, row""", "x"),
    ("""def fn(x, b):
    v = x.t()
    x[1:].add_(b[1:])
    v[0].fill_(0.25)
    return v * 2""", "x b"),
]
_HIDDEN = [
    ("""def fn(x):
    e = x[0].unsqueeze(0).expand(3, -1)
    x.mul_(-1)
    return e""", "x"),
    ("""def fn(x, b):
    y = x + 0
    y.t()[1:, ::2].add_(b.t()[1:, ::2])
    return y""", "x b"),
    ("""def fn(x):
    y = x.clone()
    rows = y.unbind(0)
    rows[0].add_(1)
    rows[-1].mul_(2)
    return y, rows[1]""", "x"),
    ("""def fn(x):
    y = torch.zeros(x.shape[1], x.shape[1])
    y.diagonal().copy_(x[0])
    y.diagonal(1).fill_(-1.0)
    return y, x""", "x"),
    ("""def fn(x, mask):
    y = x.clone()
    y[mask] = 0.0
    y.masked_fill_(y > 1, 1.0)
    return y""", "x mask"),
    ("""def fn(x, b, idx):
    x[idx] += b[idx]
    return x.sum(0)""", "x b idx"),
    ("""def fn(x):
    x[0].clamp_(min=0)
    x.add_(1)
    return x.sum(1), x[1:].t()""", "xt"),
    ("""def fn(c):
    d = c.clone()
    d.mul_(3)
    d[0] = 7
    c.add_(1)
    return d""", "c"),
    ("""def fn(x, b):
    y = x.exp()
    y.addcmul_(b, b, value=0.5)
    y.div_(2)
    y.sqrt_()
    return y""", "x b"),
    ("""def fn(x):
    v = x.t()
    x.mul_(2)
    w = v[1]
    x[0].zero_()
    return v, w""", "x"),
    ("""def fn(x):
    y = x.unsqueeze(1).clone()
    y.squeeze(1).narrow(0, 1, 2).mul_(3)
    return y.flatten()""", "x"),
    ("""def fn(x):
    y = x * 1
    s, first = y.sum(0), y[0] * 1
    y.add_(1)
    return s, first, y""", "x"),
    ("""def fn(x, b):
    y = torch.zeros(x.shape, dtype=torch.float64)
    y.copy_(x[0])
    y[:, 0].copy_(b[:, 1])
    return y""", "x b"),
    ("""def fn(x, b):
    x[0].copy_(b[1])
    b.t()[0].fill_(2.0)
    return x + b""", "x b"),
    ("""def fn(x):
    p = x.permute(2, 0, 1)
    p[0].sub_(5)
    x.view(-1)[::3].zero_()
    return p""", "x3"),
    ("""def fn(x):
    y = x * 1
    a, b = y.split([1, y.shape[0] - 1])
    a.fill_(0.5)
    b.mul_(-1)
    return y""", "x"),
    ("""def fn(x):
    y = x.t().contiguous()
    y.add_(1)
    z = x.t().reshape(-1)
    z.mul_(2)
    return y, z""", "x"),
]


def _compile(source: str):
    import torch

    namespace = {"torch": torch}
    exec(compile(source, _PROGRAM_FILE, "exec"), namespace)  # noqa: S102
    return namespace["fn"]


def _arguments(kinds: str, g, n: int, m: int, dtype):
    """The arguments a program takes, drawn from ``g``, and their description."""
    import torch

    args, said = [], []
    for kind in kinds.split():
        if kind in ("x", "b"):
            t = torch.randn(n, m, generator=g, dtype=dtype)
        elif kind == "xt":
            t = torch.randn(m, n, generator=g, dtype=dtype).t()
        elif kind == "x3":
            t = torch.randn(2, n, m, generator=g, dtype=dtype)
        elif kind == "idx":
            t = torch.randperm(n, generator=g)[: max(1, n // 2)]
        elif kind == "mask":
            t = torch.rand(n, m, generator=g) > 0.5
        else:
            t = torch.randint(-5, 6, (n, m), generator=g)
        args.append(t)
        note = ", not contiguous (a transpose)" if kind == "xt" else ""
        said.append(f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}{note}")
    return args, said


# --------------------------------------------------------------------------- the recorder
@contextlib.contextmanager
def _torch_functionalization_off():
    """Make the ways into PyTorch's own functionalization raise CheckFailure; put them back on
    the way out."""
    import torch
    import torch._functorch.eager_transforms as eager
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    def refuse(what):
        def refused(*args, **kwargs):
            raise CheckFailure(OFF.format(what=what))
        return refused

    saved = []
    try:
        for owner, attr, what in (
                (torch.func, "functionalize", "torch.func.functionalize"),
                (eager, "functionalize", "torch.func.functionalize"),
                (eager, "_wrap_functional_tensor", "torch.func.functionalize"),
                (torch._C._functorch, "_wrap_functional_tensor", "_wrap_functional_tensor"),
                (torch, "_to_functional_tensor", "torch._to_functional_tensor"),
                (FunctionalTensorMode, "__init__", "FunctionalTensorMode")):
            saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, refuse(what))
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def _shares(a, b) -> bool:
    """Whether tensors ``a`` and ``b`` share memory (a view and its base, or one tensor twice)."""
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.nbytes() > 0 and sa.data_ptr() == sb.data_ptr()


def _recorder(inputs):
    """A TorchDispatchMode that judges the operators that reach it (see the module docstring)
    and counts the ``copy_`` calls into each of ``inputs``."""
    import torch
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.inputs = list(inputs)
            self.known = {id(t): t for t in inputs}   # (kept alive, so ids are not reused)
            self.copies = Counter()
            self.problem = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in flat):
                return NotImplemented   # a subclass handles it: what it runs comes back here
            out = func(*args, **kwargs)
            outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            if all(t.device.type == "meta" for t in flat + outs):
                return out
            problem = self.judge(func, args, flat, outs)
            self.problem = self.problem or problem
            for t in outs:
                self.known[id(t)] = t
            return out

        def judge(self, func, args, flat, outs):
            schema = func._schema
            if torch._C._dispatch_tls_is_dispatch_key_included(
                    torch._C.DispatchKey.Functionalize):
                return OFF.format(what=f"{func} ran with the Functionalize key on: that key")
            if func is torch.ops.aten.copy_.default and any(args[0] is t for t in self.inputs):
                self.copies[next(i for i, t in enumerate(self.inputs) if args[0] is t)] += 1
            elif schema.is_mutable:
                written = [a.name for a in schema.arguments
                           if a.alias_info and a.alias_info.is_write]
                return (f"{func} ran below your mode: it writes into its argument "
                        f"`{', '.join(written)}` (schema `{schema}`). An in-place op of fn must "
                        "reach the kernels as its out-of-place twin (add_ -> add), whose result "
                        "becomes the tensor's new value; only the final copy_ into an argument of "
                        "g may write.")
            elif func is not torch.ops.aten.lift_fresh.default and any(
                    r.alias_info is not None for r in schema.returns) and any(
                    _shares(o, t) for o in outs for t in flat):
                return (f"{func} ran below your mode and returns a view of its input (schema "
                        f"`{schema}`): the program below must not alias either. Produce the "
                        "values a view holds with an op that copies (a *_copy op, "
                        "as_strided_copy), and remember which base it views.")
            for t in flat:
                if id(t) not in self.known and t.numel() > 1:
                    return (f"{func} read a tensor of shape {tuple(t.shape)} that is neither an "
                            "argument of g nor the result of an op that ran where the check "
                            "records: it was computed out of sight (with the dispatch modes "
                            "disabled?). Compute every value through the dispatcher, below your "
                            "mode.")
            return None

    return Recorder()


# --------------------------------------------------------------------------- one program
def _compare(got, want, what: str, where: str, fix: str) -> None:
    import torch

    plain_tensor(got, f"{where}: {what}")
    if got.shape != want.shape or got.dtype != want.dtype:
        raise CheckFailure(f"{where}: {what} has shape {tuple(got.shape)} and dtype "
                           f"{got.dtype}; fn's has shape {tuple(want.shape)} and dtype "
                           f"{want.dtype}.")
    if want.is_floating_point():
        same = torch.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    else:
        same = torch.equal(got, want)
    if not same:
        i, mine, ref, note = mismatch(got, want)
        index = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), want.shape))
        raise CheckFailure(f"{where}: element {index} of {what} is {mine}; fn gives "
                           f"{ref}{note} {fix}")


def _run(functionalize, source: str, kinds: str, g, n: int, m: int, dtype) -> None:
    import torch

    fn = _compile(source)
    inputs, said = _arguments(kinds, g, n, m, dtype)
    names = source.split("(", 1)[1].split(")", 1)[0].split(", ")
    where = (f"for the program\n{source.removeprefix('def ')}\nwith " +
             ", ".join(f"{name}: {s}" for name, s in zip(names, said)))
    expected = [t.clone() for t in inputs]
    versions = [t._version for t in expected]
    want = fn(*expected)
    writes = [int(t._version != v) for t, v in zip(expected, versions)]  # fn wrote into it
    args = [t.clone() for t in inputs]
    recorder = _recorder(args)
    with _torch_functionalization_off():
        g_fn = functionalize(fn)
        if not callable(g_fn):
            raise CheckFailure(f"functionalize(fn) returned {type(g_fn).__name__}, not a "
                               "callable g.")
        depth = torch._C._len_torch_dispatch_stack()
        with recorder:
            try:
                got = g_fn(*args)
            except CheckFailure:
                raise
            except Exception as exc:
                if recorder.problem:  # (what went wrong first, and likely why it raised)
                    raise CheckFailure(f"{where}: {recorder.problem}") from exc
                what = explain(type(exc).__name__, str(exc))
                raise AnswerError(f"{where}: your g raised {what}{learner_line(exc)}") from exc
            finally:
                left = torch._C._len_torch_dispatch_stack() - depth - 1
                for _ in range(max(left, 0)):
                    torch._C._pop_torch_dispatch_stack()
    if left > 0:
        raise CheckFailure(f"{where}: g returned with {left} dispatch mode(s) of yours still on "
                           "the mode stack: leave your mode (a `with` block) before g returns.")
    if recorder.problem:
        raise CheckFailure(f"{where}: {recorder.problem}")
    wants = list(want) if isinstance(want, tuple) else [want]
    gots = [got]
    if isinstance(want, tuple):
        size = f" of {len(got)}" if isinstance(got, (tuple, list)) else ""
        if not size or len(got) != len(wants):
            raise CheckFailure(f"{where}: fn returns a tuple of {len(wants)} tensors; g returned "
                               f"a {type(got).__name__}{size}.")
        gots = list(got)
    for k, (mine, ref) in enumerate(zip(gots, wants)):
        what = f"output {k}" if len(wants) > 1 else "the output"
        _compare(mine, ref, what, where,
                 "A write through a view must show in its base and in every other view of that "
                 "base, including views taken before the write.")
        if id(mine) not in recorder.known:
            raise CheckFailure(f"{where}: {what} is a tensor that no op the check recorded "
                               "produced, and not an argument of g: compute it through the "
                               "dispatcher.")
    for i, (mine, ref) in enumerate(zip(args, expected)):
        _compare(mine, ref, f"argument {names[i]} after g returned", where,
                 "fn writes into it (directly or through a view): after fn returns, write the "
                 "final value of each argument fn mutated back into it, with one copy_.")
    for i, name in enumerate(names):
        mine, ref = recorder.copies[i], writes[i]
        if mine != ref:
            raise CheckFailure(
                f"{where}: copy_ into argument {name} ran {mine} time(s); fn "
                f"{'writes into' if ref else 'never writes into'} {name}, so it should run "
                f"{ref} time(s). Write back each argument fn mutates exactly once, after fn "
                "returns, and leave the others alone: track whether a base was ever written.")


def _cases(functionalize, ctx, programs, offset: int, random_sizes: bool) -> None:
    import torch

    g = ctx.generator(offset)
    for source, kinds in programs:
        if random_sizes:
            n, m = (int(v) for v in torch.randint(3, 7, (2,), generator=g))
            dtype = (torch.float32, torch.float64)[int(torch.randint(0, 2, (), generator=g))]
        else:
            n, m, dtype = 3, 4, torch.float32
        _run(functionalize, source, kinds, g, n, m, dtype)


@check(EXERCISE)
def inplace_ops(functionalize, ctx):
    """in-place ops on intermediates and inputs: same outputs and inputs, no in-place op below"""
    _cases(functionalize, ctx, _INPLACE, 90, random_sizes=False)


@check(EXERCISE)
def writes_through_views(functionalize, ctx):
    """a write through a view shows in its base and every sibling view; no view op below"""
    _cases(functionalize, ctx, _VIEWS, 91, random_sizes=False)


@check(EXERCISE, hidden=True)
def random_programs(functionalize, ctx):
    """seventeen programs, seeded sizes and dtypes (expand, unbind, masks, transposes copied)"""
    _cases(functionalize, ctx, _HIDDEN, 92, random_sizes=True)
