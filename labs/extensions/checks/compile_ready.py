"""Checks of ``extensions.compile-ready``: ``pad_rows_fake(x, multiple)``, the fake kernel of the
lab's C++ operator ``pad_rows(Tensor x, int multiple) -> Tensor`` (x with zero rows appended to
dim 0 until its size is a multiple of ``multiple``; ``labs/extensions/labops.cpp``), which has a
CPU kernel only. A fake kernel computes the output's metadata (shape, dtype, strides) from
FakeTensors, without data, and must work when sizes are symbolic (torch.export with a dynamic
dim 0): it is what torch.compile and torch.export run instead of the kernel
(torch/library.py: register_fake; torch/_library/fake_impl.py).

The probe (:func:`labs.extensions.probes.compile_ready`) registers the answer as the fake kernel
for its own run only. Oracles: ``torch.cat`` with zeros, computed here, for shapes and values;
``torch.library.opcheck``; ``torch._dynamo.explain`` (no graph break) and
``torch.compile(fullgraph=True)``; ``torch.export`` with dim 0 dynamic, whose graph must call
the operator. Public: one shape's fake output, opcheck and torch.compile. Hidden (seeded): other
shapes, dtypes and multiples (already a multiple, multiple 1), and torch.export."""
from __future__ import annotations

from grader.checks import CheckFailure, check
from labs.extensions import probes
from labs.extensions.checks._common import failed_tests, first_lines, results, tensor

EXERCISE = "extensions.compile-ready"


def padded(x, multiple: int):
    """pad_rows's result, composed from torch ops (the oracle)."""
    import torch

    rows = -(-x.shape[0] // multiple) * multiple
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


def _run(answer, cases):
    seen = answer.probe(probes.compile_ready, cases)
    return results(seen, cases)


def _judge(answer, cases) -> None:
    import torch

    for (kind, x, multiple), got in zip(cases, _run(answer, cases)):
        where = (f"x of shape {tuple(x.shape)} and dtype {str(x.dtype).replace('torch.', '')}, "
                 f"multiple={multiple}")
        want = padded(x, multiple)
        if "error" in got:
            what = {"fake": "the fake kernel", "opcheck": "opcheck", "compile": "torch.compile",
                    "export": "torch.export"}[kind]
            raise CheckFailure(f"{what} raised for {where}: {first_lines(got['error']['text'])}")
        if kind == "fake":
            expected = {"shape": list(want.shape), "stride": list(want.stride()),
                        "dtype": str(want.dtype), "type": "FakeTensor"}
            if got != expected:
                raise CheckFailure(f"for {where} the fake kernel gave {got}; the kernel's output "
                                   f"is {expected}. Compute the rows from x.shape[0] and "
                                   "multiple (ceil to a multiple) and return x.new_empty(...).")
        elif kind == "opcheck":
            failed = failed_tests(got)
            if failed:
                test, why = next(iter(failed.items()))
                raise CheckFailure(f"torch.library.opcheck failed {', '.join(failed)} for "
                                   f"{where}: {test}: {first_lines(why)}")
        elif kind == "compile":
            if got.get("breaks") != 0 or got.get("graphs") != 1:
                raise CheckFailure(f"torch._dynamo.explain saw {got.get('graphs')} graph(s) and "
                                   f"{got.get('breaks')} graph break(s) for {where}: "
                                   f"{first_lines('; '.join(got.get('reasons') or []))}")
            if not torch.allclose(tensor(got["out"], "torch.compile's output"),
                                  (padded(x * 2, multiple)).sum(1)):
                raise CheckFailure(f"under torch.compile the program's output for {where} "
                                   "differs from eager's.")
        else:
            targets = got.get("targets") or []
            if not any(str(t).endswith(".pad_rows.default") for t in targets):
                raise CheckFailure(f"the exported graph for {where} calls {targets}, not "
                                   "pad_rows: export should keep the operator as one node.")
            if not torch.allclose(tensor(got["out"], "the exported program's output"),
                                  padded(x * 2, multiple).sum(1)):
                raise CheckFailure(f"the exported program's output for {where} differs from "
                                   "eager's.")


@check(EXERCISE)
def fake_opcheck_and_compile(pad_rows_fake, ctx):
    """the fake output, opcheck, and torch.compile(fullgraph=True) with no graph break"""
    import torch

    x = torch.randn(5, 3, generator=ctx.generator())
    _judge(pad_rows_fake, [["fake", x, 4], ["opcheck", x, 4], ["compile", x, 4]])


@check(EXERCISE, hidden=True)
def seeded_shapes_and_export(pad_rows_fake, ctx):
    """seeded shapes, dtypes and multiples, and torch.export with a dynamic dim 0"""
    import torch

    g = ctx.generator(1)
    rows, cols, multiple = (int(v) for v in torch.randint(2, 9, (3,), generator=g))
    x = torch.randn(rows, cols, 2, generator=g, dtype=torch.float64)
    exact_rows = torch.randn(multiple * 2, cols, generator=g)
    _judge(pad_rows_fake, [["fake", x, multiple], ["fake", exact_rows, multiple],
                           ["opcheck", x, 1], ["opcheck", exact_rows, multiple],
                           ["export", torch.randn(rows, cols, generator=g), multiple]])
