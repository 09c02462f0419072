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

How: the judge sends each program's source and arguments to the learner's kernel, where
``probes.functionalized`` calls ``functionalize(fn)`` and runs ``g`` under a recording
``TorchDispatchMode`` entered before ``g`` runs, so it sits below any mode the answer enters and
sees what that mode's kernels run (an op with a tensor-subclass argument is left to the subclass
with ``NotImplemented``; what the subclass runs on plain tensors comes back to the recorder). The
probe returns plain data only: each recorded operator's name and schema, whether its output
shares memory with an input, which argument of ``g`` a ``copy_`` wrote into, the shapes of the
tensors it read that no recorded operator made; ``g``'s outputs and its arguments afterwards as
plain tensors. The judge decides from that record. Operators on meta tensors compute no data and
are not recorded. Every tensor a judged operator reads, and every tensor ``g`` returns, must be
an argument of ``g`` or the output of a recorded operator (constants of at most one element,
such as the scalar that ``y[0] = 2.0`` lifts, are allowed): a value computed with the dispatch
modes disabled is refused by that rule. PyTorch's own functionalization is switched off in the
kernel while the answer runs (``torch.func.functionalize``, ``torch._to_functional_tensor``,
functorch's ``_wrap_functional_tensor``, ``FunctionalTensorMode``: the probe reports any call,
even one the answer caught), and an operator that reaches the recorder with ``Functionalize`` in
the thread-local include set (the C++ pass, however entered) is refused.

The oracle is ``fn`` itself, run eagerly in the grader's process on clones of the same arguments:
its outputs, its arguments afterwards, and which arguments it wrote into (their version counters
moved). Not ``torch.func.functionalize(fn, remove="mutations_and_views")``: on 2.13 its
``contiguous()`` and ``reshape()`` of a transposed view alias where eager copies, so it writes into
an argument that eager leaves alone (``y = x.t().contiguous(); y.add_(1)``). Public: in-place
operators on intermediates and inputs; writes through views (siblings, transposes, views of
inputs). Hidden (seeded sizes and values, float32/float64): seventeen programs covering expand,
chained views with steps, unbind/split, diagonal, masks and index_put, ``x[idx] += ...``, non-
contiguous and 3-d inputs, int64 tensors, factories, copy_ with broadcasting and dtype change,
values read before a later mutation, two mutated inputs, and copies (``contiguous``, ``reshape``)
of transposed views.
(torch/_functorch/eager_transforms.py: functionalize; torch/_subclasses/functional_tensor.py:
FunctionalTensorMode; aten/src/ATen/FunctionalTensorWrapper.h: FunctionalTensorWrapper.)
"""
from __future__ import annotations

import math
from collections import Counter

from grader.checks import AnswerError, AnswerRaised, CheckFailure, check, explain, paired
from labs.dispatcher import probes
from labs.dispatcher.checks._numbers import mismatch
from labs.dispatcher.checks._plain import tensor

EXERCISE = "dispatcher.functionalize"
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
    """The program's ``fn``, compiled as the probe compiles it."""
    return probes.compile_program(source)


