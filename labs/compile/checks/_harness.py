"""What the compile lab's checks share: a clean compiler state for each check, and compile
counting.

A notebook can leave the compiler in any state: functions compiled (Dynamo's caches hold their
code), ``torch._dynamo.config`` or ``torch._inductor.config`` changed (``capture_scalar_outputs
= True`` turns the ``.item()`` graph break off). Checks judge an answer under torch's defaults:
:func:`fresh_compiler` empties Dynamo's caches (``torch._dynamo.reset``) and sets every config
entry the notebook changed back to its default for the check's duration
(``torch/utils/_config_module.py``: ``ConfigModule.patch``). What Dynamo says about the breaks it
meets in the checks' own programs (log records and warnings) is kept out of the verdict's output.
"""

from __future__ import annotations

import contextlib

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._dynamo.testing import CompileCounter
from torch.utils._config_module import _UNSET_SENTINEL

from grader.checks import CheckFailure
from labs.compile import viz


def _defaults(module) -> dict:
    """``module``'s config entries (a torch config module) and their default values: a value
    forced or defaulted by an environment variable counts as the default."""
    found = {}
    for name, entry in module._config.items():
        if entry.alias is not None:
            continue
        if entry.env_value_force is not _UNSET_SENTINEL:
            found[name] = entry.env_value_force
        elif entry.env_value_default is not _UNSET_SENTINEL:
            found[name] = entry.env_value_default
        else:
            found[name] = entry.default
    return found


def changed_config() -> dict[str, dict]:
    """The config entries the notebook changed: ``{"torch._dynamo.config": {name: default}, ...}``
    (only modules with changes)."""
    out = {}
    for label, module in (("torch._dynamo.config", torch._dynamo.config),
                          ("torch._inductor.config", inductor_config)):
        now, default = module.get_config_copy(), _defaults(module)
        diff = {k: default[k] for k in now if k in default and now[k] != default[k]}
        if diff:
            out[label] = diff
    return out


@contextlib.contextmanager
def fresh_compiler():
    """Run the body with Dynamo's caches empty and both config modules at their defaults, and
    without warnings or log records below ERROR; the caches are emptied again on the way out
    (what the body compiled is not left to the notebook), and the notebook's config is given
    back."""
    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        stack.enter_context(viz.dynamo_quiet())
        changes = changed_config()
        for module, diff in ((torch._dynamo.config, changes.get("torch._dynamo.config")),
                             (inductor_config, changes.get("torch._inductor.config"))):
            if diff:
                stack.enter_context(module.patch(diff))
        try:
            yield
        finally:
            torch._dynamo.reset()


def count_compiles(compile_fn, fn, calls: list[tuple]) -> tuple[int, list]:
    """Compile ``fn`` with ``compile_fn(fn, backend)`` (``backend`` a CompileCounter), call the
    result with each argument tuple of ``calls`` in order; return (frames compiled, outputs).
    Raises CheckFailure when ``compile_fn`` does not return a callable."""
    counter = CompileCounter()
    compiled = compile_fn(fn, counter)
    if not callable(compiled):
        raise CheckFailure(f"it returned {type(compiled).__name__}, not a callable (the compiled "
                           "function).")
    outs = [compiled(*args) for args in calls]
    return counter.frame_count, outs
