"""run_checks: statuses and learner-facing messages, called directly (milliseconds)."""
import linecache

import pytest
import torch

from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks import (CheckFailure, check, checks_for, explain, run_checks,
                           state_changes)

DRAWN = []


@check("toy.rng-probe")
def draws_from_the_global_rng(answer, ctx):
    """draws from torch's global RNG"""
    DRAWN.append(torch.rand(3))


def test_public_checks_come_first_and_hidden_ones_only_when_asked():
    assert [c.hidden for c in checks_for("toy.add")] == [False, True]
    assert [c.hidden for c in checks_for("toy.add", hidden=False)] == [False]


def test_a_right_answer_passes_every_check():
    v = run_checks("toy.add", lambda a, b: a + b, seed=5)
    assert (v.status, v.passed, v.total, v.seed) == ("passed", 2, 2, 5)


def test_an_answer_tuned_to_the_public_check_fails_a_hidden_one():
    def tuned(a, b):  # right only on the few inputs the public check draws
        import random
        rng = random.Random(5)
        public = {(rng.randint(-99, 99), rng.randint(-99, 99)) for _ in range(3)}
        return a + b if (a, b) in public else 0

    assert run_checks("toy.add", tuned, seed=5, hidden=False).status == "passed"
    v = run_checks("toy.add", tuned, seed=5)
    assert v.status == "failed" and v.passed == 1
    assert v.message.startswith("hidden check 2/2 'adds many random integers' (seed 5) failed:")


def test_the_stub_is_named_as_the_stub():
    def stub(a, b):
        raise NotImplementedError("toy.add")

    v = run_checks("toy.add", stub)
    assert v.status == "error" and "toy.add is still the stub" in v.message


def test_no_verdict_or_result_keeps_terminal_control_sequences():
    from grader.results import ExerciseResult

    def coloured(a, b):
        raise ValueError("\x1b[0;31mnot\x1b[0m \x1b[1;32msummed\x1b[0m")

    v = run_checks("toy.add", coloured)
    assert v.status == "error" and "not summed" in v.message and "\x1b" not in v.message
    result = ExerciseResult("toy.add", "Add", "error", 0, 1, "\x1b[31mred\x1b[39m and plain")
    assert result.message == "red and plain"
    linked = ExerciseResult("toy.add", "Add", "error", 0, 1,
                            "a \x1b]8;;http://elsewhere\x07link\x1b]8;;\x07, a bell\x07\x00\r\n")
    assert linked.message == "a link, a bell\r\n"  # (OSC hyperlinks and control characters)


def test_an_answer_that_raises_is_an_error_quoting_the_learners_line(monkeypatch):
    src = "def add(a, b):\n    x = 1\n    return a + b + None\n"
    # IPython keeps each cell's source in linecache under the cell's file name; so do we
    monkeypatch.setitem(linecache.cache, "/tmp/ipykernel_1/123.py",
                        (len(src), None, src.splitlines(True), "/tmp/ipykernel_1/123.py"))
    ns = {}
    exec(compile(src, "/tmp/ipykernel_1/123.py", "exec"), ns)
    v = run_checks("toy.add", ns["add"])
    assert v.status == "error"
    assert "TypeError" in v.message
    assert "at line 3 of your cell: `return a + b + None`" in v.message
    assert "checks.py" not in v.message  # no check source or path leaks


def test_an_error_in_code_a_cell_evaluates_names_the_cells_line_that_evaluated_it(monkeypatch):
    src = "def add(a, b):\n    formula = 'a.conj() + b'\n    return eval(formula)\n"
    monkeypatch.setitem(linecache.cache, "/tmp/ipykernel_1/124.py",
                        (len(src), None, src.splitlines(True), "/tmp/ipykernel_1/124.py"))
    ns = {}
    exec(compile(src, "/tmp/ipykernel_1/124.py", "exec"), ns)
    v = run_checks("toy.add", ns["add"])
    assert v.status == "error" and "AttributeError" in v.message
    assert v.message.endswith("at line 3 of your cell: `return eval(formula)` "
                              "(in the code that line evaluates)"), v.message


def test_a_line_python_cannot_read_back_is_given_by_its_number():
    ns = {}
    exec(compile("def add(a, b):\n    return a + None\n", "<lost>", "exec"), ns)
    v = run_checks("toy.add", ns["add"])
    assert v.message.endswith("at line 2 of your cell"), v.message