def _arguments(kinds: str, g, n: int, m: int, dtype):
    """The arguments a program takes, drawn from ``g``, as the probe receives them (``[tensor,
    "t" or ""]``: "t" for one passed transposed), and their description."""
    import torch

    args, said = [], []
    for kind in kinds.split():
        how = ""
        if kind in ("x", "b"):
            t = torch.randn(n, m, generator=g, dtype=dtype)
        elif kind == "xt":
            t, how = torch.randn(m, n, generator=g, dtype=dtype), "t"
        elif kind == "x3":
            t = torch.randn(2, n, m, generator=g, dtype=dtype)
        elif kind == "idx":
            t = torch.randperm(n, generator=g)[: max(1, n // 2)]
        elif kind == "mask":
            t = torch.rand(n, m, generator=g) > 0.5
        else:
            t = torch.randint(-5, 6, (n, m), generator=g)
        args.append([t, how])
        shape = tuple(t.t().shape) if how else tuple(t.shape)
        note = ", not contiguous (a transpose)" if how else ""
        said.append(f"{str(t.dtype).removeprefix('torch.')} {shape}{note}")
    return args, said


# --------------------------------------------------------------------------- the recorded ops
def _problem(op: dict, copies: Counter) -> str | None:
    """What is wrong with one operator the probe recorded below the answer's machinery (see the
    module docstring), or None; counts a ``copy_`` into an argument of g in ``copies``."""
    import torch

    schema = torch._C.parse_schema(op["schema"])
    if op["functionalize"]:
        return OFF.format(what=f"{op['op']} ran with the Functionalize key on: that key")
    if op["op"] == "aten.copy_.default" and op["into"] is not None:
        copies[op["into"]] += 1
    elif schema.is_mutable:
        written = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
        return (f"{op['op']} ran below your mode: it writes into its argument "
                f"`{', '.join(written)}` (schema `{schema}`). An in-place op of fn must "
                "reach the kernels as its out-of-place twin (add_ -> add), whose result "
                "becomes the tensor's new value; only the final copy_ into an argument of "
                "g may write.")
    elif (op["op"] != "aten.lift_fresh.default" and op["shares"]
          and any(r.alias_info is not None for r in schema.returns)):
        return (f"{op['op']} ran below your mode and returns a view of its input (schema "
                f"`{schema}`): the program below must not alias either. Produce the "
                "values a view holds with an op that copies (a *_copy op, "
                "as_strided_copy), and remember which base it views.")
    for shape in op["unknown"]:
        if math.prod(shape) > 1:
            return (f"{op['op']} read a tensor of shape {tuple(shape)} that is neither an "
                    "argument of g nor the result of an op that ran where the check "
                    "records: it was computed out of sight (with the dispatch modes "
                    "disabled?). Compute every value through the dispatcher, below your "
                    "mode.")
    return None


def _recorded(ops) -> tuple[str | None, Counter]:
    """(the first problem among the recorded operators or None, the copy_ count per argument)."""
    copies: Counter = Counter()
    problem = None
    for op in ops:
        problem = problem or _problem(op, copies)
    return problem, copies


# --------------------------------------------------------------------------- one program
def _compare(entry, want, what: str, where: str, fix: str) -> None:
    import torch

    got = tensor(entry, f"{where}: {what}")
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


class _Case:
    """One program, the arguments the probe gets, and what eager ``fn`` does with them (the
    oracle): its outputs, its arguments afterwards, and which arguments it wrote into."""

    def __init__(self, source: str, kinds: str, g, n: int, m: int, dtype):
        self.source = source
        self.args, said = _arguments(kinds, g, n, m, dtype)
        self.names = source.split("(", 1)[1].split(")", 1)[0].split(", ")
        self.where = (f"for the program\n{source.removeprefix('def ')}\nwith " +
                      ", ".join(f"{name}: {s}" for name, s in zip(self.names, said)))
        self.after = [t.clone().t() if how else t.clone() for t, how in self.args]
        versions = [t._version for t in self.after]
        self.want = _compile(source)(*self.after)
        self.writes = [int(t._version != v) for t, v in zip(self.after, versions)]


_SHIPPED = ("the grader's probe did not run as shipped (answers must not modify the grader)")


def _judge(case: _Case, seen) -> None:
    """Compare what the probe saw of g on ``case`` with eager fn."""
    where = case.where
    if type(seen) is not dict or type(seen.get("refused")) is not list:
        raise CheckFailure(f"what came back from your answer is not a program's record: "
                           f"{_SHIPPED}.")
    if seen["refused"]:
        raise CheckFailure(OFF.format(what=seen["refused"][0]))
    if "raised" in seen:
        raise AnswerRaised(seen["raised"])
    if "not_callable" in seen:
        raise CheckFailure(f"functionalize(fn) returned {seen['not_callable']}, not a "
                           "callable g.")
    problem, copies = _recorded(seen["ops"])
    if seen["g_raised"] is not None:
        if problem:  # (what went wrong first, and likely why it raised)
            raise CheckFailure(f"{where}: {problem}")
        r = seen["g_raised"]
        raise AnswerError(f"{where}: your g raised {explain(r['ename'], r['evalue'])}"
                          f"{r['where']}")
    if seen["left"] > 0:
        raise CheckFailure(f"{where}: g returned with {seen['left']} dispatch mode(s) of yours "
                           "still on the mode stack: leave your mode (a `with` block) before g "
                           "returns.")
    if problem:
        raise CheckFailure(f"{where}: {problem}")
    want, out = case.want, seen["out"]
    wants = list(want) if isinstance(want, tuple) else [want]
    if isinstance(want, tuple):
        size = f" of {len(out['items'])}" if out["seq"] else ""
        if not size or len(out["items"]) != len(wants):
            raise CheckFailure(f"{where}: fn returns a tuple of {len(wants)} tensors; g returned "
                               f"a {out['type']}{size}.")
        gots, known = out["items"], out["known"]
    elif out["seq"]:  # a sequence where fn returns one tensor
        gots, known = [{"type": out["type"], "tensor": False}], [True]
    else:
        gots, known = out["items"], out["known"]
    for k, (ref, (mine, made)) in enumerate(paired(wants, list(zip(gots, known)), "outputs")):
        what = f"output {k}" if len(wants) > 1 else "the output"
        _compare(mine, ref, what, where,
                 "A write through a view must show in its base and in every other view of that "
                 "base, including views taken before the write.")
        if not made:
            raise CheckFailure(f"{where}: {what} is a tensor that no op the check recorded "
                               "produced, and not an argument of g: compute it through the "
                               "dispatcher.")
    for i, (ref, mine) in enumerate(paired(case.after, seen["args"], "arguments")):
        _compare(mine, ref, f"argument {case.names[i]} after g returned", where,
                 "fn writes into it (directly or through a view): after fn returns, write the "
                 "final value of each argument fn mutated back into it, with one copy_.")
    for i, name in enumerate(case.names):
        mine, ref = copies[i], case.writes[i]
        if mine != ref:
            raise CheckFailure(
                f"{where}: copy_ into argument {name} ran {mine} time(s); fn "
                f"{'writes into' if ref else 'never writes into'} {name}, so it should run "
                f"{ref} time(s). Write back each argument fn mutates exactly once, after fn "
                "returns, and leave the others alone: track whether a base was ever written.")


def _cases(functionalize, ctx, programs, offset: int, random_sizes: bool) -> None:
    """Draw each program's sizes and arguments, run them all in one probe, judge each."""
    import torch

    g = ctx.generator(offset)
    cases = []
    for source, kinds in programs:
        if random_sizes:
            n, m = (int(v) for v in torch.randint(3, 7, (2,), generator=g))
            dtype = (torch.float32, torch.float64)[int(torch.randint(0, 2, (), generator=g))]
        else:
            n, m, dtype = 3, 4, torch.float32
        cases.append(_Case(source, kinds, g, n, m, dtype))
    seen = functionalize.probe(probes.functionalized, [[c.source, c.args] for c in cases])
    for case, one in paired(cases, seen, "programs"):
        _judge(case, one)


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
