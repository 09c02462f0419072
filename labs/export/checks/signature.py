"""Checks of ``export.signature``: ``predict_signature(model, args)`` must predict, without
exporting, the graph signature of ``torch.export.export(model, args).run_decompositions()`` (the
functional Core ATen program, where every mutation is an output), as ``{"inputs": [(kind, target),
...], "outputs": [(kind, target), ...]}`` in placeholder and output order. Kinds are the names of
``InputKind`` / ``OutputKind``: inputs ``"PARAMETER"``, ``"BUFFER"`` and ``"CONSTANT_TENSOR"``
(target: the fully qualified name, ``InputSpec.target``) and ``"USER_INPUT"`` (target: the
placeholder's name, ``InputSpec.arg.name``, i.e. forward's argument name); outputs
``"BUFFER_MUTATION"`` (the buffer's name), ``"USER_INPUT_MUTATION"`` (the input's name) and
``"USER_OUTPUT"`` (``None``). Buffers and constants are compared as a set, sorted by name:
``export`` lists all the buffers, then the constants in the order the graph first reads them
(torch/_export/passes/lift_constants_pass.py: lift_constants_pass), but ``run_decompositions``
retraces ``ep.module()`` with each constant registered as a buffer of its module
(torch/_export/utils.py: _register_constants_as_buffers), so the decomposed program lists them
module by module, interleaved (the notebook's cell ``s1-order`` shows both); parameters stay
first and user inputs last. That order is not what this exercise teaches. The oracle is export
itself, run by the judge on its own copy of the model; the answer runs in the kernel (the probe
:func:`labs.export.probes.signatures`, which builds the same models from plain specs), where
an answer that runs export's own code (``models`` in the lab table: torch/export/, torch/_export/,
Dynamo's export, AOTAutograd) fails, whatever it returns.
Public: ``models.Counter``. Hidden (seeded sizes and choices): nested blocks with non-persistent
buffers and constants (and a tensor attribute forward never reads), BatchNorm1d in train mode, a tied weight, user inputs mutated in place and
several outputs. (torch/export/graph_signature.py: ExportGraphSignature, InputSpec, OutputSpec;
torch/export/exported_program.py: _decompose_and_get_gm_with_new_signature_constants, which
retraces ``ep.module()`` (torch/export/_unlift.py: _unlift_exported_program_lifted_states).)"""

from __future__ import annotations

import warnings

import torch

from grader.checks import AnswerRaised, CheckFailure, check, exact, paired
from labs.export import probes

EXERCISE = "export.signature"
INPUT_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR", "USER_INPUT")
OUTPUT_KINDS = ("BUFFER_MUTATION", "USER_INPUT_MUTATION", "USER_OUTPUT")
NUDGE = {
    "PARAMETER": "Parameters come first, in named_parameters() order; a parameter that two "
                 "modules share is listed under each of its names "
                 "(named_parameters(remove_duplicate=False)).",
    "BUFFER": "After the parameters come the buffers, persistent or not, and the constants: the "
              "plain tensor attributes forward reads (these two are compared sorted by name).",

    "USER_INPUT": "The user inputs come last, one per forward argument, each named like the "
                  "argument.",
    "BUFFER_MUTATION": "The outputs start with the buffers forward writes, in input order. "
                       "BatchNorm's kernel updates running_mean and running_var without bumping "
                       "their _version: compare values too.",
    "USER_INPUT_MUTATION": "After the buffers come the user inputs forward writes in place, in "
                           "input order (not in the order forward writes them).",
    "USER_OUTPUT": "Last comes one USER_OUTPUT (target None) per tensor forward returns (each "
                   "element of a returned tuple).",
}
NUDGE["CONSTANT_TENSOR"] = NUDGE["BUFFER"]


def real_signature(spec: list) -> dict:
    """The signature of ``export(model, args).run_decompositions()`` for the case ``spec``
    (:func:`labs.export.probes.signature_case`), in the answer's format (torch's own deprecation
    warnings while it exports are kept out of the learner's output)."""
    model, args = probes.signature_case(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args).run_decompositions()
    sig = ep.graph_signature
    return {
        "inputs": [(s.kind.name, s.arg.name if s.kind.name == "USER_INPUT" else s.target)
                   for s in sig.input_specs],
        "outputs": [(s.kind.name, s.target) for s in sig.output_specs],
    }


def _entries(got, key: str, kinds: tuple, what: str) -> list[tuple]:
    entries = got[key]
    if not isinstance(entries, (list, tuple)):
        raise CheckFailure(f"for {what}, got[{key!r}] is a {type(entries).__name__}; return a "
                           "list of (kind, target) pairs.")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise CheckFailure(f"for {what}, got[{key!r}][{i}] is {entry!r}; each entry is a "
                               "(kind, target) pair.")
        kind, target = entry
        exact(kind, str, f"for {what}, the kind of got[{key!r}][{i}]")
        if kind not in kinds:
            raise CheckFailure(f"for {what}, got[{key!r}][{i}] has kind {kind!r}; the kinds are "
                               f"{', '.join(kinds)} (the enum names, as strings).")
        if target is not None:
            exact(target, str, f"for {what}, the target of got[{key!r}][{i}]")
        out.append((kind, target))
    return out


_BLOCK = {"PARAMETER": 0, "BUFFER": 1, "CONSTANT_TENSOR": 1, "USER_INPUT": 2}


