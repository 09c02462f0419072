"""Checks of ``extensions.schema``: ``parse_schema(text)`` must read an operator schema string as
``native_functions.yaml`` writes it (``add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar
alpha=1) -> Tensor(a!)``) and answer what a code generator asks of it::

    {"name": "add_", "overload": "Tensor", "kind": "inplace",
     "positional": ["self", "other"], "kwarg_only": ["alpha"], "defaults": {"alpha": "1"},
     "mutated": ["self"], "returns_alias": ["self"]}

``kind`` is torchgen's ``SchemaKind`` by name (functional, inplace, out, mutable, scratch);
``defaults`` maps each argument with a default to the default as written; ``mutated`` lists
the arguments annotated as written (``(a!)``); ``returns_alias`` gives, per return, the first
argument that shares its alias set, else None.

Oracles: ``torch._C.parse_schema`` (the JIT's schema parser: name, overload, which arguments
are keyword-only) and torchgen's ``FunctionSchema.parse`` (torchgen/model.py: FunctionSchema,
Argument, Annotation, SchemaKind: kinds, defaults as written, alias annotations), run here on
the same strings. The answer runs in the kernel, where calling either (``models`` in the lab
table) fails it. Public: six schemas of the shipped yaml. Hidden: the corner cases (a mutable
``self`` without a trailing underscore, a dunder in-place operator, out= with named returns, a
list of written tensors, positional written arguments) and 40 entries drawn with the run's
seed from the shipped ``torchgen/packaged/ATen/native/native_functions.yaml``."""
from __future__ import annotations

import functools
import os
import random

from grader.checks import CheckFailure, check, exact

EXERCISE = "extensions.schema"
FIELDS = ("name", "overload", "kind", "positional", "kwarg_only", "defaults", "mutated",
          "returns_alias")
PUBLIC = (
    "add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
    "add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
    "view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
    "split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
    "embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool "
    "scale_grad_by_freq=False, bool sparse=False) -> Tensor",
    "_native_batch_norm_legit(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!) "
    "running_mean, Tensor(b!) running_var, bool training, float momentum, float eps) -> "
    "(Tensor, Tensor, Tensor)",
)
CORNERS = (
    "set_data(Tensor(a!) self, Tensor new_data) -> ()",
    "__iadd__.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
    "max.dim_max(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) max, Tensor(b!) "
    "max_values) -> (Tensor(a!) values, Tensor(b!) indices)",
    "_foreach_add_.List(Tensor(a!)[] self, Tensor[] other, *, Scalar alpha=1) -> ()",
    "fbgemm_linear_fp16_weight_fp32_activation.out(Tensor input, Tensor packed_weight, "
    "Tensor? bias, Tensor(a!) output) -> Tensor",
    "upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, "
    "float[]? scale_factors) -> Tensor",
    "scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool "
    "include_self=True) -> Tensor",
)


def yaml_path() -> str:
    """The ``native_functions.yaml`` torchgen ships in the wheel."""
    import torchgen

    return os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native",
                        "native_functions.yaml")


@functools.lru_cache(maxsize=1)
def entries() -> tuple:
    """The entries of the shipped yaml, in order (each a dict with ``func``)."""
    import yaml

    with open(yaml_path(), encoding="utf-8") as f:
        return tuple(yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def real(text: str) -> dict:
    """What the answer must return for ``text``, from torch's and torchgen's parsers."""
    import torch
    from torchgen.model import FunctionSchema

    jit, gen = torch._C.parse_schema(text), FunctionSchema.parse(text)
    args = gen.arguments.flat_all
    first = {}
    for a in args:
        for alias in (a.annotation.alias_set if a.annotation else ()):
            first.setdefault(alias, a.name)
    return {"name": jit.name, "overload": jit.overload_name, "kind": gen.kind().name,
            "positional": [a.name for a in jit.arguments if not a.kwarg_only],
            "kwarg_only": [a.name for a in jit.arguments if a.kwarg_only],
            "defaults": {a.name: a.default for a in args if a.default is not None},
            "mutated": [a.name for a in args if a.annotation and a.annotation.is_write],
            "returns_alias": [first.get(r.annotation.alias_set[0]) if r.annotation else None
                              for r in gen.returns]}


NUDGE = {
    "name": "the name is what comes before the first '.' (or '(').",
    "overload": "the overload name is what follows the first '.' up to '(' ('' when none).",
    "kind": "torchgen's SchemaKind (torchgen/model.py: FunctionSchema.kind): inplace when the "
            "name ends in '_' (or is a dunder __iX__), else scratch/out when a keyword-only "
            "argument is written (_scratch_ names: scratch), else mutable when a positional "
            "argument after self (all positional ones when there is no self) is written, else "
            "functional.",
    "positional": "positional arguments are those before a lone '*'.",
    "kwarg_only": "keyword-only arguments are those after a lone '*'.",
    "defaults": "each default is the text after '=', as written; split the arguments at the "
                "commas outside brackets ('int[2] stride=[1, 1]').",
    "mutated": "an argument is written when its annotation has '!' (Tensor(a!), Tensor(a!)[]).",
    "returns_alias": "a return aliases the first argument in whose annotation its alias set "
                     "appears (Tensor(a) ... -> Tensor(a); 'a -> *' counts as 'a').",
}


def _judge(parse_schema, texts) -> None:
    for text in texts:
        got = exact(parse_schema(text), dict, f"parse_schema({text!r})")
        want = real(text)
        missing = [k for k in FIELDS if k not in got]
        if missing:
            raise CheckFailure(f"parse_schema({text!r}) returned no {', '.join(missing)}: "
                               f"return a dict with the keys {', '.join(FIELDS)}.")
        for field in FIELDS:
            if got[field] != want[field]:
                raise CheckFailure(f"parse_schema({text!r})[{field!r}] is {got[field]!r}; "
                                   f"expected {want[field]!r}: {NUDGE[field]}")


@check(EXERCISE)
def shipped_schemas(parse_schema, ctx):
    """six schemas of native_functions.yaml, against torch's and torchgen's parsers"""
    _judge(parse_schema, PUBLIC)


@check(EXERCISE, hidden=True)
def corner_cases(parse_schema, ctx):
    """the corner cases of kinds, aliases and defaults"""
    _judge(parse_schema, CORNERS)


@check(EXERCISE, hidden=True)
def drawn_from_the_yaml(parse_schema, ctx):
    """40 schemas drawn from the shipped native_functions.yaml with the run's seed"""
    every = entries()
    _judge(parse_schema, [e["func"] for e in random.Random(ctx.seed).sample(every, 40)])
