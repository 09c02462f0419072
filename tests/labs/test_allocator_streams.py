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
            if flaw == "records the block's own stream":
                self.uses.setdefault(ptr, set()).add(stream)
            elif flaw != "ignores record_stream":
                super().record_stream(ptr, stream)

        def free(self, ptr):
            streams = self.uses.get(ptr, set())
            super().free(ptr)
            if flaw == "keeps a block's streams after free" and streams:
                self.uses[ptr] = streams  # a later allocation at ptr inherits them

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


def test_an_event_on_the_block_s_own_stream_is_named(Ref):
    """record_stream on a block's own stream is ignored: free waits only for the other streams
    it was used on. An allocator that records an event on the block's own stream too keeps the
    block pending where the model frees it, or makes it pending where the model never does; the
    message says which streams count, not only when pending blocks are processed."""
    for seed in (0, 1):
        v = assert_rejected(EX, flawed(Ref, "records the block's own stream"),
                            "record_stream on its own stream is ignored", seed=seed)
        assert "Your block at offset" in v.message


def test_a_block_that_should_never_be_pending_is_named(Ref):
    """A block's streams are forgotten when it is freed. An allocator that keeps them makes a
    later allocation at the same address pending when it is freed, where the model frees it at
    once: the message says the block should never have been pending (and why), not that pending
    blocks are processed too late."""
    for seed in (0, 1):
        v = assert_rejected(EX, flawed(Ref, "keeps a block's streams after free"),
                            "never made it pending", seed=seed)
        assert "the streams are forgotten once the block is freed" in v.message
        assert "process_events" not in v.message


def test_the_coalescing_allocator_alone_fails():
    assert_rejected(EX, load_answer("allocator.coalesce"), "record_stream")
