"""Checks of ``autograd.checkpoint``: ``checkpoint(fn, *args)`` built from a custom
``torch.autograd.Function`` that runs ``fn`` without saving its activations and recomputes it in
backward.

The oracles are plain autograd and ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``
on the same seeded functions; how often ``fn`` runs and what the forward saves are observed with a
counting wrapper and a ``saved_tensors_hooks`` spy.
"""
from __future__ import annotations


import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint

from grader.checks import CheckFailure, check, plain_tensor

EXERCISE = "autograd.checkpoint"


# ---------------------------------------------------------------- helpers
def _rng(device):
    """Fork the global RNG(s) so the checks leave the learner's RNG stream as it was."""
    devices = [torch.device(device).index or 0] if str(device).startswith("cuda") else []
    return torch.random.fork_rng(devices=devices)


class _Counted:
    """Wraps ``fn`` and counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def _block(gen, dims, device, dropout=0.0):
    layers = []
    for i in range(len(dims) - 1):
        with torch.random.fork_rng(devices=[]):   # nn.Linear's default init draws from the global RNG
            lin = nn.Linear(dims[i], dims[i + 1])
        with torch.no_grad():
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) / dims[i] ** 0.5)
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen) * 0.1)
        layers += [lin, nn.Tanh() if i % 2 == 0 else nn.GELU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers).to(device)


def _leaves_grads(leaves):
    """The leaves' .grad's, each a plain tensor (a subclass could fake the comparisons)."""
    return [None if t.grad is None else
            plain_tensor(t.grad, "a .grad computed through your checkpoint (from the gradients your "
                                 "backward returned)").clone() for t in leaves]


def _run(program, leaves, seed=None):
    """Clear .grad, run ``program()`` (returns a scalar loss), backward; the leaves' .grad's."""
    for t in leaves:
        t.grad = None
    if seed is not None:
        torch.manual_seed(seed)
    program().backward()
    return _leaves_grads(leaves)


def _same(got, want, names, label, exact=False):
    for name, g, w in zip(names, got, want):
        if w is None:
            if g is not None:
                raise CheckFailure(f"{label}: {name} got a gradient but should get none.")
            continue
        if g is None:
            raise CheckFailure(
                f"{label}: {name} got no gradient (its .grad is None). Gradients must reach every "
                "tensor argument that requires grad AND every parameter fn uses: run backward "
                "through the recomputed graph with torch.autograd.backward(outputs, grad_outputs).")
        kw = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g, w, **kw, msg=lambda m: f"{label}: the gradient of {name} "
                                   f"differs from plain autograd's: {m}")


class _PackSpy:
    """Counts and records the tensors packed while it is active (each a plain tensor: a subclass
    could lie about its data_ptr() or shape)."""

    def __init__(self):
        self.packed: list[torch.Tensor] = []

    def __enter__(self):
        def pack(t):
            self.packed.append(t)
            return t.detach()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        if exc[0] is None:
            for t in self.packed:
                plain_tensor(t, "a tensor your forward saved for backward")


def _call(answer, fn, *args):
    out = answer(fn, *args)
    if not isinstance(out, torch.Tensor):
        raise CheckFailure(f"checkpoint(fn, ...) returned {type(out).__name__}; return the tensor "
                           "that fn returns (the output of YourFunction.apply(fn, *args)).")
    return plain_tensor(out, "the tensor checkpoint(fn, ...) returned")


# ---------------------------------------------------------------- public checks
@check(EXERCISE)
def gradients_match_autograd(answer, ctx):
    """gradients through a checkpointed MLP block match plain autograd and torch.utils.checkpoint"""
    gen = ctx.generator(10)
    block = _block(gen, [6, 9, 5], ctx.device)
    x = torch.randn(4, 6, generator=gen).to(ctx.device).requires_grad_()
    leaves = [x, *block.parameters()]
    names = ["x"] + [f"block.{n}" for n, _ in block.named_parameters()]
    plain = _run(lambda: block(x).pow(2).sum(), leaves)
    theirs = _run(lambda: torch_checkpoint.checkpoint(block, x, use_reentrant=False).pow(2).sum(),
                  leaves)
    _same(theirs, plain, names, "torch.utils.checkpoint itself")  # the oracle agrees with itself
    got = _run(lambda: _call(answer, block, x).pow(2).sum(), leaves)
    _same(got, plain, names, "MLP block 6->9->5")


@check(EXERCISE)
def recomputes_once_saves_only_inputs(answer, ctx):
    """fn runs exactly twice (forward + one recompute) and the forward saves only fn's inputs"""
    gen = ctx.generator(11)
    block = _block(gen, [5, 7, 7, 3], ctx.device)
    x = torch.randn(3, 5, generator=gen).to(ctx.device).requires_grad_()
    with _PackSpy() as plain:
        block(x)
    counted = _Counted(block)
    with _PackSpy() as spy:
        out = _call(answer, counted, x)
    if counted.calls != 1:
        raise CheckFailure(f"fn ran {counted.calls} times during the forward pass; run it once.")
    if len(spy.packed) > 1 or any(t.data_ptr() != x.data_ptr() for t in spy.packed):
        raise CheckFailure(
            f"your forward saved {len(spy.packed)} tensors for backward (plain autograd saves "
            f"{len(plain.packed)} for this block); a checkpoint saves only fn's tensor inputs "
            "(here: x) with ctx.save_for_backward, and runs fn under torch.no_grad() so that fn's "
            "own operations record nothing.")
    if not out.requires_grad:
        raise CheckFailure("the output of checkpoint(fn, x) does not require grad although x "
                           "does: return YourFunction.apply(fn, *args), not fn's no-grad output.")
    out.sum().backward()
    if counted.calls != 2:
        raise CheckFailure(f"after forward and backward, fn ran {counted.calls} times; it should "
                           "run exactly twice: once in forward, once (recomputing) in backward.")


