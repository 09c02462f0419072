"""production.recompiles: plausible wrong diagnoses and fixes that keep recompiling (or stop
compiling, or change the training) fail, judged through run_checks (the check runs each fixed
script in a process of its own). The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
from tests.conftest import assert_rejected, load_answer

EX = "production.recompiles"
COMPILE = 'loss_fn = torch.compile(compute_loss, backend="eager")'


def _changed(diagnosis=None, script=None):
    fix_recompiles = load_answer(EX)

    def answer(case):
        out = fix_recompiles(case)
        if diagnosis:
            out["diagnosis"].update(diagnosis(out["diagnosis"]))
        if script:
            out["script"] = script(case.source)
        return out

    return answer


def test_the_guard_is_on_the_functions_argument_not_the_ops():
    answer = _changed(diagnosis=lambda d: {"guard": "label_smoothing"})
    assert_rejected(EX, answer, "not the argument whose guard fails")


def test_the_attempt_the_limit_refuses_is_not_a_recompile():
    answer = _changed(diagnosis=lambda d: {"recompiles": d["recompiles"] + 1})
    assert_rejected(EX, answer, "is not a recompile")


def test_eager_from_is_the_step_where_dynamo_gave_up():
    answer = _changed(diagnosis=lambda d: {"eager_from": None})
    assert_rejected(EX, answer, "Dynamo does hit its recompile limit")


def test_a_larger_recompile_limit_only_compiles_more():
    answer = _changed(script=lambda s: s.replace(
        COMPILE, COMPILE + "\n        torch._dynamo.config.recompile_limit = 64"))
    assert_rejected(EX, answer, "a larger recompile limit or dynamic=True does not help")


def test_dynamic_true_does_not_help_a_float_the_op_needs_as_a_constant():
    answer = _changed(script=lambda s: s.replace('backend="eager")',
                                                 'backend="eager", dynamic=True)'))
    assert_rejected(EX, answer, "more than the 1 a fix needs")


def test_not_compiling_is_not_a_fix():
    answer = _changed(script=lambda s: s.replace(COMPILE, "pass"))
    assert_rejected(EX, answer, "Dynamo holds no graph of compute_loss")


def test_compiling_something_else_is_not_a_fix():
    """The trial's forgery: the loss computed eagerly, and a function of no use compiled once
    so that Dynamo's graph counter reads 1 (the check counts compute_loss's own graphs)."""
    dummy = 'torch.compile(lambda t: t + 1, backend="eager")(torch.ones(1))'
    answer = _changed(script=lambda s: s.replace(COMPILE, dummy))
    assert_rejected(EX, answer, "Dynamo holds no graph of compute_loss")


def test_a_constant_smoothing_trains_another_model():
    answer = _changed(script=lambda s: s.replace("smoothing_at(step, config))",
                                                 'config["smoothing"])'))
    assert_rejected(EX, answer, "departs from the eager run's")


def test_emptying_dynamos_cache_at_the_end_does_not_hide_the_recompiles():
    """The re-trial's forgery: recompiling every step under a higher limit, then, at the last
    step, Dynamo reset and the loss compiled once more, so that the cache holds one graph; the
    runner counts every graph the run compiled."""
    step = "        loss = loss_fn(model, x, y, smoothing_at(step, config))\n"
    again = ('        if step == config["steps"] - 1:\n'
             "            torch._dynamo.reset()\n" + step.replace("    ", "        ", 1))

    def script(source):
        assert step in source
        source = source.replace(COMPILE, COMPILE + "\n        torch._dynamo.config."
                                "recompile_limit = 1000")
        return source.replace(step, step + again)

    assert_rejected(EX, _changed(script=script), "graphs of compute_loss after your fixed")
