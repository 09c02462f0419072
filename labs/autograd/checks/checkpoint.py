"""Checks of ``autograd.checkpoint``: ``checkpoint(fn, *args)`` built from a custom
``torch.autograd.Function`` that runs ``fn`` without saving its activations and recomputes it in
backward.

The oracles are plain autograd and ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``
on the same seeded functions. The answer runs in the kernel (the probe
:func:`labs.autograd.probes.checkpoint_run`, which counts how often ``fn`` runs with a counting
wrapper, records what the forward saves with a ``saved_tensors_hooks`` spy, and reports the
gradients); the same functions are built here with the same builder and compared.
"""
from __future__ import annotations


import torch
import torch.utils.checkpoint as torch_checkpoint

from grader.checks import AnswerRaised, CheckFailure, check
from labs.autograd import probes
from labs.autograd.checks._plain import Shown, exact_shown, rebuilt

EXERCISE = "autograd.checkpoint"


# ---------------------------------------------------------------- helpers
def _run(program, leaves, seed=None):
    """Clear .grad, run ``program()`` (returns a scalar loss), backward; the leaves' .grad's."""
    for t in leaves:
        t.grad = None
    if seed is not None:
        torch.manual_seed(seed)
    program().backward()
    return [None if t.grad is None else t.grad.clone() for t in leaves]


def _same(got, want, names, label, exact=False):
    for name, g, w in zip(names, got, want, strict=True):
        if w is None:
            if g is not None:
                raise CheckFailure(f"{label}: {name} got a gradient but should get none.")
            continue
        if g is None:
            raise CheckFailure(
                f"{label}: {name} got no gradient (its .grad is None). Gradients must reach every "
                "tensor argument that requires grad AND every parameter fn uses: run backward "
                "through the recomputed graph with torch.autograd.backward(outputs, "
                "grad_outputs).")
        kw = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.to(w.device), w, **kw, msg=lambda m: f"{label}: the "
                                   f"gradient of {name} differs from plain autograd's: {m}")


def _seen(answer, name: str, ctx) -> dict:
    """What :func:`labs.autograd.probes.checkpoint_run` gave for check ``name``, after the checks
    of every ``checkpoint(fn, ...)`` call it made: each returned a plain tensor."""
    seen = answer.probe(probes.checkpoint_run, name, ctx.seed, ctx.device)
    if type(seen) is not dict:
        raise CheckFailure("what came back from your checkpoint is not the probe's report.")
    for out in seen.get("outs") or []:
        out = rebuilt(out)
        if not isinstance(out, Shown) or out.base != "Tensor":
            raise CheckFailure(f"checkpoint(fn, ...) returned {getattr(out, 'type_name', out)}; "
                               "return the tensor that fn returns (the output of "
                               "YourFunction.apply(fn, *args)).")
        if out.type_name not in ("Tensor", "Parameter"):
            exact_shown(out, torch.Tensor, "the tensor checkpoint(fn, ...) returned")
    return seen


def _at(seen: dict, key: str):
    """``seen[key]``; what the answer raised before the probe got there is raised here."""
    if key in seen:
        return seen[key]
    if type(seen.get("raised")) is dict:
        raise AnswerRaised(seen["raised"])
    raise CheckFailure("what came back from your checkpoint is not the probe's report.")


def _grads(seen: dict, n: int) -> list:
    """The leaves' .grad's the probe reported, each a plain tensor (a subclass could fake the
    comparisons) or None."""
    grads = _at(seen, "grads")
    if type(grads) is not list or len(grads) != n:
        raise CheckFailure("what came back from your checkpoint is not the probe's report.")
    out = []
    for g in grads:
        g = rebuilt(g)
        if g is not None and type(g) is not torch.Tensor:
            exact_shown(g, torch.Tensor, "a .grad computed through your checkpoint (from the "
                                         "gradients your backward returned)")
        out.append(g)
    return out


def _packed(seen: dict) -> list:
    """What the forward saved, each a plain tensor (a subclass could lie about its data_ptr()
    or shape)."""
    packed = _at(seen, "packed")
    if type(packed) is not list or any(type(p) is not dict for p in packed):
        raise CheckFailure("what came back from your checkpoint is not the probe's report.")
    for p in packed:
        if p.get("type") not in ("Tensor", "Parameter"):
            exact_shown(Shown(p.get("type", "object"), p.get("base")), torch.Tensor,
                        "a tensor your forward saved for backward")
    return packed


def _count_packs(fn, *args) -> int:
    """How many tensors plain autograd saves for ``fn(*args)``."""
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t, lambda t: t):
        fn(*args)
    return len(packed)


# ---------------------------------------------------------------- public checks
@check(EXERCISE)
def gradients_match_autograd(answer, ctx):
    """gradients through a checkpointed MLP block match plain autograd and torch.utils.checkpoint"""
    case = probes.checkpoint_case("gradients_match_autograd", ctx.seed, ctx.device)
    (block,), x, leaves, names = case["blocks"], case["x"], case["leaves"], case["names"]
    seen = _seen(answer, "gradients_match_autograd", ctx)   # (first: a stub fails at once)
    plain = _run(lambda: block(x).pow(2).sum(), leaves)
    theirs = _run(lambda: torch_checkpoint.checkpoint(block, x, use_reentrant=False).pow(2).sum(),
                  leaves)
    _same(theirs, plain, names, "torch.utils.checkpoint itself")  # the oracle agrees with itself
    _same(_grads(seen, len(leaves)), plain, names, "MLP block 6->9->5")


