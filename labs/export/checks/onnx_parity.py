"""Checks of ``export.onnx-parity``: ``to_onnx(model, example, path)`` writes to ``path`` an ONNX
model of ``model`` (one float32 input shaped like ``example``, ``(batch, features)``), exported
by the dynamo-based exporter, ``torch.onnx.export(..., dynamo=True)``
(torch/onnx/_internal/exporter/_core.py: export, exported_program_to_ir), whose batch dimension
is symbolic: dim 0 of the graph's input and output is a ``dim_param`` (a name), not a
``dim_value`` (a number), so that onnxruntime accepts any batch.

The answer is called in the learner's kernel by the probe ``probes.onnx_files`` (on the model
rebuilt from its state dict, in an empty temporary folder: the exporter may write the weights
beside the file, ``path + ".data"``), which returns the folder's files as bytes; the checks load
them here (an ONNX graph is data). The file must load with ``onnx.load``
and pass ``onnx.checker.check_model``; it must carry the graph metadata the dynamo exporter
writes (``pkg.torch.export.*``: the TorchScript exporter, ``dynamo=False``, writes none); and
onnxruntime (``InferenceSession``, CPUExecutionProvider) must reproduce the eager model
(``torch.testing.assert_close``, float32 tolerances) at batch 1, at the example's batch and at
seeded batches up to 64. Public: ``models.mlp([16, 32, 32, 4])``, example batch 4. Hidden: a
seeded MLP, and a small model with LayerNorm, GELU, softmax and a shape op on the batch (a
file exported for one batch with its ``dim_param`` written in afterwards fails there). The exporter's progress lines
(``[torch.onnx] ...``), warnings and log records are kept out of the verdict's output; what the
answer prints itself is passed on.
"""

from __future__ import annotations

import os
import tempfile

import onnx  # (imported with the checks, so the grader's guard watches onnx and onnxruntime)
import onnxruntime as ort
import torch
from torch import nn

from grader.checks import CheckFailure, check
from labs.export import models, probes
from labs.export.checks._parity import same_as_eager

EXERCISE = "export.onnx-parity"
MAX_BATCH = 64
#: graph metadata keys that torch.onnx.export(..., dynamo=True) writes and the TorchScript
#: exporter does not (torch/onnx/_internal/exporter/_core.py: exported_program_to_ir)
DYNAMO_MARK = "pkg.torch.export."


def _dims(value_info) -> list:
    """The dims of a graph input/output: a name (dim_param), a number (dim_value) or None."""
    dims = []
    for d in value_info.type.tensor_type.shape.dim:
        kind = d.WhichOneof("value")
        dims.append(d.dim_param if kind == "dim_param" else d.dim_value if kind else None)
    return dims


def _load(path: str, folder: str, what: str):
    """The ModelProto at ``path``, checked; CheckFailure when there is none or it is not ONNX."""
    if not os.path.isfile(path):
        found = sorted(os.listdir(folder))
        where = (f" (the folder holds only {', '.join(found)})" if found else
                 " (nor anywhere in its folder)")
        raise CheckFailure(
            f"for {what}, to_onnx(model, example, path) wrote no file at path{where}. Save the "
            "model to exactly that path: torch.onnx.export(model, (example,), path, ...) writes "
            "it (or .save(path) on the ONNXProgram it returns).")
    with open(path, "rb") as f:
        head = f.read(4)
    try:
        proto = onnx.load(path)
        onnx.checker.check_model(path)
    except Exception as exc:  # noqa: BLE001  (DecodeError, ValidationError: onnx's words)
        zipped = (" It is a zip archive: torch.export.save and torch.save write those, not "
                  "ONNX." if head == b"PK\x03\x04" else "")
        raise CheckFailure(
            f"for {what}, the file to_onnx wrote is not a valid ONNX model: onnx.load / "
            f"onnx.checker.check_model say {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else '(no message)'}."
            f"{zipped} Write it with torch.onnx.export(..., dynamo=True).") from None
    return proto


def _judge_graph(proto, what: str) -> None:
    """Written by the dynamo exporter; one input and one output, each with a symbolic dim 0."""
    if not any(p.key.startswith(DYNAMO_MARK) for p in proto.graph.metadata_props):
        raise CheckFailure(
            f"for {what}, the ONNX file has none of the graph metadata the dynamo exporter "
            f"writes ({DYNAMO_MARK}*): it was written by the TorchScript exporter "
            f"(torch.onnx.export(..., dynamo=False), producer {proto.producer_name} "
            f"{proto.producer_version}), which traces one run and is deprecated. Export with "
            "dynamo=True, which captures the model with torch.export.")
    for kind, values in (("input", proto.graph.input), ("output", proto.graph.output)):
        if len(values) != 1:
            names = ", ".join(repr(v.name) for v in values)
            raise CheckFailure(
                f"for {what}, the ONNX graph has {len(values)} {kind}s ({names}); the model "
                f"takes one tensor and returns one: export it with args=(example,).")
        dims = _dims(values[0])
        if not dims or not isinstance(dims[0], str) or not dims[0]:
            fixed = (f"dim 0 is fixed at {dims[0]} (a dim_value)" if dims and dims[0] else
                     "dim 0 has no symbolic name (no dim_param)")
            raise CheckFailure(
                f"for {what}, the graph {kind} {values[0].name!r} has shape {dims}: {fixed}, so "
                "onnxruntime refuses every other batch. Pass dynamic_shapes to torch.onnx.export "
                "marking dim 0 of the input dynamic (a torch.export.Dim), so that the batch "
                "becomes a symbolic dim_param.")


