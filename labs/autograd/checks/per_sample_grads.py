"""Checks of ``autograd.per-sample-grads``: ``per_sample_grads(model, loss_fn, inputs, targets)``
returns ``{name: tensor of shape (batch, *param.shape)}`` for the parameters that require grad.

The oracle is a loop over the examples with ``torch.autograd.grad``, one example at a time (as a
batch of one), on seeded random models and batches. The contract, not a recipe, is checked: the
model runs once per call (a forward pre-hook counts), and the module, its parameters and their
``.grad`` are left as they were.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from grader.checks import CheckFailure, check, exact, plain_tensor
from labs.autograd.checks._plain import DICTS

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


def _init(model, gen, dtype, device):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / max(1, p.shape[-1] if p.dim() else 1) ** 0.5)
    return model.to(device=device, dtype=dtype)


def _mlp(gen, dims, dtype, device):
    layers = []
    for i in range(len(dims) - 1):
        layers += [_quietly(lambda: nn.Linear(dims[i], dims[i + 1])), nn.Tanh()]
    return _init(nn.Sequential(*layers[:-1]), gen, dtype, device)


def _quietly(make):
    """Build a module without drawing from the global RNG (its default init would)."""
    with torch.random.fork_rng(devices=[]):
        return make()


class _ConvNet(nn.Module):
    """A small conv model with a frozen parameter and a buffer."""

    def __init__(self, c_in, c_mid, classes, length):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_mid, 3, padding=1)
        self.head = nn.Linear(c_mid * length, classes)
        self.temperature = nn.Parameter(torch.ones(()), requires_grad=False)   # frozen
        self.register_buffer("shift", torch.zeros(c_in, 1))

    def forward(self, x):
        h = torch.relu(self.conv(x - self.shift))
        return self.head(h.flatten(1)) / self.temperature


def _compare(answer, model, loss_fn, inputs, targets, label, rtol=1e-4, atol=1e-6):
    want = _loop(model, loss_fn, inputs, targets)
    got = answer(model, loss_fn, inputs, targets)
    if not isinstance(got, dict):
        raise CheckFailure(f"per_sample_grads returned {type(got).__name__}; return a dict "
                           "{parameter name: per-sample gradient}.")
    # Plain types only, before anything is compared: a dict, str or tensor subclass could lie
    # (__eq__, __iter__, __torch_function__ answering allclose, shape or dtype).
    exact(got, DICTS, "the value per_sample_grads returned")
    for key, value in dict.items(got):
        if not isinstance(key, str):
            raise CheckFailure(f"{label}: the dict's keys should be parameter names (str), as "
                               f"model.named_parameters() gives them; one is {type(key).__name__}.")
        exact(key, str, f"{label}: the key {str.__repr__(key)}")
        if isinstance(value, torch.Tensor):
            plain_tensor(value, f"{label}: the value for {str.__repr__(key)}")
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
            raise CheckFailure(f"{label}: the value for {name!r} is {type(g).__name__}, not a tensor.")
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
    gen = ctx.generator(20)
    model = _mlp(gen, [5, 8, 3], torch.float32, ctx.device)
    x = torch.randn(6, 5, generator=gen).to(ctx.device)
    y = torch.randn(6, 3, generator=gen).to(ctx.device)
    _compare(answer, model, F.mse_loss, x, y, "MLP 5->8->3, batch 6, mse_loss")


@check(EXERCISE)
def one_vectorized_call_model_untouched(answer, ctx):
    """runs the model once for the whole batch and leaves parameters and .grad untouched"""
    gen = ctx.generator(21)
    model = _mlp(gen, [4, 6, 2], torch.float32, ctx.device)
    x = torch.randn(5, 4, generator=gen).to(ctx.device)
    y = torch.randn(5, 2, generator=gen).to(ctx.device)
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    first = params["0.weight"]
    first.grad = torch.full_like(first, 7.0)          # a .grad left over from training
    calls = []
    handle = model.register_forward_pre_hook(lambda mod, args: calls.append(1))
    try:
        answer(model, F.mse_loss, x, y)
    finally:
        handle.remove()
    if len(calls) != 1:
        raise CheckFailure(
            f"the model ran {len(calls)} times for a batch of 5; the contract is one run of the "
            "model per call, on all examples together, not a Python loop of one-example passes.")
    now = dict(model.named_parameters())
    if list(now) != list(params) or any(now[n] is not params[n] for n in params):
        raise CheckFailure("per_sample_grads replaced the model's parameters; leave the module "
                           "as it was (torch.func.functional_call runs a module with other tensors "
                           "without assigning them).")
    for n, p in params.items():
        if not torch.equal(p.detach(), before[n]):
            raise CheckFailure(f"per_sample_grads changed the values of {n!r}.")
    if not torch.equal(first.grad, torch.full_like(first, 7.0)) or any(
            p.grad is not None for n, p in params.items() if n != "0.weight"):
        raise CheckFailure("per_sample_grads changed some parameter's .grad; the gradients are "
                           "the result, not a side effect: leave every .grad as it was (no "
                           ".backward()).")


# ---------------------------------------------------------------- hidden checks
@check(EXERCISE, hidden=True)
def random_mlps_cross_entropy(answer, ctx):
    """seeded random MLPs with cross-entropy: odd batch sizes and a batch of one"""
    gen = ctx.generator(22)
    for batch in (1, 7, int(torch.randint(2, 12, (1,), generator=gen)) * 2 + 1):
        depth = int(torch.randint(1, 4, (1,), generator=gen))
        dims = [int(d) for d in torch.randint(2, 9, (depth + 1,), generator=gen)]
        model = _mlp(gen, dims, torch.float32, ctx.device)
        x = torch.randn(batch, dims[0], generator=gen).to(ctx.device)
        y = torch.randint(0, dims[-1], (batch,), generator=gen).to(ctx.device)
        _compare(answer, model, F.cross_entropy, x, y,
                 f"MLP {dims}, batch {batch}, cross_entropy")


@check(EXERCISE, hidden=True)
def frozen_parameter_buffer_conv(answer, ctx):
    """a conv model in float64 with a frozen parameter and a buffer: only trainable parameters"""
    gen = ctx.generator(23)
    c_in, c_mid, classes, length = (int(v) for v in torch.randint(2, 5, (4,), generator=gen))
    batch = int(torch.randint(1, 5, (1,), generator=gen)) * 2 + 1
    model = _init(_quietly(lambda: _ConvNet(c_in, c_mid, classes, length)), gen, torch.float64,
                  ctx.device)
    with torch.no_grad():
        model.temperature.fill_(1.5)
        model.shift.copy_(torch.randn(c_in, 1, generator=gen))
    x = torch.randn(batch, c_in, length, generator=gen, dtype=torch.float64).to(ctx.device)
    y = torch.randint(0, classes, (batch,), generator=gen).to(ctx.device)
    _compare(answer, model, F.cross_entropy, x, y,
             f"Conv1d({c_in}->{c_mid}) + Linear, float64, batch {batch}, a frozen parameter and a "
             "buffer", rtol=1e-7, atol=1e-9)
