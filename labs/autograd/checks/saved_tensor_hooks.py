"""Checks of ``autograd.saved-tensor-hooks``: ``compressed_saved_tensors(dtype=torch.bfloat16)``
returns a ``torch.autograd.graph.saved_tensors_hooks`` whose pack hook stores wide floating-point
saved tensors as ``dtype`` and whose unpack hook restores their dtype and device.

The oracle is autograd itself: the same seeded model run with every wide floating saved tensor
rounded to ``dtype`` (and, to show that compression happened, run without hooks). The answer runs
in the kernel (the probe :func:`labs.autograd.probes.hooks_runs`), which wraps the answer's own
``pack_hook`` / ``unpack_hook`` in a spy pair and reports what each packed object holds and what
each unpack gave back: it must hold no tensor that requires grad, and a graph built under the
hooks and dropped without backward must be freed (a weak reference to its outputs dies), since a
packed output of the node that saves it would make a reference cycle that only backward breaks.
The same models are built here with the same builder, and what they save is recorded here.
"""
from __future__ import annotations

import torch

from grader.checks import AnswerRaised, CheckFailure, check
from labs.autograd import probes
from labs.autograd.checks._plain import Shown, exact_shown, rebuilt

EXERCISE = "autograd.saved-tensor-hooks"


# ---------------------------------------------------------------- helpers
def _report():
    return CheckFailure("what came back from your compressed_saved_tensors is not the probe's "
                        "report.")


def _hooks(seen: dict, dtype) -> None:
    """Insist that the answer returned a saved_tensors_hooks object whose hooks are what it
    runs (the probe's :func:`labs.autograd.probes.hooks_shape`)."""
    if "hooks" not in seen:
        if type(seen.get("raised")) is dict:
            raise AnswerRaised(seen["raised"])
        raise _report()
    shape = seen["hooks"]
    if type(shape) is not dict:
        raise _report()
    kind = shape.get("type")
    if not shape.get("is_hooks"):
        raise CheckFailure(
            f"compressed_saved_tensors({dtype}) returned {kind}; return a "
            "torch.autograd.graph.saved_tensors_hooks(pack, unpack) object (or an instance of a "
            "subclass of it, as torch.autograd.graph.save_on_cpu is).")
    if shape.get("redefined"):
        raise CheckFailure(
            f"compressed_saved_tensors({dtype}) returned a {kind}, a subclass of "
            f"saved_tensors_hooks that redefines {', '.join(map(str, shape['redefined']))}. Keep "
            "saved_tensors_hooks's own machinery: pass your two functions to its __init__ "
            "(super().__init__(pack, unpack)), as torch.autograd.graph.save_on_cpu does.")
    if not shape.get("has_hooks"):
        raise CheckFailure(
            f"compressed_saved_tensors({dtype}) returned a saved_tensors_hooks without its "
            "pack_hook and unpack_hook functions: construct it as saved_tensors_hooks(pack, "
            "unpack) (in a subclass, call super().__init__(pack, unpack)).")


def _narrow(original: torch.dtype, target: torch.dtype) -> bool:
    """Whether a tensor of dtype ``original`` must be stored as ``target``."""
    return original.is_floating_point and original.itemsize > target.itemsize


def _held(entries, where: str) -> list[dict]:
    """The tensors a packed object holds (the probe's :func:`labs.autograd.probes.held`), each
    plain; containers must be exactly tuple, list or dict (or the standard library's
    OrderedDict, defaultdict, or a namedtuple that redefines none of tuple's dunders): a subclass
    could hide what it holds (__iter__, values()) or lie about a tensor's dtype
    (__torch_function__). ``where`` names the saved tensor, for the message."""
    if type(entries) is not list or any(type(e) is not dict for e in entries):
        raise _report()
    for e in entries:
        what = (f"{where}, {'what' if e.get('depth') == 0 else 'an object inside what'} your "
                "pack hook returned")
        if "refused" in e:
            r = e["refused"] if type(e["refused"]) is dict else {}
            if e.get("dict"):
                exact_shown(Shown(r.get("type", "object"), r.get("base")), dict,
                            f"{where}, the __dict__ of an object your pack hook returned")
            exact_shown(Shown(r.get("type", "object"), r.get("base")),
                        (tuple, list, dict), what)
        elif e.get("type") not in ("Tensor", "Parameter"):
            exact_shown(Shown(e.get("type", "object"), e.get("base")), torch.Tensor, what)
    return entries


