"""How the dispatcher lab's checks quote a value that differs from torch's: both numbers in full
(``repr``, so that two different floats never print alike), their difference, and a hint when the
difference is the size of float32 rounding in a float64 comparison (precision lost on the way)."""
from __future__ import annotations


def worst_element(got, want) -> int:
    """The flat index where ``got`` and ``want`` (same shape) differ most; nan counts as the most,
    equal elements (infinities included) as no difference."""
    import torch

    g, w = got.detach().flatten().double(), want.detach().flatten().double()
    d = (g - w).abs().nan_to_num(nan=float("inf"), posinf=float("inf"))
    d = torch.where(g == w, torch.zeros_like(d), d)
    return int(d.argmax())


def _float32_level(got, want) -> bool:
    """Whether a float64 ``got`` differs from a float64 ``want`` only by float32-sized rounding."""
    import torch

    if want.dtype != torch.float64 or got.dtype != torch.float64:
        return False
    g, w = got.detach().double(), want.detach().double()
    if not (torch.isfinite(g).all() and torch.isfinite(w).all()):
        return False
    return bool(torch.allclose(g, w, rtol=1e-5, atol=1e-6))


def mismatch(got, want) -> tuple[int, str, str, str]:
    """``(i, got_i, want_i, note)`` for the element where ``got`` and ``want`` differ most: the two
    values as ``repr`` strings and a note to end the message with (``" (difference 2.4e-07)."`` and,
    when the whole difference looks like float32 rounding of float64 values, what to fix)."""
    i = worst_element(got, want)
    g, w = float(got.detach().flatten()[i]), float(want.detach().flatten()[i])
    diff = abs(g - w)
    note = f" (difference {diff:.3g})." if diff == diff else "."
    if _float32_level(got, want):
        note += (" All differences are the size of float32 rounding (about 1e-7 relative) on float64 "
                 "inputs: float64 precision is lost somewhere. Compute in the input's dtype: no .float(), "
                 "no float32 tensors or dtype=torch.float32 along the way.")
    return i, repr(g), repr(w), note
