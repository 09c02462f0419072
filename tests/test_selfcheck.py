"""The in-notebook API, called in-process with __main__ standing in for the kernel's namespace
(outside a kernel, IPython's display prints the mimebundle)."""
import sys

import pytest

from grader.selfcheck import VERDICT_MIME, check, grade


@pytest.fixture
def main(monkeypatch):
    """The notebook namespace: set attributes on it to 'run a cell'."""
    namespace = sys.modules["__main__"]
    for name in ("add", "mul", "gpu_value", "seed", "device"):
        monkeypatch.delattr(namespace, name, raising=False)
    return lambda **names: [monkeypatch.setattr(namespace, k, v, raising=False)
                            for k, v in names.items()]


def test_check_runs_the_public_checks_with_the_notebooks_seed(main, capsys):
    main(add=lambda a, b: a + b, seed=4)
    check("toy.add")
    out = capsys.readouterr().out
    assert "✓ toy.add: passed — 1/1 checks passed (seed 4)" in out  # public only: 1 of 2


def test_check_says_when_the_answer_is_not_defined(main, capsys):
    check("toy.add")
    assert "✗ toy.add: error — `add` is not defined" in capsys.readouterr().out


def test_check_skips_what_this_machine_cannot_run(main, capsys):
    main(gpu_value=42, device="cpu")
    check("toy.gpu")
    assert "– toy.gpu: skipped — needs cuda" in capsys.readouterr().out


def test_grade_emits_the_full_verdict_for_the_grader(main, capsys):
    main(add=lambda a, b: a + b)
    grade("toy.add", seed=9, device="cpu")
    out = capsys.readouterr().out
    assert VERDICT_MIME in out and "'total': 2" in out and "'status': 'passed'" in out
