"""Checks of ``compile.partitioner``: ``RecomputePartitioner()`` is an AOTAutograd partition
function; ``functorch.compile.aot_function(fn, nop, nop, partition_fn=p)`` must give the
gradients ``torch.autograd.grad`` gives on eager ``fn``, and the forward must save fewer bytes
for backward than ``functorch.compile.default_partition`` whenever
``min_cut_rematerialization_partition`` does (both measured at check time, on the same
function). What a forward saves is read at run time: the tensors its graph returns after the
first ``num_fwd_outputs``. ``p.saved(fn, *inputs)`` must report those (shape, dtype) pairs, for
the learner's partition and for a subclass that partitions with ``default_partition`` (so it
must ask ``self``). The partition must choose what to save itself: a call of
``default_partition`` or ``min_cut_rematerialization_partition`` while it runs is refused
(seen with ``sys.setprofile``). Public: the two functions of ``programs.PARTITIONED``; hidden:
seeded random chains (matmul or linear, then pointwise ops)."""

from __future__ import annotations

import contextlib
import random
import sys

import torch
import torch._functorch.config as functorch_config
from functorch.compile import (
    aot_function,
    default_partition,
    make_boxed_func,
    min_cut_rematerialization_partition,
)

from grader.checks import CheckFailure, check, exact
from labs.compile import programs
from labs.compile.checks._harness import _defaults, fresh_compiler

EXERCISE = "compile.partitioner"
_LIBRARY = {default_partition.__code__: "default_partition",
            min_cut_rematerialization_partition.__code__: "min_cut_rematerialization_partition"}


@contextlib.contextmanager
def _clean():
    """fresh_compiler(), and AOTAutograd's own config (which steers min-cut) at its defaults."""
    now, default = functorch_config.get_config_copy(), _defaults(functorch_config)
    diff = {k: default[k] for k in now if k in default and now[k] != default[k]}
    with fresh_compiler(), functorch_config.patch(diff):
        yield


class _Watched:
    """Wraps the learner's partition: runs it with a profile hook that notes any call of the
    library's partitioners; ``used`` names them."""

    def __init__(self, partition):
        self.partition, self.used, self.calls = partition, [], 0

    def _hook(self, frame, event, arg):
        if event == "call" and frame.f_code in _LIBRARY:
            self.used.append(_LIBRARY[frame.f_code])

    def __call__(self, joint_module, joint_inputs, **kwargs):
        self.calls += 1
        before = sys.getprofile()
        sys.setprofile(self._hook)
        try:
            return self.partition(joint_module, joint_inputs, **kwargs)
        finally:
            sys.setprofile(before)


def _nbytes(saved: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in saved if isinstance(t, torch.Tensor))


def _measure(fn, inputs, partition, grad_out_seed: int):
    """Compile ``fn`` with ``partition``, run forward and backward on copies of ``inputs``;
    return (output, grads, saved tensors), the saved tensors read from the forward's run."""
    found = {}

    def watch_partition(joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
        found["n"] = num_fwd_outputs
        return partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def fw_compiler(fw_module, example_inputs):
        def run(*args):
            outs = fw_module(*args)
            found["saved"] = list(outs[found["n"]:])
            return outs

        return make_boxed_func(run)

    def bw_compiler(bw_module, example_inputs):
        return make_boxed_func(bw_module)

    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    compiled = aot_function(fn, fw_compiler, bw_compiler, partition_fn=watch_partition)
    out = compiled(*leaves)
    g = torch.Generator().manual_seed(grad_out_seed)
    grads = torch.autograd.grad(out, leaves, torch.randn(out.shape, generator=g))
    return out, grads, found["saved"]


def _eager(fn, inputs, grad_out_seed: int):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    g = torch.Generator().manual_seed(grad_out_seed)
    return out, torch.autograd.grad(out, leaves, torch.randn(out.shape, generator=g))


def _instance(cls):
    if not isinstance(cls, type):
        raise CheckFailure(f"RecomputePartitioner is a {type(cls).__name__}; define it as a "
                           "class (the checks make instances with RecomputePartitioner()).")
    p = cls()
    if not callable(p):
        raise CheckFailure("a RecomputePartitioner instance is not callable: define __call__"
                           "(self, joint_module, joint_inputs, *, num_fwd_outputs, **kwargs).")
    return p


def _verify(p, name: str, fn, inputs) -> list[torch.Tensor]:
    """Gradients equal eager's, no library partitioner used, fewer bytes than default whenever
    min-cut saves fewer. Returns the tensors the learner's forward saved."""
    watched = _Watched(p)
    try:
        out, grads, saved = _measure(fn, inputs, watched, 1)
    except AssertionError as exc:  # (torch's graph extraction asserts on a missing value)
        raise CheckFailure(
            f"partitioning {name} failed: AssertionError: {exc}. The backward graph must find "
            "every forward value it reads among the saved values, or be able to recompute it "
            "from them (and the tangents): save more.") from None
    finally:
        if watched.used:
            raise CheckFailure(
                f"your partition called {watched.used[0]} on {name}: choose what to save "
                "yourself (pick the saved nodes, then build the graphs with "
                "_extract_fwd_bwd_modules).")
    if watched.calls != 1:
        raise CheckFailure(f"aot_function never called your partition on {name}.")
    want_out, want_grads = _eager(fn, inputs, 1)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"{name}: the forward's output differs from eager "
                                             f"fn's. {m}")
    for i, (got, want) in enumerate(zip(grads, want_grads)):
        what = f"{name}: the gradient of input {i} differs from torch.autograd.grad of eager fn"
        torch.testing.assert_close(
            got, want, rtol=1e-4, atol=1e-5,
            msg=lambda m, what=what: f"{what}: the backward must recompute exactly what the "
                                     f"forward computed. {m}")
    mine = _nbytes(saved)
    default = _nbytes(_measure(fn, inputs, default_partition, 1)[2])
    min_cut = _nbytes(_measure(fn, inputs, min_cut_rematerialization_partition, 1)[2])
    if min_cut < default and mine >= default:
        raise CheckFailure(
            f"on {name} your forward saves {mine} bytes for backward; default_partition saves "
            f"{default} and min_cut_rematerialization_partition {min_cut} (yours / default / "
            f"min-cut: {mine} / {default} / {min_cut}). Save fewer: recompute cheap pointwise "
            "ops in backward from what you do save.")
    return saved