def _batches(example_batch: int, g: torch.Generator) -> list[int]:
    """1, the example's batch, two seeded batches in 2..MAX_BATCH - 1 and MAX_BATCH."""
    drawn = [int(b) for b in torch.randint(2, MAX_BATCH, (2,), generator=g)]
    return list(dict.fromkeys([1, example_batch, *drawn, MAX_BATCH]))


def _files(reply, what: str) -> dict:
    """The ``{name: bytes}`` of the folder the probe returned, checked to be that."""
    files = reply.get("files") if type(reply) is dict else None
    if type(files) is not dict or not all(
            type(k) is str and os.path.basename(k) == k and k not in ("", ".", "..")
            and (v is None or type(v) is bytes) for k, v in files.items()):
        raise CheckFailure(f"for {what}, what came back from your answer is not the folder the "
                           "grader's probe reads: the probe did not run as shipped (answers "
                           "must not modify the grader).")
    return files


def _compare(to_onnx, spec: list, model: nn.Module, example: torch.Tensor, g: torch.Generator,
             what: str) -> None:
    reply = to_onnx.probe(probes.onnx_files, spec, dict(model.state_dict()), example.clone())
    files = _files(reply, what)
    with tempfile.TemporaryDirectory(prefix="onnx_parity_") as folder:
        for name, data in files.items():
            if data is None:
                os.mkdir(os.path.join(folder, name))
            else:
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(data)
        path = os.path.join(folder, "model.onnx")
        proto = _load(path, folder, what)
        _judge_graph(proto, what)
        options = ort.SessionOptions()
        options.log_severity_level = 3  # (errors only)
        try:
            session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001  (onnxruntime's own exception classes)
            raise CheckFailure(f"for {what}, onnxruntime could not load the file: "
                               f"{str(exc).strip()[:300]}") from None
        name = session.get_inputs()[0].name
        for batch in _batches(example.shape[0], g):
            x = torch.randn(batch, example.shape[1], generator=g)
            with torch.no_grad():
                want = model(x)
            try:
                got = session.run(None, {name: x.numpy()})
            except Exception as exc:  # noqa: BLE001  (onnxruntime's own exception classes)
                raise CheckFailure(
                    f"for {what}, onnxruntime failed to run the model at batch {batch} "
                    f"(input {list(x.shape)}): {str(exc).strip()[:300]}. Does the graph hold a "
                    "size fixed at the example's batch (a traced shape)?") from None
            got = torch.from_numpy(got[0])
            same_as_eager(got, want, what, batch, "onnxruntime")


@check(EXERCISE)
def public_mlp(to_onnx, ctx):
    """models.mlp([16, 32, 32, 4]) exported at batch 4, run by onnxruntime at batches 1 to 64"""
    g = ctx.generator()
    model = models.mlp([16, 32, 32, 4], g)
    example = torch.randn(4, 16, generator=g)
    _compare(to_onnx, ["mlp", [16, 32, 32, 4]], model, example, g,
             "models.mlp([16, 32, 32, 4]) with an example batch of 4")


@check(EXERCISE, hidden=True)
def seeded_mlp(to_onnx, ctx):
    """a seeded MLP and example batch, run by onnxruntime at seeded batches"""
    g = ctx.generator(1)
    widths = [int(w) for w in torch.randint(3, 40, (4,), generator=g)]
    model = models.mlp(widths, g)
    batch = int(torch.randint(2, 9, (), generator=g))
    example = torch.randn(batch, widths[0], generator=g)
    _compare(to_onnx, ["mlp", widths], model, example, g,
             f"models.mlp({widths}) with an example batch of {batch}")


@check(EXERCISE, hidden=True)
def layernorm_gelu_softmax(to_onnx, ctx):
    """a model with LayerNorm, GELU, softmax and a shape op on the batch, run by onnxruntime at
    seeded batches"""
    g = ctx.generator(2)
    d, hidden, k = (int(v) for v in torch.randint(4, 33, (3,), generator=g))
    model = models.Head(d, hidden, k, g)
    batch = int(torch.randint(2, 9, (), generator=g))
    example = torch.randn(batch, d, generator=g)
    _compare(to_onnx, ["head", d, hidden, k], model, example, g,
             f"models.Head: x ({d} features) and a column of ones as tall as the batch -> "
             f"Linear({d + 1}, {hidden}) -> LayerNorm -> GELU -> Linear({hidden}, {k}) -> "
             f"softmax, with an example batch of {batch}")
