"""Checks of ``dispatcher.subclass``: the learner's ``ScaledTensor(inner, scale)``, a
``__torch_dispatch__`` wrapper subclass whose value is ``inner * scale``.

Oracle: every program runs twice, once on ScaledTensors in the learner's kernel
(``probes.scaled_tensor``) and once here, in the grader's process, on the dense tensors
``inner * scale`` they stand for; torch's results on the dense tensors (values, and gradients from
its autograd) are what the ScaledTensor results must equal. Both sides draw the programs and their
inputs from the same seeded generator (``probes.subclass_cases``). Floating-point outputs must
come back as ScaledTensors, other outputs (bool and integer tensors, Python numbers) as plain
values; the probe returns each ScaledTensor as its parts (``.inner``, ``.scale``, and the shape,
dtype and device its TensorImpl records), and ``inner * scale`` is computed here.
"""
from __future__ import annotations

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.dispatcher import probes
from labs.dispatcher.checks._numbers import mismatch
from labs.dispatcher.checks._plain import refuse

EXERCISE = "dispatcher.subclass"


# --------------------------------------------------------------------------- helpers
def _cases(ScaledTensor, name: str, seed: int) -> list[tuple[dict, dict]]:
    """(case, what the probe saw) for each case of the check ``name`` that the probe ran, after
    the structural checks every use needs: a torch.Tensor subclass with its own
    __torch_dispatch__."""
    seen = ScaledTensor.probe(probes.scaled_tensor, name, seed)
    facts = seen["class"]
    if not facts["tensor_class"]:
        raise CheckFailure("ScaledTensor must be a class deriving from torch.Tensor "
                           f"(got {facts['type']}).")
    if not facts["dispatch"]:
        raise CheckFailure("ScaledTensor does not define __torch_dispatch__ (it inherits "
                           "torch.Tensor's). Define it as a classmethod __torch_dispatch__(cls, "
                           "func, types, args=(), kwargs=None).")
    return paired(probes.subclass_cases(name, seed), seen["cases"], "cases")


def _raised(seen: dict) -> None:
    """Re-raise what the answer raised where the probe stopped."""
    if "raised" in seen:
        raise AnswerRaised(seen["raised"])


def _made(made: dict, inner) -> None:
    """ScaledTensor(inner, scale), as the probe saw it, with its attributes and metadata
    checked."""
    if made["kind"] != "scaled":
        raise CheckFailure(f"ScaledTensor(inner, scale) returned a {made['type']}, not a "
                           "ScaledTensor.")
    _parts(made, "ScaledTensor(inner, scale)", scales=("float",))
    shape, dtype, device = made["meta"]
    if tuple(shape) != tuple(inner.shape) or dtype != inner.dtype or device != inner.device:
        raise CheckFailure(
            f"ScaledTensor(inner, scale) for inner of shape {tuple(inner.shape)}, {inner.dtype} "
            f"has shape {tuple(shape)}, dtype {dtype}, device {device}: pass inner's shape, "
            "strides, dtype and device to torch.Tensor._make_wrapper_subclass.")


# What the answer's class says about its own objects is not trusted: its __torch_function__ may
# answer .shape, .dtype, allclose or equal with anything. The probe reads a wrapper's metadata
# with torch functions disabled for subclasses; the checks require .inner to be a plain tensor
# (or, nested, a ScaledTensor) and .scale a plain float, and compute inner * scale themselves on
# plain tensors.

