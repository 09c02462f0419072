"""Checks of ``export.signature``: ``predict_signature(model, args)`` must predict, without
exporting, the graph signature of ``torch.export.export(model, args).run_decompositions()`` (the
functional Core ATen program, where every mutation is an output), as ``{"inputs": [(kind, target),
...], "outputs": [(kind, target), ...]}`` in placeholder and output order. Kinds are the names of
``InputKind`` / ``OutputKind``: inputs ``"PARAMETER"``, ``"BUFFER"`` and ``"CONSTANT_TENSOR"``
(target: the fully qualified name, ``InputSpec.target``) and ``"USER_INPUT"`` (target: the
placeholder's name, ``InputSpec.arg.name``, i.e. forward's argument name); outputs
``"BUFFER_MUTATION"`` (the buffer's name), ``"USER_INPUT_MUTATION"`` (the input's name) and
``"USER_OUTPUT"`` (``None``). Buffers and constants are compared as a set, sorted by name: export
lists them module by module in an order that depends on how ``run_decompositions`` retraces the
program, which is not what this exercise teaches. The oracle is export itself, run by the check on
its own copy of the model; while the answer runs, the export entry points (``torch.export.export``
and ``draft_export`` through ``torch.export._trace._export``, ``torch._dynamo.export``) raise.
Public: ``models.Counter``. Hidden (seeded sizes and choices): nested blocks with non-persistent
buffers and constants, BatchNorm1d in train mode, a tied weight, user inputs mutated in place and
several outputs. (torch/export/graph_signature.py: ExportGraphSignature, InputSpec, OutputSpec;
torch/export/exported_program.py: _decompose_and_get_gm_with_new_signature_constants, which
retraces ``ep.module()`` (torch/export/_unlift.py: _unlift_exported_program_lifted_states).)"""

from __future__ import annotations

import contextlib
import copy
import importlib
import warnings

import torch
from torch import nn

from grader.checks import CheckFailure, check, exact
from labs.export import models

EXERCISE = "export.signature"
INPUT_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR", "USER_INPUT")
OUTPUT_KINDS = ("BUFFER_MUTATION", "USER_INPUT_MUTATION", "USER_OUTPUT")
NO_EXPORT = (
    "predict_signature must not export: {what} is disabled while the check runs your answer. "
    "Predict from the module itself: named_parameters, named_buffers, "
    "_non_persistent_buffers_set, the plain tensor attributes forward reads, forward's "
    "signature, and which buffers and inputs forward writes (run a deepcopy eagerly and look at "
    "each tensor's _version and values).")
#: (module, attribute) of every export entry point; export() and draft_export() both reach
#: torch.export._trace._export, so a name bound before the check (`from torch.export import
#: export`) is refused too
ENTRY_POINTS = (
    ("torch.export._trace", "_export"),
    ("torch.export", "export"),
    ("torch.export", "export_for_training"),
    ("torch.export", "draft_export"),
    ("torch.export._draft_export", "draft_export"),
    ("torch.export._draft_export", "_export"),
    ("torch._dynamo", "export"),
    ("torch._dynamo.eval_frame", "export"),
)
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


@contextlib.contextmanager
def _no_export():
    """Make every export entry point raise CheckFailure; put them back on the way out."""

    def refuse(what):
        def refused(*args, **kwargs):
            raise CheckFailure(NO_EXPORT.format(what=what))
        return refused

    saved = []
    try:
        for module_name, attr in ENTRY_POINTS:
            module = importlib.import_module(module_name)
            if hasattr(module, attr):
                saved.append((module, attr, getattr(module, attr)))
                setattr(module, attr, refuse(f"{module_name}.{attr}".replace("._trace._export",
                                                                             ".export")))
        yield
    finally:
        for module, attr, original in saved:
            setattr(module, attr, original)


def real_signature(model: nn.Module, args: tuple) -> dict:
    """The signature of ``export(model, args).run_decompositions()``, in the answer's format
    (torch's own deprecation warnings while it exports are kept out of the learner's output)."""
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


def compare(predict_signature, model: nn.Module, args: tuple, what: str) -> None:
    """Export a copy of ``model`` (the oracle), then ask the answer, with export disabled, about
    another copy; raise CheckFailure at the first entry that differs."""
    real = real_signature(copy.deepcopy(model), copy.deepcopy(args))
    with _no_export():
        got = predict_signature(copy.deepcopy(model), copy.deepcopy(args))
    if not isinstance(got, dict) or set(got) != {"inputs", "outputs"}:
        keys = f" with keys {sorted(map(str, got))}" if isinstance(got, dict) else ""
        raise CheckFailure(f"for {what}, predict_signature returned a {type(got).__name__}"
                           f"{keys}; return a dict with the keys 'inputs' and 'outputs'.")
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


