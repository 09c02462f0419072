"""The compile lab's checks, one module per exercise (each registers with grader.checks.check)."""
from labs.compile.checks import (  # noqa: F401  (imported to register their checks)
    dynamic_shapes,
    fusion,
    fusion_gpu,
    graph_breaks,
    graph_capture,
    guards,
    mini_dynamo,
    partitioner,
    recompiles,
)
