"""production.checkpoint: resumes that restore part of the state, or resume one step off, and
wrong diagnoses fail against the uninterrupted run. The reference and the stub are tested for
every exercise in test_exercise_contract.py."""
from tests.conftest import assert_rejected, load_answer

EX = "production.checkpoint"
DATA_RESTORE = '        loader.generator.set_state(checkpoint["data_order"])\n'
RNG_RESTORE = '        torch.set_rng_state(checkpoint["rng"])\n'


def _answer(diagnose=None, edit=None):
    """The reference answer with its diagnosis rewritten by ``diagnose`` or its fixed script
    edited by ``edit``."""
    fix_checkpoint = load_answer(EX)

    def answer(case):
        reply = fix_checkpoint(case)
        if diagnose:
            reply["diagnosis"] = diagnose(dict(reply["diagnosis"]))
        if edit:
            script = edit(reply["script"])
            assert script != reply["script"]
            reply["script"] = script
        return reply

    return answer


def test_restoring_the_schedule_but_restarting_the_data_order_fails():
    answer = _answer(edit=lambda s: s.replace(DATA_RESTORE, ""))
    assert_rejected(EX, answer, "some state still starts afresh on resume")


def test_the_generator_saved_mid_epoch_is_not_the_epochs_order():
    # the generator's state at the stop, after the epoch's permutation was drawn
    answer = _answer(edit=lambda s: s.replace(
        '"data_order": order}', '"data_order": loader.generator.get_state()}'))
    assert_rejected(EX, answer, "some state still starts afresh on resume")


def test_restoring_everything_but_torchs_rng_fails():
    answer = _answer(edit=lambda s: s.replace(RNG_RESTORE, ""))
    assert_rejected(EX, answer, "differs from the uninterrupted one")


def test_resuming_one_step_late_fails():
    answer = _answer(edit=lambda s: s.replace(
        '        step = checkpoint["step"]\n', '        step = checkpoint["step"] + 1\n'))
    assert_rejected(EX, answer, "a step is trained twice or skipped")


def test_diverges_at_is_not_always_the_stop():
    # true for the public stop (in the second epoch), not for a stop in the first
    answer = _answer(diagnose=lambda d: {**d, "diverges_at": 9 if d["diverges_at"] == 9
                                         else 5})
    assert_rejected(EX, answer, "diverges_at is 5")


def test_missing_names_only_what_the_checkpoint_lacks():
    answer = _answer(diagnose=lambda d: {**d, "missing": ["data_order", "rng", "scheduler"]})
    assert_rejected(EX, answer, "missing is")
