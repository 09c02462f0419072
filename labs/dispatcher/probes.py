"""The dispatcher lab's probes: what runs in the learner's kernel when an exercise is judged
(see ``grader.probe``). Each calls the answer and returns what it observed as plain data; the
judges in ``labs/dispatcher/checks`` decide."""
from __future__ import annotations

from grader.checks import probe


def _spy_mode():
    """A dispatch mode that records the aten ops run while it is active
    (torch/utils/_python_dispatch.py: TorchDispatchMode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    return Spy()


@probe
def geometry(view_geometry, shape: list, ops: list) -> dict:
    """``view_geometry(shape, ops)`` under a dispatch mode: ``{"got": what it returned, "ops":
    the aten ops it ran}`` (an observation in the kernel: the judge's message for the common
    slip of asking torch; the int64-overflowing shapes are what no such answer can pass)."""
    with _spy_mode() as spy:
        got = view_geometry(tuple(shape), [tuple(op) for op in ops])
    return {"got": got, "ops": spy.ops}
