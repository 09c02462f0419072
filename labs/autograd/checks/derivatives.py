"""Checks of ``autograd.derivatives``: the learner's ``generate_backward(entry)``, which turns one
entry of the ``derivatives.yaml`` shipped in the wheel (``torchgen/packaged/autograd/``) into a
``torch.autograd.Function`` called as ``Fn.apply(*arguments in schema order)``.

Oracles, all read or run at check time: the yaml entries themselves (loaded from the installed
torchgen, never copied here), the aten op an entry names (``torch.ops.aten.<name>.<overload>``)
for values, ``torch.autograd.grad`` through that op for gradients, and the ``_saved_*`` fields of
the node that op records for what must be saved. Public checks use five named ops; hidden ones
draw ops from :data:`SUPPORTED` with broadcasting shapes, and hand the generator entries whose
formulas the check edited (one op's name with another op's formula, or a negated formula), whose
gradients are still torch's (the other op's, or the negated one): only a backward that evaluates
the formula text passes, not one that obtains the op's gradient from torch.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torchgen
import yaml  # imported here, before any notebook code runs, so the guard watches its names

from grader.checks import AnswerRaised, CheckFailure, check, explain
from labs.autograd import probes
from labs.autograd.checks._plain import exact_shown, is_a, rebuilt, type_name

EXERCISE = "autograd.derivatives"

#: the unary ops whose formulas use only ``grad`` and ``self``
UNARY_SELF = ("sin", "cos", "sinh", "cosh", "asin", "acos", "atan", "asinh", "atanh", "log",
              "log2", "log10", "log1p", "abs", "neg", "erf", "erfc", "erfinv", "lgamma",
              "digamma", "i0")
#: the entries the exercise supports (the task cell lists the same), by ``name`` before ``(``
SUPPORTED = UNARY_SELF + (
    "tan", "tanh", "exp", "exp2", "expm1", "sqrt", "rsqrt", "reciprocal", "sigmoid",
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "hypot", "logaddexp", "logaddexp2",
    "maximum", "minimum", "xlogy.Tensor", "fmod.Tensor", "remainder.Tensor",
    "lerp.Tensor", "addcmul", "addcdiv",
    "add.Scalar", "mul.Scalar", "div.Scalar", "pow.Tensor_Scalar")
PUBLIC = ("sin", "exp", "mul.Tensor", "add.Tensor", "pow.Tensor_Scalar")
#: broadcasting shapes for ops with 1, 2 and 3 tensor arguments
_SHAPES = {1: [[(3,)], [(2, 3)], [()], [(2, 1, 3)]],
           2: [[(3, 1), (4,)], [(2, 3), (2, 3)], [(), (3,)], [(4,), (1,)]],
           3: [[(3, 1), (4,), (1, 4)], [(2,), (2,), (2,)], [(), (3,), (2, 1)]]}
_SCALARS = (-1.5, -0.5, 0.5, 1.0, 2.0, 3.0)


@functools.lru_cache(maxsize=1)
def _entries() -> dict:
    """The wheel's derivatives.yaml as {name before '(': entry}."""
    path = Path(torchgen.__file__).parent / "packaged" / "autograd" / "derivatives.yaml"
    with open(path) as f:
        entries = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return {e["name"].split("(")[0]: e for e in entries}


def _op(name: str):
    """The aten OpOverload of an entry name such as ``mul.Tensor``."""
    import torch

    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _arguments(name: str, g):
    """Seeded arguments for op ``name`` in schema order: float64 tensors in (0.1, 0.9) with
    broadcasting shapes, Python floats for Scalars."""
    import torch

    schema = _op(name)._schema.arguments
    n = sum(str(a.type) == "Tensor" for a in schema)
    shapes = iter(_SHAPES[n][int(torch.randint(len(_SHAPES[n]), (), generator=g))])
    return [torch.rand(next(shapes), generator=g, dtype=torch.float64) * 0.8 + 0.1
            if str(a.type) == "Tensor" else _SCALARS[int(torch.randint(6, (), generator=g))]
            for a in schema]


def _call_op(name: str, values):
    """The aten op on ``values`` (schema order), keyword-only arguments by keyword."""
    schema = _op(name)._schema.arguments
    return _op(name)(*[v for a, v in zip(schema, values) if not a.kwarg_only],
                     **{a.name: v for a, v in zip(schema, values) if a.kwarg_only})


def _report() -> CheckFailure:
    return CheckFailure("what came back from your generate_backward is not the probe's report.")


def _leaves(values):
    import torch

    return [v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) else v
            for v in values]