def _canonical(inputs: list[tuple], what: str) -> list[tuple]:
    """``inputs`` with the buffers and constants sorted by name; CheckFailure when the three blocks
    (parameters, buffers and constants, user inputs) are out of order."""
    blocks = [_BLOCK[kind] for kind, _ in inputs]
    for i in range(1, len(blocks)):
        if blocks[i] < blocks[i - 1]:
            raise CheckFailure(
                f"for {what}, inputs[{i}] is {inputs[i]}, after {inputs[i - 1]}: placeholders "
                "come in three blocks, parameters, then buffers and constants, then user inputs.")
    middle = sorted((e for e in inputs if _BLOCK[e[0]] == 1), key=lambda e: e[1])
    return ([e for e in inputs if e[0] == "PARAMETER"] + middle
            + [e for e in inputs if e[0] == "USER_INPUT"])


def compare(predict_signature, cases: list) -> None:
    """Ask the answer, in the kernel, about the case of each ``(spec,
    what)`` of ``cases`` (one probe for all); export each here (the oracle) and raise
    CheckFailure at the first entry that differs."""
    seen = predict_signature.probe(probes.signatures, [spec for spec, _ in cases])
    for (spec, what), run in paired(cases, seen, "models"):
        if "raised" in run:
            raise AnswerRaised(run["raised"])
        _compare(run, real_signature(spec), what)


def _compare(run: dict, real: dict, what: str) -> None:
    if not run["dict"] or run["keys"] != ["inputs", "outputs"]:
        keys = f" with keys {run['keys']}" if run["dict"] else ""
        raise CheckFailure(f"for {what}, predict_signature returned a {run['type']}"
                           f"{keys}; return a dict with the keys 'inputs' and 'outputs'.")
    if run["unplain"]:
        raise CheckFailure(f"for {what}, {run['unplain']}.")
    got = run["value"]
    for key, kinds in (("inputs", INPUT_KINDS), ("outputs", OUTPUT_KINDS)):
        mine, theirs = _entries(got, key, kinds, what), real[key]
        if key == "inputs":
            mine, theirs = _canonical(mine, what), _canonical(theirs, what)
        for i in range(max(len(mine), len(theirs))):
            want = theirs[i] if i < len(theirs) else None
            have = mine[i] if i < len(mine) else None
            if want == have:
                continue
            said = (f"you predicted {have}" if have is not None else
                    f"your list ends there ({len(mine)} {key})")
            there = (f"the exported program has {want}" if want is not None else
                     f"the exported program's {key} end there ({len(theirs)})")
            kind = (want or have)[0]
            raise CheckFailure(f"for {what}, {key}[{i}]: {there}; {said}. {NUDGE[kind]}")


def _seed(g: torch.Generator) -> int:
    return int(torch.randint(0, 2**31, (), generator=g))


@check(EXERCISE)
def counter(predict_signature, ctx):
    """predicts the signature of models.Counter's decomposed program"""
    g = ctx.generator()
    width, batch = (int(v) for v in torch.randint(2, 7, (2,), generator=g))
    compare(predict_signature, [(["counter", width, batch, _seed(g)],
                                 f"models.Counter({width}) on x, y of shape ({batch}, {width})")])


@check(EXERCISE, hidden=True)
def nested_batchnorm_tied(predict_signature, ctx):
    """nested blocks with constants, BatchNorm1d in train mode, a tied weight"""
    g = ctx.generator(1)
    width, batch = (int(v) for v in torch.randint(3, 9, (2,), generator=g))
    counted = [bool(c) for c in torch.rand(int(torch.randint(2, 4, (1,), generator=g)),
                                           generator=g) < 0.5]
    counting = ("; blocks " + ", ".join(str(i) for i, c in enumerate(counted) if c)
                + " also count calls in a buffer seen") if any(counted) else ""
    hidden = int(torch.randint(4, 12, (1,), generator=g))
    seed = _seed(g)
    compare(predict_signature, [
        (["stack", width, counted, batch, seed],
         (f"Stack(width {width}) of {len(counted)} blocks (each: Linear, non-persistent "
          f"buffer gain, constant shift{counting}), a root buffer steps, a root constant "
          "bias and a tensor attribute spare that forward never reads")),
        (["batchnorm", width, hidden, batch, seed],
         (f"Sequential(Linear({width}, {hidden}), BatchNorm1d({hidden}), ReLU, "
          f"Linear({hidden}, 2)) in train mode")),
        (["tied", width, batch, seed], f"Tied({width}): head.weight is embed.weight"),
    ])


@check(EXERCISE, hidden=True)
def mutated_inputs(predict_signature, ctx):
    """user inputs written in place, a buffer written, several outputs"""
    g = ctx.generator(2)
    width, batch = (int(v) for v in torch.randint(3, 9, (2,), generator=g))
    names = ["x", "state", "extra"]
    first, second = sorted(torch.randperm(3, generator=g)[:2].tolist())
    writes = [names[second], names[first]]  # (the later input first)
    n_out = int(torch.randint(2, 4, (1,), generator=g))
    compare(predict_signature, [
        (["writes", width, writes, n_out, batch, _seed(g)],
         (f"Writes({width}): forward(x, state, extra) writes {' then '.join(writes)} in "
          f"place and returns {n_out} tensors"))])
