"""The allocator lab's checks, one module per exercise (each registers with grader.checks.check)."""
from labs.allocator.checks import (  # noqa: F401  (imported to register their checks)
    autocast,
    best_fit_split,
    coalesce,
    graph_pools,
    oom_forensics,
    round_size,
    streams,
    vs_real,
)