def test_the_self_check_numbers_checks_as_the_grader_does_and_names_the_hidden_ones():
    v = run_checks("toy.add", lambda a, b: a + b, seed=1, hidden=False)
    assert v.message == ("1/1 public checks passed (seed 1); the grader also runs 1 hidden "
                         "check(s) on other inputs")
    wrong = run_checks("toy.add", lambda a, b: a - b, hidden=False)
    assert wrong.message.startswith("check 1/2 "), wrong.message  # 2: public and hidden


def test_withheld_hidden_checks_keep_the_count_where_only_public_ones_run(monkeypatch,
                                                                          tmp_path):
    """In a learner's copy (``grader dist student``) the hidden checks are cut out and the lab
    table's ``withheld`` counts them: checks are numbered as the full grader numbers them, and
    even the grader's own run (hidden=True) says what it did not run."""
    from grader import labs

    tables = labs._tables()
    table = tmp_path / "labs" / "toy" / "lab.toml"
    table.parent.mkdir(parents=True)
    table.write_text(tables["toy"].read_text().replace('id = "toy.add"',
                                                       'id = "toy.add"\nwithheld = 2'))
    monkeypatch.setattr(labs, "_tables", lambda: tables | {"toy": table})
    assert labs.load_lab("toy").exercise("toy.add").withheld == 2  # (beside its own hidden one)
    for hidden in (False, True):
        wrong = run_checks("toy.add", lambda a, b: a - b, hidden=hidden)
        assert wrong.message.startswith("check 1/4 "), wrong.message
    right = run_checks("toy.add", lambda a, b: a + b, seed=1, hidden=False)
    assert right.message == ("1/1 public checks passed (seed 1); the grader also runs 3 hidden "
                             "check(s) on other inputs")
    graded = run_checks("toy.add", lambda a, b: a + b, seed=1)
    assert graded.message == ("2/2 checks passed (seed 1); the grader also runs 2 hidden "
                              "check(s) on other inputs"), graded.message


def test_an_answer_of_the_wrong_type_is_asked_about_not_blamed_for_raising():
    v = run_checks("toy.mul", lambda a, b: {"product": a * b})
    assert v.status == "error"
    assert "checking your answer raised TypeError" in v.message
    assert "Does your answer return what the exercise asks for" in v.message
    assert "your answer raised" not in v.message.replace("checking your answer raised", "")


def test_long_messages_are_clipped():
    v = run_checks("toy.add", lambda a, b: 10**3000)
    assert v.status == "failed" and len(v.message) <= 1200


def test_an_exercise_without_checks_is_a_lookup_error():
    with pytest.raises(LookupError, match="toy.nothing"):
        run_checks("toy.nothing", None)


def test_checks_draw_from_a_seeded_fork_of_the_global_rng():
    state = torch.get_rng_state()
    DRAWN.clear()
    for seed in (1, 1, 2):
        run_checks("toy.rng-probe", None, seed=seed)
    assert torch.equal(torch.get_rng_state(), state)  # the learner's RNG is untouched
    assert torch.equal(DRAWN[0], DRAWN[1]) and not torch.equal(DRAWN[0], DRAWN[2])


def _in_state(fn):
    """An answer that reports the global state it runs under, with its value."""
    return lambda x: (torch.is_grad_enabled(), torch.get_default_dtype(),
                      torch.are_deterministic_algorithms_enabled(), fn(x))


@check("toy.state-probe")
def square_under_defaults(answer, ctx):
    """squares x under torch's defaults"""
    grad_mode, dtype, deterministic, y = answer(torch.tensor([3.0]))
    if (grad_mode, dtype, deterministic) != (True, torch.float32, False):
        raise CheckFailure(f"the answer ran under {grad_mode}, {dtype}, {deterministic}")
    if y.dtype != torch.float32 or y.item() != 9.0:
        raise CheckFailure(f"expected a float32 9, got {y}")


def test_checks_run_under_torchs_defaults_whatever_the_notebook_set():
    class Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            raise RuntimeError("the learner's mode saw an op")

    mode = Tracer()
    torch.set_grad_enabled(False)
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True)
    mode.__enter__()  # left active, as a learner's cell can leave it
    try:
        v = run_checks("toy.state-probe", _in_state(lambda x: x ** 2))
        left = (torch.is_grad_enabled(), torch.get_default_dtype(),
                torch.are_deterministic_algorithms_enabled())
    finally:
        mode.__exit__(None, None, None)
        torch.use_deterministic_algorithms(False)
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
    assert v.status == "passed", v.message
    assert left == (False, torch.float64, True)  # the notebook's own state is given back


