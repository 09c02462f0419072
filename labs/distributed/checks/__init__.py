"""The distributed lab's checks, one module per exercise (each registers with grader.checks.check).
They are judges: the answer runs in the learner's kernel, on ranks the probes of
``labs/distributed/probes.py`` start there, and the judges start ranks of their own (with
:func:`labs.distributed.launch.run`) to run torch's collectives, DDP, FSDP2 and DTensor."""
from labs.distributed.checks import (  # noqa: F401  (imported to register their checks)
    collective_cost,
    comm_hook,
    ddp_buckets,
    dtensor_redistribute,
    flight_recorder,
    fsdp_memory,
    mini_ddp,
    mini_fsdp,
    ring_allreduce,
)
