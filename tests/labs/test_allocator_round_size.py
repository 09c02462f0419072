"""allocator.round-size: plausible wrong answers fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest

from labs.allocator import model
from tests.conftest import assert_rejected
from tests.labs._liars import LyingStr

EX = "allocator.round-size"
MiB = 1024**2


# The real rules written here again (the checks refuse answers that call labs.allocator.model).
def _next_division(size, divisions):
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    return -(-size // step) * step if step else 2 * floor


def _round(size, divisions=0):
    if size < 512:
        return 512
    if divisions > 1 and size > 512 * divisions:
        return _next_division(size, divisions)
    return -(-size // 512) * 512


def _segment(rounded):
    if rounded <= MiB:
        return 2 * MiB
    return 20 * MiB if rounded < 10 * MiB else -(-rounded // (2 * MiB)) * 2 * MiB


def _with(rounding=None, pool_of=None, segment=None):
    """The real rules, with one of them replaced."""

    def plan(size, divisions=0):
        rounded = (rounding or _round)(size, divisions)
        pool = (pool_of or (lambda s, r: "small" if r <= MiB else "large"))(size, rounded)
        return rounded, pool, (segment or _segment)(rounded)

    return plan


def test_the_rules_written_here_pass():
    from grader.checks import run_checks

    assert run_checks(EX, _with(), seed=1).status == "passed"


WRONG = {
    "no minimum block": _with(rounding=lambda s, d: -(-s // 512) * 512 if s >= 512 else s),
    "rounds to 256": _with(rounding=lambda s, d: max(512, -(-s // 256) * 256)),
    "ignores divisions": _with(rounding=lambda s, d: _round(s)),
    "power of two always": _with(rounding=lambda s, d: max(512, 1 << (s - 1).bit_length())),
    "divisions without the 512*N condition": _with(
        rounding=lambda s, d: _next_division(s, d)
        if d > 1 and s >= 512
        else _round(s)
    ),
    "small pool up to 1 MiB exclusive": _with(pool_of=lambda s, r: "small" if r < MiB else "large"),
    "20 MiB segments up to 10 MiB inclusive": _with(
        segment=lambda r: _segment(r) if r != 10 * MiB else 20 * MiB
    ),
    "large segments rounded to 20 MiB": _with(
        segment=lambda r: _segment(r) if r < 10 * MiB else -(-r // (20 * MiB)) * 20 * MiB
    ),
    "float arithmetic": _with(rounding=lambda s, d: max(512, int(round(s / 512 + 0.4999)) * 512)),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_rules_fail(name):
    v = assert_rejected(EX, WRONG[name], seed=1)
    assert "the reference model (torch 2.13.0's rules) says" in v.message or "has type" in v.message


def test_a_list_instead_of_a_tuple_is_refused():
    assert_rejected(EX, lambda size, d=0: list(_with()(size, d)), "has type list")


def test_a_lying_pool_name_is_refused():
    def lying(size, d=0):
        block, _, segment = _with()(size, d)
        return block, LyingStr("small"), segment

    assert_rejected(EX, lying, "subclass of str")


def test_a_float_size_is_refused():
    assert_rejected(EX, lambda size, d=0: (float(_round(size, d)), "small", 0), "float")


def test_calling_the_reference_model_is_refused():
    assert_rejected(EX, model.allocation_plan, "own model or checks")
