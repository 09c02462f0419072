"""compile.recompiles: wrong predictions and compile_once functions that recompile (or never
compile) fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch

from tests.conftest import assert_rejected

EX = "compile.recompiles"

# torch 2.13's counts (the checks measure them; these are only the answer tested here)
RIGHT_COUNTS = {"growing batch": 2, "dtype flip": 2, "python int": 2, "python float": 2,
                "bool flag": 2, "a batch of one later": 3, "mark_dynamic": 1,
                "same shape, new values": 1}


def _once(fn, backend):
    return torch.compile(fn, backend=backend, dynamic=True)


def _answer(predicted=None, compile_once=_once, **changes):
    return {"predicted": {**RIGHT_COUNTS, **changes} if predicted is None else predicted,
            "compile_once": compile_once}


def test_the_counts_written_here_pass():
    from grader.checks import run_checks

    v = run_checks(EX, _answer(), seed=5)
    assert v.status == "passed", v.message


def test_a_function_returning_the_predictions_passes():
    from grader.checks import run_checks

    v = run_checks(EX, {"predicted": lambda: dict(RIGHT_COUNTS), "compile_once": _once}, seed=0,
                   hidden=False)
    assert v.status == "passed", v.message


@pytest.mark.parametrize("answer, phrase", [
    (_answer(predicted=dict.fromkeys(RIGHT_COUNTS, 1)), "6 prediction(s) are not right"),
    (_answer(**{"a batch of one later": 2}), "'a batch of one later' (you said 2"),
    (_answer(**{"bool flag": 1}), "'bool flag' (you said 1; the calls: x: (2, 3) float32"),
    (_answer(**{"python float": 3}), "scale: 0.5 -> 1.5 -> 2.5"),
    (_answer(**{"growing batch": 4}), "x: (2, 3) float32 -> (3, 3) float32"),
    (_answer(predicted={**RIGHT_COUNTS, "mark_dynamic": True}), "has type bool"),
    (_answer(predicted={k: v for k, v in RIGHT_COUNTS.items() if k != "dtype flip"}),
     "no prediction for ['dtype flip']"),
])
def test_wrong_predictions_fail(answer, phrase):
    assert_rejected(EX, answer, phrase)


@pytest.mark.parametrize("compile_once, phrase", [
    (lambda fn, backend: torch.compile(fn, backend=backend), "compiled 2 frames, not 1"),
    (lambda fn, backend: torch.compile(fn, backend=backend, dynamic=False), "compiled 4 frames"),
    (lambda fn, backend: torch.compile(fn, backend="eager", dynamic=True),
     "use the backend you are given"),
    (lambda fn, backend: fn, "use the backend you are given"),
    (lambda fn, backend: torch.compile(lambda *a: fn(*a) + 1, backend=backend, dynamic=True),
     "different value from eager"),
])
def test_wrong_compile_once_fails(compile_once, phrase):
    assert_rejected(EX, _answer(compile_once=compile_once), phrase)


def test_compile_once_that_marks_only_the_first_dim_fails_on_hidden_sequences():
    def mark_batch(fn, backend):
        compiled = torch.compile(fn, backend=backend)

        def run(*args):
            for a in args:
                if isinstance(a, torch.Tensor):
                    torch._dynamo.mark_dynamic(a, 0)
            return compiled(*args)

        return run

    v = assert_rejected(EX, _answer(compile_once=mark_batch), "frames, not 1")
    assert v.passed >= 1


def test_a_missing_key_is_named():
    assert_rejected(EX, {"predicted": RIGHT_COUNTS}, "no 'compile_once'")