def test_a_failure_under_a_changed_state_says_which_state_the_notebook_changed():
    with torch.no_grad():
        assert state_changes() == ["grad mode is off (torch.set_grad_enabled(False), or "
                                   "torch.no_grad() entered and not left)"]
        v = run_checks("toy.state-probe", _in_state(lambda x: x ** 3))
    assert v.status == "failed" and "expected a float32 9" in v.message
    assert "your notebook changed settings (grad mode is off" in v.message
    assert len(v.message) <= 1200
    assert "changed settings" not in run_checks("toy.state-probe",
                                                _in_state(lambda x: x ** 3)).message


def test_a_failure_names_the_environment_variables_and_config_the_notebook_changed(
        monkeypatch):
    from torch._inductor import config as inductor_config

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "en0")  # left from a laptop
    monkeypatch.setenv("COURSE_UNRELATED_VARIABLE", "1")
    with inductor_config.patch({"cpp.cxx": ("clang++",)}):
        v = run_checks("toy.state-probe", _in_state(lambda x: x ** 3))
    assert v.status == "failed" and len(v.message) <= 1200
    assert "GLOO_SOCKET_IFNAME='en0' (unset when the kernel started)" in v.message
    assert "torch._inductor.config.cpp.cxx = ('clang++',)" in v.message
    assert "COURSE_UNRELATED_VARIABLE" not in v.message
    assert "changed settings" not in run_checks("toy.state-probe",
                                                _in_state(lambda x: x ** 2)).message


@pytest.mark.parametrize("ename, evalue, phrase", [
    ("StdinNotImplementedError", "raw_input was called, but this frontend does not support "
     "input requests.", "input requests (input() waits for a keyboard, and the grader has none"),
    ("FileNotFoundError", "[Errno 2] No such file or directory: 'data.csv'",
     "'data.csv' (grading runs in an empty folder"),
    ("SystemExit", "0", "SystemExit: 0 (sys.exit() and raise SystemExit end a program"),
    ("ValueError", "bad value.", "ValueError: bad value")])
def test_errors_are_explained_without_a_doubled_period(ename, evalue, phrase):
    text = explain(ename, evalue)
    assert phrase in text and not text.endswith(".")


def test_input_in_an_answer_the_checks_call_says_the_grader_has_no_keyboard():
    from ipykernel.kernelbase import StdinNotImplementedError

    def add(a, b):
        raise StdinNotImplementedError("raw_input was called, but this frontend does not "
                                       "support input requests.")

    v = run_checks("toy.add", add)
    assert v.status == "error" and "the grader has none: remove the call" in v.message
    assert ".." not in v.message


def test_work_ahead_gets_the_seed_and_what_goes_wrong_there_is_left_to_the_checks(monkeypatch):
    from grader import checks

    monkeypatch.setattr(checks, "_AHEAD", {})
    seen = []
    checks.ahead("toy")(seen.append)
    checks.ahead("toy")(lambda seed: 1 / 0)
    checks.start_ahead("toy", 5)  # (raises nothing)
    checks.start_ahead("no-such-lab", 5)
    assert seen == [5]


def test_a_settings_reply_the_notebook_forged_or_broke_leaves_the_verdict_alone(monkeypatch):
    """The note comes from the kernel, which the notebook controls: an entry that is not a str
    (an int str() refuses), a reader that raises, or a name with terminal escapes costs the
    note, never the verdict."""
    from grader.kernel import probe

    wrong = _in_state(lambda x: x ** 3)
    monkeypatch.setattr(probe, "settings_changes", lambda: [10 ** 5000, "GLOO_X='1'"])
    v = run_checks("toy.state-probe", wrong)
    assert v.status == "failed" and "changed settings (GLOO_X='1')" in v.message

    def broken():
        raise RuntimeError("the notebook broke this")

    monkeypatch.setattr(probe, "settings_changes", broken)
    v = run_checks("toy.state-probe", wrong)
    assert v.status == "failed" and "changed settings" not in v.message
    monkeypatch.undo()

    monkeypatch.setenv("TORCHINDUCTOR_\x1b]8;;http://elsewhere\x07X", "\x1b[31m1")
    with torch._dynamo.config.patch(cache_size_limit=torch.tensor([1, 2])):  # (!= is ambiguous)
        v = run_checks("toy.state-probe", wrong)
    assert v.status == "failed" and "TORCHINDUCTOR_" in v.message
    assert not any(c in v.message for c in "\x1b\x07"), v.message
