"""`train_step` jitted over a device mesh: one SPMD program, the collectives inserted by GSPMD
from the shardings the rules of jaxgpt/sharding.py give the state and the batch. Here too: the
state's layout (shapes, dtypes and shardings, nothing allocated) and the state itself born
sharded. The other way to run the same step is one program per CPU core (core_parallel.py);
step_choice.py chooses between them.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from jaxgpt import sharding
from jaxgpt.config import RunConfig
from jaxgpt.model import GPT
from jaxgpt.optimizer import make_optimizer
from jaxgpt.train_step import TrainState, create_train_state, eval_step, seed_key_data, train_step


def state_layout(run: RunConfig, mesh):
    """The train state's shapes, dtypes and shardings (nothing allocated), and the function
    that creates it: the compiled initialisation (`.func`) applied to the seed's key data."""
    create = partial(create_train_state, run.model, make_optimizer(run.train))
    key_data = seed_key_data(run.train.seed)
    shapes = jax.eval_shape(create, key_data)
    layout = sharding.laid_out(shapes, mesh)
    shardings = jax.tree.map(lambda s: s.sharding, layout)
    return layout, partial(jax.jit(create, out_shardings=shardings), key_data)


def jit_train_step(run: RunConfig, mesh, layout):
    """`train_step` for this run, jitted with the shardings of its state (`layout`, from
    state_layout) and batches. The old state's buffers are donated to the new one."""
    state_shardings = jax.tree.map(lambda s: s.sharding, layout)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    step = partial(
        train_step,
        model=GPT(run.model),
        optimizer=make_optimizer(run.train),
        layer_grad_norms=run.train.log_layer_grad_norms,
    )
    return jax.jit(
        sharding.traced_on(mesh, partial(step, microbatches=run.train.microbatches)),
        in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )


def batch_layout(run: RunConfig, mesh) -> jax.ShapeDtypeStruct:
    shape = (run.train.batch_size, run.model.block_size + 1)
    return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding.batch_sharding(mesh))


def initial_state(run: RunConfig, mesh) -> TrainState:
    """The run's step-0 state, born sharded over `mesh` (jit with out_shardings): no device
    ever holds all of it."""
    _, create = state_layout(run, mesh)
    return create()


class MeshStep:
    """`train_step` jitted over a device mesh: one SPMD program. The other implementation of
    the same interface (step_choice.Step) runs one program per CPU core (core_parallel.py)."""

    what = "the train step, one program over the mesh"  # for the line that says it compiled

    def __init__(self, run: RunConfig, mesh, layout, compiled=None):
        self.batch_mesh = mesh  # batches are sharded over the mesh's data axes
        self.devices = list(mesh.devices.flat)
        self._step = jit_train_step(run, mesh, layout)
        self._compiled = compiled  # choosing the microbatches may have compiled it already
        self._lowered = None
        self._eval_loss = jax.jit(
            sharding.traced_on(mesh, partial(eval_step, model=GPT(run.model))),
            in_shardings=(jax.tree.map(lambda s: s.sharding, layout.params), sharding.batch_sharding(mesh)),
            out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
        )

    def __call__(self, state: TrainState, windows: jax.Array) -> tuple[TrainState, dict]:
        return (self._compiled or self._step)(state, windows)

    def trace(self, state: TrainState, windows: jax.Array) -> MeshStep:
        """Trace the step to StableHLO for this state and batch (Python's share of the work,
        which no compilation cache skips); returns self."""
        if self._compiled is None and self._lowered is None:
            self._lowered = self._step.lower(state, windows)
        return self

    def compile(self, state: TrainState, windows: jax.Array) -> MeshStep:
        """Compile ahead of time for this state and batch (unless already); returns self."""
        if self._compiled is None:
            self._compiled = self.trace(state, windows)._lowered.compile()
        return self

    def eval_losses(self, params, make_batch, count: int) -> list[dict[str, jax.Array]]:
        """`eval_step`'s losses of each of `count` batches, batch i built by make_batch(i, mesh)."""
        return [self._eval_loss(params, make_batch(i, self.batch_mesh)) for i in range(count)]

    def memory_analysis(self):
        """XLA's memory analysis of the compiled program (after `compile`)."""
        return self._compiled.memory_analysis()

    def cost_analysis(self) -> dict:
        """XLA's cost analysis of the compiled program (after `compile`): its FLOPs, bytes."""
        cost = self._compiled.cost_analysis()
        return cost[0] if isinstance(cost, list) else cost

    def program_texts(self, state: TrainState, windows: jax.Array) -> list[str]:
        """The compiled program's HLO, compiling it first if needed."""
        return [self.compile(state, windows)._compiled.as_text()]
