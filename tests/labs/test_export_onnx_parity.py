"""export.onnx-parity: plausible wrong to_onnx answers fail, called directly through run_checks.
Each fails in the public check (one ONNX export at most, ~2 s each). The reference and the stub
are tested in test_exercise_contract.py."""
import pytest
import torch
from torch.export import Dim

from tests.conftest import assert_rejected

EX = "export.onnx-parity"


def fixed_batch(model, example, path):
    """The dynamo exporter without dynamic_shapes: the batch is fixed at the example's."""
    torch.onnx.export(model, (example,), path, dynamo=True, verbose=False)


def torchscript_exporter(model, example, path):
    """The legacy TorchScript exporter with dynamic_axes: a valid, dynamic file, but not the
    exporter the exercise asks for."""
    torch.onnx.export(model, (example,), path, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})


def never_saved(model, example, path):
    """Exports, but never writes the ONNXProgram to path."""
    return torch.onnx.export(model, (example,), dynamo=True, verbose=False,
                             dynamic_shapes=({0: Dim("batch")},))


def exported_program_saved(model, example, path):
    """Saves a torch.export ExportedProgram (a .pt2 zip archive), not ONNX."""
    ep = torch.export.export(model, (example,), dynamic_shapes=({0: Dim("batch")},))
    torch.export.save(ep, path)


def dim_param_written_in(model, example, path):
    """Exports for the example's batch, then names dim 0 of the file's input and output: the
    input types say any batch, the program inside does not."""
    import onnx

    torch.onnx.export(model, (example,), path, dynamo=True, verbose=False)
    proto = onnx.load(path)
    for value in (*proto.graph.input, *proto.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(proto, path)


def test_a_dim_param_written_into_a_fixed_batch_file_fails_on_the_batch_shape_op():
    v = assert_rejected(EX, dim_param_written_in, "a column of ones as tall as the batch")
    assert v.message.startswith("hidden check 3/3"), v.message
    assert "Does the graph hold a size fixed at the example's batch" in v.message, v.message


@pytest.mark.parametrize("answer, phrase", [
    (fixed_batch, "has shape [4, 16]: dim 0 is fixed at 4 (a dim_value)"),
    (torchscript_exporter, "it was written by the TorchScript exporter"),
    (never_saved, "wrote no file at path"),
    (exported_program_saved, "It is a zip archive: torch.export.save and torch.save write those"),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/3"), v.message


def test_probe_returns_the_folder_as_bytes():
    """The probe sends back the files the answer wrote (the judge loads them itself)."""
    from grader.checks import LocalAnswer
    from labs.export import models, probes

    model = models.mlp([3, 2], torch.Generator().manual_seed(0))
    reply = LocalAnswer(fixed_batch, EX).probe(
        probes.onnx_files, ["mlp", [3, 2]], dict(model.state_dict()), torch.randn(2, 3))
    assert "model.onnx" in reply["files"]  # (and model.onnx.data: the weights, beside it)
    assert all(type(data) is bytes for data in reply["files"].values())