def _desc(t_dtype, shape) -> str:
    return f"a tensor of dtype {str(t_dtype).replace('torch.', '')} and shape {tuple(shape)}"


def _verify(mine: list, theirs, target: torch.dtype) -> None:
    """Every packed object (the probe's records, ``theirs``) holds the right representation of
    the tensor saved (``mine``, recorded here on the same forward); every unpack restored it."""
    if type(theirs) is not list:
        raise _report()
    if not theirs:
        raise CheckFailure("your hooks were never called: was the forward pass run inside "
                           "`with compressed_saved_tensors(): ...`?")
    if len(theirs) != len(mine) or any(type(r) is not dict for r in theirs):
        raise _report()
    eps = torch.finfo(target).eps
    for rec, got in zip(mine, theirs, strict=True):
        what = _desc(rec["dtype"], rec["shape"])
        held = _held(got.get("held"), f"for {what}")
        numel = rec["value"].numel()
        if any(t.get("requires_grad") for t in held):
            raise CheckFailure(
                f"for {what}, your packed object holds a tensor that requires grad (the saved "
                "tensor itself, or something computed from it with grad mode on). When a node "
                f"saves its own output, that is a reference cycle: {_CYCLE}. Keep detached "
                "tensors only (t.detach()).")
        if _narrow(rec["dtype"], target):
            if not [t for t in held if t.get("dtype") == target and t.get("numel") == numel]:
                raise CheckFailure(
                    f"for {what}, your pack hook stored no {target} tensor of the same number "
                    f"of elements; it should keep `t.to({target})` (plus whatever you need to "
                    "restore the original dtype and device).")
            if [t for t in held if t.get("dtype") == rec["dtype"] and t.get("numel") == numel]:
                raise CheckFailure(
                    f"for {what}, your packed object still holds a {rec['dtype']} copy of the "
                    "tensor, so nothing is saved: keep only the compressed copy.")
        elif not [t for t in held if t.get("dtype") == rec["dtype"]
                  and tuple(t.get("shape") or ()) == rec["shape"]]:
            raise CheckFailure(
                f"{what} was saved, and your pack hook did not keep it as it is: only "
                f"floating-point tensors wider than {target} are to be compressed; store "
                "integer, bool and already-narrow tensors unchanged (e.g. `t.detach()`).")
        out = got.get("out")
        if out is None:
            continue  # never unpacked (backward did not need it)
        if type(out) is not dict:
            raise _report()
        if out.get("base") != "Tensor":
            raise CheckFailure(f"for {what}, your unpack hook returned {out.get('type')}, "
                               "not a tensor.")
        if out.get("type") not in ("Tensor", "Parameter"):
            exact_shown(Shown(out.get("type", "object"), out.get("base")), torch.Tensor,
                        f"for {what}, the tensor your unpack hook returned")
        value = out.get("value")
        if type(value) is not torch.Tensor:
            raise _report()
        device = torch.device(rec["device"])
        if out.get("dtype") != rec["dtype"] or tuple(out.get("shape") or ()) != rec["shape"] \
                or out.get("device") != device:
            raise CheckFailure(
                f"{what} on {device} came back from your unpack hook as "
                f"{_desc(out.get('dtype'), out.get('shape') or ())} on {out.get('device')}; "
                "unpack must restore the original dtype, shape and device.")
        value = value.to(device)
        if _narrow(rec["dtype"], target):
            torch.testing.assert_close(
                value, rec["value"], rtol=eps, atol=1e-6,
                msg=lambda m: f"for {what}, unpack(pack(t)) is further from t than one "
                              f"rounding to {target}: {m}")
        elif not torch.equal(value, rec["value"]):
            raise CheckFailure(f"{what} came back from unpack with different values; tensors "
                               "you do not compress must come back exactly.")


_CYCLE = ("output -> grad_fn -> SavedVariable -> your packed object -> output, which only a "
          "backward pass breaks (release_variables), so a graph dropped without backward is never "
          "freed")


