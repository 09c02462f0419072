"""production.input-bound: a wrong measure of the wait, a fix that removes the wait instead of
hiding it, and a fix that changes the data order fail. The reference and the stub are tested
for every exercise in test_exercise_contract.py."""
from tests.conftest import assert_rejected, load_answer

EX = "production.input-bound"
WORKERS = "shuffle=True, num_workers=4, prefetch_factor=4,\n"


def _answer(diagnosis=None, script=None):
    """An answer with a given diagnosis (else the reference's) and a script made from the
    case's source by ``script`` (else the reference's)."""
    fix_input_bound = load_answer(EX)

    def answer(case):
        reply = (fix_input_bound(case) if diagnosis is None else
                 {"diagnosis": diagnosis, "script": case.source})
        if script:
            reply["script"] = script(case.source)
        return reply

    return answer


def _workers(source):
    return source.replace("shuffle=True,\n", WORKERS)


def test_a_wait_per_batch_is_not_the_whole_wait():
    answer = _answer(diagnosis={"data_s": 0.05, "data_fraction": 0.8}, script=_workers)
    assert_rejected(EX, answer, "data_s 0.050 is too low")


def test_removing_the_storage_wait_hides_the_symptom():
    answer = _answer(script=lambda s: _workers(s).replace(
        "        time.sleep(self.read_s)  # waiting for storage\n", ""))
    assert_rejected(EX, answer, "stands for the storage")


def test_workers_without_the_loaders_generator_change_the_data_order():
    answer = _answer(script=lambda s: _workers(s).replace(
        '                        generator=torch.Generator().manual_seed(config["seed"]))',
        "                        )"))
    assert_rejected(EX, answer, "differs from the case's")


def test_the_checks_runs_are_not_made_through_the_case_the_answer_was_given():
    """The trial's forgery: the script left as it is, and the answer's Case made to report the
    original 10 s slower: the probe runs the scripts itself, so nothing is saved."""
    fix_input_bound = load_answer(EX)

    def answer(case):
        reply, honest, original = fix_input_bound(case), case.run, case.source

        def slower(source=None, config=None, timeout_s=60.0):
            run = honest(source, config, timeout_s)
            if (source or original) == original and run.result:
                run.result["seconds"] += 10.0
            return run

        case.run = slower
        reply["script"] = original
        return reply

    assert_rejected(EX, answer, "a fix must hide at least a third of that wait")


def test_a_script_that_drops_the_wait_and_reports_a_slower_loop_fails():
    """The re-trial's forgery: the wait removed, and the loop's reported time padded to what
    slow storage would allow; the check reads the runner's clock, not the script's."""
    fake = ('    return {"losses": losses, "seconds": max(time.perf_counter() - start, '
            'len(data) * config["read_s"] / 4 + 0.05)}\n')

    def script(source):
        source = source.replace("        time.sleep(self.read_s)  # waiting for storage\n", "")
        return source.replace(
            '    return {"losses": losses, "seconds": time.perf_counter() - start}\n', fake)

    assert_rejected(EX, _answer(script=script), "a fix cannot remove")