def _applied(seen, name: str):
    """The output of ``Fn.apply(...)`` the probe reported (its ``"compare"`` or ``"saved"``
    part), checked for type and grad_fn."""
    import torch

    if type(seen) is not dict:
        raise _report()
    out = rebuilt(seen.get("out"))
    if not is_a(out, torch.Tensor):
        raise CheckFailure(f"{name}: Fn.apply(...) returned {type_name(out)}, not a tensor.")
    exact_shown(out, (torch.Tensor, torch.nn.Parameter), f"{name}: the output of Fn.apply(...)")
    if seen.get("recorded") is not True:
        raise CheckFailure(
            f"{name}: the output's grad_fn is {seen.get('grad_fn')}, not your Function's "
            "node. Call the aten op inside forward (it runs with grad mode off), so that apply() "
            "records your backward in the graph.")
    return out


def _compare(name: str, values, g, *, oracle=None, why: str = "the aten op"):
    """``(request, judge)``: the probe's ``"compare"`` request for op ``name`` on ``values``,
    and the judge of its result: forward output against the aten op ``name``; gradients
    against ``oracle(leaves, v)`` (default: torch.autograd.grad through the op) for the same
    seeded ``v``."""
    import torch

    tensor_names = [a.name for a in _op(name)._schema.arguments if str(a.type) == "Tensor"]
    real = _call_op(name, values)
    v = torch.randn(real.shape, generator=g, dtype=torch.float64)

    def judge(seen, raised):
        out = _applied(seen, name)
        if out.shape != real.shape or out.dtype != real.dtype or not torch.allclose(
                out, real, rtol=1e-10, atol=1e-12, equal_nan=True):
            raise CheckFailure(f"{name}: Fn.apply(...) gives {tuple(out.shape)} {out.dtype} "
                               "values that differ from the aten op's: forward must call the op "
                               "the entry names, with every argument in schema order.")
        if "grads_raised" in seen:
            r = seen["grads_raised"] if type(seen["grads_raised"]) is dict else {}
            first = (str(r.get("evalue") or "").splitlines() or [""])[0]
            raise CheckFailure(f"{name}: backward through your Function raised "
                               f"{explain(str(r.get('ename')), first)}{r.get('where', '')}.")
        if "grads" not in seen and type(raised) is dict:
            raise AnswerRaised(raised)
        got = [rebuilt(a) for a in seen.get("grads") or []]
        if len(got) != len(tensor_names):
            raise _report()
        theirs = _leaves(values)
        want = (oracle or (lambda xs, v: _torch_grads(_call_op(name, xs), xs, v)))(theirs, v)
        for arg, a, b in zip(tensor_names, got, want, strict=True):
            if a is None and b is not None:
                raise CheckFailure(
                    f"{name}: your Function gives no gradient for `{arg}` (backward returned "
                    f"None there), but the entry has a formula for `{arg}`: evaluate the "
                    "formula of every differentiable input the entry lists.")
            if a is None:
                continue
            exact_shown(a, (torch.Tensor, torch.nn.Parameter),
                        f"{name}: the gradient your backward returns for `{arg}`")
            if b is None or a.shape != b.shape or not torch.allclose(a, b, rtol=1e-8,
                                                                     atol=1e-10):
                raise CheckFailure(f"{name}: the gradient for `{arg}` differs from "
                                   f"torch.autograd.grad through {why}. {_FORMULA_HINT}")

    return {"values": list(values), "v": v}, judge


def _torch_grads(out, values, v):
    """torch.autograd.grad of ``out`` for the tensors among ``values`` (None where unused)."""
    import torch

    tensors = [t for t in values if isinstance(t, torch.Tensor)]
    return torch.autograd.grad(out, tensors, v, allow_unused=True)