def _parts(t: dict, what: str, depth: int = 0, scales=("float", "int")):
    """(inner, scale) of ``t`` (a leaf as ``probes._scaled_leaf`` gives it), which must be
    exactly a ScaledTensor (not a subclass of it), with .inner a plain tensor or a ScaledTensor
    and .scale exactly one of ``scales`` (a Python float; an int is tolerated in results, as
    inner * scale means the same)."""
    if not t["exact"]:
        raise CheckFailure(f"{what} is a {t['type']}, a subclass of ScaledTensor; results must "
                           "be ScaledTensors themselves (cls(inner, scale) in "
                           "__torch_dispatch__).")
    inner, scale = t["inner"], t["scale"]
    subclass = type(scale) is dict
    ok = (any(scale[k] for k in scales) if subclass else type(scale).__name__ in scales)
    if inner is None or not ok:
        raise CheckFailure("ScaledTensor(inner, scale) must store the tensor as .inner and the "
                           "scale as a Python float .scale.")
    if subclass:
        refuse(scale["type"], True, f"the .scale of {what}", next(k for k in scales if scale[k]))
    if inner["kind"] in ("scaled", "deep") and inner.get("exact", True):
        if depth > 8:
            raise CheckFailure(f"{what} nests ScaledTensors more than 8 deep in .inner; keep "
                               ".inner a plain tensor.")
    else:
        _plain(inner, f"the .inner of {what}")
    return inner, scale


def _plain(v: dict, what: str):
    """The plain tensor of a leaf, or ``plain_tensor``'s refusal."""
    if v["kind"] != "tensor":
        refuse(v["type"], v["kind"] in ("scaled", "tensor_sub"), what, "Tensor")
    return v["value"]


def _dense(v: dict, what: str, depth: int = 0):
    """The plain tensor ``v`` stands for, computed here on plain tensors: inner * scale for a
    ScaledTensor (inner itself may be scaled), ``v`` itself for a plain tensor; anything else (a
    subclass that could lie about its values) is refused."""
    if v["kind"] == "scaled":
        inner, scale = _parts(v, what, depth)
        return _dense(inner, f"the .inner of {what}", depth + 1) * scale
    return _plain(v, what)


def _describe(inner, scale, scaled: bool) -> str:
    """A program input, for messages."""
    kind = f"ScaledTensor(scale={float(scale)})" if scaled else "tensor"
    return f"{kind} of shape {tuple(inner.shape)}, {str(inner.dtype)[6:]}"


def _tolerance(want):
    """rtol, atol for comparing with a dense result (atol grows with its magnitude)."""
    import torch

    big = float(want.detach().abs().max()) if want.numel() and want.is_floating_point() else 0.0
    if want.dtype == torch.float64:
        return 1e-7, 1e-9 * (1.0 + big)
    return 1e-4, 1e-5 * (1.0 + big)


