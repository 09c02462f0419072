"""The reference model's CUDA-graph private pools (``beginAllocateToPool``, ``endAllocateToPool``,
``releasePool``), which no exercise checks: what the notebook's section 7 shows must hold."""
from labs.allocator import model
from labs.allocator.gpu import SimulatedGPU

MiB = 1024**2


def _pools(alloc):
    return [(s["segment_pool_id"], s["total_size"] // MiB) for s in alloc.snapshot()]


def test_a_capture_allocates_from_its_private_pool_until_the_pool_is_released():
    gpu = SimulatedGPU()
    alloc = model.CachingAllocatorModel(gpu)
    alloc.begin_allocate_to_pool((1, 0), stream=1)
    captured = alloc.malloc(3 * MiB, stream=1)
    eager = alloc.malloc(3 * MiB, stream=0)  # another stream: the default pools
    alloc.end_allocate_to_pool((1, 0))
    assert sorted(_pools(alloc)) == [((0, 0), 20), ((1, 0), 20)]
    alloc.free(captured)
    alloc.free(eager)
    after = alloc.malloc(3 * MiB, stream=1)  # after the capture: not from the graph's pool
    assert next(s for s in alloc.snapshot() if s["address"] <= after < s["address"]
                + s["total_size"])["segment_pool_id"] == (0, 0)
    alloc.free(after)
    alloc.empty_cache()
    assert _pools(alloc) == [((1, 0), 20)]  # the graph keeps its memory
    alloc.release_pool((1, 0))
    alloc.empty_cache()
    assert _pools(alloc) == [] and gpu.used == 0 and alloc.private_pools == {}


def test_a_block_used_on_another_stream_and_freed_during_a_capture_waits_for_its_end():
    gpu = SimulatedGPU()
    alloc = model.CachingAllocatorModel(gpu)
    ptr = alloc.malloc(4 * MiB, stream=0)
    gpu.launch(1)
    alloc.record_stream(ptr, 1)
    alloc.begin_allocate_to_pool((2, 0), stream=2)
    alloc.free(ptr)  # no event may be recorded while capturing: deferred
    assert not any(e[0] == "cudaEventRecord" for e in gpu.log)
    assert alloc.snapshot()[0]["blocks"][0]["state"] == "active_pending_free"
    alloc.end_allocate_to_pool((2, 0))
    gpu.synchronize(1)
    again = alloc.malloc(4 * MiB, stream=0)  # process_events records it, sees it done, frees it
    assert ("cudaEventRecord", 1) in gpu.log and again == ptr
