"""The distributed lab's checks, one module per exercise (each registers with grader.checks.check).
Every check starts its own ranks with :func:`labs.distributed.launch.run`."""
from labs.distributed.checks import (  # noqa: F401  (imported to register their checks)
    collective_cost,
    ddp_buckets,
    dtensor_redistribute,
    fsdp_memory,
    mini_ddp,
    ring_allreduce,
)
