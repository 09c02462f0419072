"""What learners see of the reference model: its recorded runs (``labs/allocator/recorded.json``,
read by ``traces.recorded``), which the notebook shows and the public checks compare with. The
file must be what the model makes now, and a recorded run must read back as the model's live
run of the same trace."""
import json

import pytest

from labs.allocator import model, traces, viz
from labs.allocator.gpu import DeviceOutOfMemory


def test_the_recorded_runs_are_what_the_model_makes_now():
    assert traces.RECORDED.read_text(encoding="utf-8") == model.recorded_text(), (
        "labs/allocator/recorded.json is out of date: run `python -m labs.allocator.model`")


@pytest.mark.parametrize("name", ["streams_random", "out_of_memory", "graph_pool", "best_fit"])
def test_a_recorded_run_reads_back_as_the_live_model_s_steps(name):
    run = traces.recorded(name)
    live = viz.record(run.trace, model.CachingAllocatorModel, capacity=run.capacity,
                      max_split_size=run.max_split_size, coalesce=run.coalesce)
    assert len(run.steps) == len(live) == len(run.trace)
    for got, want in zip(run.steps, live):
        assert (got.index, got.op, got.text, got.calls, got.stats) == \
            (want.index, want.op, want.text, want.calls, want.stats)
        assert got.segments == traces.unpack(traces.pack(want.segments))
        if isinstance(want.result, DeviceOutOfMemory):
            assert str(got.result) == str(want.result)
        else:
            assert got.result == want.result
    keys = ("address", "total_size", "stream", "segment_type", "blocks")
    assert [{k: s[k] for k in keys} for s in run.steps[-1].segments] == \
        [{k: s[k] for k in keys} | {"blocks": [{k: b[k] for k in ("address", "size",
                                                                   "requested_size", "state")}
                                               for b in s["blocks"]]}
         for s in live[-1].segments]


def test_the_recorded_plans_and_oom_cases_are_the_model_s():
    for size, divisions in traces.PLANS:
        assert traces.recorded_plan(size, divisions) == model.allocation_plan(size, divisions)
    snapshot, answer = traces.recorded_oom("fragmented")
    want = model.oom_case(traces.FRAGMENTED, 100 * 1024**2)
    assert [snapshot, answer] == json.loads(json.dumps(want))


def test_an_unrecorded_name_is_a_clear_error():
    with pytest.raises(KeyError, match="recordings .*'best_fit'.*viz.record"):
        traces.recorded("my_trace")
    with pytest.raises(KeyError, match="plans"):
        traces.recorded_plan(12345)
