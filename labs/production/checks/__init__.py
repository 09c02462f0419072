"""The production lab's checks, one module per exercise (each registers with
grader.checks.check)."""

from labs.production.checks import (  # noqa: F401  (imported to register their checks)
    checkpoint,
    hang,
    input_bound,
    leak,
    nan,
    recompiles,
)
