"""export.aoti: plausible wrong package_aoti answers fail, called directly through run_checks.
Only the static-batch answer compiles (an AOTInductor compile costs ~10 s, more with a cold
cache); the others fail on what they return before anything is compiled. The reference and the
stub are tested in test_exercise_contract.py."""
import os

import pytest
import torch
from torch.export import Dim, export

from tests.conftest import assert_rejected

EX = "export.aoti"


def static_batch(model, example, path):
    """Exports without dynamic_shapes: the package only computes the example's batch."""
    ep = export(model, (example,))
    return torch._inductor.aoti_compile_and_package(ep, package_path=path)


def _saved_program(model, example, path):
    ep = export(model, (example,), dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    torch.export.save(ep, path)


def exported_program_saved(model, example, path):
    """Saves the ExportedProgram with torch.export.save (a .pt2 archive, but no package)."""
    _saved_program(model, example, path)
    return path


def no_return(model, example, path):
    """Writes the file and forgets to return its path."""
    _saved_program(model, example, path)


def file_name_returned(model, example, path):
    """Returns the file's name (relative to the folder the notebook ran in), not its path."""
    _saved_program(model, example, path)
    return os.path.basename(path)


@pytest.mark.parametrize("answer, phrase", [
    (static_batch, ("The package was compiled for one batch only (its input check says: "
                    "input_handles[0]: unmatched dim value at 0, expected: 4, but got: ")),
    (exported_program_saved, "holds no AOTInductor model (nothing under data/aotinductor/)"),
    (no_return, "package_aoti returned None"),
    (file_name_returned, ("package_aoti returned 'model.pt2', which is not a file (a relative "
                          "path")),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def from_two(model, example, path):
    """Declares the batch from 2 (Inductor's own lower bound) up: the package runs batch 1 only
    because the grader compiles with the lower-bound check off."""
    ep = export(model, (example,), dynamic_shapes=({0: Dim("batch", min=2, max=64)},))
    return torch._inductor.aoti_compile_and_package(ep, package_path=path)


def from_two_beside_a_decoy(model, example, path):
    """Compiles the program declared from 2 up, after exporting a decoy declared from 1."""
    ep = export(model, (example,), dynamic_shapes=({0: Dim("batch", min=2, max=64)},))
    export(model, (example,), dynamic_shapes=({0: Dim("b2", min=1, max=64)},))
    return torch._inductor.aoti_compile_and_package(ep, package_path=path)


@pytest.mark.parametrize("answer", [from_two, from_two_beside_a_decoy])
def test_a_program_declared_from_batch_two_fails_its_declared_range(answer):
    v = assert_rejected(EX, answer, "declares dim 0 (the batch) in [2, 64]")
    assert v.message.startswith("hidden check 2/2"), v.message


def test_judge_never_loads_a_package():
    """A package is native code the learner's kernel built: only the probe loads and runs it."""
    from pathlib import Path

    import labs.export.checks.aoti as judge

    source = Path(judge.__file__).read_text()
    assert "aoti_load_package(" not in source and "zipfile" not in source
