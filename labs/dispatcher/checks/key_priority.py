"""Checks of ``dispatcher.key-priority``: ``dispatch_key(keyset, kernels, fallthroughs, include,
exclude)``, a model of how the dispatcher picks the kernel for one call, against what really runs.

Each scenario defines a fresh operator ``probe(Tensor x) -> ()`` in a unique namespace with
``torch.library.Library``, registers on chosen runtime keys either a Python kernel that records its
key or ``torch.library.fallthrough_kernel``, calls it on a chosen tensor (CPU, meta, conjugate,
negative, zero, inference) under chosen thread-local state (no_grad, inference_mode, autocast,
``_AutoDispatchBelowAutograd``, include / exclude guards), and records which kernel ran (or that the
call raised). The model's inputs are read from torch in the same state: the tensor's keys from
``torch._C._dispatch_keys``, the kernels and fallthroughs from ``torch._C._dispatch_dump_table``,
the TLS include set from ``torch._C._dispatch_tls_local_include_set()``, and the runtime keys the
TLS exclude set removes. Each Library is destroyed after its scenario.
"""
from __future__ import annotations

import contextlib
import itertools
import random
import re
import uuid

from grader.checks import CheckFailure, check, exact

EXERCISE = "dispatcher.key-priority"

# keys whose global fallback is a real kernel: a scenario always registers something on them
_ALWAYS = ("Functionalize", "Python", "PreDispatch", "PythonTLSSnapshot", "Conjugate", "Negative",
           "ZeroTensor")
# keys whose global fallback is a fallthrough: "nothing registered" is a fallthrough too
_DEFAULT_FALLTHROUGH = ("ADInplaceOrView", "BackendSelect", "AutocastCPU")
# keys with no fallback at all: with nothing registered, reaching them raises
_NO_FALLBACK = ("Fake", "DeferredInit")
_INCLUDABLE = _ALWAYS + _NO_FALLBACK + ("AutocastCPU", "BackendSelect", "ADInplaceOrView")
_TENSORS = ("cpu", "cpu, requires_grad", "meta", "conj", "neg", "zero", "inference")
_CONTEXTS = ("none", "no_grad", "enable_grad", "inference_mode", "autocast cpu",
             "_AutoDispatchBelowAutograd", "_AutoDispatchBelowADInplaceOrView")
_counter = itertools.count()


# ------------------------------------------------------------------------ reading torch
def _names(keyset) -> list[str]:
    """The runtime keys a DispatchKeySet prints, lowest priority first."""
    text = repr(keyset)
    inner = text[text.index("(") + 1: text.rindex(")")]
    return [k.strip() for k in inner.split(",") if k.strip()]


def _table(qualname: str) -> tuple[list[str], list[str]]:
    """(keys with a kernel, keys with a fallthrough) in the operator's computed dispatch table."""
    import torch

    kernels, fallthroughs = [], []
    for line in torch._C._dispatch_dump_table(qualname).splitlines():
        match = re.match(r"^(\w+): (fallthrough )?registered at", line)
        if match:
            (fallthroughs if match.group(2) else kernels).append(match.group(1))
    return kernels, fallthroughs


def _effectively_excluded(names) -> list[str]:
    """The runtime keys among ``names`` that the current TLS exclude set removes. Exclusion works on
    functionality bits: excluding AutogradCPU removes every Autograd<backend> key."""
    import torch

    C = torch._C
    excluded = C._dispatch_tls_local_exclude_set()
    out = []
    for name in names:
        key = C._parse_dispatch_key(name)
        if key is None:
            continue
        alone = C.DispatchKeySet(key)
        if not (alone - excluded).has(key):
            out.append(name)
    return out


# ------------------------------------------------------------------------ scenarios
def _tensor(kind: str):
    import torch

    if kind == "cpu":
        return torch.zeros(2)
    if kind == "cpu, requires_grad":
        return torch.zeros(2, requires_grad=True)
    if kind == "meta":
        return torch.empty(2, device="meta")
    if kind == "conj":
        return torch.zeros(2, dtype=torch.complex64).conj()
    if kind == "neg":
        return torch.zeros(2, dtype=torch.complex64).conj().imag
    if kind == "zero":
        return torch._efficientzerotensor(2)
    with torch.inference_mode():
        return torch.zeros(2)


