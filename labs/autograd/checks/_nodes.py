"""What the autograd lab's checks ask of the graph an answer's ``autograd.Function`` builds."""
from __future__ import annotations


def recorded_by(out, function) -> bool:
    """Whether ``out.grad_fn`` is the node ``function.apply`` recorded: a ``BackwardCFunction``
    whose ``_forward_cls`` is ``function`` (torch/autograd/function.py: BackwardCFunction,
    FunctionMeta), not the node of an op run outside ``forward``."""
    from torch.autograd.function import BackwardCFunction

    node = out.grad_fn
    return isinstance(node, BackwardCFunction) and getattr(node, "_forward_cls", None) is function
