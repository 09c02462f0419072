"""The in-notebook API, called in-process with __main__ standing in for the kernel's namespace
and IPython's ``display`` recorded: verdicts, progress, hints and the grader's check cell."""
import sys

import pytest

import grader.kernel.selfcheck as selfcheck
from grader.kernel.selfcheck import check, hint, progress

WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def main(monkeypatch):
    """The notebook namespace: set attributes on it to 'run a cell'."""
    namespace = sys.modules["__main__"]
    for name in ("add", "mul", "gpu_value", "seed", "device"):
        monkeypatch.delattr(namespace, name, raising=False)
    monkeypatch.setattr(selfcheck, "_LAST", {})
    monkeypatch.setattr(selfcheck, "_SHOWN", {})
    return lambda **names: [monkeypatch.setattr(namespace, k, v, raising=False)
                            for k, v in names.items()]


@pytest.fixture
def shown(monkeypatch):
    """Every display call as (bundle, keyword arguments), in order."""
    import IPython.display

    calls = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: calls.append((obj, kw)))
    return calls


def test_check_shows_a_rich_verdict_that_names_the_hidden_checks(main, shown):
    main(add=lambda a, b: a + b, seed=4)
    check("toy.add")
    verdict = shown[0][0]
    assert verdict["text/plain"] == ("✓ toy.add: passed — 1/1 public checks passed (seed 4); the "
                                     "grader also runs 1 hidden check(s) on other inputs")
    page = verdict["text/html"]
    assert "✓ passed" in page and "Add two numbers" in page and "<pre" not in page
    assert "word-break:normal" in page  # JupyterLab's <pre> breaks words anywhere
    assert not any(WIDGET in b for b, _ in shown)  # no hints offered for a pass


def test_a_failing_verdict_quotes_code_as_code_and_offers_the_hints(main, shown):
    main(add=lambda a, b: a - b)
    check("toy.add")
    verdict, button = shown[0][0], shown[1][0]
    assert verdict["text/plain"].startswith("✗ toy.add: failed — check 1/2 ")
    assert WIDGET in button and button["text/plain"] == (
        'Stuck? 2 hints: run hint("toy.add") to see the next one.')


def test_the_hint_button_reveals_the_hints_one_at_a_time_in_step_with_hint(main, shown):
    button, revealed = selfcheck._hint_panel("toy.mul").children
    assert button.description == "Show hint 1 of 3" and revealed.value == ""
    button.click()
    assert "Hint 1 of 3 for toy.mul" in revealed.value and "<code>*</code>" in revealed.value
    assert button.description == "Show hint 2 of 3"
    hint("toy.mul")  # the function and the button share one count
    assert shown[-1][0]["text/plain"].startswith("Hint 2 of 3 for toy.mul: ")
    button.click()  # the hints shown so far stay, in order
    assert [revealed.value.index(f"Hint {i} of 3") for i in (1, 2, 3)] == sorted(
        revealed.value.index(f"Hint {i} of 3") for i in (1, 2, 3))
    assert button.description == "All 3 hints shown" and button.disabled


def test_hint_shows_the_next_hint_then_all_again(main, shown):
    for _ in range(3):
        hint("toy.add")
    texts = [b["text/plain"] for b, _ in shown]
    assert texts[0] == "Hint 1 of 2 for toy.add: Python's `+` adds two numbers."
    assert texts[1].startswith("Hint 2 of 2") and len(texts) == 4  # then both again
    assert texts[2].startswith("Hint 1 of 2") and texts[3].startswith("Hint 2 of 2")


def test_hint_says_so_when_an_exercise_has_none(main, shown):
    hint("toy.gpu")
    assert shown[0][0] == {"text/plain": "toy.gpu has no hints."}