@check(EXERCISE)
def recomputes_once_saves_only_inputs(answer, ctx):
    """fn runs exactly twice (forward + one recompute) and the forward saves only fn's inputs"""
    case = probes.checkpoint_case("recomputes_once_saves_only_inputs", ctx.seed, ctx.device)
    plain = _count_packs(case["blocks"][0], case["x"])
    seen = _seen(answer, "recomputes_once_saves_only_inputs", ctx)
    (calls,) = _at(seen, "calls")
    packed = _packed(seen)
    if calls != 1:
        raise CheckFailure(f"fn ran {calls} times during the forward pass; run it once.")
    if len(packed) > 1 or any(not p.get("argument") for p in packed):
        raise CheckFailure(
            f"your forward saved {len(packed)} tensors for backward (plain autograd saves "
            f"{plain} for this block); a checkpoint saves only fn's tensor inputs "
            "(here: x) with ctx.save_for_backward, and runs fn under torch.no_grad() so that fn's "
            "own operations record nothing.")
    if not _at(seen, "requires_grad"):
        raise CheckFailure("the output of checkpoint(fn, x) does not require grad although x "
                           "does: return YourFunction.apply(fn, *args), not fn's no-grad output.")
    (calls,) = _at(seen, "calls_after")
    if calls != 2:
        raise CheckFailure(f"after forward and backward, fn ran {calls} times; it should "
                           "run exactly twice: once in forward, once (recomputing) in backward.")


# ---------------------------------------------------------------- hidden checks
@check(EXERCISE, hidden=True)
def mixed_arguments_and_segments(answer, ctx):
    """two checkpointed segments; arguments that don't require grad and non-tensor arguments"""
    case = probes.checkpoint_case("mixed_arguments_and_segments", ctx.seed, ctx.device)
    (block1, segment2), leaves = case["fns"], case["leaves"]
    plain = _run(lambda: segment2(block1(case["x"]), *case["others"]).pow(2).sum(), leaves)
    seen = _seen(answer, "mixed_arguments_and_segments", ctx)
    extra = [p for p in _packed(seen) if not p.get("argument")]
    if extra:
        raise CheckFailure(
            f"with two checkpointed segments, the forward saved {len(extra)} tensor(s) that are "
            f"not arguments of a segment (shapes {[tuple(p['shape']) for p in extra][:4]}): save "
            "only the tensor arguments; fn's activations must be recomputed in backward.")
    _same(_grads(seen, len(leaves)), plain, case["names"], case["label"])
    c1, c2 = _at(seen, "calls_after")
    if (c1, c2) != (2, 2):
        raise CheckFailure(f"over one forward+backward pass the two segments ran {c1} and "
                           f"{c2} times; each should run exactly twice.")


@check(EXERCISE, hidden=True)
def dropout_rng_replayed(answer, ctx):
    """dropout inside fn: the recompute replays the forward's random mask (RNG state restored)"""
    case = probes.checkpoint_case("dropout_rng_replayed", ctx.seed, ctx.device)
    (block,), x, leaves, names, seed = (case["blocks"], case["x"], case["leaves"],
                                        case["names"], case["seed"])
    with probes.rng_fork(ctx.device):
        plain = _run(lambda: block(x).pow(2).sum(), leaves, seed=seed)
        theirs = _run(lambda: torch_checkpoint.checkpoint(block, x, use_reentrant=False).pow(2)
                      .sum(), leaves, seed=seed)
    _same(theirs, plain, names, "torch.utils.checkpoint itself")
    got = _grads(_seen(answer, "dropout_rng_replayed", ctx), len(leaves))
    try:
        _same(got, plain, names, case["label"])
    except AssertionError as exc:
        raise CheckFailure(
            f"{exc}\nWith dropout inside fn, the recompute drew a different random mask than "
            "the forward: stash torch.get_rng_state() in forward and restore it (inside "
            "torch.random.fork_rng()) before recomputing.") from None


@check(EXERCISE, hidden=True)
def rng_stream_left_alone(answer, ctx):
    """after backward, the global RNG stream is where it would be without checkpointing"""
    case = probes.checkpoint_case("rng_stream_left_alone", ctx.seed, ctx.device)
    (block,), x = case["blocks"], case["x"]
    with probes.rng_fork(ctx.device):
        torch.manual_seed(case["seed"])
        out = block(x)
        torch.rand(5, device=ctx.device)           # other code draws numbers between the passes
        out.sum().backward()
        want = torch.rand(8, device=ctx.device)    # the next numbers the program would draw
    got = _at(_seen(answer, "rng_stream_left_alone", ctx), "rng_after")
    if type(got) is not torch.Tensor or not torch.equal(got.to(want.device), want):
        raise CheckFailure(
            "after backward, the global RNG has moved compared with a run without checkpointing: "
            "the recompute in backward consumed or reset the program's random stream. Restore the "
            "stashed state inside `with torch.random.fork_rng(...)`, which puts the surrounding "
            "state back when the block exits.")