def _grads(run, tensors):
    """Run ``run()`` (a forward returning a scalar loss) and backward; return the .grad's."""
    for t in tensors:
        t.grad = None
    run().backward()
    return [t.grad.clone() for t in tensors]


def _their_grads(seen: dict, n: int) -> list:
    """The .grad's the answer's hooks gave (the probe's report): what it raised in the forward
    is raised here; a RuntimeError in backward, a leaf without .grad or a .grad that is no
    plain tensor fails the check."""
    if "grads" not in seen:
        raised = seen.get("raised")
        if type(raised) is not dict:
            raise _report()
        if seen.get("stage") == "backward" and seen.get("runtime_error"):
            raise CheckFailure(
                f"backward failed under your hooks with RuntimeError: {raised.get('evalue')}\n"
                "The tensor your unpack hook returns must have the original dtype, shape and "
                "device of the tensor that was packed.")
        raise AnswerRaised(raised)
    grads = [rebuilt(g) for g in seen["grads"]] if type(seen["grads"]) is list else None
    if grads is None or len(grads) != n:
        raise _report()
    if any(g is None for g in grads):
        raise CheckFailure("with your hooks active, some leaf tensors got no .grad at all: the "
                           "tensor your unpack hook returns must be usable by backward.")
    for g in grads:
        if type(g) is not torch.Tensor:
            exact_shown(g, torch.Tensor, "a .grad computed under your hooks (from what your "
                                         "unpack hook returned)")
    return grads


class _Rounded:
    """The oracle's hooks: autograd with each wide floating saved tensor rounded to ``target``;
    ``records`` notes what was packed, in order (``dtype``, ``shape``, ``device``, ``value``)."""

    def __init__(self, target):
        self.target, self.records = target, []

    def pack(self, t):
        self.records.append({"dtype": t.dtype, "shape": tuple(t.shape), "device": t.device,
                             "value": t.detach().clone()})
        return (t.to(self.target), t.dtype) if _narrow(t.dtype, self.target) \
            else (t.detach(), None)

    @staticmethod
    def unpack(packed):
        data, dtype = packed
        return data if dtype is None else data.to(dtype)

    def __call__(self, forward):
        def run():
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                return forward()
        return run


def _compare(got, want, target, label):
    tol = torch.finfo(target).eps
    for i, (g, w) in enumerate(zip(got, want)):
        g = g.to(w.device)
        if g.dtype != w.dtype or g.shape != w.shape:
            raise CheckFailure(f"{label}: gradient {i} has dtype {g.dtype} / shape "
                               f"{tuple(g.shape)}, expected {w.dtype} / {tuple(w.shape)} as "
                               "without hooks.")
        if not torch.isfinite(g).all():
            raise CheckFailure(f"{label}: gradient {i} has NaN or inf values.")
        err = ((g - w).norm() / w.norm().clamp_min(1e-12)).item()
        if err > tol:
            raise CheckFailure(
                f"{label}: gradient {i} differs by a relative error of {err:.3g} from autograd's "
                f"own gradient with the same saved tensors rounded once to {target}. Check that "
                "unpack returns the tensor that was packed, converted back to its original dtype.")


def _cases(answer, name: str, ctx):
    """``(case, seen)`` for each case of check ``name`` (built here), with what the answer did
    on it in the kernel (one probe call for the check)."""
    seen = answer.probe(probes.hooks_runs, name, ctx.seed, ctx.device)
    if type(seen) is not list or any(type(s) is not dict for s in seen):
        raise _report()
    for i, case in enumerate(probes.hooks_cases(name, ctx.seed, ctx.device)):
        if i >= len(seen):
            raise _report()
        yield case, seen[i]


def _spied(case: dict, seen: dict, integers: bool = False) -> None:
    """A case run under the spy: the gradients, what was packed, then the gradients' values."""
    target, leaves = case["target"], case["leaves"]
    oracle = _Rounded(target)
    want = _grads(oracle(case["forward"]), leaves)
    _hooks(seen, target)
    got = _their_grads(seen, len(leaves))
    if integers and not any(not r["dtype"].is_floating_point for r in oracle.records):
        raise CheckFailure("no integer tensor went through your pack hook, yet this model saves "
                           "int64 indices: is the forward run inside your context manager?")
    _verify(oracle.records, seen.get("records"), target)
    _compare(got, want, target, case["label"])


