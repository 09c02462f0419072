"""Checks of ``export.aoti``: ``package_aoti(model, example, path)`` exports ``model`` (one
float32 input shaped like ``example``, ``(batch, features)``) with a dynamic batch, dim 0, over
at least 1..64, compiles it with AOTInductor into a package at ``path``
(torch/_inductor/__init__.py: aoti_compile_and_package) and returns the package's path. The
probe loads that path with ``torch._inductor.aoti_load_package``
(torch/_inductor/package/package.py: load_package; torch/export/pt2_archive/_package.py:
AOTICompiledModel) and runs the loaded model
against the eager one (``torch.testing.assert_close``, float32 tolerances).

A package's generated code checks its input's sizes against what it was compiled for only when
the environment variable ``AOTI_RUNTIME_CHECK_INPUTS`` is set (read at its first run:
torch/_inductor/codegen/cpp_wrapper_cpu.py: generate_input_output_runtime_checks). Without it, a
package compiled for batch 4 runs at batch 7 and returns wrong rows, or reads past its input at
batch 1. The checks run the loaded model with it set, so such a package raises a RuntimeError
that names the size it was compiled for, and a batch outside the exported range is refused.
Those checks refuse sizes 0 and 1 of any dynamic dimension, even one exported with
``Dim(min=1)`` (Inductor's shape environment starts a dynamic size at 2:
torch/fx/experimental/symbolic_shapes.py: ShapeEnv._default_value_range), unless the package
is compiled with ``aot_inductor.check_lowerbound=False``: the answer is
called with that inductor setting, so that batch 1 can run.

A package is native code the learner's kernel built: it is loaded and run there only, by the
probe ``probes.aoti_runs``, on the inputs the check sends; the check compares what comes back
with its own eager model. The answer is called once, on ``models.mlp([16, 32, 32, 4])`` with an
example batch of 4, in an empty temporary folder (compiling costs ~10 s, more with a cold
compiler cache), and the package is run at every batch of both checks. Public: batch 4 and a
seeded batch in 5..16. Hidden: batches 1, 64 and a seeded batch in 17..63 (from the public
check's reply when the same answer handle was judged with the same seed, else compiled again),
and the batch range of the program the answer exported (the probe records it at
``torch.export._trace._export``) must hold 1..64: with the lower-bound check off, a package
compiled from a program declared from 2 up would run batch 1 all the same.
Warnings and log records below ERROR from export and Inductor, and what the loaded model's input
checks print, are kept out of the output.
"""

from __future__ import annotations

import torch

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.export import models, probes
from labs.export.checks._parity import same_as_eager

EXERCISE = "export.aoti"
WIDTHS = [16, 32, 32, 4]
EXAMPLE_BATCH, MAX_BATCH = 4, 64
WHAT = "models.mlp([16, 32, 32, 4]) with an example batch of 4"
#: the last reply the checks got: {"answer", "seed", "reply"}; the hidden check judges it again
#: when the public check got it for the same answer handle and seed (a compile costs ~10 s)
_SEEN: dict = {}


def _case(ctx) -> tuple[torch.nn.Module, torch.Tensor, list[torch.Tensor]]:
    """The model, the example and the inputs of both checks (public, then hidden), for
    ``ctx.seed``."""
    g = ctx.generator()
    model = models.mlp(WIDTHS, g)
    example = torch.randn(EXAMPLE_BATCH, WIDTHS[0], generator=g)
    public = int(torch.randint(5, 17, (), generator=g))
    hidden = int(torch.randint(17, MAX_BATCH, (), generator=g))
    batches = [EXAMPLE_BATCH, public, 1, MAX_BATCH, hidden]
    return model, example, [torch.randn(b, WIDTHS[0], generator=g) for b in batches]


def _package(reply) -> list:
    """The outputs of the probe's reply, once what the answer returned is checked to be the
    path of an AOTInductor package that loads."""
    if type(reply) is not dict or type(reply.get("returned")) is not dict:
        raise CheckFailure("what came back from your answer is not what the grader's probe "
                           "returns: the probe did not run as shipped (answers must not modify "
                           "the grader).")
    returned = reply["returned"]
    if returned.get("type") == "NoneType":
        raise CheckFailure(
            f"for {WHAT}, package_aoti returned None: return the package's path (what "
            "torch._inductor.aoti_compile_and_package returns).")
    path = returned.get("path")
    if type(path) is not str:
        raise CheckFailure(
            f"for {WHAT}, package_aoti returned a {returned.get('type')}, not a path: return the "
            "package's path (a str, what torch._inductor.aoti_compile_and_package returns).")
    if not reply.get("file"):
        relative = ("" if reply.get("abs") else
                    " (a relative path: read from where the check runs)")
        found = [str(n) for n in reply.get("folder") or []]
        where = (f"; the folder of path holds {', '.join(found)}" if found else
                 "; nothing was written in the folder of path either")
        raise CheckFailure(
            f"for {WHAT}, package_aoti returned {path!r}, which is not a file{relative}{where}. "
            "Compile with aoti_compile_and_package(ep, package_path=path) and return the path "
            "it returns.")
    if not reply.get("zip"):
        raise CheckFailure(
            f"for {WHAT}, package_aoti returned {path!r}, which is not a zip archive; a .pt2 "
            "package is one. Write it with torch._inductor.aoti_compile_and_package.")
    if not reply.get("aoti"):
        raise CheckFailure(
            f"for {WHAT}, the .pt2 archive at the returned path holds no AOTInductor model "
            "(nothing under data/aotinductor/): it holds an ExportedProgram, which "
            "torch.export.save writes and only torch.export.load reads back. Compile the "
            "ExportedProgram with torch._inductor.aoti_compile_and_package(ep, "
            "package_path=path) instead.")
    if type(reply.get("load")) is dict:
        err = reply["load"]
        text = str(err.get("text", "")).strip()
        raise CheckFailure(
            f"for {WHAT}, torch._inductor.aoti_load_package could not load the package "
            f"package_aoti returned: {err.get('ename')}: "
            f"{text.splitlines()[0][:300] if text else ''}")
    return reply.get("outputs")


