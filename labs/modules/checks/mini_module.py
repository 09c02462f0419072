"""Checks of ``modules.mini-module``: ``Module`` must be a base class with ``nn.Module``'s
attribute routing (``__setattr__`` into ``_parameters`` / ``_buffers`` / ``_modules``,
``__getattr__``'s fallback, ``__delattr__``), ``register_buffer`` (``persistent``) and
``register_parameter``, the ``named_*`` traversals (prefixes, ``recurse``, duplicates removed),
``state_dict`` and ``load_state_dict`` (strict or not, missing and unexpected keys, shapes),
forward pre-hooks and hooks with removable handles (torch/nn/modules/module.py: Module).

Oracle: the same model tree built on ``torch.nn.Module`` by the same builder
(:func:`labs.modules.probes.build_tree`) and observed the same way
(:func:`labs.modules.probes.observe_tree`), here. Public: one tree with a shared child, a tied
parameter, a ``None`` parameter and a non-persistent buffer. Hidden: three trees drawn with the
run's seed."""

from __future__ import annotations

import random

from grader.checks import CheckFailure, check
from labs.modules import probes

EXERCISE = "modules.mini-module"
PUBLIC = {
    "params": [["weight", [3]], ["bias", None]],
    "buffers": [["running_mean", [3], True], ["scratch", [2], False]],
    "children": [
        ["encoder", {"params": [["weight", [2, 3]]], "calls": []}],
        [
            "decoder",
            {
                "params": [["weight", [3]]],
                "buffers": [["steps", [1], True]],
                "children": [["inner", {"same_as": "encoder"}]],
                "calls": ["inner"],
            },
        ],
    ],
    "calls": ["encoder", "decoder"],
    "ties": [["encoder.weight", "decoder.tied"]],
}

#: what each observation tests, for the message (the key is the observation's name)
NUDGE = {
    "routing": "__setattr__ puts a Parameter in _parameters, a Module in _modules, and "
    "register_buffer a tensor in _buffers; none of them in the instance's __dict__.",
    "named_parameters": "walk named_modules() (each module once), then each module's "
    "_parameters, skipping None and any parameter already yielded.",
    "named_parameters(prefix='model', recurse=False)": "prefix goes before every name "
    "('model.weight'); recurse=False "
    "yields this module's own only.",
    "named_parameters(remove_duplicate=False)": "with remove_duplicate=False neither a shared "
    "module nor a tied parameter is skipped.",
    "named_buffers": "the same walk over _buffers (non-persistent buffers included).",
    "named_modules": "the module itself first (name ''), then each child's subtree, "
    "'parent.child' names, each module once.",
    "parameters": "parameters() yields the tensors of named_parameters(), in its order.",
    "state_dict": "each module's parameters, then its persistent buffers (skipping None), "
    "then each child's entries under 'child.'; a shared module is saved under "
    "every path it has.",
    "load_state_dict(strict=True)": "load_state_dict returns (missing_keys, unexpected_keys) "
    "and copies each tensor into the module's own, in place.",
    "state_dict after loading": "load_state_dict copies every value into the parameter or "
    "buffer already there (under torch.no_grad(), with copy_).",
    "load_state_dict(strict=False) missing one key, one unexpected": "a key of the model that "
    "the dict lacks is missing; a key of the dict that names nothing in the model is "
    "unexpected; with strict=False both are returned, nothing raises.",
    "load_state_dict(strict=True) missing one key, one unexpected": "with strict=True, "
    "missing or unexpected keys raise RuntimeError naming them.",
    "load_state_dict(strict=True) a tensor of another shape": "a tensor whose shape differs "
    "from the module's raises RuntimeError naming its key, strict or not.",
    "call with hooks": "__call__ runs each forward pre-hook (a result that is not None "
    "replaces the arguments; wrap a single value in a tuple), then forward, "
    "then each forward hook (a result that is not None replaces the output), "
    "in the order registered; a removed handle's hook no longer runs.",
    "assignments": "a plain tensor assigned to a parameter's name raises TypeError; None "
    "keeps the name a parameter (set to None); an unknown name raises "
    "AttributeError from __getattr__.",
    "reassignment and deletion": "del removes a child from _modules; a name re-bound to a "
    "Module moves from __dict__ to _modules; a Parameter bound "
    "to a buffer's name replaces the buffer.",
}


