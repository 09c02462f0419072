"""The modules lab's checks, one module per exercise (each registers with
grader.checks.check)."""

from labs.modules.checks import (  # noqa: F401  (imported to register their checks)
    foreach_adamw,
    fx_pass,
    hook_order,
    loader,
    mini_module,
    mini_tracer,
    profile,
)
