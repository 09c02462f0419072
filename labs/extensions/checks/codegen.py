"""Checks of ``extensions.codegen``: ``kernels_for(entry)`` gets one entry of
``native_functions.yaml`` (the dict the yaml holds: ``func``, and where given ``dispatch``,
``structured``, ``structured_delegate``, ``variants``, ``tags``...) and returns, sorted, which
of :data:`KEYS` torchgen's generated ``Register<Key>.cpp`` files register a kernel for.

Oracle: the dispatcher of the running torch, ``torch._C._dispatch_dump("aten::<op>")``, whose
lines name the file each kernel was registered from: a key counts when its kernel comes from
``build/aten/src/ATen/Register<Key>_N.cpp`` (a Meta kernel that Python's
``torch/_meta_registrations.py`` replaced is listed as "Meta (inactive)", and counts). The rules
are torchgen's (torchgen/gen.py: get_native_function_declarations and the backend indices;
torchgen/dest/register_dispatch_key.py: RegisterDispatchKey.gen_unstructured, its in-place
Meta kernels; torchgen/model.py: NativeFunction.from_yaml, where an entry with no ``dispatch``
is CompositeImplicitAutograd). The answer runs in the kernel, where calling torchgen or the
dispatcher's introspection (``models`` in the lab table) fails it. Public: six entries, one per
rule. Hidden: the corner cases (an empty ``dispatch``, an in-place operator with only a CUDA
kernel, a dunder in-place operator) and 60 entries drawn with the run's seed."""
from __future__ import annotations

import random
import re

from grader.checks import CheckFailure, check, exact
from labs.extensions.checks.schema import entries

EXERCISE = "extensions.codegen"
KEYS = ("CPU", "Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
        "CompositeExplicitAutogradNonFunctional")
PUBLIC = ("matmul", "abs", "relu", "add.out", "add.Tensor", "relu_")
CORNERS = ("_nested_view_from_jagged", "_philox_normal_", "__ilshift__.Scalar", "view",
           "empty_like", "as_strided_")
_LINE = re.compile(r"^(\w+)(?: \(inactive\))?(?:\[alias\])?: registered at \S*/"
                   r"Register(\w+?)(?:_\d+)?\.cpp:")


def name_of(entry: dict) -> str:
    """``add.Tensor`` of ``add.Tensor(Tensor self, ...) -> Tensor``."""
    return entry["func"].split("(", 1)[0]


def real(name: str) -> list[str]:
    """The keys of :data:`KEYS` whose kernel for ``aten::<name>`` comes from torchgen's
    ``Register<Key>.cpp``, sorted."""
    import torch

    found = set()
    for line in torch._C._dispatch_dump(f"aten::{name}").splitlines():
        m = _LINE.match(line)
        if m and m.group(1) in KEYS and m.group(1) == m.group(2):
            found.add(m.group(1))
    return sorted(found)


def _entry(name: str) -> dict:
    for e in entries():
        if name_of(e) == name:
            return e
    raise LookupError(name)


def _judge(kernels_for, chosen) -> None:
    for entry in chosen:
        name = name_of(entry)
        got = exact(kernels_for(entry), list, f"kernels_for(<the entry of {name}>)")
        want = real(name)
        if got != want:
            extra = sorted(set(map(str, got)) - set(want))
            missing = sorted(set(want) - set(map(str, got)))
            shown = {k: v for k, v in entry.items() if k in ("func", "dispatch", "structured",
                                                             "structured_delegate")}
            raise CheckFailure(
                f"for {shown} kernels_for returned {got}; torch's dispatcher has kernels from "
                f"torchgen's Register<Key>.cpp for {want}"
                + (f" (missing: {', '.join(missing)})" if missing else "")
                + (f" (not registered: {', '.join(extra)})" if extra else "")
                + ". Return the sorted keys.")


@check(EXERCISE)
def one_entry_per_rule(kernels_for, ctx):
    """six entries, one per rule, against the dispatcher's own table"""
    _judge(kernels_for, [_entry(n) for n in PUBLIC])


@check(EXERCISE, hidden=True)
def corner_cases(kernels_for, ctx):
    """an empty dispatch, in-place Meta kernels, dunders, views and factories"""
    _judge(kernels_for, [_entry(n) for n in CORNERS])


@check(EXERCISE, hidden=True)
def drawn_from_the_yaml(kernels_for, ctx):
    """60 entries drawn from the shipped native_functions.yaml with the run's seed"""
    _judge(kernels_for, random.Random(ctx.seed + 1).sample(entries(), 60))