_FORMULA_HINT = ("Evaluate the entry's formula with `grad` bound to the incoming gradient, each "
                 "argument name (`self`, `other`, ...) to that argument's saved value and "
                 "`result` to the op's output.")


def _compare_saved(name: str, values):
    """``(request, judge)``: the probe's ``"saved"`` request for op ``name`` on ``values``, and
    the judge of its result: what the answer's node saved (``ctx.saved_names`` over
    ``ctx.saved_tensors``, Scalar arguments as ctx attributes) against the ``_saved_*`` fields
    of the op's own node."""
    import torch

    keys = [a.name for a in _op(name)._schema.arguments] + ["result"]

    def judge(seen, raised):
        _applied(seen, name)
        real = _call_op(name, _leaves(values)).grad_fn
        Node = type(real).__name__
        fields = {n[len("_saved_"):]: getattr(real, n) for n in dir(real)
                  if n.startswith("_saved_")}
        want_t = {k: t for k, t in fields.items() if isinstance(t, torch.Tensor)}
        want_s = {k: x for k, x in fields.items() if type(x) in (int, float)}
        if "names" not in seen and type(raised) is dict:
            raise AnswerRaised(raised)
        names = exact_shown(rebuilt(seen.get("names")), (tuple, list),
                            f"{name}: ctx.saved_names (the names of what you passed to "
                            "save_for_backward)")
        tensors = [rebuilt(t) for t in seen.get("tensors") or []]
        if len(names) != len(tensors) or any(type(n) is not str for n in names):
            raise CheckFailure(f"{name}: ctx.saved_names must hold one name (a str) per tensor "
                               f"passed to ctx.save_for_backward ({len(tensors)} tensors, "
                               f"{len(names)} names).")
        attributes = seen.get("attributes") if type(seen.get("attributes")) is dict else {}
        attrs = {k: rebuilt(attributes[k]) for k in keys if k in attributes and k not in names}
        got = sorted([*names, *attrs])
        if got != sorted([*want_t, *want_s]):
            raise CheckFailure(
                f"{name}: your Function saved {got or 'nothing'}; the op's own node {Node} saves "
                f"{sorted([*want_t, *want_s]) or 'nothing'} (its `_saved_*` fields). Save "
                "exactly the arguments (and `result`, the output) that the entry's formulas "
                "name; a name used only in `x.scalar_type()` needs x's dtype, not x.")
        for k, value in attrs.items():
            if k in want_t:
                raise CheckFailure(f"{name}: you kept the tensor `{k}` as a ctx attribute; save "
                                   "tensors with ctx.save_for_backward (and name them in "
                                   "ctx.saved_names), as the node keeps a SavedVariable.")
            if type(value) not in (int, float) or value != want_s[k]:
                raise CheckFailure(f"{name}: ctx.{k} is {value!r}; {Node}._saved_{k} is "
                                   f"{want_s[k]!r}: keep the Scalar argument `{k}` as it was "
                                   "passed (a Python number), as a ctx attribute.")
        for n, t in zip(names, tensors, strict=True):
            if n not in want_t:
                raise CheckFailure(f"{name}: you saved the Scalar `{n}` as a tensor; {Node} "
                                   f"keeps it as a number (_saved_{n} is {want_s[n]!r}): store "
                                   "it as a ctx attribute.")
            exact_shown(t, (torch.Tensor, torch.nn.Parameter),
                        f"{name}: the tensor you saved as `{n}`")
            if t.shape != want_t[n].shape or not torch.equal(t, want_t[n]):
                raise CheckFailure(
                    f"{name}: the tensor you saved as `{n}` is not what {Node}._saved_{n} "
                    "holds: `result` is the op's output, every other name the argument of that "
                    "name.")

    return {"values": list(values), "keys": keys}, judge


