"""What the distributed checks see of a rank's communication: every c10d operation it issues.

Since PyTorch 2.1 each ``torch.distributed`` call reaches its backend through a dispatcher op
(``c10d::send``, ``c10d::allreduce_``, ``_c10d_functional::all_gather_into_tensor``...), so a
``TorchDispatchMode`` sees them all, whichever API issued them (``dist.*``, a ``ProcessGroup``
method, functional collectives, DTensor). ``CommDebugMode`` counts them the same way.
(torch/csrc/distributed/c10d/Ops.cpp: the c10d op registrations;
torch/distributed/tensor/debug/_comm_mode.py: CommDebugMode.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: c10d / functional-collective op name -> the collective it is, in the course's words
KINDS = {
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast", "broadcast": "broadcast", "reduce_": "reduce",
    "gather_": "gather", "scatter_": "scatter", "barrier": "barrier",
}


@dataclass(frozen=True)
class Comm:
    """One communication op a rank issued: its ``kind`` (a value of :data:`KINDS`, or the op's
    own name), the ``peer`` rank of a send or recv (else None) and the ``bytes`` of its tensors
    (for a send, what it sends; for a recv, the buffer it receives into)."""

    kind: str
    peer: int | None
    bytes: int


class CommLog(TorchDispatchMode):
    """Record every c10d op issued under it, in order, in ``self.comms``."""

    def __init__(self):
        super().__init__()
        self.comms: list[Comm] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional"):
            name = func._opname
            tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])
                       if isinstance(t, torch.Tensor)]
            peer = args[2] if name in ("send", "recv_") else None
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            self.comms.append(Comm(KINDS.get(name, name), peer, nbytes))
        return func(*args, **(kwargs or {}))

    def counts(self) -> dict[str, int]:
        """How many ops of each kind (``wait_tensor`` and the like left out)."""
        found: dict[str, int] = {}
        for c in self.comms:
            if c.kind in set(KINDS.values()):
                found[c.kind] = found.get(c.kind, 0) + 1
        return found


def describe(counts: dict[str, int]) -> str:
    """``{"all_gather": 2}`` as ``"2 all_gather"``; ``"none"`` when empty."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none"


# The first TorchDispatchMode a process enters imports torch's symbolic-shape machinery (sympy
# and ~800 modules, about 1.4 s). Enter one here, in the process that forks the ranks, so that
# they inherit those modules instead of each importing them again.
with CommLog():
    torch.zeros(())