# ---------------------------------------------------------------- hidden checks
@check(EXERCISE, hidden=True)
def mixed_arguments_and_segments(answer, ctx):
    """two checkpointed segments; arguments that don't require grad and non-tensor arguments"""
    gen = ctx.generator(12)
    n = int(torch.randint(1, 6, (1,), generator=gen))
    d = [int(v) for v in torch.randint(2, 10, (4,), generator=gen)]
    block1 = _block(gen, d[:3], ctx.device)
    block2 = _block(gen, [d[2], d[3]], ctx.device)
    x = torch.randn(n, d[0], generator=gen).to(ctx.device).requires_grad_()
    b = torch.randn(d[3], generator=gen).to(ctx.device).requires_grad_()
    mask = (torch.rand(n, d[3], generator=gen) > 0.3).to(ctx.device)     # bool, no grad
    const = torch.randn(d[3], generator=gen).to(ctx.device)              # float, no grad
    scale = float(torch.rand(1, generator=gen)) + 0.5

    def segment2(h, mask, scale, b, const):
        return block2(h) * mask * scale + b * const

    leaves = [x, b, *block1.parameters(), *block2.parameters()]
    names = ["x", "b"] + [f"block1.{k}" for k, _ in block1.named_parameters()] \
        + [f"block2.{k}" for k, _ in block2.named_parameters()]
    plain = _run(lambda: segment2(block1(x), mask, scale, b, const).pow(2).sum(), leaves)
    c1, c2 = _Counted(block1), _Counted(segment2)
    for t in leaves:
        t.grad = None
    with _PackSpy() as spy:
        h = _call(answer, c1, x)
        out = _call(answer, c2, h, mask, scale, b, const)
    allowed = {t.data_ptr() for t in (x, h, mask, b, const)}
    extra = [t for t in spy.packed if t.data_ptr() not in allowed]
    if extra:
        raise CheckFailure(
            f"with two checkpointed segments, the forward saved {len(extra)} tensor(s) that are "
            f"not arguments of a segment (shapes {[tuple(t.shape) for t in extra][:4]}): save only "
            "the tensor arguments; fn's activations must be recomputed in backward.")
    out.pow(2).sum().backward()
    got = _leaves_grads(leaves)
    _same(got, plain, names, f"two segments, batch {n}, dims {d}, a bool mask, a float and "
                             "tensors without grad among the arguments")
    if (c1.calls, c2.calls) != (2, 2):
        raise CheckFailure(f"over one forward+backward pass the two segments ran {c1.calls} and "
                           f"{c2.calls} times; each should run exactly twice.")


@check(EXERCISE, hidden=True)
def dropout_rng_replayed(answer, ctx):
    """dropout inside fn: the recompute replays the forward's random mask (RNG state restored)"""
    gen = ctx.generator(13)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    n = int(torch.randint(2, 7, (1,), generator=gen))
    block = _block(gen, [7, 11, 6], ctx.device, dropout=0.5)
    x = torch.randn(n, 7, generator=gen).to(ctx.device).requires_grad_()
    leaves = [x, *block.parameters()]
    names = ["x"] + [f"block.{k}" for k, _ in block.named_parameters()]
    with _rng(ctx.device):
        plain = _run(lambda: block(x).pow(2).sum(), leaves, seed=seed)
        theirs = _run(lambda: torch_checkpoint.checkpoint(block, x, use_reentrant=False).pow(2)
                      .sum(), leaves, seed=seed)
        _same(theirs, plain, names, "torch.utils.checkpoint itself")
        try:
            got = _run(lambda: _call(answer, block, x).pow(2).sum(), leaves, seed=seed)
            _same(got, plain, names, f"dropout(p=0.5) inside fn, batch {n}")
        except AssertionError as exc:
            raise CheckFailure(
                f"{exc}\nWith dropout inside fn, the recompute drew a different random mask than "
                "the forward: stash torch.get_rng_state() in forward and restore it (inside "
                "torch.random.fork_rng()) before recomputing.") from None


@check(EXERCISE, hidden=True)
def rng_stream_left_alone(answer, ctx):
    """after backward, the global RNG stream is where it would be without checkpointing"""
    gen = ctx.generator(14)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    block = _block(gen, [4, 6, 4], ctx.device, dropout=0.25)
    x = torch.randn(3, 4, generator=gen).to(ctx.device).requires_grad_()

    def after(make_out):
        torch.manual_seed(seed)
        out = make_out()
        torch.rand(5, device=ctx.device)           # other code draws numbers between the passes
        out.sum().backward()
        return torch.rand(8, device=ctx.device)    # the next numbers the program would draw
    with _rng(ctx.device):
        want = after(lambda: block(x))
        got = after(lambda: _call(answer, block, x))
    if not torch.equal(got, want):
        raise CheckFailure(
            "after backward, the global RNG has moved compared with a run without checkpointing: "
            "the recompute in backward consumed or reset the program's random stream. Restore the "
            "stashed state inside `with torch.random.fork_rng(...)`, which puts the surrounding "
            "state back when the block exits.")
