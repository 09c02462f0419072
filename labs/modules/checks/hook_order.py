"""Checks of ``modules.hook-order``: ``hook_order(model, hooks)`` must predict, as data, every
hook call and every ``forward`` of a run: the model (a tree spec of
:mod:`labs.modules.probes`, each module's forward calling its children in order) called on an
input that requires grad, then ``backward`` of the output's sum. ``hooks`` lists hook
registrations in order: ``{"label", "kind" (forward_pre, forward, backward_pre, backward),
"on" (a module's path, "" for the root, None for a global hook on every module), "prepend"}``.
The answer returns ``[[label, path], ...]``, with ``["forward", path]`` for each forward.

Oracle: the same run, made here with ``nn.Module`` (torch/nn/modules/module.py:
Module._call_impl; torch/utils/hooks.py: BackwardHook), recording each hook as it is called
(:func:`labs.modules.probes.traced_run`). Public: one model with hooks of every kind. Hidden: a
module called twice with global backward hooks, and three models and hook sets drawn with the
run's seed."""

from __future__ import annotations

import random

from grader.checks import CheckFailure, check, exact
from labs.modules import probes, viz
from labs.modules.checks.mini_module import random_tree

EXERCISE = "modules.hook-order"
#: the explorer's model (labs/modules/viz.py), its root calling the encoder once, not twice
PUBLIC_MODEL = {**viz.EXPLORER_MODEL, "calls": ["encoder", "decoder"]}
PUBLIC_HOOKS = [
    {"label": "log_inputs", "kind": "forward_pre", "on": None, "prepend": False},
    {"label": "check_shape", "kind": "forward_pre", "on": "encoder", "prepend": False},
    {"label": "first_please", "kind": "forward_pre", "on": "encoder", "prepend": True},
    {"label": "record_output", "kind": "forward", "on": "decoder", "prepend": False},
    {"label": "clip_grad_out", "kind": "backward_pre", "on": "", "prepend": False},
    {"label": "grad_in_norm", "kind": "backward", "on": "decoder.head", "prepend": False},
    {"label": "grad_in_seen", "kind": "backward", "on": "encoder", "prepend": False},
]
TWICE_MODEL = {
    "children": [
        ["block", {"params": [["w", [3]]], "calls": []}],
        ["mixer", {"params": [["w", [3]]], "calls": []}],
    ],
    "calls": ["block", "mixer", "block"],
}
TWICE_HOOKS = [
    {"label": "every_grad_out", "kind": "backward_pre", "on": None, "prepend": False},
    {"label": "mixer_grad_in", "kind": "backward", "on": "mixer", "prepend": False},
    {"label": "every_grad_in", "kind": "backward", "on": None, "prepend": False},
    {"label": "block_after", "kind": "forward", "on": "block", "prepend": False},
    {"label": "block_after_first", "kind": "forward", "on": "block", "prepend": True},
]


def paths(spec: dict, prefix: str = "") -> list[str]:
    """The paths of the modules ``spec`` builds (each module once, under its first path)."""
    out = [prefix]
    for name, child in spec.get("children", []):
        if "same_as" not in child:
            out += paths(child, f"{prefix}.{name}" if prefix else name)
    return out


def random_hooks(rng: random.Random, spec: dict) -> list[dict]:
    """Four to eight hook registrations on ``spec``'s modules (a quarter of them global)."""
    where = paths(spec)
    hooks = []
    for i in range(rng.randint(4, 8)):
        on = None if rng.random() < 0.25 else rng.choice(where)
        hooks.append(
            {
                "label": f"h{i}",
                "kind": rng.choice(probes.HOOK_KINDS),
                "on": on,
                "prepend": on is not None and rng.random() < 0.3,
            }
        )
    return hooks


def _event(e) -> str:
    return f"{e[0]} on {e[1]!r}" if type(e) in (list, tuple) and len(e) == 2 else repr(e)


def judge(hook_order, model: dict, hooks: list, seed: int, what: str) -> None:
    """Compare ``hook_order``'s prediction with a real run's events, event by event."""
    want = probes.traced_run(model, hooks, seed)
    got = exact(hook_order(model, hooks), list, f"hook_order(...) for {what}")
    got = [list(e) if type(e) in (list, tuple) else e for e in got]
    kinds = {h["label"]: h["kind"] for h in hooks}
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            raise CheckFailure(
                f"{what}: event {i + 1} of {len(want)} is {_event(w)} in a real run; you "
                f"predicted {_event(g)} (the events before it agree; the hooks: "
                f"{[(h['label'], h['kind'], h['on']) for h in hooks]}). "
                f"{NUDGE[kinds.get(w[0], 'forward').startswith('backward')]}"
            )
    if len(got) != len(want):
        more = "fewer" if len(got) < len(want) else "more"
        raise CheckFailure(
            f"{what}: you predicted {len(got)} events, {more} than the "
            f"{len(want)} of a real run (its last: {_event(want[-1])})."
        )


#: what to look at, for an event of the forward pass (False) or of backward (True)
NUDGE = {
    False: "Module._call_impl runs the global forward pre-hooks, then the module's own, then "
    "forward (which calls the children), then the global forward hooks, then the "
    "module's own; prepend=True puts a hook before those already registered.",
    True: "A module gets a BackwardHook when it has backward or backward pre-hooks (its own or "
    "global, global first): its pre-hooks run when the gradient of its output arrives, "
    "its backward hooks when the gradients of its inputs are done, so a module called "
    "later finishes its backward earlier (torch/utils/hooks.py: BackwardHook).",
}


@check(EXERCISE)
def hooks_of_every_kind(hook_order, ctx):
    """a model with forward, pre, backward and global hooks, against a real run"""
    judge(hook_order, PUBLIC_MODEL, PUBLIC_HOOKS, ctx.seed, "the public model")


@check(EXERCISE, hidden=True)
def a_module_called_twice(hook_order, ctx):
    """a module called twice, with global backward hooks"""
    judge(hook_order, TWICE_MODEL, TWICE_HOOKS, ctx.seed, "a model calling one module twice")


@check(EXERCISE, hidden=True)
def drawn_models_and_hooks(hook_order, ctx):
    """three models and hook sets drawn with the run's seed"""
    rng = random.Random(ctx.seed)
    for i in range(3):
        model = random_tree(rng)
        judge(hook_order, model, random_hooks(rng, model), ctx.seed + i, f"hidden model {i + 1}")
