"""Shared fixtures: load an exercise's reference answer (from solutions/) or stub (from notebooks/)
by executing the lab's setup cells and that exercise's answer cell, as the kernel would.

``tests/fixtures`` holds a tiny course of its own (``labs/toy``, its solution and release) used to
test the grader; it is put on ``sys.path`` and ``PYTHONPATH`` (so kernels see it too) before the
``labs`` package is first imported.
"""
import os
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# The course root comes first so that `import labs` finds the real (regular) package, which
# then extends itself with tests/fixtures/labs; kernels started by the grader inherit this.
sys.path.insert(0, str(FIXTURES))
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(ROOT), str(FIXTURES), os.environ.get("PYTHONPATH")]))
#: where the tests build lab 7's C++ sources (labs/extensions/build.py), once per source for the
#: whole session: the test processes and the kernels of test_run_all and test_run_twice share it
#: (a grading kernel never does: the grader gives each its own, empty)
EXTENSIONS = ROOT / "build" / "test-extensions"
os.environ["TORCH_EXTENSIONS_DIR"] = str(EXTENSIONS)

from grader import notebook
from grader.labs import load_lab


def _prime_autograd_engine():
    """Run one backward before any test registers a device. Autograd starts its device threads
    once per process, at the first backward (torch/csrc/autograd/engine.cpp:
    Engine::start_device_threads); if a non-CPU device is registered by then (lab 1's
    PrivateUse1 backend counts one device), the threads start and every process forked
    afterwards refuses to run backward ("Unable to handle autograd's threading in combination
    with fork-based multiprocessing"), which would break lab 5's forked ranks in a pytest worker
    that ran lab 1's tests first. Primed with only the CPU, the engine starts no threads at all,
    as in a grading kernel, where each lab runs alone."""
    import torch

    torch.ones(1, requires_grad=True).sum().backward()


_prime_autograd_engine()

#: the test files that grade whole notebooks in kernels, longest first, and the two that grade
#: every exercise's reference (each over a minute of one worker): run before the rest, so that
#: neither pytest-xdist worker is left alone with one of them at the end of `make test`
SLOW_FIRST = ("tests/hostile/", "tests/test_labs_end_to_end.py", "tests/test_run_twice.py",
              "tests/labs/test_reference_seeds.py", "tests/labs/test_exercise_contract.py",
              "tests/test_batch.py", "tests/test_dist.py", "tests/test_grade.py",
              "tests/test_run_all.py")


def pytest_collection_modifyitems(items):
    """Collect the files of SLOW_FIRST first (in that order), the others as they come; the
    order within a file is kept (--dist loadfile hands a worker whole files, in this order)."""
    rank = {item: next((i for i, p in enumerate(SLOW_FIRST) if item.nodeid.startswith(p)),
                       len(SLOW_FIRST)) for item in items}
    items.sort(key=rank.__getitem__)


def load_answer(exercise_id: str, source: str = "solutions"):
    """The object the answer cell of ``exercise_id`` binds, executed from ``source``
    (``solutions`` for the reference answer, ``notebooks`` for the released stub), after the
    setup cells and the reference answers of the lab's earlier exercises (which later ones may
    build on, as lab 3's allocator classes do)."""
    lab = load_lab(exercise_id.split(".", 1)[0])
    solved = notebook.read(ROOT / "solutions" / f"{lab.notebook}.ipynb")
    nb = notebook.read(ROOT / source / f"{lab.notebook}.ipynb")
    # A module of its own, as the kernel's __main__ is: what looks a global up through a class's
    # __module__ (Dynamo's guards, when export traces a module strictly) finds the cells' names.
    module = types.ModuleType(f"_answers_of_{lab.id}")
    sys.modules[module.__name__] = module
    namespace = vars(module)
    namespace.update(seed=0, device="cpu")
    for src in notebook.code_of(solved, "setup"):
        exec(compile(src, f"<setup {lab.id}>", "exec"), namespace)
    ids = [e.id for e in lab.exercises]
    for earlier in ids[: ids.index(exercise_id)]:
        for src in notebook.code_of(solved, "answer", earlier):
            exec(compile(src, f"<answer {earlier}>", "exec"), namespace)
    sources = notebook.code_of(nb, "answer", exercise_id)
    assert sources, f"{source}/{lab.notebook}.ipynb has no answer cell for {exercise_id}"
    for src in sources:
        exec(compile(src, f"<answer {exercise_id}>", "exec"), namespace)
    return namespace[lab.exercise(exercise_id).answer]


def assert_rejected(exercise_id: str, answer, phrase: str = "", seed: int = 0):
    """Assert that the public and hidden checks of ``exercise_id`` reject ``answer`` (status
    ``failed`` or ``error``), that the message contains ``phrase``, and that it shows no check
    source. Returns the Verdict."""
    from grader.checks import run_checks

    v = run_checks(exercise_id, answer, seed=seed, hidden=True)
    assert v.status in ("failed", "error"), (exercise_id, seed, v.message)
    assert phrase in v.message, (phrase, seed, v.message)
    assert "def " not in v.message and "raise CheckFailure" not in v.message, v.message
    return v


@pytest.fixture
def reference():
    """``reference(exercise_id)`` -> the reference answer from solutions/."""
    return lambda exercise_id: load_answer(exercise_id, "solutions")


@pytest.fixture
def stub():
    """``stub(exercise_id)`` -> the released stub from notebooks/."""
    return lambda exercise_id: load_answer(exercise_id, "notebooks")
