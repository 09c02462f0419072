"""What the export lab's runtime checks share: an output compared with the eager model's."""
from __future__ import annotations


import torch

from grader.checks import CheckFailure


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
