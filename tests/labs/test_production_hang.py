"""production.hang: plausible wrong diagnoses and fixes that hide the hang, or change what the
job trains, fail against the original script run with the corrupted step skipped by every rank
(its config's skip list). The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
from tests.conftest import assert_rejected, load_answer

EX = "production.hang"
SKIP = ("        if not torch.isfinite(loss):\n"
        "            continue  # a corrupted batch: skip this step\n")


def _answer(diagnose=None, script=None, edit=None):
    """The reference answer with its diagnosis rewritten by ``diagnose``, its script replaced
    by ``script(case.source)`` or edited by ``edit``."""
    fix_hang = load_answer(EX)

    def answer(case):
        reply = fix_hang(case)
        if diagnose:
            reply["diagnosis"] = diagnose(dict(reply["diagnosis"]))
        if script:
            reply["script"] = script(case.source)
        if edit:
            edited = edit(reply["script"])
            assert edited != reply["script"]
            reply["script"] = edited
        return reply

    return answer


def test_the_rank_that_raised_is_not_the_one_that_skipped():
    answer = _answer(diagnose=lambda d: {**d, "rank": 1 - d["rank"]})
    assert_rejected(EX, answer, "is not the culprit")


def test_the_step_where_a_rank_waits_is_not_the_step_skipped():
    answer = _answer(diagnose=lambda d: {**d, "step": 7})  # where the other rank hangs
    assert_rejected(EX, answer, "The step where a rank waits is not where the other skipped")


def test_the_collective_is_named_as_torch_distributed_names_it():
    answer = _answer(diagnose=lambda d: {**d, "collective": "allreduce"})
    assert_rejected(EX, answer, "which call did one rank skip")


def test_skipping_the_gradient_sync_on_every_rank_trains_another_model():
    # every rank skips the corrupted step together, but no rank averages its gradients
    answer = _answer(edit=lambda s: s.replace(
        "            dist.all_reduce(p.grad)\n", "            pass\n"))
    assert_rejected(EX, answer, "trains differently from a correct fix")


def test_dropping_only_the_gradient_sync_still_leaves_the_ranks_apart():
    answer = _answer(script=lambda s: s.replace(
        "            dist.all_reduce(p.grad)\n", "            pass\n"))
    assert_rejected(EX, answer, "trains differently from a correct fix")


def test_joining_the_all_reduce_with_zero_gradients_is_not_skipping_the_step():
    zeros = ("        if not torch.isfinite(loss):\n"
             "            loss = loss.nan_to_num(0.0) * 0  # a corrupted batch: zero gradients\n")
    answer = _answer(script=lambda s: s.replace(SKIP, zeros))
    assert_rejected(EX, answer, "skipped by every rank, and only that step")


def test_a_longer_timeout_still_hangs():
    answer = _answer(script=lambda s: s.replace(
        'timeout=timedelta(seconds=config["timeout_s"])',
        'timeout=timedelta(seconds=2 * config["timeout_s"])'))
    assert_rejected(EX, answer, "did not finish")


def test_a_fix_written_for_the_case_it_was_shown_fails_on_data_it_was_not():
    """The trial's forgery: the script told to skip the step the diagnosis found (a step typed
    into config['skip']): right for the case the answer saw, not a fix of the job."""
    fix_hang = load_answer(EX)

    def answer(case):
        reply = fix_hang(case)
        merge = "    config = {**DEFAULTS, **config}\n"
        assert merge in case.source
        skip = f"    config['skip'] = [{reply['diagnosis']['step']}]\n"
        reply["script"] = case.source.replace(merge, merge + skip)
        return reply

    assert_rejected(EX, answer, "your fix run on data it was not shown")