def _match(flat_got: list, want, where: str) -> None:
    """got (the leaves from ScaledTensors, as the probe saw them) against want (from dense
    tensors): structure, types and values."""
    import torch
    from torch.utils._pytree import tree_flatten

    flat_want, _ = tree_flatten(want)
    if len(flat_got) != len(flat_want):
        raise CheckFailure(f"{where}: returned {len(flat_got)} value(s); on dense tensors torch "
                           f"returns {len(flat_want)}. Return the op's outputs in the same "
                           "structure (tree_map over them).")
    for k, (a, b) in enumerate(zip(flat_got, flat_want)):
        which = f"{where}, output {k}" if len(flat_want) > 1 else where
        if isinstance(b, torch.Tensor):
            if a["kind"] not in ("scaled", "tensor", "tensor_sub"):
                raise CheckFailure(f"{which}: returned {a['type']}, expected a tensor.")
            if b.is_floating_point():
                if a["kind"] != "scaled":
                    raise CheckFailure(
                        f"{which}: returned a plain {a['type']}; floating-point results must "
                        "come back as ScaledTensors. Wrap every floating-point tensor that func "
                        "returns (tree_map_only over the outputs) before returning from "
                        "__torch_dispatch__.")
                value = _dense(a, which)      # checks a's type, .inner and .scale first
                shape, dtype, _ = a["meta"]
                if tuple(shape) != tuple(b.shape) or dtype != b.dtype:
                    raise CheckFailure(
                        f"{which}: the ScaledTensor says shape {tuple(shape)}, dtype {dtype}; "
                        f"torch gives shape {tuple(b.shape)}, dtype {b.dtype} on the dense "
                        "tensors.")
                if value.shape != b.shape:
                    raise CheckFailure(f"{which}: the result's inner has shape "
                                       f"{tuple(value.shape)}, but the ScaledTensor says "
                                       f"{tuple(b.shape)}: build the wrapper from inner's shape.")
                rtol, atol = _tolerance(b)
                if not torch.allclose(value, b.detach(), rtol=rtol, atol=atol, equal_nan=True):
                    i, mine, ref, note = mismatch(value, b)
                    raise CheckFailure(
                        f"{which}: value element {i} is {mine} (inner * scale); the same program "
                        f"on dense tensors gives {ref}{note}")
            else:
                if a["kind"] != "tensor":
                    raise CheckFailure(
                        f"{which}: a {b.dtype} result came back as {a['type']}; only "
                        "floating-point results are ScaledTensors. Return bool and integer "
                        "tensors as plain tensors.")
                v = a["value"]
                if v.shape != b.shape or v.dtype != b.dtype or not torch.equal(v, b):
                    raise CheckFailure(f"{which}: the {b.dtype} result differs from torch's on "
                                       "the dense tensors.")
        elif isinstance(b, (bool, int, float)):
            if a["kind"] in ("scaled", "tensor", "tensor_sub"):
                raise CheckFailure(f"{which}: returned a tensor; torch gives {b!r} on the dense "
                                   "tensors.")
            if a["kind"] == "number_sub":       # a subclass could claim to equal anything
                refuse(a["type"], True, which, a["base"])
            v = a.get("value")
            if a["kind"] != "number" or not (v == b or abs(v - b) <= 1e-5 * (1 + abs(b))):
                shown = repr(v) if a["kind"] == "number" else f"a {a['type']}"
                raise CheckFailure(f"{which}: returned {shown}; torch gives {b!r} on the dense "
                                   "tensors.")


def _run_case(case: dict, seen: dict) -> None:
    """A "run" case: fn on ScaledTensor inputs (in the kernel) and on the dense tensors they
    stand for (here); compare the results and the inputs afterwards (in-place ops must update
    the ScaledTensor's value)."""
    _raised(seen)
    made = iter(seen["made"])
    for inner, _, is_scaled in case["inputs"]:
        if is_scaled:
            _made(next(made), inner)
    dense = [(inner * s).clone() for inner, s, _ in case["inputs"]]
    where = f"{case['label']} with " + ", ".join(_describe(*x) for x in case["inputs"])
    want = case["fn"](*dense)
    if "fn_raised" in seen:
        exc = AnswerRaised(seen["fn_raised"])
        if exc.ename == "NotImplementedError" and exc.evalue == EXERCISE:
            raise exc
        text = (exc.evalue.strip().splitlines() or [""])[0][:200]
        raise CheckFailure(f"{where}: raised {exc.ename}: {text}{exc.record.get('where', '')}; "
                           "on dense tensors torch computes it without error.")
    _match(seen["out"], want, where)
    for k, (after, d) in enumerate(zip(seen["after"], dense, strict=True)):
        if after is not None:
            _match([after], d, f"{where}: afterwards, input {k}")


