"""compile.graph-breaks: plausible wrong rewrites fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch

from labs.compile import programs
from tests.conftest import assert_rejected

EX = "compile.graph-breaks"


def _branch(x):
    return torch.where(x.sum() > 0, x.relu() * 2, x.sigmoid() - 1)


def _logged(x):
    return x.tanh() * 3 + 1


def _item(x):
    return x / x.abs().max()


def _builtin(x):
    return x[torch.topk(x.sum(1), 2).indices].sum(0)


def _generator(x):
    windows = x.unfold(0, 2, 1).transpose(1, 2)
    return windows[windows.sum((1, 2)).argmax(0, keepdim=True)][0]


RIGHT = {"branch": _branch, "logged": _logged, "item": _item, "builtin": _builtin,
         "generator": _generator}


def _with(**changes):
    return {**RIGHT, **changes}


def _off_by_one_windows(x):
    windows = x.unfold(0, 2, 1).transpose(1, 2)
    return windows[windows.sum((1, 2)).argmax(0, keepdim=True) + 1][0]


def _last_window_missed(x):
    windows = torch.stack((x[:-2], x[1:-1]), 1)  # range(n - 2): one window short
    return windows[windows.sum((1, 2)).argmax(0, keepdim=True)][0]


def _windows_of_one_row_ahead(x):
    windows = torch.stack((x[1:], x[:-1]), 1)  # rows swapped inside each window
    return windows[windows.sum((1, 2)).argmax(0, keepdim=True)][0]


WRONG = {
    "the originals left in place": (dict(programs.BREAKING), "graph break(s) in fixed['branch']"),
    "always relu": (_with(branch=lambda x: x.relu() * 2), "example input 2"),
    "item kept": (_with(item=lambda x: x / x.abs().max().item()), "break(s) in fixed['item']"),
    "top-1 only": (_with(builtin=lambda x: x[torch.topk(x.sum(1), 1).indices].sum(0)),
                   "different values from programs.builtin"),
    "a 0-d index": (_with(builtin=lambda x: x[torch.topk(x.sum(1), 2).indices[0]]
                          + x[torch.topk(x.sum(1), 2).indices[1]]), "Data dependent"),
    "off-by-one windows": (_with(generator=_off_by_one_windows), "fixed['generator']"),
    "last window missed": (_with(generator=_last_window_missed), "fixed['generator']"),
    "window rows swapped": (_with(generator=_windows_of_one_row_ahead), "different values"),
    "print kept": (_with(logged=programs.logged), "graph break(s) in fixed['logged']"),
    "sum of abs for item": (_with(item=lambda x: x / x.abs().sum()), "different values"),
    ">= for >": (_with(branch=lambda x: torch.where(x.sum() >= 0, x.relu() * 2, x.sigmoid() - 1)),
                 "whose sum is exactly 0"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_rewrites_fail(name):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase)


def test_a_right_answer_passes():
    from grader.checks import run_checks

    v = run_checks(EX, RIGHT, seed=4)
    assert v.status == "passed", v.message


def test_a_missing_name_is_named():
    assert_rejected(EX, {k: v for k, v in RIGHT.items() if k != "item"}, "no entry for 'item'")


def test_a_misspelled_name_is_named():
    assert_rejected(EX, {**RIGHT, "generators": _generator}, "'generators'")


def test_a_value_that_is_not_a_function_is_named():
    assert_rejected(EX, _with(logged=None), "fixed['logged'] is a NoneType")


def test_a_break_the_notebooks_config_hides_is_explained():
    """With capture_scalar_outputs on, the notebook sees no break in `.item()`; the check runs
    with the default config, finds one, and says which setting it set back."""
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        v = assert_rejected(EX, WRONG["item kept"][0], "break(s) in fixed['item']")
    assert "torch._dynamo.config.capture_scalar_outputs back to the default" in v.message, \
        v.message


def test_no_config_note_when_the_notebook_kept_the_defaults():
    v = assert_rejected(EX, WRONG["item kept"][0], "break(s) in fixed['item']")
    assert "default config" not in v.message, v.message


def test_what_a_library_installed_in_the_config_is_not_named():
    # AOTInductor records metadata in inductor's config (lab 6's cells, or an earlier test in
    # this process): not a setting the notebook made, so the note names none (CI met this)
    from torch._inductor import config as inductor_config

    with inductor_config.patch({"aot_inductor.metadata": {"AOTI_DEVICE_KEY": "cpu"}}):
        v = assert_rejected(EX, WRONG["item kept"][0], "break(s) in fixed['item']")
    assert "default config" not in v.message and "metadata" not in v.message, v.message