# ----------------------------------------------------------------------------- the hidden models
class Block(nn.Module):
    """``tanh(lin(x) * gain + shift)``: a Linear, a non-persistent buffer ``gain``, a constant
    ``shift`` and, when ``counted``, a persistent int64 buffer ``seen`` that forward adds 1 to."""

    def __init__(self, width: int, g: torch.Generator, counted: bool):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("gain", torch.rand(width, generator=g) + 0.5, persistent=False)
        self.shift = torch.randn(width, generator=g)
        self.counted = counted
        if counted:
            self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        if self.counted:
            self.seen.add_(1)
        return torch.tanh(self.lin(x) * self.gain + self.shift)


class Stack(nn.Module):
    """A root buffer ``steps`` (forward adds 1), ``blocks`` of :class:`Block`, a root constant
    ``bias`` read after the blocks, and a Linear ``out``."""

    def __init__(self, width: int, counted: list[bool], g: torch.Generator):
        super().__init__()
        self.register_buffer("steps", torch.zeros(1))
        self.blocks = nn.ModuleList(Block(width, g, c) for c in counted)
        self.bias = torch.randn(width, generator=g)
        self.out = nn.Linear(width, 2)

    def forward(self, x):
        self.steps.add_(1)
        for block in self.blocks:
            x = block(x)
        return self.out(x + self.bias)


class Tied(nn.Module):
    """``head(body(embed(x)))`` where ``head.weight`` is ``embed.weight`` (square, no bias)."""

    def __init__(self, width: int):
        super().__init__()
        self.embed = nn.Linear(width, width, bias=False)
        self.body = nn.Linear(width, width)
        self.head = nn.Linear(width, width, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(torch.relu(self.body(self.embed(x))))


class Writes(nn.Module):
    """``forward(x, state, extra)`` writes the inputs named in ``writes`` in place (in that
    order), accumulates a persistent buffer ``total``, and returns ``n_out`` tensors."""

    def __init__(self, width: int, writes: list[str], n_out: int):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("total", torch.zeros(width))
        self.writes, self.n_out = writes, n_out

    def forward(self, x, state, extra):
        for name in self.writes:
            {"x": x, "state": state, "extra": extra}[name].add_(1)
        y = self.lin(x) + state
        self.total.add_(y.sum(0))
        return (y, state.sum(), extra * 2)[: self.n_out]


@check(EXERCISE)
def counter(predict_signature, ctx):
    """predicts the signature of models.Counter's decomposed program"""
    g = ctx.generator()
    width, batch = (int(v) for v in torch.randint(2, 7, (2,), generator=g))
    model = models.Counter(width)
    args = (torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g))
    compare(predict_signature, model, args,
            f"models.Counter({width}) on x, y of shape ({batch}, {width})")


@check(EXERCISE, hidden=True)
def nested_batchnorm_tied(predict_signature, ctx):
    """nested blocks with constants, BatchNorm1d in train mode, a tied weight"""
    g = ctx.generator(1)
    width, batch = (int(v) for v in torch.randint(3, 9, (2,), generator=g))
    counted = [bool(c) for c in torch.rand(int(torch.randint(2, 4, (1,), generator=g)),
                                           generator=g) < 0.5]
    x = torch.randn(batch, width, generator=g)
    counting = ("; blocks " + ", ".join(str(i) for i, c in enumerate(counted) if c)
                + " also count calls in a buffer seen") if any(counted) else ""
    compare(predict_signature, Stack(width, counted, g), (x,),
            f"Stack(width {width}) of {len(counted)} blocks (each: Linear, non-persistent "
            f"buffer gain, constant shift{counting}), a root buffer steps and a root constant "
            "bias")
    hidden = int(torch.randint(4, 12, (1,), generator=g))
    bn = nn.Sequential(nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                       nn.Linear(hidden, 2)).train()
    compare(predict_signature, bn, (x,),
            f"Sequential(Linear({width}, {hidden}), BatchNorm1d({hidden}), ReLU, "
            f"Linear({hidden}, 2)) in train mode")
    compare(predict_signature, Tied(width), (x,),
            f"Tied({width}): head.weight is embed.weight")


@check(EXERCISE, hidden=True)
def mutated_inputs(predict_signature, ctx):
    """user inputs written in place, a buffer written, several outputs"""
    g = ctx.generator(2)
    width, batch = (int(v) for v in torch.randint(3, 9, (2,), generator=g))
    names = ["x", "state", "extra"]
    first, second = sorted(torch.randperm(3, generator=g)[:2].tolist())
    writes = [names[second], names[first]]  # (the later input first)
    n_out = int(torch.randint(2, 4, (1,), generator=g))
    args = tuple(torch.randn(batch, width, generator=g) for _ in names)
    compare(predict_signature, Writes(width, writes, n_out), args,
            f"Writes({width}): forward(x, state, extra) writes {' then '.join(writes)} in place "
            f"and returns {n_out} tensors")
