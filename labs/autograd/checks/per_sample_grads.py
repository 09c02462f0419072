"""Checks of ``autograd.per-sample-grads``: ``per_sample_grads(model, loss_fn, inputs, targets)``
returns ``{name: tensor of shape (batch, *param.shape)}`` for the parameters that require grad.

The oracle is a loop over the examples with ``torch.autograd.grad``, one example at a time (as a
batch of one), on seeded random models and batches. The contract, not a recipe, is checked: the
model runs once per call (a forward pre-hook counts), and the module, its parameters and their
``.grad`` are left as they were.
"""
from __future__ import annotations

import torch

from grader.checks import AnswerRaised, CheckFailure, check
from labs.autograd import probes
from labs.autograd.checks._plain import DICTS, exact_shown, is_a, rebuilt, type_name

EXERCISE = "autograd.per-sample-grads"


# ---------------------------------------------------------------- helpers
def _loop(model, loss_fn, inputs, targets):
    """The oracle: one torch.autograd.grad call per example."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(inputs.shape[0]):
        loss = loss_fn(model(inputs[i:i + 1]), targets[i:i + 1])
        rows.append(torch.autograd.grad(loss, params, allow_unused=True))
    return {n: torch.stack([r[j] for r in rows]) for j, n in enumerate(names)}


def _seen(seen, i: int) -> dict:
    """Entry ``i`` of what :func:`labs.autograd.probes.per_sample_runs` gave; what the answer
    raised there is raised here."""
    entry = seen[i] if type(seen) is list and i < len(seen) else None
    if type(entry) is not dict:
        raise CheckFailure("what came back from your per_sample_grads is not the probe's report.")
    if "raised" in entry:
        raise AnswerRaised(entry["raised"])
    return entry


def _judge(answer, name: str, ctx) -> None:
    """Run the cases of check ``name`` through the answer in the kernel (one probe call) and
    compare each with the per-example loop on the same model and batch, built here."""
    seen = answer.probe(probes.per_sample_runs, name, ctx.seed, ctx.device)
    for i, (label, model, loss_fn, x, y, tol) in enumerate(
            probes.per_sample_cases(name, ctx.seed, ctx.device)):
        _compare(rebuilt(_seen(seen, i).get("got")), model, loss_fn, x, y, label, **tol)


def _compare(got, model, loss_fn, inputs, targets, label, rtol=1e-4, atol=1e-6):
    """Compare what the answer returned (rebuilt from the probe's report) with the per-example
    loop on ``model``; raise CheckFailure on a miss."""
    want = _loop(model, loss_fn, inputs, targets)
    if not is_a(got, dict):
        raise CheckFailure(f"per_sample_grads returned {type_name(got)}; return a dict "
                           "{parameter name: per-sample gradient}.")
    # Plain types only, before anything is compared: a dict, str or tensor subclass could lie
    # (__eq__, __iter__, __torch_function__ answering allclose, shape or dtype).
    exact_shown(got, DICTS, "the value per_sample_grads returned")
    for key, value in dict.items(got):
        if not is_a(key, str):
            raise CheckFailure(f"{label}: the dict's keys should be parameter names (str), as "
                               f"model.named_parameters() gives them; one is {type_name(key)}.")
        shown_key = str.__repr__(key) if type(key) is str else repr(key)
        exact_shown(key, str, f"{label}: the key {shown_key}")
        if is_a(value, torch.Tensor):
            exact_shown(value, (torch.Tensor, torch.nn.Parameter),
                        f"{label}: the value for {shown_key}")
    if list(got) != list(want):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        raise CheckFailure(
            f"{label}: the dict's keys should be the names of the parameters that require grad, "
            f"in model.named_parameters() order: {list(want)}"
            + (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else "")
            + ("" if missing or extra else " (same names, different order)"))
    batch = inputs.shape[0]
    for name, w in want.items():
        g = got[name]
        if not isinstance(g, torch.Tensor):
            raise CheckFailure(f"{label}: the value for {name!r} is {type_name(g)}, not a tensor.")
        g = g.to(w.device)                 # (what comes back from the kernel is on the CPU)
        if tuple(g.shape) != tuple(w.shape):
            raise CheckFailure(
                f"{label}: {name!r} has shape {tuple(g.shape)}; expected (batch, *param.shape) = "
                f"{tuple(w.shape)} — one gradient per example, stacked along a new first dim.")
        if batch > 1 and torch.allclose(g, w.mean(0, keepdim=True).expand_as(w), rtol=rtol, atol=atol) \
                and not torch.allclose(w, w[:1].expand_as(w), rtol=rtol, atol=atol):
            raise CheckFailure(f"{label}: every row of {name!r} is the batch-average gradient; "
                               "row i must be the gradient of example i's loss alone.")
        torch.testing.assert_close(
            g, w, rtol=rtol, atol=atol,
            msg=lambda m: f"{label}: {name!r} differs from a per-example loop with "
                          f"torch.autograd.grad: {m}")


# ---------------------------------------------------------------- public checks
@check(EXERCISE)
def matches_per_example_loop(answer, ctx):
    """matches a per-example torch.autograd.grad loop on a small MLP with MSE loss"""
    _judge(answer, "matches_per_example_loop", ctx)


@check(EXERCISE)
def one_vectorized_call_model_untouched(answer, ctx):
    """runs the model once for the whole batch and leaves parameters and .grad untouched"""
    seen = _seen(answer.probe(probes.per_sample_runs, "one_vectorized_call_model_untouched",
                              ctx.seed, ctx.device), 0)
    if seen.get("runs") != 1:
        raise CheckFailure(
            f"the model ran {seen.get('runs')} times for a batch of 5; the contract is one run of "
            "the model per call, on all examples together, not a Python loop of one-example "
            "passes.")
    if seen.get("replaced") is not False:
        raise CheckFailure("per_sample_grads replaced the model's parameters; leave the module "
                           "as it was (torch.func.functional_call runs a module with other tensors "
                           "without assigning them).")
    for n in seen.get("changed") or []:
        raise CheckFailure(f"per_sample_grads changed the values of {n!r}.")
    if seen.get("grads_changed") is not False:
        raise CheckFailure("per_sample_grads changed some parameter's .grad; the gradients are "
                           "the result, not a side effect: leave every .grad as it was (no "
                           ".backward()).")


# ---------------------------------------------------------------- hidden checks
@check(EXERCISE, hidden=True)
def random_mlps_cross_entropy(answer, ctx):
    """seeded random MLPs with cross-entropy: odd batch sizes and a batch of one"""
    _judge(answer, "random_mlps_cross_entropy", ctx)


@check(EXERCISE, hidden=True)
def frozen_parameter_buffer_conv(answer, ctx):
    """a conv model in float64 with a frozen parameter and a buffer: only trainable parameters"""
    _judge(answer, "frozen_parameter_buffer_conv", ctx)
