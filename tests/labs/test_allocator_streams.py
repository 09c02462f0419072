"""allocator.streams: plausible wrong allocators fail, called directly through run_checks. Each
is the reference answer with one rule changed. The reference and the stub are tested for every
exercise in test_exercise_contract.py."""
import pytest

from tests.conftest import assert_rejected, load_answer

EX = "allocator.streams"


@pytest.fixture(scope="module")
def Ref():
    return load_answer(EX)


def flawed(Ref, flaw):
    """The reference allocator with one flaw."""
    Coalescing = Ref.__mro__[1]

    class Flawed(Ref):
        def _best_fit(self, rounded, pool, stream):
            if flaw != "shares blocks across streams":
                return super()._best_fit(rounded, pool, stream)
            found = []
            for s in {g.stream for g in self.segments}:
                if (f := Ref._best_fit(self, rounded, pool, s)) is not None:
                    found.append(f)
            return min(found, key=lambda f: f[0].blocks[f[1]].size) if found else None

        def record_stream(self, ptr, stream):
            if flaw != "ignores record_stream":
                super().record_stream(ptr, stream)

        def malloc(self, size, stream=0):
            if flaw == "never processes events at malloc":
                return Coalescing.malloc(self, size, stream)
            return super().malloc(size, stream)

        def empty_cache(self):
            if flaw == "empty_cache does not wait for events":
                self._process_events(wait=False)
                return Coalescing.empty_cache(self)
            return super().empty_cache()

        def _process_events(self, wait):
            if flaw == "frees pending blocks without waiting":
                wait = True
            return super()._process_events(wait)

        def _merge(self, segment, i):
            blocks = segment.blocks
            if flaw == "merges into pending blocks" and blocks[i].state == "inactive":
                for j in (i + 1, i - 1):
                    if 0 <= j < len(blocks) and blocks[j].state == "active_pending_free":
                        blocks[j].size += blocks[i].size
                        blocks[j].address = min(blocks[j].address, blocks[i].address)
                        del blocks[i]
                        return
            super()._merge(segment, i)

    return Flawed


FLAWS = {
    "shares blocks across streams": "",
    "ignores record_stream": "",
    "never processes events at malloc": "",
    "empty_cache does not wait for events": "",
    "frees pending blocks without waiting": "",
    "merges into pending blocks": "",
}


@pytest.mark.parametrize("flaw", list(FLAWS))
def test_flawed_allocators_fail(Ref, flaw):
    for seed in (0, 1):
        assert_rejected(EX, flawed(Ref, flaw), FLAWS[flaw], seed=seed)


def test_the_coalescing_allocator_alone_fails():
    assert_rejected(EX, load_answer("allocator.coalesce"), "record_stream")