def _judge(generate_backward, items: list) -> None:
    """Run ``items`` (``(entry, compare, saved)``, ``compare`` and ``saved`` each a ``(request,
    judge)`` pair or None) through the answer in the kernel (one probe call) and judge each
    result in order."""
    requests = [{"entry": entry, "compare": c and c[0], "saved": s and s[0]}
                for entry, c, s in items]
    seen = generate_backward.probe(probes.derivative_runs, requests)
    if type(seen) is not list or any(type(r) is not dict for r in seen):
        raise _report()
    for i, (entry, compare, saved) in enumerate(items):
        if i >= len(seen):
            raise _report()
        got = seen[i]
        if "function" not in got:
            if type(got.get("raised")) is dict:
                raise AnswerRaised(got["raised"])
            raise _report()
        if got["function"] is not True:
            raise CheckFailure(f"generate_backward(entry of {entry['name'].split('(')[0]}) "
                               f"returned {got.get('type')}; return a class deriving from "
                               "torch.autograd.Function.")
        for part, pair in (("compare", compare), ("saved", saved)):
            if pair is None:
                continue
            if part not in got:
                if type(got.get("raised")) is dict:
                    raise AnswerRaised(got["raised"])
                raise _report()
            pair[1](got[part], got.get("raised"))


# --------------------------------------------------------------------------- checks


@check(EXERCISE)
def values_and_gradients(generate_backward, ctx):
    """values and gradients match the aten op (sin, exp, mul, add, pow.Tensor_Scalar)"""
    g = ctx.generator(50)
    _judge(generate_backward, [(_entries()[name], _compare(name, _arguments(name, g), g), None)
                               for name in PUBLIC])


@check(EXERCISE)
def saves_what_the_node_saves(generate_backward, ctx):
    """saves what the op's own node saves (its _saved_* fields), for the same five ops"""
    g = ctx.generator(51)
    _judge(generate_backward, [(_entries()[name], None, _compare_saved(name, _arguments(name, g)))
                               for name in PUBLIC])


@check(EXERCISE, hidden=True)
def random_supported_ops(generate_backward, ctx):
    """values, gradients and saved fields match torch on seeded ops drawn from the yaml"""
    import torch

    g = ctx.generator(52)
    pool = [n for n in SUPPORTED if n not in PUBLIC]
    items = []
    for i in torch.randperm(len(pool), generator=g)[:10].tolist():
        compare = _compare(pool[i], _arguments(pool[i], g), g)
        items.append((_entries()[pool[i]], compare,
                      _compare_saved(pool[i], _arguments(pool[i], g))))
    _judge(generate_backward, items)


@check(EXERCISE, hidden=True)
def follows_edited_formulas(generate_backward, ctx):
    """follows the entry's formula text when the check edits it"""
    import torch

    g = ctx.generator(53)

    def pick(seq):
        return seq[int(torch.randint(len(seq), (), generator=g))]

    items = []
    unary = [n for n in SUPPORTED if len(_op(n)._schema.arguments) == 1]
    for _ in range(2):  # op a's name with op b's `self:` formula: the gradient is b's
        a = pick(unary)
        b = pick([n for n in UNARY_SELF if n != a])
        entry = dict(_entries()[a], self=_entries()[b]["self"])
        items.append((entry, _compare(
            a, _arguments(a, g), g,
            oracle=lambda xs, v, b=b: _torch_grads(_call_op(b, xs), xs, v),
            why=f"{b} (the check gave you {a}'s entry with {b}'s formula "
                f"`self: {entry['self']}`: the formula text, not the op, says the gradient)"),
            None))
    multi = [n for n in SUPPORTED
             if sum(str(x.type) == "Tensor" for x in _op(n)._schema.arguments) > 1]
    name = pick(multi)
    args = [a.name for a in _op(name)._schema.arguments if str(a.type) == "Tensor"]
    k = int(torch.randint(len(args), (), generator=g))
    entry = dict(_entries()[name], **{args[k]: f"-({_entries()[name][args[k]]})"})

    def negated(xs, v):
        grads = list(_torch_grads(_call_op(name, xs), xs, v))
        grads[k] = -grads[k]
        return grads

    items.append((entry, _compare(
        name, _arguments(name, g), g, oracle=negated,
        why=f"{name} with its gradient for `{args[k]}` negated (the check gave you the "
            f"entry with `{args[k]}: {entry[args[k]]}`: the formula text, not the op, says "
            "the gradient)"), None))
    _judge(generate_backward, items)