def _declared(ranges) -> None:
    """The batch range of every program the answer exported (the one compiled among them) must
    hold 1..MAX_BATCH: the grader compiles with the lower-bound check off, so a package's own
    input checks would not refuse batch 1 for a program declared from 2 up. (An observation in
    the kernel: see the README on what a learner can still bend.)"""
    if not ranges:
        raise CheckFailure(
            f"for {WHAT}, package_aoti exported no program with torch.export (the checks "
            "read the batch range it declares): export the model with a dynamic batch, then "
            "compile that ExportedProgram.")
    narrow = [(lo, up) for lo, up in ranges if lo > 1 or (up is not None and up < MAX_BATCH)]
    if narrow:  # (any: which of several programs was compiled is not observed)
        lower, upper = narrow[0]
        shown = f"[{lower}, {'inf' if upper is None else upper}]"
        raise CheckFailure(
            f"for {WHAT}, a program package_aoti exported declares dim 0 (the batch) in "
            f"{shown}; the exercise asks for every batch in 1..{MAX_BATCH}. Give the batch's "
            f"Dim min=1 and max={MAX_BATCH} or more (AOTInductor's own input checks start at 2; "
            "the grader compiles with aot_inductor.check_lowerbound=False, so batch 1 runs).")


def _run(outputs: list, model: torch.nn.Module, xs: list[torch.Tensor]) -> None:
    """What the loaded package returned on each x against the eager model's output."""
    for x, got in zip(xs, outputs, strict=True):
        batch = x.shape[0]
        if type(got) is dict and type(got.get("error")) is dict:
            text = str(got["error"].get("text", "")).strip()
            text = text.splitlines()[0] if text else ""
            if "unmatched dim value at 0" in text:
                why = (f" The package was compiled for one batch only (its input check says: "
                       f"{text}): export with dynamic_shapes marking dim 0 of the input dynamic "
                       "(a torch.export.Dim) before compiling.")
            elif "dim value is too" in text:
                why = (f" The batch is outside the range the package was exported for ({text}):"
                       f" give the batch's Dim a range that holds 1..{MAX_BATCH}.")
            else:
                why = f" ({text[:300]})"
            raise CheckFailure(f"for {WHAT}, the loaded package refused a ({batch}, "
                               f"{WIDTHS[0]}) input (batch {batch}).{why}")
        if type(got) is not torch.Tensor:
            kind = got.get("type") if type(got) is dict else type(got).__name__
            raise CheckFailure(f"what the loaded package returned at batch {batch} is a {kind}, "
                               "not a torch.Tensor.")
        with torch.no_grad():
            want = model(x)
        same_as_eager(got, want, WHAT, batch, "the loaded package")


def _outputs(package_aoti, ctx, model, example, xs) -> list:
    """The package's outputs on every x (one probe call: one compile), from the public
    check's reply when it was for the same answer handle and seed."""
    if _SEEN.get("answer") is package_aoti and _SEEN.get("seed") == ctx.seed:
        reply = _SEEN["reply"]
    else:
        _SEEN.clear()
        reply = package_aoti.probe(probes.aoti_runs, WIDTHS, dict(model.state_dict()),
                                   example.clone(), [x.clone() for x in xs])
        _SEEN.update(answer=package_aoti, seed=ctx.seed, reply=reply)
    pairs = paired(xs, _package(reply), "batches")
    if len(pairs) < len(xs):
        raise AnswerRaised(pairs[-1][1]["raised"])
    return [got for _, got in pairs]


@check(EXERCISE)
def compile_load_and_run(package_aoti, ctx):
    """models.mlp([16, 32, 32, 4]) compiled at batch 4, loaded back, run at batch 4 and another"""
    model, example, xs = _case(ctx)
    _SEEN.clear()
    outputs = _outputs(package_aoti, ctx, model, example, xs)
    _run(outputs[:2], model, xs[:2])


@check(EXERCISE, hidden=True)
def batches_1_to_64(package_aoti, ctx):
    """the same package run at batches 1, 64 and a seeded one; its program declares 1..64"""
    model, example, xs = _case(ctx)
    outputs = _outputs(package_aoti, ctx, model, example, xs)
    _run(outputs[2:], model, xs[2:])
    _declared(_SEEN["reply"].get("ranges"))
