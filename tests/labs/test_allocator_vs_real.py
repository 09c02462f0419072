"""allocator.vs-real and the reference model against the real allocator.

Without CUDA: the exercise is skipped with its reason, and the model is checked against every
recording of the real allocator in tests/labs/data/allocator_gpu/ (made on a GPU by
``python -m tests.labs.record_allocator``). With CUDA: the same traces are replayed live through
the real allocator and the model, and wrong answers to the exercise fail."""
import json
from pathlib import Path

import pytest
import torch

from grader.labs import load_lab
from labs.allocator import model
from labs.allocator.snapshots import MiB
from labs.allocator.traces import BEST_FIT, Run
from tests.conftest import assert_rejected, load_answer
from tests.labs import record_allocator as rec

EX = "allocator.vs-real"
RECORDINGS = sorted((Path(__file__).parent / "data" / "allocator_gpu").glob("*.json"))
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cuda(test):
    """Marks a test that needs CUDA: ``gpu`` (``make gpu-check`` runs these), skipped without."""
    return pytest.mark.gpu(needs_cuda(test))


def test_without_cuda_the_exercise_is_skipped_with_its_reason():
    reason = load_lab("allocator").exercise(EX).unmet("cpu")
    assert reason and "needs cuda" in reason


def predicted(trace):
    """The model's statistics after each step of ``trace`` (what the judge compares with)."""
    return [step.stats for step in Run.from_json(model.run(trace, capacity=1 << 36)).steps]


def test_the_prediction_has_one_step_per_op():
    steps = predicted(BEST_FIT)
    assert len(steps) == len(BEST_FIT)
    # live at the end: 3000 B and 700 B (rounded to 3 KiB and 1 KiB), 12, 9 and 16 MiB, and
    # the whole 3 MiB block the 2 MiB request took (1 MiB would have remained: no split)
    assert steps[-1]["allocated_bytes.all.current"] == 4 * 1024 + 40 * 2**20
    assert steps[-1]["allocated_bytes.small_pool.current"] == 4 * 1024


@pytest.mark.skipif(not RECORDINGS, reason="no recording of the real allocator yet: run "
                    "`python -m tests.labs.record_allocator` on a CUDA machine")
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_the_model_matches_recorded_gpu_runs(path):
    data = json.loads(path.read_text())
    for t in data["traces"]:
        trace = [tuple(op) for op in t["trace"]]
        found = rec.differences(t["steps"], rec.replay_model(
            trace, t["capacity"], t.get("max_split_size")), trace)
        assert not found, f"{data['gpu']} (torch {data['torch']}), {t['name']}: {found[:3]}"


@cuda
@pytest.mark.parametrize("t", rec.traces(), ids=lambda t: t["name"])
def test_the_real_allocator_matches_the_model(t):
    trace = [tuple(op) for op in t["trace"]]
    split = t.get("max_split_size")
    real, capacity = rec.replay_real(trace, t["capacity"], split)
    model_capacity = capacity if t["capacity"] is not None else 1 << 50
    found = rec.differences(real, rec.replay_model(trace, model_capacity, split), trace)
    assert not found, found[:3]


def test_the_recorded_traces_hold_the_boundaries_and_the_captures():
    """Each trace the GPU run replays runs through the model here; the max_split_size cases and
    the captures do what they are there for (a new segment at the rounding limit, the smaller
    oversize segment freed, segments of private pools)."""
    runs = {t["name"]: rec.replay_model([tuple(op) for op in t["trace"]],
                                        t["capacity"] or 1 << 50, t.get("max_split_size"))
            for t in rec.traces()}
    rounding = runs["oversize rounding limit"]
    # malloc 60, free, malloc 40: the cached 60 MiB block is exactly 20 MiB larger: a new segment
    assert [s[1] for s in rounding[2]["segments"]] == [40 * MiB, 60 * MiB]
    smallest = runs["oversize release, smallest first"]
    assert [s[1] for s in smallest[-1]["segments"]] == [30 * MiB, 90 * MiB]
    private = [s for name, steps in runs.items() if name.startswith("graph")
               for step in steps for s in step["segments"] if s[4] != [0, 0]]
    assert private and all(s[4][1] == 0 for s in private)


@cuda
def test_returning_the_model_s_prediction_is_refused():
    assert_rejected(EX, predicted, "own model or checks")


@cuda
def test_a_replay_without_streams_fails():
    reference = load_answer(EX)

    def one_stream(trace):
        return reference([op if op[0] != "malloc" else op[:3] + (0,) for op in trace
                          if op[0] != "use"])

    assert_rejected(EX, one_stream)
