"""A simulated CUDA device for lab 3: ``cudaMalloc``/``cudaFree`` over a fixed capacity, streams
whose queued work finishes when told to, and events recorded on them.

It stands in for the CUDA runtime under the caching allocator, so the allocator models of the lab
(the learner's and the reference model) run, and are checked, on a machine without a GPU.
Only what ``c10/cuda/CUDACachingAllocator.cpp`` asks of the runtime is simulated:

- ``cudaMalloc`` (``alloc_block`` -> ``cudaMallocMaybeCapturing``): device memory in bytes, failing
  (``None`` here, ``cudaErrorMemoryAllocation`` there) when the capacity would be exceeded;
  addresses are the lowest free range of a virtual address space, aligned to 2 MiB, so a freed
  range is handed out again as the driver does;
- ``cudaFree`` (``release_block``);
- ``cudaEventRecord`` / ``cudaEventQuery`` / ``cudaEventSynchronize`` (``insert_events``,
  ``process_events``, ``synchronize_and_free_events``): an event completes when the work queued
  on its stream before it has finished. Work is queued with :meth:`SimulatedGPU.launch` and
  finishes at :meth:`SimulatedGPU.synchronize` (or when an event on it is synchronized).

Streams are small ints (0 is the default stream).
"""

from __future__ import annotations

import dataclasses

#: cudaMalloc's alignment here (2 MiB, the smallest segment the caching allocator asks for)
ALIGNMENT = 2 * 1024 * 1024
#: the first address handed out (an arbitrary, realistic-looking device address)
BASE_ADDRESS = 0x7F0000000000


class DeviceOutOfMemory(Exception):
    """What an allocator model raises when a request cannot be met even after releasing its cached
    blocks (``torch.OutOfMemoryError`` on a real GPU: "CUDA out of memory. Tried to allocate...")."""


@dataclasses.dataclass
class Event:
    """A CUDA event recorded on ``stream`` after ``ticket`` units of queued work (``cudaEvent_t``)."""

    gpu: SimulatedGPU = dataclasses.field(repr=False)
    stream: int
    ticket: int

    def query(self) -> bool:
        """Whether the work queued before the event has finished (``cudaEventQuery`` == success)."""
        return self.gpu._finished.get(self.stream, 0) >= self.ticket

    def synchronize(self) -> None:
        """Wait for the event (``cudaEventSynchronize``): its stream's earlier work finishes."""
        self.gpu.log.append(("cudaEventSynchronize", self.stream))
        done = self.gpu._finished
        done[self.stream] = max(done.get(self.stream, 0), self.ticket)


class SimulatedGPU:
    """A device with ``capacity`` bytes of memory (int) for allocator models to run on.

    ``log`` records every runtime call an allocator made, in order: ``("cudaMalloc", nbytes,
    ptr)`` (``ptr`` is ``None`` when it failed), ``("cudaFree", ptr, nbytes)``,
    ``("cudaEventRecord", stream)`` and ``("cudaEventSynchronize", stream)``.
    """

    def __init__(self, capacity: int = 8 * 1024**3):
        self.capacity = int(capacity)
        self.used = 0
        self.log: list[tuple] = []
        self._live: dict[int, int] = {}  # ptr -> nbytes of each cudaMalloc'ed range
        self._queued: dict[int, int] = {}  # stream -> work units launched
        self._finished: dict[int, int] = {}  # stream -> work units finished

    # ------------------------------------------------------------------ memory
    def cuda_malloc(self, nbytes: int) -> int | None:
        """``cudaMalloc``: the address of ``nbytes`` of fresh device memory, or ``None`` when the
        device has fewer than ``nbytes`` free. Raises ValueError for a size that is not positive."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"cudaMalloc of {nbytes!r} bytes: the size must be a positive int")
        if self.used + nbytes > self.capacity:
            self.log.append(("cudaMalloc", nbytes, None))
            return None
        ptr = BASE_ADDRESS
        for start in sorted(self._live):  # the lowest gap that fits, as a driver reuses ranges
            if start - ptr >= nbytes:
                break
            ptr = max(ptr, _align(start + self._live[start]))
        self._live[ptr] = nbytes
        self.used += nbytes
        self.log.append(("cudaMalloc", nbytes, ptr))
        return ptr

    def cuda_free(self, ptr: int) -> None:
        """``cudaFree``. Raises ValueError for an address ``cuda_malloc`` did not return (or one
        already freed): a caching allocator only frees whole segments."""
        if ptr not in self._live:
            raise ValueError(
                f"cudaFree({ptr:#x}): not the start of a live cudaMalloc'ed segment (a caching "
                "allocator may only cudaFree a whole segment, by the address cudaMalloc returned)"
            )
        nbytes = self._live.pop(ptr)
        self.used -= nbytes
        self.log.append(("cudaFree", ptr, nbytes))

    # ------------------------------------------------------------------ streams and events
    def launch(self, stream: int) -> None:
        """Queue one kernel on ``stream`` (it runs until the stream is synchronized)."""
        self._queued[stream] = self._queued.get(stream, 0) + 1

    def synchronize(self, stream: int | None = None) -> None:
        """Finish the work queued on ``stream`` (every stream when ``None``)."""
        for s in [stream] if stream is not None else list(self._queued):
            self._finished[s] = self._queued.get(s, 0)

    def record_event(self, stream: int) -> Event:
        """``cudaEventRecord`` on ``stream``: an event that completes after the work queued so far."""
        self.log.append(("cudaEventRecord", stream))
        return Event(self, stream, self._queued.get(stream, 0))

    def segments(self) -> dict[int, int]:
        """The live ``cudaMalloc``'ed ranges: address -> size in bytes."""
        return dict(self._live)


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT
