"""The training program's step (jaxgpt/training/program.py) jitted over a device mesh: one SPMD program,
the collectives inserted by GSPMD from the shardings the rules of jaxgpt/sharding.py give the
state and the batch. Here too: the state's layout (shapes, dtypes and shardings, nothing
allocated) and the state itself born sharded. The other way to run the same step is one program
per CPU core (core_parallel.py); step_choice.py chooses between them.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import jax
import numpy as np

from jaxgpt import sharding
from jaxgpt.training.program import TrainingProgram
from jaxgpt.training.train_step import TrainState


def state_layout(program: TrainingProgram, mesh):
    """The train state's shapes, dtypes and shardings (nothing allocated), and what creates it
    (`InitialState`): the compiled initialisation applied to the seed's key data.

    The model's initialisation is traced once, here: the program that creates the state replays
    that trace with the shardings its shapes gave, instead of tracing the model again (a Flax
    initialisation is slow to trace, a large part of what tracing its training step takes)."""
    # the seed's key bits as an argument, not a constant: runs that differ only in seed share
    # one compiled initialisation (`compare --seeds`)
    key_data = np.asarray(jax.random.key_data(jax.random.key(program.run.train.seed)))
    traced = jax.jit(program.create_state).trace(key_data)
    layout = sharding.laid_out(traced.out_info, mesh)
    shardings = jax.tree.map(lambda s: s.sharding, layout)

    def create_state(key_data):
        return traced(key_data)  # the traced program's operations, bound again

    return layout, InitialState(jax.jit(create_state, out_shardings=shardings), key_data)


class InitialState:
    """Step 0's train state, created when called: the jitted initialisation (`creating`) applied
    to the seed's key data. `compile_in_background` starts its compile ahead of the call."""

    def __init__(self, creating, key_data):
        self._creating, self._key_data = creating, key_data
        self._compiled: Future | None = None

    def lower(self):
        """The initialisation lowered for this seed's key data (an argument, not a constant: every
        seed lowers to the same program)."""
        return self._creating.lower(self._key_data)

    def compile_in_background(self) -> None:
        """Start compiling the initialisation on a thread of its own (`in_background`),
        for a caller sure to create the state (the trainer, once its workdir is its own): the
        step's programs then compile beside it."""
        if self._compiled is None:
            self._compiled = in_background(self.lower().compile)

    def __call__(self) -> TrainState:
        return (self._compiled.result() if self._compiled else self._creating)(self._key_data)


def in_background(work) -> Future:
    """`work()` on a thread of its own: XLA compiles without holding the GIL, so the programs
    the caller compiles next, or its own Python, run beside it (the model's initialisation, as
    costly to compile as a small model's step, beside the step). Not a daemon thread: a process
    that ends while XLA still compiles on a daemon thread aborts at the interpreter's exit (the
    thread, forced out of XLA's C++, "terminate called ... exception not rethrown"), so an exit
    waits for the compile; Ctrl-C's exit skips the interpreter's (jaxgpt/commands/interrupt.py)."""
    future: Future = Future()

    def run_it():
        try:
            future.set_result(work())
        except BaseException as error:  # raised where the result is asked for
            future.set_exception(error)

    threading.Thread(target=run_it, name="jaxgpt-compile").start()
    return future


def jit_train_step(program: TrainingProgram, mesh, layout):
    """The program's step, jitted with the shardings of its state (`layout`, from state_layout)
    and batches. The old state's buffers are donated to the new one."""
    state_shardings = jax.tree.map(lambda s: s.sharding, layout)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(
        sharding.traced_on(mesh, program.step),
        in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )


def initial_state(program: TrainingProgram, mesh) -> TrainState:
    """The run's step-0 state, born sharded over `mesh` (jit with out_shardings): no device
    ever holds all of it."""
    _, create = state_layout(program, mesh)
    return create()


class MeshStep:
    """The program's step jitted over a device mesh: one SPMD program. The other implementation of
    the same interface (step_choice.Step) runs one program per CPU core (core_parallel.py)."""

    what = "the train step, one program over the mesh"  # for the line that says it compiled

    def __init__(self, program: TrainingProgram, mesh, layout, compiled=None):
        self.batch_mesh = mesh  # batches are sharded over the mesh's data axes
        self.devices = list(mesh.devices.flat)
        self._step = jit_train_step(program, mesh, layout)
        self._compiled = compiled  # choosing the microbatches may have compiled it already
        self._lowered = None
        self._eval_loss = jax.jit(
            sharding.traced_on(mesh, program.eval_step),
            in_shardings=(jax.tree.map(lambda s: s.sharding, layout.params), sharding.batch_sharding(mesh)),
            out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
        )

    def __call__(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        return (self._compiled or self._step)(state, batch)

    def trace(self, state: TrainState, batch: dict) -> MeshStep:
        """Trace the step to StableHLO for this state and batch (Python's share of the work,
        which no compilation cache skips); returns self."""
        if self._compiled is None and self._lowered is None:
            self._lowered = self._step.lower(state, batch)
        return self

    def compile(self, state: TrainState, batch: dict) -> MeshStep:
        """Compile ahead of time for this state and batch (unless already); returns self."""
        if self._compiled is None:
            self._compiled = self.trace(state, batch)._lowered.compile()
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

    def program_texts(self, state: TrainState, batch: dict) -> list[str]:
        """The compiled program's HLO, compiling it first if needed."""
        return [self.compile(state, batch)._compiled.as_text()]
