"""Which compiled training step a run uses on the devices it has, chosen in one place.

The trainer, `jaxgpt.check`'s pre-flight checks and the benchmarks all call `choose_step`, so
what they compile, measure and time is the program training runs. Both steps apply
`train_step.gradients` then `train_step.apply_gradients`, and have one interface (`Step`):

  - MeshStep (jaxgpt/hardware/mesh_step.py): `train_step` jitted over the run's device mesh,
    one SPMD program; on accelerators, several processes, or CPU devices asked for as a mesh.
  - CoreParallelStep (jaxgpt/hardware/core_parallel.py): one single-device program per CPU core on its
    share of the batch, joined on the first core; the CPU default when the batch splits.

Either way train.microbatches = 0 is filled in by the machine (jaxgpt/hardware/autotune.py). A
TPU compiled ahead of time (`check --target`, jaxgpt/hardware/tpu.py) gets its step here too.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax

from jaxgpt.config import RunConfig
from jaxgpt.hardware import core_parallel
from jaxgpt.hardware.autotune import fill_microbatches
from jaxgpt.hardware.core_parallel import CoreParallelStep
from jaxgpt.hardware.mesh_step import MeshStep, check_batch_fits_mesh
from jaxgpt.train_step import TrainState


class Step(Protocol):
    """What every caller (the trainer, check, the benchmarks, the TPU compile) uses of a step,
    whichever runs. The analyses are per device: one core's program, or the SPMD program's
    share on each device of the mesh."""

    batch_mesh: jax.sharding.Mesh  # what training and evaluation batches are sharded over
    devices: list  # the devices it computes on
    what: str  # what runs, in words: for the line that says it compiled

    def __call__(self, state: TrainState, windows: jax.Array) -> tuple[TrainState, dict]: ...
    def trace(self, state: TrainState, windows: jax.Array) -> Step: ...
    def compile(self, state: TrainState, windows: jax.Array) -> Step: ...
    def eval_losses(self, params, make_batch, count: int) -> list[dict[str, jax.Array]]: ...
    def memory_analysis(self): ...
    def cost_analysis(self) -> dict: ...
    def program_texts(self, state: TrainState, windows: jax.Array) -> list[str]: ...


class ChosenStep(NamedTuple):
    run: RunConfig  # train.microbatches filled in
    step: Step
    note: str | None  # what was chosen and why, for the start-up lines


def choose_step(run: RunConfig, mesh, device_bytes: int | None = None, layout=None) -> ChosenStep:
    """The step for `run` on `mesh`: one program per CPU core when the mesh is the CPU default
    and the batch splits over several cores, else the mesh's own jitted step. `device_bytes`
    is each accelerator's memory where the devices cannot say (compile-only TPU devices);
    `layout` the state's on `mesh` (mesh_step.state_layout), where the caller has it."""
    cores = core_parallel.cores_for(mesh)
    if len(cores) > 1:
        plan = core_parallel.plan(run, cores)
        if len(plan.devices) > 1:
            return ChosenStep(plan.run, CoreParallelStep(plan.run, plan.devices), plan.note)
    tuned = fill_microbatches(run, mesh, device_bytes, layout=layout)
    check_batch_fits_mesh(tuned.run, mesh)
    return ChosenStep(tuned.run, MeshStep(tuned.run, mesh, tuned.compiled, layout), tuned.note)
