"""Checks of ``extensions.cpp-op``: ``mul_tanh_source()``, which returns a C++ source that defines
``mul_tanh(Tensor x, Tensor y) -> Tensor`` (``x * tanh(y)`` elementwise, for x and y of one
shape and one floating dtype) in a ``TORCH_LIBRARY(TORCH_EXTENSION_NAME, m)`` block, with a CPU
kernel and a Meta kernel (``TORCH_LIBRARY_IMPL``).

The probe (:func:`labs.extensions.probes.cpp_op`) builds the source in the kernel's own
extensions folder and runs the operator on the inputs chosen here. Oracles: the composite ``x *
torch.tanh(y)`` computed here; its shape and dtype, with contiguous strides (the kernel's output
is a new contiguous tensor), for what the Meta kernel must report; ``torch.library.opcheck``
(its schema, autograd registration, FakeTensor and AOTDispatcher tests: torch/library.py:
opcheck). Public: float32 inputs (one transposed), the Meta kernel, opcheck. Hidden (seeded):
float64, transposed and sliced (non-contiguous) inputs, empty and 0-d tensors, mismatched shapes
(which must raise, not read past the end), and opcheck on a non-contiguous pair."""
from __future__ import annotations

from grader.checks import CheckFailure, check
from labs.extensions import probes
from labs.extensions.checks._common import built, failed_tests, first_lines, results, tensor

EXERCISE = "extensions.cpp-op"


def _describe(x, y) -> str:
    def one(t):
        layout = "contiguous" if t.is_contiguous() else f"strides {tuple(t.stride())}"
        return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} ({layout})"
    return f"x {one(x)}, y {one(y)}"


def _run(source, cases):
    seen = built(source.probe(probes.cpp_op, cases), EXERCISE, "mul_tanh")
    return results(seen, cases)


def _values(source, pairs) -> None:
    import torch

    for (x, y), seen in zip(pairs, _run(source, [["call", x, y] for x, y in pairs])):
        where = _describe(x, y)
        if "error" in seen:
            raise CheckFailure(f"mul_tanh raised for {where}: "
                               f"{first_lines(seen['error']['text'])}")
        got, want = tensor(seen["out"], f"mul_tanh's output for {where}"), x * torch.tanh(y)
        if got.shape != want.shape or got.dtype != want.dtype:
            raise CheckFailure(f"for {where} mul_tanh returned shape {tuple(got.shape)}, dtype "
                               f"{got.dtype}; expected {tuple(want.shape)}, {want.dtype}.")
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            hint = (" The inputs are not contiguous: read them through their strides, or make "
                    "them contiguous first (x.contiguous())." if not (x.is_contiguous() and
                                                                      y.is_contiguous()) else "")
            raise CheckFailure(f"for {where} mul_tanh's values differ from x * tanh(y) (largest "
                               f"difference {(got - want).abs().max().item():.3g}).{hint}")


def _meta_and_opcheck(source, pairs) -> None:
    import torch

    cases = [[kind, x, y] for x, y in pairs for kind in ("meta", "opcheck")]
    for (kind, x, y), seen in zip(cases, _run(source, cases)):
        where = _describe(x, y)
        if kind == "meta":
            if "error" in seen:
                raise CheckFailure(
                    f"on meta tensors ({where}) mul_tanh raised: "
                    f"{first_lines(seen['error']['text'])}. Register a Meta kernel "
                    "(TORCH_LIBRARY_IMPL(TORCH_EXTENSION_NAME, Meta, m)) that computes the "
                    "output's shape and dtype without reading data.")
            want = x * torch.tanh(y)
            meta = seen.get("meta") or {}
            expected = {"device": "meta", "shape": list(want.shape), "dtype": str(want.dtype),
                        "stride": list(torch.empty(want.shape).stride())}
            if meta != expected:
                raise CheckFailure(f"on meta tensors ({where}) mul_tanh returned {meta}; expected "
                                   f"{expected}: a new contiguous tensor like the CPU kernel's.")
        else:
            failed = failed_tests(seen)
            if failed:
                test, why = next(iter(failed.items()))
                raise CheckFailure(f"torch.library.opcheck failed {', '.join(failed)} for "
                                   f"{where}: {test}: {first_lines(why)}")


def _inputs(g, shape, dtype, layout: str):
    import torch

    if layout == "transposed":
        x = torch.randn(*reversed(shape), generator=g, dtype=dtype).t()
    elif layout == "sliced":
        x = torch.randn(shape[0], shape[1] * 2, generator=g, dtype=dtype)[:, ::2]
    else:
        x = torch.randn(*shape, generator=g, dtype=dtype)
    return x


@check(EXERCISE)
def float32_values(mul_tanh_source, ctx):
    """x * tanh(y) on float32 inputs (one transposed), against torch's composite"""
    import torch

    g = ctx.generator()
    pairs = [(torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)),
             (torch.randn(7, generator=g), torch.randn(7, generator=g)),
             (torch.randn(5, 3, generator=g).t(), torch.randn(3, 5, generator=g))]
    _values(mul_tanh_source, pairs)


@check(EXERCISE)
def meta_kernel_and_opcheck(mul_tanh_source, ctx):
    """the Meta kernel's output, and torch.library.opcheck"""
    import torch

    g = ctx.generator(1)
    _meta_and_opcheck(mul_tanh_source, [(torch.randn(4, 3, generator=g),
                                         torch.randn(4, 3, generator=g))])


@check(EXERCISE, hidden=True)
def strides_dtypes_and_edges(mul_tanh_source, ctx):
    """float64, non-contiguous, empty and 0-d inputs (seeded)"""
    import torch

    g = ctx.generator(2)
    rows, cols = (int(v) for v in torch.randint(2, 9, (2,), generator=g))
    pairs = [(_inputs(g, (rows, cols), torch.float64, "plain"),
              _inputs(g, (rows, cols), torch.float64, "plain")),
             (_inputs(g, (rows, cols), torch.float32, "transposed"),
              _inputs(g, (rows, cols), torch.float32, "plain")),
             (_inputs(g, (rows, cols), torch.float32, "plain"),
              _inputs(g, (rows, cols), torch.float32, "sliced")),
             (torch.randn(0, cols, generator=g), torch.randn(0, cols, generator=g)),
             (torch.randn((), generator=g), torch.randn((), generator=g))]
    _values(mul_tanh_source, pairs)


@check(EXERCISE, hidden=True)
def mismatched_shapes_raise(mul_tanh_source, ctx):
    """x and y of different shapes raise an error instead of reading past the end"""
    import torch

    g = ctx.generator(3)
    x, y = torch.randn(3, 4, generator=g), torch.randn(2, 4, generator=g)
    seen = _run(mul_tanh_source, [["call", x, y]])[0]
    if "error" not in seen:
        raise CheckFailure(f"mul_tanh(x, y) with x {tuple(x.shape)} and y {tuple(y.shape)} "
                           "returned instead of raising: check that the shapes agree "
                           "(TORCH_CHECK(x.sizes() == y.sizes(), ...)) before reading y.")


@check(EXERCISE, hidden=True)
def opcheck_non_contiguous(mul_tanh_source, ctx):
    """opcheck and the Meta kernel on non-contiguous float64 inputs"""
    import torch

    g = ctx.generator(4)
    _meta_and_opcheck(mul_tanh_source, [(_inputs(g, (5, 3), torch.float64, "transposed"),
                                         _inputs(g, (5, 3), torch.float64, "sliced"))])