def _context(kind: str):
    import torch

    return {
        "none": contextlib.nullcontext,
        "no_grad": torch.no_grad,
        "enable_grad": torch.enable_grad,
        "inference_mode": torch.inference_mode,
        "autocast cpu": lambda: torch.autocast("cpu"),
        "_AutoDispatchBelowAutograd": torch._C._AutoDispatchBelowAutograd,
        "_AutoDispatchBelowADInplaceOrView": torch._C._AutoDispatchBelowADInplaceOrView,
    }[kind]()


class Scenario:
    """One call of a fresh operator: which keys get a recording kernel or a fallthrough, the
    tensor, the context and the TLS guards."""

    def __init__(self, tensor: str, registered: dict, context: str = "none",
                 include=(), exclude=()):
        self.tensor, self.registered, self.context = tensor, dict(registered), context
        self.include, self.exclude = tuple(include), tuple(exclude)

    def describe(self) -> str:
        regs = ", ".join(f"{k}={'kernel' if v == 'kernel' else 'fallthrough'}"
                         for k, v in self.registered.items())
        parts = [f"a {self.tensor} tensor", f"registered: {regs or 'nothing'}"]
        if self.context != "none":
            parts.append(f"under {self.context}")
        if self.include:
            parts.append(f"_IncludeDispatchKeyGuard({', '.join(self.include)})")
        if self.exclude:
            parts.append(f"_ExcludeDispatchKeyGuard({', '.join(self.exclude)})")
        return "; ".join(parts)

    def run(self):
        """Run the call. Returns (model inputs as a dict, the key whose kernel ran or None, error)."""
        import torch

        C = torch._C
        ns = f"_kp_{next(_counter)}_{uuid.uuid4().hex[:8]}"      # never a namespace seen before
        lib = torch.library.Library(ns, "DEF")
        ran: list[str] = []
        try:
            lib.define("probe(Tensor x) -> ()")
            for key, how in self.registered.items():
                if how == "kernel":
                    lib.impl("probe", (lambda k: lambda x: ran.append(k))(key), key)
                else:
                    lib.impl("probe", torch.library.fallthrough_kernel, key)
            op = getattr(torch.ops, ns).probe.default
            qualname = f"{ns}::probe"
            x = _tensor(self.tensor)
            with contextlib.ExitStack() as stack:
                stack.enter_context(_context(self.context))
                for key in self.include:
                    stack.enter_context(C._IncludeDispatchKeyGuard(C._parse_dispatch_key(key)))
                for key in self.exclude:
                    stack.enter_context(C._ExcludeDispatchKeyGuard(C.DispatchKeySet(C._parse_dispatch_key(key))))
                keyset = _names(C._dispatch_keys(x))
                include = _names(C._dispatch_tls_local_include_set())
                kernels, fallthroughs = _table(qualname)
                exclude = _effectively_excluded(sorted(set(keyset + include + kernels + fallthroughs)))
                error = None
                try:
                    op(x)
                except (NotImplementedError, RuntimeError) as exc:
                    error = str(exc).strip().splitlines()[0][:160]
        finally:
            lib._destroy()
        inputs = {"keyset": keyset, "kernels": kernels, "fallthroughs": fallthroughs,
                  "include": include, "exclude": exclude}
        return inputs, (ran[0] if ran else None), error


def _registrations(rng, backend: str, *, sparse: bool = False) -> dict:
    """A random registration for every key that matters (see _ALWAYS / _DEFAULT_FALLTHROUGH)."""
    def pick(options):
        return rng.choice(options)

    regs = {}
    regs[backend] = pick(("kernel", "kernel", "kernel", "fallthrough") if backend == "Meta"
                         else ("kernel", "kernel", "kernel", "fallthrough", None))
    regs[f"Autograd{backend}"] = pick(("kernel", "fallthrough"))
    for key in _DEFAULT_FALLTHROUGH:
        if backend == "Meta" and key == "AutocastCPU":
            continue
        regs[key] = pick(("kernel", "fallthrough", None, None) if sparse else ("kernel", "fallthrough", None))
    for key in _ALWAYS:
        regs[key] = pick(("kernel", "fallthrough", "fallthrough") if sparse else ("kernel", "fallthrough"))
    for key in _NO_FALLBACK:
        regs[key] = pick(("kernel", "fallthrough", None))
    return {k: v for k, v in regs.items() if v is not None}


