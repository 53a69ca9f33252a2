"""Joining the processes of a multi-host run to JAX's distributed runtime.

Every process runs the same `train.py`; `jax.distributed.initialize` connects them, after which
`jax.devices()` lists every device of every host and one mesh spans them all. Call it before
anything touches a device.
"""

from __future__ import annotations

import os

import jax

# Environments where jax.distributed.initialize() finds the coordinator by itself.
_CLUSTER_SIZE_VARIABLES = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def initialize(
    coordinator_address: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> None:
    """Join the run's other processes, if there are any.

    With a coordinator address (host:port of process 0), the process count and this process's
    id are explicit — the way to run several processes on one machine or on GPU hosts
    without a scheduler. Without one, a TPU pod slice, SLURM or Open MPI job of more than one
    process is detected from its environment; a single machine needs nothing.
    """
    if coordinator_address:
        # CPU devices of several processes need a collectives library to talk; GPUs and TPUs
        # bring their own and ignore this setting.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    elif _multi_host_tpu() or any(int(os.environ.get(v, "1")) > 1 for v in _CLUSTER_SIZE_VARIABLES):
        jax.distributed.initialize()


def _multi_host_tpu() -> bool:
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return len([h for h in hosts.split(",") if h]) > 1


def is_main_process() -> bool:
    """Process 0 prints and writes the run's files; every process computes and checkpoints."""
    return jax.process_index() == 0