def _verify_saved(p, name: str, fn, inputs, saved: list[torch.Tensor], whose: str) -> None:
    got = p.saved(fn, *[x.detach().clone().requires_grad_() for x in inputs])
    exact(got, list, f"saved({name}, ...)")
    want = [(tuple(t.shape), t.dtype) for t in saved]
    for item in got:
        exact(item, tuple, f"an item of saved({name}, ...)")
    got = [(tuple(shape), dtype) for shape, dtype in got]
    if got != want:
        raise CheckFailure(
            f"for {whose}, saved({name}, ...) returned {len(got)} (shape, dtype) pairs "
            f"{_short(got)}, but the forward saved {len(want)}: {_short(want)}. Report the "
            "forward graph's outputs after the first num_fwd_outputs (the user's outputs), as "
            "partitioned by self.")


def _short(pairs) -> str:
    text = ", ".join(f"({list(s)}, {str(d).replace('torch.', '')})" for s, d in pairs)
    return f"[{text}]" if len(text) < 300 else f"[{text[:297]}...]"


def _given(seed: int) -> list[tuple[str, object, list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    return [(f"programs.{name}", fn, [torch.randn(s, generator=g) * 0.5 for s in shapes])
            for name, (fn, shapes) in programs.PARTITIONED.items()]


_UNARY = {"sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "exp": torch.exp,
          "sigmoid": torch.sigmoid, "relu": torch.relu}


def _chain(linear: bool, ops: list[str], reduce: bool):
    """A random chain: matmul (or linear with a bias), then pointwise ops; ``mul``/``add`` use
    the last input ``y``. Takes ``x, w`` (then ``b`` if linear, then ``y`` if used)."""
    uses_y = any(op in ("mul", "add") for op in ops)

    def fn(x, w, *rest):
        b, y = (rest[0] if linear else None), (rest[-1] if uses_y else None)
        h = torch.nn.functional.linear(x, w, b) if linear else x @ w.t()
        for op in ops:
            if op == "mul":
                h = h * y
            elif op == "add":
                h = h + y
            elif op == "square":
                h = h * h
            else:
                h = _UNARY[op](torch.tanh(h) if op == "exp" else h)  # (exp stays finite)
        return h.sum(1) if reduce else h

    fn.__name__ = fn.__qualname__ = ("linear" if linear else "mm") + "+" + "+".join(ops)
    return fn, uses_y


def _random(seed: int, count: int) -> list[tuple[str, object, list[torch.Tensor]]]:
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n, k, m = rng.randint(3, 40), rng.randint(2, 24), rng.randint(3, 40)
        ops = [rng.choice([*_UNARY, "mul", "add", "square"]) for _ in range(rng.randint(2, 5))]
        linear = rng.random() < 0.5
        fn, uses_y = _chain(linear, ops, rng.random() < 0.4)
        shapes = [(n, k), (m, k)] + [(m,)] * linear + [(n, m)] * uses_y
        inputs = [torch.randn(s, generator=g) * 0.4 for s in shapes]
        out.append((f"a random chain `{fn.__name__}` (x {[n, k]}, w {[m, k]})", fn, inputs))
    return out


def _default_subclass(cls):
    class DefaultPartitioner(cls):
        def __call__(self, joint_module, joint_inputs, **kwargs):
            return default_partition(joint_module, joint_inputs, **kwargs)

    return DefaultPartitioner


@check(EXERCISE)
def given_functions(cls, ctx):
    """the given functions: eager's gradients, fewer saved bytes than default_partition"""
    p = _instance(cls)
    with _clean():
        for name, fn, inputs in _given(ctx.seed):
            _verify(p, name, fn, inputs)


@check(EXERCISE)
def saved_on_given(cls, ctx):
    """saved() reports what your forward saves on the given functions"""
    p = _instance(cls)
    with _clean():
        for name, fn, inputs in _given(ctx.seed):
            saved = _measure(fn, inputs, p, 1)[2]
            _verify_saved(p, name, fn, inputs, saved, "your partitioner")


@check(EXERCISE, hidden=True)
def random_chains(cls, ctx):
    """seeded random chains: eager's gradients, fewer bytes, saved() right"""
    p = _instance(cls)
    with _clean():
        for name, fn, inputs in _random(ctx.seed, 4):
            saved = _verify(p, name, fn, inputs)
            _verify_saved(p, name, fn, inputs, saved, "your partitioner")


@check(EXERCISE, hidden=True)
def saved_asks_self(cls, ctx):
    """saved() reports what a subclass partitioning with default_partition saves"""
    _instance(cls)
    sub = _default_subclass(cls)()
    with _clean():
        for name, fn, inputs in _given(ctx.seed) + _random(ctx.seed + 100, 1):
            saved = _measure(fn, inputs, default_partition, 1)[2]
            _verify_saved(sub, name, fn, inputs, saved,
                          "a subclass whose __call__ is default_partition")