@pytest.mark.parametrize("call, said", [
    (lambda: hint("toy.ad"), "✗ toy.ad: error — lab 'toy' has no exercise 'toy.ad'; did you "
                             "mean `toy.add`? Its exercises: `toy.add`, `toy.mul`, `toy.gpu`."),
    (lambda: check("toy.mull"), "did you mean `toy.mul`?"),
    (lambda: check("toys.add"), "there is no lab 'toys' (the labs: "),
    (lambda: progress("toys"), "there is no lab 'toys' (the labs: "),
])
def test_a_mistyped_id_is_a_short_error_naming_the_right_ones(main, shown, call, said):
    call()  # (no traceback: nothing is raised)
    assert said in shown[0][0]["text/plain"] and len(shown) == 1


def test_progress_is_one_display_that_each_check_updates(main, shown):
    progress("toy")
    first, kw = shown[0]
    assert kw["display_id"] == "course-progress-toy" and "update" not in kw
    assert ("0 of 2 exercises pass their public checks, worth 0 of 3 points (the grader also "
            "runs hidden checks); 1 more, worth 1 points, needs what this machine lacks (a GPU)"
            in first["text/plain"])
    main(add=lambda a, b: a + b, mul=lambda a, b: a + b)
    check("toy.add")
    check("toy.mul")
    updates = [(b, kw) for b, kw in shown if kw.get("update")]
    assert [kw["display_id"] for _, kw in updates] == ["course-progress-toy"] * 2
    last = updates[-1][0]["text/plain"]
    assert "1 of 2 exercises pass their public checks, worth 1 of 3 points" in last
    rows = [line.split("  toy.")[0].strip() for line in last.splitlines()[3:]]
    assert rows == ["passed", "failed", "skipped"]
    assert "✗ failed" in updates[-1][0]["text/html"]


def test_check_says_when_the_answer_is_not_defined(main, shown):
    check("toy.add")
    assert shown[0][0]["text/plain"].startswith("✗ toy.add: error — `add` is not defined")
    assert "<code>add</code> is not defined" in shown[0][0]["text/html"]


def test_check_skips_what_this_machine_cannot_run(main, shown):
    main(gpu_value=42, device="cpu")
    check("toy.gpu")
    assert shown[0][0]["text/plain"].startswith("– toy.gpu: skipped — needs cuda")


def _kernel_outputs(cells: list[str]) -> list[str]:
    """Run ``cells`` in order in a real kernel (IPython's events fire as in JupyterLab); the
    text of each cell's outputs."""
    import nbformat.v4 as v4
    from nbclient import NotebookClient

    nb = v4.new_notebook(cells=[v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=120).execute()
    return ["".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")
                    + o.get("evalue", "") for o in c.outputs) for c in nb.cells]


def test_check_refuses_a_definition_that_the_last_run_of_its_cell_did_not_make():
    right = "def add(a, b):\n    return a + b\n"
    out = _kernel_outputs([
        "from grader.kernel.selfcheck import check",
        "def add(a, b):\n    return a - b\n      x = 1\n",  # never defined yet: not "earlier"
        'check("toy.add")',
        right,
        "def add(a, b):\n    return a - b\n      x = 1\n",  # an IndentationError: add unchanged
        'check("toy.add")',
        right,
        'check("toy.add")',
        "undefined_name\n" + right,  # raises before the def: add unchanged
        'check("toy.add")',
        right + "undefined_name\n",  # raises after the def: the new add stands
        'check("toy.add")',
        "print('another cell fails')\n1 / 0",  # a cell that does not define add
        'check("toy.add")',
    ])
    assert out[2].startswith("✗ toy.add: error — `add` is not defined"), out[2]
    out = out[:1] + out[3:]  # (the rest as if those two cells were not there)
    assert out[3].startswith("✗ toy.add: error — the last run of the answer cell of toy.add "
                             "raised IndentationError: unexpected indent"), out[3]
    assert "`add` is still what an earlier run defined: it is not checked" in out[3]
    assert out[5].startswith("✓ toy.add: passed"), out[5]
    assert "raised NameError: name 'undefined_name' is not defined" in out[7], out[7]
    assert out[9].startswith("✓ toy.add: passed"), out[9]
    assert out[11].startswith("✓ toy.add: passed"), out[11]
