"""allocator.graph-pools: plausible wrong allocators fail, called directly through run_checks.
Each is the reference answer with one rule of a capture changed. The reference and the stub are
tested for every exercise in test_exercise_contract.py."""
import pytest

from tests.conftest import assert_rejected, load_answer

EX = "allocator.graph-pools"


@pytest.fixture(scope="module")
def Ref():
    return load_answer(EX)


def _base(Ref, name):
    return next(cls for cls in Ref.__mro__ if cls.__name__ == name)


def test_ignoring_the_capture_fails_on_the_public_example(Ref):
    """Requests on the capturing stream served from the default pools."""
    BestFit = _base(Ref, "BestFitAllocator")

    class NoPrivatePool(Ref):
        def malloc(self, size, stream=0):
            if self.capture is None:
                self._process_events(wait=False)
            return BestFit.malloc(self, size, stream)

    v = assert_rejected(EX, NoPrivatePool, "segment_pool_id (0, 0) in your snapshot, (1, 0)")
    assert v.message.startswith("check 1/4"), v.message


@pytest.mark.parametrize("seed", [0, 1])
def test_a_pool_freed_when_its_first_graph_is_destroyed_fails(Ref, seed):
    """Sharing ignored: one release_pool makes the pool freeable."""
    class Unshared(Ref):
        def release_pool(self, pool_id):
            self.holders[pool_id] = 0

    v = assert_rejected(EX, Unshared, "only once no graph holds the pool", seed=seed)
    assert "on a pool two graphs share" in v.message, v.message


@pytest.mark.parametrize("seed", [0, 1])
def test_processing_events_during_a_capture_fails(Ref, seed):
    class Processes(Ref):
        def malloc(self, size, stream=0):
            self._process_events(wait=False)
            return super().malloc(size, stream)

    v = assert_rejected(EX, Processes, "no process_events", seed=seed)
    assert "on a pending block during a capture" in v.message, v.message


@pytest.mark.parametrize("seed", [0, 1])
def test_emptying_the_cache_out_of_memory_during_a_capture_fails(Ref, seed):
    Stream = _base(Ref, "StreamAllocator")

    class Empties(Ref):
        def _new_segment(self, segment_size, pool, stream, rounded):
            return Stream._new_segment(self, segment_size, pool, stream, rounded)

        def empty_cache(self):
            capture, self.capture = self.capture, None
            try:
                super().empty_cache()
            finally:
                self.capture = capture

    v = assert_rejected(EX, Empties, "runs out of memory here", seed=seed)
    assert "on out of memory during a capture" in v.message, v.message


def test_a_snapshot_without_pool_ids_is_named(Ref):
    class NoIds(Ref):
        def snapshot(self):
            return [{k: v for k, v in s.items() if k != "segment_pool_id"}
                    for s in super().snapshot()]

    assert_rejected(EX, NoIds, "has segment_pool_id None: a pair of ints")


def test_a_stream_allocator_without_pools_is_told_what_is_missing():
    """The previous exercise's class, as is: it has no begin_allocate_to_pool."""
    v = assert_rejected(EX, load_answer("allocator.streams"), "begin_allocate_to_pool")
    assert v.status == "error", v.message
