"""allocator.coalesce: plausible wrong allocators fail, called directly through run_checks. Each
is the reference answer with one rule changed. The reference and the stub are tested for every
exercise in test_exercise_contract.py."""
import pytest

from tests.conftest import assert_rejected, load_answer

EX = "allocator.coalesce"


@pytest.fixture(scope="module")
def Ref():
    return load_answer(EX)


def flawed(Ref, flaw):
    """The reference allocator with one flaw."""
    BestFit = Ref.__mro__[1]

    class Flawed(Ref):
        def free(self, ptr):
            if flaw == "no merging":
                return BestFit.free(self, ptr)
            if flaw == "merges only with the next block":
                BestFit.free(self, ptr)
                segment, i = self._find(ptr)
                blocks = segment.blocks
                if i + 1 < len(blocks) and blocks[i + 1].state == "inactive":
                    blocks[i].size += blocks.pop(i + 1).size
                return None
            return super().free(ptr)

        def empty_cache(self):
            if flaw == "empty_cache frees segments with a free block":
                for s in list(self.segments):
                    if any(b.state == "inactive" for b in s.blocks):
                        self._release(s)
                return None
            return super().empty_cache()

        def _new_segment(self, segment_size, pool, stream, rounded):
            if flaw == "no retry":
                return BestFit._new_segment(self, segment_size, pool, stream, rounded)
            if flaw == "empties the cache before the oversize release":
                try:
                    return BestFit._new_segment(self, segment_size, pool, stream, rounded)
                except Exception:
                    self.empty_cache()
                    return BestFit._new_segment(self, segment_size, pool, stream, rounded)
            return super()._new_segment(segment_size, pool, stream, rounded)

        def _release_oversize(self, rounded, pool, stream):
            if flaw == "oversize release counts free blocks of split segments":
                if self.max_split_size == float("inf"):
                    return False
                need = max(rounded, self.max_split_size)
                cached = sorted((s.blocks[0].size, s.address, s) for s in self.segments
                                if s.pool == pool and s.stream == stream
                                for b in s.blocks if b.state == "inactive")
                covering = [c for c in cached if c[0] >= need]
                if covering:
                    self._release(covering[0][2])
                    return True
                return False
            if flaw == "no oversize release":
                return False
            if flaw == "oversize release frees the largest covering segment":
                if self.max_split_size == float("inf"):
                    return False
                need = max(rounded, self.max_split_size)
                whole = sorted((s.blocks[0].size, s.address, s) for s in self.segments
                               if s.pool == pool and s.stream == stream and len(s.blocks) == 1
                               and s.blocks[0].state == "inactive")
                covering = [w for w in whole if w[0] >= need]
                if covering:
                    self._release(covering[-1][2])  # the mistake: the smallest is covering[0]
                    return True
                return super()._release_oversize(rounded, pool, stream)
            if flaw == "oversize release frees the lowest addresses first":
                if self.max_split_size == float("inf"):
                    return False
                need = max(rounded, self.max_split_size)
                whole = sorted((-s.blocks[0].size, s.address, s) for s in self.segments
                               if s.pool == pool and s.stream == stream and len(s.blocks) == 1
                               and s.blocks[0].state == "inactive")
                if whole and -whole[-1][0] >= need:
                    self._release(next(w[2] for w in reversed(whole) if -w[0] >= need))
                    return True
                released = 0
                for size, _, s in whole:
                    if released >= need or -size < self.max_split_size:
                        break
                    released -= size
                    self._release(s)
                return released >= need
            return super()._release_oversize(rounded, pool, stream)

    return Flawed


FLAWS = {
    "no merging": "inactive_split_bytes",
    "merges only with the next block": "two free blocks side by side",
    "empty_cache frees segments with a free block": "",
    "no retry": "raised DeviceOutOfMemory",
    "empties the cache before the oversize release": "",
    "oversize release counts free blocks of split segments": "",
    "no oversize release": "",
    "oversize release frees the lowest addresses first": "",
}


@pytest.mark.parametrize("flaw", list(FLAWS))
def test_flawed_allocators_fail(Ref, flaw):
    for seed in (0, 1):
        assert_rejected(EX, flawed(Ref, flaw), FLAWS[flaw], seed=seed)


def test_the_oom_release_frees_the_smallest_covering_segment(Ref):
    """release_available_cached_blocks frees the smallest cached segment that covers
    max(request, max_split_size). One that frees the largest instead (160 MiB GPU, max_split_size
    40 MiB: 60 and 90 MiB cached, a 30 MiB request frees the 90 MiB one where the real allocator
    frees the 60 MiB one) fails the hidden check of that case, whatever the seed, and the message
    names the rule."""
    for seed in (0, 1):
        v = assert_rejected(EX, flawed(Ref, "oversize release frees the largest covering segment"),
                            "first the smallest cached block", seed=seed)
        assert "a 160 MiB GPU" in v.message and "cudaFree of the 90 MiB segment" in v.message


def test_the_best_fit_allocator_alone_fails():
    assert_rejected(EX, load_answer("allocator.best-fit-split"), "inactive_split_bytes")
