"""The extensions lab's checks, one module per exercise (each registers with
grader.checks.check)."""
from labs.extensions.checks import (  # noqa: F401  (imported to register their checks)
    boxed_fallback,
    codegen,
    compile_ready,
    cpp_autograd,
    cpp_op,
    cuda_op,
    schema,
)
