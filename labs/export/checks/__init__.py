"""The export lab's checks, one module per exercise (each registers with grader.checks.check)."""
from labs.export.checks import (  # noqa: F401  (imported to register their checks)
    aoti,
    cond,
    dynamic_shapes,
    graph_pass,
    mini_interpreter,
    onnx_parity,
    signature,
    unflatten,
)
