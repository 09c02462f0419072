"""production.leak: plausible wrong diagnoses and fixes that leave the reference in place (or
change what is logged) fail, judged through run_checks (the check runs each fixed script and the
original side by side in processes of their own). The reference and the stub are tested for
every exercise in test_exercise_contract.py."""
from tests.conftest import assert_rejected, load_answer

EX = "production.leak"
KEEPS = "        val_losses.append(val_loss)"


def _changed(diagnosis=None, script=None):
    fix_leak = load_answer(EX)

    def answer(case):
        out = fix_leak(case)
        if diagnosis:
            out["diagnosis"].update(diagnosis(out["diagnosis"]))
        if script:
            out["script"] = script(case.source)
        return out

    return answer


def test_the_line_is_the_one_that_keeps_the_reference_not_the_forward():
    answer = _changed(diagnosis=lambda d: {"line": d["line"] - 1})  # `val_loss = loss_fn(...)`
    v = assert_rejected(EX, answer, "not the line that keeps each step's memory alive")
    assert "val_loss = loss_fn" in v.message


def test_bytes_per_step_are_measured_not_guessed_from_the_public_case():
    answer = _changed(diagnosis=lambda d: {"bytes_per_step": 2 * d["bytes_per_step"]})
    assert_rejected(EX, answer, "away from the growth per step")


def test_deleting_the_name_after_appending_keeps_the_graph():
    answer = _changed(script=lambda s: s.replace(KEEPS, KEEPS + "\n        del val_loss"))
    assert_rejected(EX, answer, "still grows")


def test_item_only_for_printing_keeps_the_graph():
    answer = _changed(script=lambda s: s.replace(
        KEEPS, KEEPS + "\n        print(f'val {val_loss.item():.4f}')"))
    assert_rejected(EX, answer, "still grows")


def test_detaching_the_training_loss_is_the_wrong_tensor():
    answer = _changed(script=lambda s: s.replace("train_losses.append(loss.item())",
                                                 "train_losses.append(loss.detach().item())"))
    assert_rejected(EX, answer, "still grows")


def test_logging_a_smaller_validation_batch_changes_what_is_logged():
    answer = _changed(script=lambda s: s.replace(
        "        val_loss = loss_fn(model(val_x), val_y)",
        "        val_loss = loss_fn(model(val_x[:64]), val_y[:64])").replace(
        KEEPS, "        val_losses.append(val_loss.detach())"))
    assert_rejected(EX, answer, "departs from the original's")


def test_memory_readings_the_script_fakes_do_not_hide_the_leak():
    """A forger's fix: the leak left in place, the script's own readings made flat; the
    runner's samples of the heap still see each step kept."""
    answer = _changed(script=lambda s: s.replace(
        "        memory.append(allocated_bytes())\n", "        memory.append(1 << 20)\n"))
    assert_rejected(EX, answer, "each step's memory is still kept until the end")


def test_memory_held_before_main_and_freed_in_it_does_not_hide_the_leak():
    """The re-trial's forgery: ballast allocated by the script's module code and freed as main
    starts, so the leak stays under where the heap was when main was called; the runner's
    baseline is taken before the module code runs."""
    ballast = "\n_BALLAST = [torch.ones(1 << 28, dtype=torch.uint8)]\n\n\ndef main(config):\n"

    def script(source):
        source = source.replace("\n\ndef main(config):\n", ballast + "    _BALLAST.clear()\n", 1)
        return source.replace("        memory.append(allocated_bytes())\n",
                              "        memory.append(1 << 20)\n")

    assert_rejected(EX, _changed(script=script), "each step's memory is still kept")