def random_scenario(rng) -> Scenario:
    tensor = rng.choice(_TENSORS)
    backend = "Meta" if tensor == "meta" else "CPU"
    regs = _registrations(rng, backend, sparse=rng.random() < 0.5)
    context = rng.choice(_CONTEXTS)
    include = rng.sample(_INCLUDABLE, rng.choice((0, 1, 1, 2, 3)))
    universe = [backend, f"Autograd{backend}", *(_DEFAULT_FALLTHROUGH if backend == "CPU"
                                                  else _DEFAULT_FALLTHROUGH[:2]), *_ALWAYS, *_NO_FALLBACK]
    exclude = rng.sample([k for k in universe if k != backend] if rng.random() < 0.9 else universe,
                         rng.choice((0, 0, 1, 1, 2)))
    return Scenario(tensor, regs, context, include, exclude)


# ------------------------------------------------------------------------ comparing
def _call(dispatch_key, inputs):
    """Call the answer on fresh copies of the inputs."""
    return dispatch_key(list(inputs["keyset"]), list(inputs["kernels"]),
                        fallthroughs=list(inputs["fallthroughs"]), include=list(inputs["include"]),
                        exclude=list(inputs["exclude"]))


def verify(dispatch_key, scenario: Scenario, where: str) -> None:
    inputs, ran, error = scenario.run()
    got = _call(dispatch_key, inputs)
    if got is not None and not isinstance(got, str):
        raise CheckFailure(f"dispatch_key returned a {type(got).__name__}; return a key name "
                           "such as 'AutogradCPU' (a str), or None when the call would raise.")
    # exactly a str: a subclass could claim to equal whatever it is compared with
    exact(got, (str, type(None)), "the value dispatch_key returned")
    if got == ran:
        return
    relevant = _relevant(inputs)
    shown = (f"keyset={inputs['keyset']}, include={inputs['include']}, "
             f"exclude (of these) = {[k for k in inputs['exclude'] if k in relevant]}, "
             f"kernels (of these) = {[k for k in inputs['kernels'] if k in relevant]}, "
             f"fallthroughs (of these) = {[k for k in inputs['fallthroughs'] if k in relevant]}")
    truth = (f"the kernel registered on {ran} ran" if ran is not None
             else f"the call raised ({error})")
    hint = _hint(got, ran, error, inputs)
    raise CheckFailure(f"on {where} ({scenario.describe()}): you returned {got!r}, but {truth}. "
                       f"Your inputs were {shown}. {hint}")


def _relevant(inputs) -> set[str]:
    return set(inputs["keyset"]) | set(inputs["include"])


def _selected(ran, error):
    """The key the dispatcher selected: the one that ran, or the one named by the error."""
    if ran is not None:
        return ran
    match = re.search(r"from the '(\w+)' backend", error or "")
    return match.group(1) if match else None


def _hint(got, ran, error, inputs) -> str:
    import torch

    full = repr(torch._C._dispatch_keyset_full())
    rank = {k: i for i, k in enumerate(full[full.index("(") + 1: full.rindex(")")].split(", "))}
    live = _relevant(inputs) - set(inputs["exclude"])
    selected = _selected(ran, error)
    if got in inputs["exclude"]:
        return "That key is in the TLS exclude set: exclusion wins over the tensor's keys and over include."
    if got is not None and got in inputs["fallthroughs"]:
        return ("A fallthrough kernel is not run: the dispatcher masks fallthrough keys out "
                "(DispatchKeyExtractor's nonFallthroughKeys_) and looks at the next key down.")
    if got is not None and got not in _relevant(inputs):
        return "Only keys in (tensor keys | TLS include) - TLS exclude take part."
    if ran is None and got is not None:
        if selected is None:
            return ("No key was left once exclusions and fallthroughs were removed, so the call "
                    "raised.")
        origin = " (from the TLS include set)" if selected not in inputs["keyset"] else ""
        return (f"Here the highest-priority remaining key was {selected}{origin}; it has no kernel "
                "and no fallthrough, so the call raised: the dispatcher does not go on looking for "
                "a lower key that has one.")
    if selected in inputs["include"] and selected not in inputs["keyset"]:
        return f"{selected} came from the TLS include set: (tensor keys | include) - exclude."
    if got is None and ran is not None:
        above = [k for k in live if rank.get(k, -1) > rank.get(ran, -1)]
        if above and all(k in inputs["fallthroughs"] for k in above):
            return (f"The keys above {ran} ({', '.join(sorted(above, key=rank.get))}) hold "
                    "fallthroughs: the dispatcher skips them, it does not fail on them.")
    return ("Check your priority order: read it from torch (e.g. the order "
            "torch._C._dispatch_keyset_full() prints its keys in, lowest first).")


