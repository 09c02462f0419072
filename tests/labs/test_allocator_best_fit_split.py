"""allocator.best-fit-split: plausible wrong allocators fail, called directly through run_checks.
Each is the reference answer with one rule changed. The reference and the stub are tested for
every exercise in test_exercise_contract.py."""
import pytest

from labs.allocator import model
from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import LyingList

EX = "allocator.best-fit-split"
MiB = 1024**2


@pytest.fixture(scope="module")
def Ref():
    return load_answer(EX)


def _plan(size):
    return load_answer("allocator.round-size")(size)


def flawed(Ref, flaw):
    """The reference allocator with one flaw."""

    class Flawed(Ref):
        def _best_fit(self, rounded, pool, stream):
            if flaw == "no max_split_size rules":
                saved, self.max_split_size = self.max_split_size, float("inf")
                try:
                    return super()._best_fit(rounded, pool, stream)
                finally:
                    self.max_split_size = saved
            if flaw not in ("first fit", "highest address on ties", "both pools", "never reuse",
                            "oversize rounding limit exclusive"):
                return super()._best_fit(rounded, pool, stream)
            if flaw == "never reuse":
                return None
            free = [
                (b.size, b.address, s, i)
                for s in self.segments
                if (s.pool == pool or flaw == "both pools") and s.stream == stream
                for i, b in enumerate(s.blocks)
                if b.state == "inactive" and b.size >= rounded
            ]
            if not free:
                return None
            key = {"first fit": lambda f: f[1], "highest address on ties": lambda f: (f[0], -f[1]),
                   "both pools": lambda f: f[:2],
                   "oversize rounding limit exclusive": lambda f: f[:2]}[flaw]
            best, _, segment, i = min(free, key=key)
            if flaw == "oversize rounding limit exclusive" and (
                    rounded < self.max_split_size <= best
                    or rounded >= self.max_split_size and best > rounded + 20 * MiB):  # not >=
                return None
            return segment, i

        def malloc(self, size, stream=0):
            if flaw == "requested size rounded":
                ptr = super().malloc(size, stream)
                segment, i = self._find(ptr)
                segment.blocks[i].requested = _plan(size)[0]
                return ptr
            if flaw not in ("split at 1 MiB inclusive", "never split large", "keep the back"):
                return super().malloc(size, stream)
            rounded, pool, segment_size = _plan(size)
            segment, i = (self._best_fit(rounded, pool, stream)
                          or self._new_segment(segment_size, pool, stream, rounded))
            block = segment.blocks[i]
            remaining = block.size - rounded
            if pool == "small":
                split = remaining >= 512
            elif flaw == "split at 1 MiB inclusive":
                split = rounded < self.max_split_size and remaining >= MiB
            elif flaw == "never split large":
                split = False
            else:
                split = rounded < self.max_split_size and remaining > MiB
            if split:
                rest = type(block)(block.address + rounded, remaining)
                segment.blocks.insert(i + 1, rest)
                block.size = rounded
                if flaw == "keep the back":  # the allocation takes the end of the block
                    block.address, rest.address = block.address + remaining, block.address
                    segment.blocks[i], segment.blocks[i + 1] = rest, block
                    block = segment.blocks[i + 1]
            block.state, block.requested = "active_allocated", size
            return block.address

        def snapshot(self):
            segments = super().snapshot()
            if flaw == "segments in creation order":
                return sorted(segments, key=lambda s: -s["address"])
            if flaw == "lying snapshot":
                return LyingList(segments)
            if flaw == "free blocks called free":
                for s in segments:
                    for b in s["blocks"]:
                        b["state"] = "free" if b["state"] == "inactive" else b["state"]
            return segments

    return Flawed


FLAWS = {
    "first fit": "Best fit is",
    "highest address on ties": "lowest address on ties",
    "both pools": "",
    "never reuse": "cudaMalloc",
    "no max_split_size rules": "",
    "split at 1 MiB inclusive": "more than 1 MiB",
    "never split large": "",
    "keep the back": "front of the chosen block",
    "segments in creation order": "address order",
    "lying snapshot": "subclass of list",
    "free blocks called free": "state",
    "requested size rounded": "requested_size",
}


@pytest.mark.parametrize("flaw", list(FLAWS))
def test_flawed_allocators_fail(Ref, flaw):
    for seed in (0, 1):
        assert_rejected(EX, flawed(Ref, flaw), FLAWS[flaw], seed=seed)


def test_wrapping_the_reference_model_is_refused():
    class Wrapper:
        def __init__(self, gpu, max_split_size=None):
            self.inner = model.CachingAllocatorModel(gpu, max_split_size=max_split_size,
                                                     coalesce=False)

        def malloc(self, size, stream=0):
            return self.inner.malloc(size, stream)

        def free(self, ptr):
            self.inner.free(ptr)

        def snapshot(self):
            return self.inner.snapshot()

    assert_rejected(EX, Wrapper, "own model or checks")


def test_an_oversize_block_exactly_20_mib_bigger_is_refused(Ref):
    """get_free_block refuses a cached oversize block 20 MiB (max_non_split_rounding) or more
    bigger than the request: `>=`. With `>`, a 60 MiB block is handed to a 40 MiB request
    (max_split_size 40 MiB) that the real allocator serves with a segment of its own; the hidden
    check of that boundary says which rule, whatever the seed."""
    for seed in (0, 1):
        v = assert_rejected(EX, flawed(Ref, "oversize rounding limit exclusive"),
                            "max_non_split_rounding (20 MiB) or more bigger", seed=seed)
        assert "the max_non_split_rounding boundary" in v.message
        assert "cudaMalloc(40 MiB)" in v.message


def test_a_mistake_names_the_step_and_the_rule(Ref):
    v = assert_rejected(EX, flawed(Ref, "first fit"))
    assert "after step" in v.message and "Best fit is the smallest cached block" in v.message
