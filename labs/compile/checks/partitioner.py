"""Checks of ``compile.partitioner``: ``RecomputePartitioner()`` is an AOTAutograd partition
function; ``functorch.compile.aot_function(fn, nop, nop, partition_fn=p)`` must give the gradients
``torch.autograd.grad`` gives on eager ``fn``; the forward must save no more bytes for backward
than ``functorch.compile.min_cut_rematerialization_partition`` (measured by the judge, on the same
function and inputs); and the backward may recompute only pointwise ops and views: any other op (a
matmul, a reduction) it calls more often than ``default_partition``'s backward fails, whatever it
saves. What a forward saves is read at run time: the tensors its graph returns after the first
``num_fwd_outputs``. ``p.saved(fn, *inputs)`` must report those (shape, dtype) pairs, for the
learner's partition and for a subclass that partitions with ``default_partition`` (so it must ask
``self``). The partition must choose what to save itself: a call of ``default_partition`` or
``min_cut_rematerialization_partition`` while it runs is refused (seen with ``sys.setprofile``).
The probe :func:`labs.compile.probes.partitions` runs the learner's partition in the kernel and
reports the output, the gradients, what the forward saved (shapes and dtypes) and what ``saved()``
said; eager, the library's partitioners and the bytes they save run in the judge. Public: the two
functions of ``programs.PARTITIONED``; hidden: seeded random chains (matmul or linear, then
pointwise ops)."""

from __future__ import annotations

import random

import torch
from functorch.compile import default_partition, min_cut_rematerialization_partition

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.compile import probes, programs

EXERCISE = "compile.partitioner"


def _nbytes(saved: list) -> int:
    """Bytes of the saved tensors a probe described (``[shape, dtype]``, None for others)."""
    total = 0
    for item in saved:
        if type(item) is list and len(item) == 2:
            shape, dtype = item
            total += torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return total


def _eager(fn, inputs, grad_out):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, grad_out)


def _library(fn, inputs, grad_out) -> tuple[int, int, list[str]]:
    """The oracle, here: the bytes default_partition and min-cut save, and the ops
    default_partition's backward graph calls."""
    found = []
    with probes.fresh_compiler(functorch=True):
        for partition in (default_partition, min_cut_rematerialization_partition):
            found.append(probes.saved_by(fn, inputs, partition, grad_out)[2:])
    (default, ops), (min_cut, _) = found
    return _nbytes(probes.described(default)), _nbytes(probes.described(min_cut)), ops


def _cheap(name: str) -> bool:
    """Whether the ATen op ``name`` (``"aten.mm.default"``) is pointwise or a view: cheap to
    run again in backward. Anything else (a matmul, a reduction, an unknown name) is not."""
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.partition(".")
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (AttributeError, RuntimeError):
        return False
    return isinstance(op, torch._ops.OpOverload) and (torch.Tag.pointwise in op.tags
                                                      or op.is_view)


def _recomputed(mine: list, default: list) -> str | None:
    """The first op that is not cheap (:func:`_cheap`) and that the learner's backward graph
    calls more often than default_partition's (which recomputes nothing), with both counts."""
    if type(mine) is not list or not all(type(name) is str for name in mine):
        return "(no list of op names)"
    for name in dict.fromkeys(mine):
        if not _cheap(name) and mine.count(name) > default.count(name):
            return f"{name} {mine.count(name)} times, where default_partition's calls it " \
                   f"{default.count(name)}"
    return None


def _kind(seen: dict) -> None:
    if not seen["class"]:
        raise CheckFailure(f"RecomputePartitioner is a {seen['type']}; define it as a "
                           "class (the checks make instances with RecomputePartitioner()).")
    if not seen["callable"]:
        raise CheckFailure("a RecomputePartitioner instance is not callable: define __call__"
                           "(self, joint_module, joint_inputs, *, num_fwd_outputs, **kwargs).")


def _case(spec: list, name: str, inputs: list) -> tuple:
    """(spec, name, fn, inputs, grad_out, eager output, eager grads) of one case."""
    fn = probes.partitioned_function(spec)
    out = fn(*inputs)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    want_out, want_grads = _eager(fn, inputs, grad_out)
    return spec, name, fn, inputs, grad_out, want_out, want_grads


def _ask(cls, cases: list[tuple], **how) -> list[tuple]:
    seen = cls.probe(probes.partitions, [[spec, inputs, grad_out]
                                         for spec, _, _, inputs, grad_out, _, _ in cases], **how)
    _kind(seen)
    pairs = paired(cases, seen["cases"], "functions")
    return [(case, got) for case, got in pairs]


def _verify(case: tuple, seen: dict) -> list:
    """Gradients equal eager's, no library partitioner used, only pointwise ops and views
    recomputed, no more bytes than min-cut saves. Returns what the learner's forward saved
    (described)."""
    _, name, fn, inputs, grad_out, want_out, want_grads = case
    if seen.get("used"):
        raise CheckFailure(
            f"your partition called {seen['used'][0]} on {name}: choose what to save "
            "yourself (pick the saved nodes, then build the graphs with "
            "_extract_fwd_bwd_modules).")
    if "raised" in seen:
        raise AnswerRaised(seen["raised"])
    if "failed" in seen:  # (torch's graph extraction asserts on a missing value)
        raise CheckFailure(
            f"partitioning {name} failed: AssertionError: {seen['failed']['text']}. The backward "
            "graph must find every forward value it reads among the saved values, or be able "
            "to recompute it from them (and the tangents): save more.")
    if seen["calls"] != 1:
        raise CheckFailure(f"aot_function never called your partition on {name}.")
    torch.testing.assert_close(seen["output"], want_out, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"{name}: the forward's output differs from eager "
                                             f"fn's. {m}")
    for i, (want, got) in enumerate(paired(list(want_grads), seen["grads"], "gradients")):
        what = f"{name}: the gradient of input {i} differs from torch.autograd.grad of eager fn"
        torch.testing.assert_close(
            got, want, rtol=1e-4, atol=1e-5,
            msg=lambda m, what=what: f"{what}: the backward must recompute exactly what the "
                                     f"forward computed. {m}")
    mine = _nbytes(seen["saved"])
    default, min_cut, default_ops = _library(fn, inputs, grad_out)
    again = _recomputed(seen.get("backward_ops"), default_ops)
    if again:
        raise CheckFailure(
            f"on {name} your backward graph calls {again}: it recomputes an op that is neither "
            "pointwise nor a view (a matmul or a reduction costs far more time to run again "
            "than its bytes cost to keep). Recompute only pointwise ops and views; save the "
            "output of anything else.")
    if mine > min_cut:
        raise CheckFailure(
            f"on {name} your forward saves {mine} bytes for backward; "
            f"min_cut_rematerialization_partition saves {min_cut} and default_partition "
            f"{default} (yours / default / min-cut: {mine} / {default} / {min_cut}). A cheaper "
            "choice exists: recomputing a value means keeping what it is computed from, which "
            "can cost more bytes than the value itself (a sum of two tensors read from two "
            "saved ones). For each value choose the cheaper side: this is a minimum cut of the "
            "forward graph, weighted by bytes.")
    return seen["saved"]


def _verify_saved(name: str, seen: dict, saved: list, whose: str) -> None:
    """``saved()`` (as the probe saw it) reported the (shape, dtype) of each of ``saved``."""
    if "raised" in seen:
        raise AnswerRaised(seen["raised"])
    report = seen["saved_report"]
    got = report["value"]
    if type(got) is not list:
        raise CheckFailure(f"saved({name}, ...) has type {report['type']}, not a list.")
    for item, kind in zip(got, report["items"]):
        if type(item) is not tuple:
            raise CheckFailure(f"an item of saved({name}, ...) has type {kind}, not a tuple.")
    want = [(tuple(s[0]), s[1]) if s is not None else None for s in saved]
    try:
        got = [(tuple(shape), dtype) for shape, dtype in got]
    except (TypeError, ValueError):
        raise CheckFailure(f"saved({name}, ...) returned items that are not (shape, dtype) "
                           "pairs.") from None
    if got != want:
        raise CheckFailure(
            f"for {whose}, saved({name}, ...) returned {len(got)} (shape, dtype) pairs "
            f"{_short(got)}, but the forward saved {len(want)}: {_short(want)}. Report the "
            "forward graph's outputs after the first num_fwd_outputs (the user's outputs), as "
            "partitioned by self.")


def _short(pairs) -> str:
    text = ", ".join("(not a tensor)" if p is None else
                     f"({list(p[0])}, {str(p[1]).replace('torch.', '')})" for p in pairs)
    return f"[{text}]" if len(text) < 300 else f"[{text[:297]}...]"


def _given(seed: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    return [_case(["program", name], f"programs.{name}",
                  [torch.randn(s, generator=g) * 0.5 for s in shapes])
            for name, (fn, shapes) in programs.PARTITIONED.items()]


def _random(seed: int, count: int) -> list[tuple]:
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n, k, m = rng.randint(3, 40), rng.randint(2, 24), rng.randint(3, 40)
        ops = [rng.choice(probes.CHAIN_OPS) for _ in range(rng.randint(2, 5))]
        linear = rng.random() < 0.5
        reduce = rng.random() < 0.4
        fn, uses_y = probes.chain(linear, ops, reduce)
        shapes = [(n, k), (m, k)] + [(m,)] * linear + [(n, m)] * uses_y
        inputs = [torch.randn(s, generator=g) * 0.4 for s in shapes]
        out.append(_case(["chain", linear, ops, reduce],
                         f"a random chain `{fn.__name__}` (x {[n, k]}, w {[m, k]})", inputs))
    return out


@check(EXERCISE)
def given_functions(cls, ctx):
    """the given functions: eager's gradients, no more saved bytes than min-cut"""
    for case, seen in _ask(cls, _given(ctx.seed)):
        _verify(case, seen)


@check(EXERCISE)
def saved_on_given(cls, ctx):
    """saved() reports what your forward saves on the given functions"""
    for case, seen in _ask(cls, _given(ctx.seed), saved=True):
        if "raised" in seen:
            raise AnswerRaised(seen["raised"])
        if "saved" not in seen:
            _verify(case, seen)  # (says why the forward did not run)
        _verify_saved(case[1], seen, seen["saved"], "your partitioner")


@check(EXERCISE, hidden=True)
def random_chains(cls, ctx):
    """seeded random chains: eager's gradients, no more bytes than min-cut, saved() right"""
    for case, seen in _ask(cls, _random(ctx.seed, 4), saved=True):
        saved = _verify(case, seen)
        _verify_saved(case[1], seen, saved, "your partitioner")


@check(EXERCISE, hidden=True)
def saved_asks_self(cls, ctx):
    """saved() reports what a subclass partitioning with default_partition saves"""
    cases = _given(ctx.seed) + _random(ctx.seed + 100, 1)
    for case, seen in _ask(cls, cases, run=False, saved=True, subclass=True):
        _, name, fn, inputs, grad_out, _, _ = case
        with probes.fresh_compiler(functorch=True):
            saved = probes.saved_by(fn, inputs, default_partition, grad_out)[2]
        _verify_saved(name, seen, probes.described(saved),
                      "a subclass whose __call__ is default_partition")