def _autograd_case(case: dict, seen: dict) -> None:
    """An "autograd" case: the program on leaves (kind 's': ScaledTensor, 'd': plain tensor, both
    requiring grad) and on dense leaves; compare the output and the gradient of every leaf."""
    import torch

    _raised(seen)
    made = iter(seen["made"])
    for inner, _, kind in case["leaves"]:
        if kind == "s":
            _made(next(made), inner)
    dense_leaves = [(inner * s).requires_grad_() for inner, s, _ in case["leaves"]]
    where = f"{case['label']} with leaves " + ", ".join(
        _describe(inner * s if kind == "d" else inner, s, kind == "s")
        for inner, s, kind in case["leaves"])
    want = case["program"](*dense_leaves)
    _match(seen["out"], want, where)
    if not seen["recorded"]:
        raise CheckFailure(
            f"{where}: the result does not require grad although its leaves do, so autograd "
            "recorded nothing. __torch_dispatch__ runs below autograd: autograd records the "
            "graph on the ScaledTensors themselves as long as ScaledTensors flow out of your "
            "ops; do not unwrap in __torch_function__ or detach.")
    wants = torch.autograd.grad(want, dense_leaves, case["v"], allow_unused=True)
    if "grads_raised" in seen:
        raise AnswerRaised(seen["grads_raised"])
    for k, (mine, ref, (inner, s, kind)) in enumerate(zip(seen["grads"], wants,
                                                          case["leaves"], strict=True)):
        name = (f"the gradient of leaf {k} "
                f"({_describe(inner * s if kind == 'd' else inner, s, kind == 's')})")
        if ref is None:
            continue
        if mine is None:
            raise CheckFailure(f"{where}: {name} is None; dense autograd gives a gradient.")
        value = _dense(mine, f"{where}: {name}")
        rtol, atol = _tolerance(ref)
        if value.shape != ref.shape:
            raise CheckFailure(f"{where}: {name} has shape {tuple(value.shape)}; dense "
                               f"autograd's has {tuple(ref.shape)}.")
        if not torch.allclose(value, ref, rtol=rtol, atol=atol):
            i, got, want, note = mismatch(value, ref)
            raise CheckFailure(
                f"{where}: element {i} of {name} is {got} (as inner * scale); dense autograd "
                f"gives {want}{note} The backward pass runs aten ops on ScaledTensors too (the "
                "incoming gradient is one): check the rules those ops hit in your "
                "__torch_dispatch__ (mm and bmm, views, in-place).")


# --------------------------------------------------------------------------- checks
@check(EXERCISE)
def construction(ScaledTensor, ctx):
    """ScaledTensor(inner, scale) is a wrapper tensor with inner's shape and dtype, standing for inner * scale"""
    *makes, run = _cases(ScaledTensor, "construction", ctx.seed + 60)
    for make, seen in makes:
        _raised(seen)
        _made(seen["made"][0], make["inner"])
        _, t_scale = _parts(seen["made"][0], "ScaledTensor(inner, scale)")
        if not seen["same_inner"] or t_scale != make["scale"]:
            raise CheckFailure("ScaledTensor(inner, scale) must keep the given tensor as .inner "
                               "(not a copy) and the scale as .scale.")
        if seen["requires_grad"]:
            raise CheckFailure("a new ScaledTensor must not require grad (pass "
                               "requires_grad=False to _make_wrapper_subclass); callers use "
                               ".requires_grad_().")
        if not seen["python_key"]:
            raise CheckFailure(f"the ScaledTensor's dispatch keys are {seen['keys']}, without "
                               "Python: create it with torch.Tensor._make_wrapper_subclass so "
                               "that aten ops reach __torch_dispatch__.")
        (strides, offset), (inner_strides, inner_offset) = seen["layout"]
        if (strides, offset) != (inner_strides, inner_offset):
            raise CheckFailure(
                f"ScaledTensor(inner, scale) for an inner that is a view (strides "
                f"{tuple(inner_strides)}, storage offset {inner_offset}) has strides "
                f"{tuple(strides)} and storage offset {offset}: pass inner's strides and "
                "storage_offset to torch.Tensor._make_wrapper_subclass, so that the wrapper "
                "describes the same view of memory as inner.")
    _run_case(*run)


@check(EXERCISE)
def ops_match_dense(ScaledTensor, ctx):
    """pointwise ops, reductions, comparisons and indexing match the dense tensor"""
    for case, seen in _cases(ScaledTensor, "ops_match_dense", ctx.seed + 61):
        _run_case(case, seen)


@check(EXERCISE)
def autograd_flows(ScaledTensor, ctx):
    """gradients flow through ScaledTensor leaves and match dense autograd"""
    for case, seen in _cases(ScaledTensor, "autograd_flows", ctx.seed + 64):
        _autograd_case(case, seen)


