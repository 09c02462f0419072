"""production.nan: plausible wrong diagnoses and fixes that hide the NaN fail, judged through
run_checks (the check runs each fixed script in a process of its own). The reference and the
stub are tested for every exercise in test_exercise_contract.py."""
from tests.conftest import assert_rejected, load_answer

EX = "production.nan"


def _changed(diagnosis=None, script=None):
    """The reference answer with its diagnosis updated by ``diagnosis(d)`` and its script
    rewritten by ``script(case)``."""
    fix_nan = load_answer(EX)

    def answer(case):
        out = fix_nan(case)
        if diagnosis:
            out["diagnosis"].update(diagnosis(out["diagnosis"]))
        if script:
            out["script"] = script(case)
        return out

    return answer


def test_the_step_counts_from_zero():
    answer = _changed(diagnosis=lambda d: {"step": d["step"] + 1})
    assert_rejected(EX, answer, "an earlier step's loss is already not finite")


def test_the_node_is_the_one_anomaly_mode_names():
    answer = _changed(diagnosis=lambda d: {"node": "SoftmaxBackward0"})
    assert_rejected(EX, answer, "not the Node anomaly mode names")


def test_the_line_is_the_forward_op_not_the_backward_call():
    def backward_line(d):
        return {"line": d["line"] + 16}  # the `loss.backward()` line the error is raised from

    v = assert_rejected(EX, _changed(diagnosis=backward_line), "traceback of the forward call")
    assert "loss.backward()" in v.message


def test_nan_to_num_on_the_loss_hides_the_symptom():
    def script(case):
        return case.source.replace("        loss.backward()",
                                   "        loss = torch.nan_to_num(loss)\n        loss.backward()")

    assert_rejected(EX, _changed(script=script), "your fixed script's loss departs from")


def test_clamping_the_probabilities_changes_the_training():
    def script(case):
        return case.source.replace("torch.log(probs)", "torch.log(probs.clamp_min(1e-6))")

    assert_rejected(EX, _changed(script=script), "clamping or adding an epsilon")


def test_a_smaller_learning_rate_trains_another_model():
    def script(case):
        return case.source.replace('lr=config["lr"]', 'lr=config["lr"] / 4')

    assert_rejected(EX, _changed(script=script), "your fixed script's loss departs from")


def test_an_unfixed_script_is_still_not_finite():
    assert_rejected(EX, _changed(script=lambda case: case.source), "the NaN is still there")
