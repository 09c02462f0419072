"""Checks of ``extensions.boxed-fallback``: ``logging_fallback_source()``, which returns a C++
source with a boxed fallback for the dispatch key ``TESTING_ONLY_GenericMode`` (one no tensor
carries) that records the name of every operator it sees (``aten::add.Tensor``:
``c10::toString(OperatorName)``) and redispatches to the keys below it, plus two operators in
its own namespace: ``start() -> ()`` clears the log, registers the fallback (a
``torch::Library`` held until stop(): a key has one fallback per process) and switches the key
on for this thread, ``stop() -> str[]`` switches it off, drops the registration and returns the
log. Only the calls made from Python are logged, as a ``TorchDispatchMode`` logs them: what the
kernels below call is not (c10/core/impl/LocalDispatchKeySet.h: ExcludeDispatchKeyGuard;
aten/src/ATen/core/dispatch/Dispatcher.h: OperatorHandle::redispatchBoxed; torch/library.h:
Library::fallback, CppFunction:: makeFromBoxedFunction).

Oracle: the same programs (:func:`labs.extensions.probes.run_program`, steps that call ATen
operators with kernels of their own) run here under a Python ``TorchDispatchMode`` that logs
``func._schema.name`` and the overload (torch/utils/_python_dispatch.py). The probe drops the
entries of the source's own operators (its stop()). Public: two fixed programs. Hidden: eight
programs of seeded steps."""
from __future__ import annotations

import random

from grader.checks import CheckFailure, check
from labs.extensions import probes
from labs.extensions.checks._common import built, first_lines, results

EXERCISE = "extensions.boxed-fallback"
PUBLIC = (["mm", "relu", "sum"], ["add", "view", "cat", "exp"])


def python_log(steps: list, seed: int) -> list[str]:
    """The operators a Python TorchDispatchMode sees while the program runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            overload = "" if func._overloadname == "default" else f".{func._overloadname}"
            self.calls.append(func._schema.name + overload)
            return func(*args, **(kwargs or {}))

    with Log() as log:
        probes.run_program(steps, seed)
    return log.calls


def _judge(source, programs) -> None:
    seen = built(source.probe(probes.boxed_fallback, programs), EXERCISE, None)
    if "missing" in seen:
        raise CheckFailure(f"your source registers no {' and no '.join(map(str, seen['missing']))}"
                           " operator: define start() -> () and stop() -> str[] in its "
                           "TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) block.")
    found = results(seen, programs, "programs")
    for (steps, seed), got in zip(programs, found):
        if "error" in got:
            raise CheckFailure(f"running the program {steps} between start() and stop() raised: "
                               f"{first_lines(got['error']['text'])}")
        want, log = python_log(steps, seed), got.get("log")
        if log == want:
            continue
        extra = list(dict.fromkeys(e for e in log if e not in want)) if type(log) is list else []
        why = (f" Your log has {extra[:6]}, which the kernels below ran: exclude the key while "
               "you redispatch (c10::impl::ExcludeDispatchKeyGuard), so that only the calls "
               "made from Python are seen." if extra else "")
        raise CheckFailure(f"for the program {steps} stop() returned {log}; a TorchDispatchMode "
                           f"logs {want}.{why}")


@check(EXERCISE)
def two_programs(logging_fallback_source, ctx):
    """two programs, against a Python TorchDispatchMode's log"""
    _judge(logging_fallback_source, [[list(p), ctx.seed] for p in PUBLIC])


@check(EXERCISE, hidden=True)
def seeded_programs(logging_fallback_source, ctx):
    """eight programs of seeded steps"""
    rng = random.Random(ctx.seed)
    names = sorted(probes.program_steps())
    _judge(logging_fallback_source, [[rng.choices(names, k=rng.randint(2, 6)), ctx.seed + i]
                                     for i in range(8)])