@check(EXERCISE)
def matmul_multiplies_scales(ScaledTensor, ctx):
    """mm and bmm of two ScaledTensors multiply the inners and the scales; mixed matmuls match"""
    import torch

    for case, seen in _cases(ScaledTensor, "matmul_multiplies_scales", ctx.seed + 62):
        if case["kind"] == "run":
            _run_case(case, seen)
            continue
        _raised(seen)
        (A, s1), (B, s2) = case["a"], case["b"]
        for made, inner in zip(seen["made"], (A, B), strict=True):
            _made(made, inner)
        fn = case["fn"]
        where = (f"{case['label']} for ScaledTensors of shapes {tuple(A.shape)} (scale {s1}) and "
                 f"{tuple(B.shape)} (scale {s2})")
        _match(seen["out"], fn(A * s1, B * s2), where)
        inner, scale = _parts(seen["out"][0], where)
        if abs(scale - s1 * s2) > 1e-9 * abs(s1 * s2) or not torch.allclose(
                _dense(inner, f"the .inner of {where}"), fn(A, B)):
            raise CheckFailure(
                f"{where}: the result has scale {scale!r}; expected inner = a.inner @ b.inner and "
                f"scale = a.scale * b.scale = {s1 * s2!r}. Handle aten.mm and aten.bmm on two "
                "ScaledTensors without forming the dense values: (s_a A) @ (s_b B) = "
                "(s_a s_b) (A @ B).")


@check(EXERCISE)
def views_and_inplace(ScaledTensor, ctx):
    """views keep the scale and alias the original; in-place ops update the value and return self"""
    for case, seen in _cases(ScaledTensor, "views_and_inplace", ctx.seed + 63):
        _raised(seen)
        label, fn = case["label"], case["fn"]
        if case["kind"] == "view":
            inner, s = case["inner"], case["scale"]
            _made(seen["made"][0], inner)
            where = f"{label} of a ScaledTensor of shape (3, 4), scale {s}"
            _match(seen["out"], fn(inner * s), where)
            v_inner, v_scale = _parts(seen["out"][0], where)
            _plain(v_inner, f"the .inner of {where}")
            shares = seen["shares"]
            if v_scale != s or not shares:
                raise CheckFailure(
                    f"{where}: the view has scale {v_scale} and "
                    f"{'shares' if shares else 'does not share'}"
                    " the original's inner storage. A view op (func.is_view) must apply func to "
                    "inner and keep the scale, so that the result aliases the original like a "
                    "view of a dense tensor does.")
            if "after_raised" in seen:
                raise AnswerRaised(seen["after_raised"])
            dense = inner * s
            fn(dense).mul_(-2.0)
            _match([seen["after"]], dense, f"after {label}.mul_(-2.0), the original")
            continue
        (A, s1), (B, s2) = case["a"], case["b"]
        for made, inner in zip(seen["made"], (A, B), strict=True):
            _made(made, inner)
        dense, dense_b = A * s1, B * s2
        fn(dense, dense_b)
        _match([seen["after"]], dense, f"after {label}, a")
        if label != "a[0] = b[1]" and not seen["same"]:
            raise CheckFailure(f"{label} returned a new object; in-place ops return their first "
                               "argument (return args[0] from __torch_dispatch__ after writing "
                               "into its inner).")


@check(EXERCISE, hidden=True)
def random_sweep(ScaledTensor, ctx):
    """a seeded sweep of random ops and shapes (pointwise, matmul, reductions, views, indexing, in-place) matches"""
    for case, seen in _cases(ScaledTensor, "random_sweep", ctx.seed + 65):
        _run_case(case, seen)


@check(EXERCISE, hidden=True)
def random_autograd(ScaledTensor, ctx):
    """gradients match dense autograd on random differentiable programs, in-place and views included"""
    for case, seen in _cases(ScaledTensor, "random_autograd", ctx.seed + 66):
        _autograd_case(case, seen)
