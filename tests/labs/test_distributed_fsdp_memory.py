"""distributed.fsdp-memory: plausible wrong memory models fail, called directly through
run_checks. Each is the reference answer with one quantity computed wrongly. The reference and
the stub are tested for every exercise in test_exercise_contract.py."""
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


def test_counting_frozen_parameters_fails_on_a_hidden_case(ref):
    v = assert_rejected(EX, flawed(ref, "frozen parameters counted"), "with layers[1] frozen")
    assert v.message.startswith("hidden check 2/2") and "None)['grads'] is" in v.message
