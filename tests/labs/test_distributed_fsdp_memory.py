"""distributed.fsdp-memory: plausible wrong memory models fail, called directly through
run_checks. Each is the reference answer with one quantity computed wrongly. The reference and
the stub are tested for every exercise in test_exercise_contract.py."""
import math

import pytest

from tests.conftest import assert_rejected, load_answer

EX = "distributed.fsdp-memory"


@pytest.fixture(scope="module")
def ref():
    return load_answer(EX)


def _full(module):
    return sum(p.numel() * p.element_size() for p in module.parameters())


def flawed(ref, flaw):
    """The reference answer with one flaw."""

    def fsdp_memory(model, world_size, reshard_after_forward):
        if flaw == "None taken as True" and reshard_after_forward is None:
            reshard_after_forward = True
        if flaw == "frozen parameters counted":
            model.requires_grad_(True)
        out = ref(model, world_size, reshard_after_forward)
        p = world_size
        if flaw == "an even split":
            out["params"] = [_full(model) // p] * p
        if flaw == "no Adam step tensors":
            out["optim"] = [2 * g for g in out["grads"]]
        if flaw == "no floor at zero":  # (negative where torch.chunk runs out of rows first)
            def rows_of(q, rank):
                per = math.ceil(q.shape[0] / p)
                mine = min(per, q.shape[0] - rank * per)
                return mine * (q.numel() // q.shape[0]) * q.element_size()

            out["params"] = [sum(rows_of(q, r) for q in model.parameters()) for r in range(p)]
        if flaw == "every layer gathered at the peak":
            every = _full(model.head) + sum(_full(layer) for layer in model.layers)
            out["peak_forward"] = [s + every for s in out["params"]]
        return out

    return fsdp_memory


CALL = "for Stack([16, 40, 24, 30], out=3), fsdp_memory(model, 4, reshard_after_forward="


@pytest.mark.parametrize("flaw, phrase", [
    ("an even split", CALL + "None)['params'] is [2507, 2507, 2507, 2507]; measured on 4 "
     "real ranks it is [2588, 2588, 2588, 2264]"),
    ("no Adam step tensors", CALL + "None)['optim'] is ["),
    ("None taken as True", CALL + "None)['after_forward'] is ["),
    ("every layer gathered at the peak", CALL + "None)['peak_forward'] is ["),
])
def test_flawed_memory_models_fail(ref, flaw, phrase):
    v = assert_rejected(EX, flawed(ref, flaw), phrase)
    assert "; measured on 4 real ranks it is [" in v.message, v.message


def test_shards_without_a_floor_at_zero_fail_where_torch_chunk_runs_out_first(ref):
    from labs.distributed.checks.fsdp_memory import _hidden

    # a seed whose seeded Stack has out > 1: only the fixed case has fewer rows than ranks
    seed = next(s for s in range(50) if _hidden(s)[0][0]["out"] > 1)
    v = assert_rejected(EX, flawed(ref, "no floor at zero"),
                        "for Stack([12, 5, 20], out=1) (fewer rows than ranks in places)",
                        seed=seed)
    assert v.message.startswith("hidden check 2/2") and "None)['params'] is [" in v.message
    assert "-" in v.message.split("['params'] is [", 1)[1].split("]", 1)[0], v.message


def test_counting_frozen_parameters_fails_on_a_hidden_case(ref):
    v = assert_rejected(EX, flawed(ref, "frozen parameters counted"), "with layers[1] frozen")
    assert v.message.startswith("hidden check 2/2") and "None)['grads'] is" in v.message


def sharded_by_fsdp2(ref):
    """Calls fully_shard itself (here on a model with no process group, where it fails at
    once), then answers as the reference does."""
    from torch.distributed.fsdp import fully_shard

    def fsdp_memory(model, world_size, reshard_after_forward):
        try:
            fully_shard(model)
        except Exception:  # noqa: BLE001  (a failed call is still a call)
            pass
        return ref(model, world_size, reshard_after_forward)

    return fsdp_memory


def measured_on_real_ranks(ref):
    """Runs FSDP2 on real ranks (a process per rank) and reports what it measured (here: the
    reference, after starting the world)."""
    from labs.distributed import launch

    def fsdp_memory(model, world_size, reshard_after_forward):
        launch.run(int, 2)
        return ref(model, world_size, reshard_after_forward)

    return fsdp_memory


@pytest.mark.parametrize("answer, phrase", [
    (sharded_by_fsdp2, "your answer ran torch/distributed/_composable/contract.py"),
    (measured_on_real_ranks, "your answer started a process"),
])
def test_answers_that_run_fsdp2_fail(ref, answer, phrase):
    v = assert_rejected(EX, answer(ref), phrase)
    assert v.message.startswith("check 1/2"), v.message