def _rng(ctx, offset: int) -> random.Random:
    return random.Random(f"{EXERCISE}:{ctx.seed}:{offset}")


# ------------------------------------------------------------------------ checks
@check(EXERCISE)
def backend_autograd_fallthrough(dispatch_key, ctx):
    """Autograd before the backend, fallthroughs skipped, a missing kernel raises"""
    rng = _rng(ctx, 0)
    cases = [
        Scenario("cpu", {"CPU": "kernel", "AutogradCPU": "kernel"}),
        Scenario("cpu, requires_grad", {"CPU": "kernel", "AutogradCPU": "fallthrough"}),
        Scenario("cpu", {"CPU": "kernel", "AutogradCPU": "fallthrough", "ADInplaceOrView": "kernel"}),
        Scenario("cpu", {"AutogradCPU": "fallthrough"}),
        Scenario("cpu", {"CPU": "kernel", "AutogradCPU": "fallthrough"}, include=("Fake",)),
        Scenario("meta", {"Meta": "kernel", "AutogradMeta": rng.choice(("kernel", "fallthrough"))}),
        Scenario("cpu", {"CPU": "kernel", "AutogradCPU": rng.choice(("kernel", "fallthrough")),
                         "BackendSelect": "kernel", "AutocastCPU": "kernel"}),
    ]
    for i, scenario in enumerate(cases):
        verify(dispatch_key, scenario, f"scenario #{i}")


@check(EXERCISE)
def tls_include_exclude(dispatch_key, ctx):
    """the thread-local include and exclude sets: guards, no_grad, inference_mode, autocast"""
    rng = _rng(ctx, 1)
    both = {"CPU": "kernel", "AutogradCPU": "kernel", "AutocastCPU": "kernel",
            "Functionalize": "kernel", "ADInplaceOrView": rng.choice(("kernel", None))}
    both = {k: v for k, v in both.items() if v}
    cases = [
        Scenario("cpu", both, exclude=("AutogradCPU",)),
        Scenario("cpu", both, include=("Functionalize",)),
        Scenario("cpu", both, include=("Functionalize",), exclude=("Functionalize",)),
        Scenario("cpu, requires_grad", both, context="no_grad"),
        Scenario("cpu", both, context="inference_mode"),
        Scenario("cpu", both, context="autocast cpu"),
        Scenario("cpu", both, context="_AutoDispatchBelowAutograd"),
    ]
    for i, scenario in enumerate(cases):
        verify(dispatch_key, scenario, f"scenario #{i}")


@check(EXERCISE, hidden=True)
def random_scenarios(dispatch_key, ctx):
    """seeded random registrations, tensors, contexts and guards"""
    rng = _rng(ctx, 2)
    for i in range(40):
        verify(dispatch_key, random_scenario(rng), f"random scenario #{i} (seed {ctx.seed})")


@check(EXERCISE, hidden=True)
def tensor_keys_and_defaults(dispatch_key, ctx):
    """conjugate, negative, zero and inference tensors; the default TLS include set"""
    rng = _rng(ctx, 3)
    for i, tensor in enumerate(("conj", "neg", "zero", "inference", "meta")):
        backend = "Meta" if tensor == "meta" else "CPU"
        regs = _registrations(rng, backend)
        verify(dispatch_key, Scenario(tensor, regs), f"scenario #{i}")
        regs[f"Autograd{backend}"] = "fallthrough"
        verify(dispatch_key, Scenario(tensor, regs, context=rng.choice(_CONTEXTS)), f"scenario #{i}b")
    only_view = {"CPU": "kernel", "AutogradCPU": "kernel", "ADInplaceOrView": "kernel"}
    verify(dispatch_key, Scenario("inference", only_view), "an inference tensor outside inference_mode")
    verify(dispatch_key, Scenario("cpu", {"CPU": "kernel", "AutogradCPU": "kernel"},
                                  exclude=("AutogradMeta",)),
           "a CPU tensor with AutogradMeta excluded")
    verify(dispatch_key, Scenario("cpu", {"CPU": "fallthrough", "AutogradCPU": "fallthrough"}),
           "a call where every key falls through")
    verify(dispatch_key, Scenario("cpu", {"CPU": "kernel", "AutogradCPU": "fallthrough",
                                          "Python": "kernel", "Functionalize": "fallthrough"},
                                  include=("DeferredInit", "Python", "Functionalize")),
           "DeferredInit (no kernel, no fallback) included above kernels on Python and CPU")
