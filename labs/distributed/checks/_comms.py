"""What the distributed checks see of a rank's communication: every c10d operation it issues.

Since PyTorch 2.1 each ``torch.distributed`` call reaches its backend through a dispatcher op
(``c10d::send``, ``c10d::allreduce_``, ``_c10d_functional::all_gather_into_tensor``...), so a
``TorchDispatchMode`` sees them all, whichever API issued them (``dist.*``, a ``ProcessGroup``
method, functional collectives, DTensor). ``CommDebugMode`` counts them the same way.
(torch/csrc/distributed/c10d/Ops.cpp: the c10d op registrations;
torch/distributed/tensor/debug/_comm_mode.py: CommDebugMode.)
"""
from __future__ import annotations

# (they live with the probes: the learner's kernel records what its ranks issue with them)
from labs.distributed.probes import KINDS, Comm, CommLog, describe

__all__ = ["KINDS", "Comm", "CommLog", "describe"]
