"""How the dispatcher lab's judges refuse what a probe reported as not of the exact type the
contract asks for: the probe sends the type's name and whether it is a subclass of the wanted
type (a subclass can override ``__eq__``, ``__len__`` or ``__torch_dispatch__`` to lie about its
contents, so its contents never cross), and the judge words it as ``grader.checks.exact`` does."""
from __future__ import annotations

from grader.checks import CheckFailure


def refuse(type_name: str, subclass: bool, what: str, want: str) -> None:
    """Raise ``exact``'s CheckFailure for a value of type ``type_name`` (a subclass of ``want``
    when ``subclass``): ``"{what} has type X, a subclass of {want}; return a plain {want}."``."""
    why = f"a subclass of {want}; return a plain {want}" if subclass else f"not a {want}"
    raise CheckFailure(f"{what} has type {type_name}, {why}.")


def tensor(entry, what: str):
    """``entry`` (a probe's ``tensor_entry``: a plain tensor, or ``{"type", "tensor"}`` for
    anything else) as a plain tensor, or ``exact``'s CheckFailure."""
    import torch

    if type(entry) is dict:
        refuse(entry["type"], entry["tensor"], what, "Tensor")
    if type(entry) is not torch.Tensor:
        refuse(type(entry).__name__, False, what, "Tensor")
    return entry
