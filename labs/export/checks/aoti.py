"""Checks of ``export.aoti``: ``package_aoti(model, example, path)`` exports ``model`` (one
float32 input shaped like ``example``, ``(batch, features)``) with a dynamic batch, dim 0, over
at least 1..64, compiles it with AOTInductor into a package at ``path``
(torch/_inductor/__init__.py: aoti_compile_and_package) and returns the package's path. The
check loads that path with ``torch._inductor.aoti_load_package``
(torch/_inductor/package/package.py: load_package, AOTICompiledModel) and runs the loaded model
against the eager one (``torch.testing.assert_close``, float32 tolerances).

A package's generated code checks its input's sizes against what it was compiled for only when
the environment variable ``AOTI_RUNTIME_CHECK_INPUTS`` is set (read at its first run:
torch/_inductor/codegen/cpp_wrapper_cpu.py: generate_input_output_runtime_checks). Without it, a
package compiled for batch 4 runs at batch 7 and returns wrong rows, or reads past its input at
batch 1. The checks run the loaded model with it set, so such a package raises a RuntimeError
that names the size it was compiled for, and a batch outside the exported range is refused.
Those checks refuse sizes 0 and 1 of any dynamic dimension (export's ``[2, ...]`` lower bound)
unless the package is compiled with ``aot_inductor.check_lowerbound=False``: the answer is
called with that inductor setting, so that batch 1 can run.

The answer is called once, on a copy of ``models.mlp([16, 32, 32, 4])`` with an example batch of
4, in an empty temporary folder (compiling costs ~10 s, more with a cold compiler cache). Public:
the loaded model at batch 4 and a seeded batch in 5..16. Hidden: the same package (kept from the
public check when the same answer passed it with the same seed, else compiled again) at batches
1, 64 and a seeded batch in 17..63. Warnings and log records below ERROR from export and
Inductor, and what the loaded model's input checks print, are kept out of the output.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import tempfile
import zipfile

import torch
import torch._inductor
import torch._inductor.config as inductor_config

from grader.checks import CheckFailure, check, plain_tensor
from labs.export import models
from labs.export.checks._parity import quiet, same_as_eager

EXERCISE = "export.aoti"
WIDTHS = [16, 32, 32, 4]
EXAMPLE_BATCH, MAX_BATCH = 4, 64
WHAT = "models.mlp([16, 32, 32, 4]) with an example batch of 4"
CHECK_INPUTS = "AOTI_RUNTIME_CHECK_INPUTS"
#: the last package the checks loaded: {"answer", "seed", "runner"}; the hidden check runs it
#: again when the public check loaded it for the same answer and seed (a compile costs ~10 s)
_LOADED: dict = {}


def _quiet_compile():
    """Warnings and log records below ERROR from export and Inductor kept out of the output."""
    return quiet("torch._inductor", "torch.export", "torch._export", "torch._dynamo")


@contextlib.contextmanager
def _checked_inputs():
    """``AOTI_RUNTIME_CHECK_INPUTS=1`` for the body, and what C++ writes to fds 1 and 2 (the
    input check prints its error before raising it) sent to /dev/null."""
    old = os.environ.get(CHECK_INPUTS)
    os.environ[CHECK_INPUTS] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
        if old is None:
            del os.environ[CHECK_INPUTS]
        else:
            os.environ[CHECK_INPUTS] = old


def _case(ctx) -> tuple[torch.nn.Module, torch.Tensor, torch.Generator]:
    """The model, the example and the generator the batches are drawn from, for ``ctx.seed``."""
    g = ctx.generator()
    model = models.mlp(WIDTHS, g)
    return model, torch.randn(EXAMPLE_BATCH, WIDTHS[0], generator=g), g


def _package_path(got, folder: str) -> str:
    """The path the answer returned, checked to be an AOTInductor package."""
    if got is None:
        raise CheckFailure(
            f"for {WHAT}, package_aoti returned None: return the package's path (what "
            "torch._inductor.aoti_compile_and_package returns).")
    if not isinstance(got, (str, os.PathLike)):
        raise CheckFailure(
            f"for {WHAT}, package_aoti returned a {type(got).__name__}, not a path: return the "
            "package's path (a str, what torch._inductor.aoti_compile_and_package returns).")
    path = os.fspath(got)
    if not os.path.isfile(path):
        relative = ("" if os.path.isabs(path) else
                    " (a relative path: read from where the check runs)")
        found = sorted(os.listdir(folder))
        where = (f"; the folder of path holds {', '.join(found)}" if found else
                 "; nothing was written in the folder of path either")
        raise CheckFailure(
            f"for {WHAT}, package_aoti returned {path!r}, which is not a file{relative}{where}. "
            "Compile with aoti_compile_and_package(ep, package_path=path) and return the path "
            "it returns.")
    if not zipfile.is_zipfile(path):
        raise CheckFailure(
            f"for {WHAT}, package_aoti returned {path!r}, which is not a zip archive; a .pt2 "
            "package is one. Write it with torch._inductor.aoti_compile_and_package.")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    if not any("/data/aotinductor/" in n for n in names):
        raise CheckFailure(
            f"for {WHAT}, the .pt2 archive at the returned path holds no AOTInductor model "
            "(nothing under data/aotinductor/): it holds an ExportedProgram, which "
            "torch.export.save writes and only torch.export.load reads back. Compile the "
            "ExportedProgram with torch._inductor.aoti_compile_and_package(ep, "
            "package_path=path) instead.")
    return path


def _compile_and_load(package_aoti, model: torch.nn.Module, example: torch.Tensor):
    """Call the answer in an empty folder and load the package it returns."""
    with tempfile.TemporaryDirectory(prefix="aoti_") as folder:
        path = os.path.join(folder, "model.pt2")
        with _quiet_compile(), inductor_config.patch({"aot_inductor.check_lowerbound": False}):
            got = package_aoti(copy.deepcopy(model), example.clone(), path)
        path = _package_path(got, folder)
        try:
            with _quiet_compile():
                return torch._inductor.aoti_load_package(path)
        except Exception as exc:  # noqa: BLE001  (what the loader says is the learner's clue)
            raise CheckFailure(
                f"for {WHAT}, torch._inductor.aoti_load_package could not load the package "
                f"package_aoti returned: {type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}") from None


def _run(runner, model: torch.nn.Module, batches: list[int], g: torch.Generator) -> None:
    """The loaded package against the eager model at each batch."""
    for batch in batches:
        x = torch.randn(batch, WIDTHS[0], generator=g)
        try:
            with _checked_inputs():
                got = runner(x)
        except RuntimeError as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
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
                               f"{WIDTHS[0]}) input (batch {batch}).{why}") from None
        plain_tensor(got, f"what the loaded package returned at batch {batch}")
        with torch.no_grad():
            want = model(x)
        same_as_eager(got, want, WHAT, batch, "the loaded package")


@check(EXERCISE)
def compile_load_and_run(package_aoti, ctx):
    """models.mlp([16, 32, 32, 4]) compiled at batch 4, loaded back, run at batch 4 and another"""
    model, example, g = _case(ctx)
    _LOADED.clear()
    runner = _compile_and_load(package_aoti, model, example)
    _run(runner, model, [EXAMPLE_BATCH, int(torch.randint(5, 17, (), generator=g))], g)
    _LOADED.update(answer=package_aoti, seed=ctx.seed, runner=runner)


@check(EXERCISE, hidden=True)
def batches_1_to_64(package_aoti, ctx):
    """the same package run at batches 1, 64 and a seeded one"""
    model, example, g = _case(ctx)
    torch.randint(5, 17, (), generator=g)  # (the public check's batch: the same draws follow)
    if _LOADED.get("answer") is package_aoti and _LOADED.get("seed") == ctx.seed:
        runner = _LOADED["runner"]
    else:
        runner = _compile_and_load(package_aoti, model, example)
    _run(runner, model, [1, MAX_BATCH, int(torch.randint(17, MAX_BATCH, (), generator=g))], g)