# ---------------------------------------------------------------- public checks
@check(EXERCISE)
def gradients_close_to_uncompressed(answer, ctx):
    """gradients of a small MLP under your hooks stay within bfloat16 rounding of plain autograd"""
    for case, seen in _cases(answer, "gradients_close_to_uncompressed", ctx):
        forward, leaves = case["forward"], case["leaves"]
        plain = _grads(forward, leaves)
        want = _grads(_Rounded(torch.bfloat16)(forward), leaves)
        _hooks(seen, torch.bfloat16)
        got = _their_grads(seen, len(leaves))
        if all(torch.equal(g.to(w.device), w) for g, w in zip(got, plain)):
            raise CheckFailure(
                "the gradients are bit-identical to the uncompressed run, so backward used the "
                "original float32 values: the pack hook should keep only `t.to(dtype)`, and "
                "unpack should rebuild the tensor from that copy.")
        _compare(got, want, torch.bfloat16, case["label"])


@check(EXERCISE)
def packs_narrow_and_restores(answer, ctx):
    """float32 saved tensors are packed as bfloat16 and come back with their dtype, shape and device"""
    for case, seen in _cases(answer, "packs_narrow_and_restores", ctx):
        _spied(case, seen)


@check(EXERCISE)
def dropped_graph_is_freed(answer, ctx):
    """a graph built under your hooks and dropped without backward is freed"""
    for _, seen in _cases(answer, "dropped_graph_is_freed", ctx):
        _hooks(seen, torch.bfloat16)
        if "alive" not in seen:
            raise AnswerRaised(seen["raised"]) if type(seen.get("raised")) is dict \
                else _report()
        if seen["alive"] is not False:
            raise CheckFailure(
                "a graph of float16 ops (y = exp(a * 0.5), z = tanh(y), (z * y).sum()) built "
                "under your hooks with dtype=torch.bfloat16 and dropped without backward is still "
                "alive: what your pack hook keeps holds the saved tensor itself. exp and tanh "
                f"save their own outputs, so that makes a reference cycle {_CYCLE}. Keep a "
                "detached tensor (t.detach()).")


# ---------------------------------------------------------------- hidden checks
@check(EXERCISE, hidden=True)
def integer_saved_tensors_untouched(answer, ctx):
    """integer saved tensors (embedding indices, max indices, gather index) are kept exactly"""
    for case, seen in _cases(answer, "integer_saved_tensors_untouched", ctx):
        _spied(case, seen, integers=True)


@check(EXERCISE, hidden=True)
def other_dtypes_and_random_shapes(answer, ctx):
    """float16 target, float64 models and seeded random shapes; 16-bit tensors are not re-cast"""
    for case, seen in _cases(answer, "other_dtypes_and_random_shapes", ctx):
        if case["kind"] == "spied":
            _spied(case, seen)
            continue
        # a float16 tensor saved under a bfloat16 target is already 2 bytes wide: keep it as is
        _hooks(seen, torch.bfloat16)
        oracle = _Rounded(torch.bfloat16)
        oracle(case["forward"])()
        if "grads" not in seen:
            raise AnswerRaised(seen["raised"]) if type(seen.get("raised")) is dict \
                else _report()
        _verify(oracle.records, seen.get("records"), torch.bfloat16)
        grads = seen["grads"] if type(seen["grads"]) is list else [None]
        a_grad = rebuilt(grads[0])
        if type(a_grad) is not torch.Tensor:
            exact_shown(a_grad if isinstance(a_grad, Shown) else Shown(type(a_grad).__name__,
                                                                        None),
                        torch.Tensor, "a .grad computed under your hooks (from what your unpack "
                                      "hook returned)")
        torch.testing.assert_close(
            a_grad, case["leaves"][1].detach(), rtol=0, atol=0,
            msg="float16 tensors must come back exactly under a bfloat16 target")


@check(EXERCISE, hidden=True)
def parameters_saved_directly(answer, ctx):
    """a parameter saved directly (x @ W, F.linear) still gets its .grad, and x gets the right one"""
    for case, seen in _cases(answer, "parameters_saved_directly", ctx):
        _spied(case, seen)