def _same(got, want) -> bool:
    import torch

    if isinstance(want, torch.Tensor):
        return (
            type(got) in (torch.Tensor, torch.nn.Parameter)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and torch.equal(got, want)
        )
    if type(want) in (list, tuple):
        return (
            type(got) in (list, tuple)
            and len(got) == len(want)
            and all(_same(g, w) for g, w in zip(got, want))
        )
    if type(want) is dict:
        if set(want) == {"raised", "text"}:  # torch raised: the same type must be raised
            return type(got) is dict and got.get("raised") == want["raised"]
        return (
            type(got) is dict
            and set(got) == set(want)
            and all(_same(got[k], want[k]) for k in want)
        )
    return type(got) is type(want) and got == want


def _shown(value) -> str:
    """A value as a learner reads it in a message (tensors by shape)."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)}"
    if type(value) in (list, tuple):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if type(value) is dict and "raised" in value:
        return f"{value['raised']}: {str(value.get('text', ''))[:200]}"
    if type(value) is dict:
        return "{" + ", ".join(f"{k!r}: {_shown(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _names_keys(want, key: str) -> list[str]:
    """The state-dict keys a strict loading error must name."""
    if type(want) is dict and key.endswith("missing one key, one unexpected"):
        return ["extra.weight", *[k for k in want.get("text", "").split('"')[1::2]]]
    return []


def judge(Module, spec: dict, seed: int, what: str) -> None:
    """Build ``spec`` on the learner's ``Module`` and on ``nn.Module`` and compare every
    observation (:func:`labs.modules.probes.observe_tree`)."""
    import torch

    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed + 1))
    loaded = dict(probes.build_tree(torch.nn.Module, spec, seed + 2)[0].state_dict())
    want = probes.observe_tree(torch.nn.Module, spec, seed, loaded, x)
    got = Module.probe(probes.module_tree, spec, seed, loaded, x)
    if type(got) is not dict:
        raise CheckFailure(f"{what}: the probe returned {type(got).__name__}, not a dict.")
    for key, expected in want.items():
        if key not in got:
            raise CheckFailure(f"{what}: nothing came back for {key}.")
        if not _same(got[key], expected):
            if (
                type(got[key]) is dict
                and "raised" in got[key]
                and not (type(expected) is dict and "raised" in expected)
            ):
                raise CheckFailure(
                    f"{what}: {key} raised {_shown(got[key])}; nn.Module gives "
                    f"{_shown(expected)}. {NUDGE[key]}"
                )
            raise CheckFailure(
                f"{what}: {key} gave {_shown(got[key])}; nn.Module gives "
                f"{_shown(expected)}. {NUDGE[key]}"
            )
        for name in _names_keys(expected, key):
            if name not in str(got[key].get("text", "")):
                raise CheckFailure(
                    f"{what}: {key} raised, but its message does not name "
                    f"{name!r}: say which keys are missing and unexpected."
                )


def random_tree(rng: random.Random) -> dict:
    """A model tree (see :mod:`labs.modules.probes`) of depth 2 drawn from ``rng``: parameters
    (some None), buffers (some non-persistent), a shared child and a tied parameter."""
    names = iter(f"m{i}" for i in range(100))

    def node(depth: int) -> dict:
        params = [
            [f"p{i}", rng.choice([None, [rng.randint(1, 3)], [2, rng.randint(1, 3)]])]
            for i in range(rng.randint(0, 2))
        ]
        buffers = [
            [f"b{i}", [rng.randint(1, 3)], rng.random() < 0.6] for i in range(rng.randint(0, 2))
        ]
        children = [
            [next(names), node(depth + 1)] for _ in range(rng.randint(1, 2) if depth < 2 else 0)
        ]
        calls = [c for c, _ in children] * rng.randint(1, 2)
        return {"params": params, "buffers": buffers, "children": children, "calls": calls}

    tree = node(0)
    tree["params"].append(["w", [3]])  # one parameter every tree has, to tie and to load
    first = tree["children"][0][0]
    tree["children"].append(["again", {"same_as": first}])
    tree["ties"] = [["w", f"{first}.tied"]]
    return tree


@check(EXERCISE)
def one_tree(Module, ctx):
    """a model with shared, tied and None entries and a non-persistent buffer, vs nn.Module"""
    judge(Module, PUBLIC, ctx.seed, "the public model")


@check(EXERCISE, hidden=True)
def drawn_trees(Module, ctx):
    """three model trees drawn with the run's seed, against nn.Module"""
    rng = random.Random(ctx.seed)
    for i in range(3):
        judge(Module, random_tree(rng), ctx.seed + 10 * i, f"hidden model {i + 1}")
