"""run_checks: statuses and learner-facing messages, called directly (milliseconds)."""
import pytest
import torch

from grader.checks import check, checks_for, run_checks

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


def test_an_answer_that_raises_is_an_error_pointing_at_the_learners_line():
    src = "def add(a, b):\n    x = 1\n    return a + b + None\n"
    ns = {}
    exec(compile(src, "/tmp/ipykernel_1/123.py", "exec"), ns)
    v = run_checks("toy.add", ns["add"])
    assert v.status == "error"
    assert "TypeError" in v.message and "(line 3 of your code)" in v.message
    assert "checks.py" not in v.message  # no check source or path leaks


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
