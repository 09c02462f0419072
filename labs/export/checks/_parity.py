"""What the export lab's runtime checks share: exporters and compilers kept quiet, and an output
compared with the eager model's."""
from __future__ import annotations

import contextlib
import logging
import warnings

import torch

from grader.checks import CheckFailure


@contextlib.contextmanager
def quiet(*loggers: str):
    """Warnings, and records below ERROR of the named loggers (e.g. ``"torch._inductor"``), kept
    out of the output for the body; the loggers' levels are put back afterwards."""
    found = [logging.getLogger(name) for name in loggers]
    levels = [lg.level for lg in found]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for lg in found:
                lg.setLevel(logging.ERROR)
            yield
    finally:
        for lg, level in zip(found, levels, strict=True):
            lg.setLevel(level)


def same_as_eager(got: torch.Tensor, want: torch.Tensor, what: str, batch: int,
                  runner: str) -> None:
    """CheckFailure unless ``got`` (what ``runner``, e.g. ``"onnxruntime"``, returned at
    ``batch``) has the shape of ``want`` (the eager model's output) and its values, within
    ``torch.testing.assert_close``'s tolerances for the dtype; ``what`` names the case."""
    if got.shape != want.shape:
        raise CheckFailure(f"for {what}, at batch {batch} {runner} returned shape "
                           f"{list(got.shape)}; the eager model returns {list(want.shape)}.")
    torch.testing.assert_close(got, want, msg=lambda m: (
        f"for {what}, at batch {batch} {runner}'s output differs from the eager model's: {m}"))
