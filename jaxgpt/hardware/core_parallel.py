"""Data parallelism over a CPU's cores, with no collective in any program.

One XLA CPU device runs a small model's step mostly on one core: XLA spreads a large matmul
over its thread pool but runs the many small elementwise ops, the softmax and the optimizer
one after another. Splitting the batch over one device per core uses them all, but as one
SPMD program it ends every step in an all-reduce, and XLA's in-process collectives can abort
the process on a busy machine (jaxgpt/hardware/runtime.py says how). So each core runs the one-device
program on its own rows instead, and the host joins them:

    params  --copy-->  every other core            (a memcpy; the runtime's, not XLA's)
    each core: its share of (loss, gradient)        (`train_step.gradients`, its microbatches)
    results --copy-->  the first core; added there in a fixed order, then the optimizer

The state lives on the first core, in exactly the layout of a one-device run, so checkpoints
do not depend on the core count. No thread ever waits for another inside XLA: a starved core
only makes the step slower. The update equals the one-device step's up to float32 summation
order (each core's share is its rows' sums over the whole batch's count, train_step.scored);
dropout draws from fold_in(step key, core).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt import sharding
from jaxgpt.training.batch import as_batch, rows_of
from jaxgpt.training.program import TrainingProgram
from jaxgpt.training.train_step import TrainState, apply_gradients, batch_weight, gradients


def core_gradients(params, key, step, rows, core, weight=None, *, model, microbatches: int, batch_rows: int):
    """One core's share of the step's measurements and gradient (train_step.gradients): its
    `rows` (a batch, jaxgpt/training/batch.py) are the batch's core * n, core * n + 1, ... (the batch is
    split over the cores in order), `weight` the whole batch's (`whole_batch_weight`; None
    where the core can count it alone), and its dropout draws from fold_in(step key, core)."""
    step_key = jax.random.fold_in(key, step)
    rows = as_batch(rows)
    n = rows_of(rows)
    return gradients(
        params, rows, step_key, model=model, microbatches=microbatches, example_ids=core * n + jnp.arange(n),
        batch_rows=batch_rows, weight=weight, dropout_rng=jax.random.fold_in(step_key, core),
    )  # fmt: skip


def whole_batch_weight(key, step, batch, *, model):
    """What the whole batch scores (train_step.batch_weight), for a batch with weights: no core
    can count it from its own rows."""
    return batch_weight(model.config, jax.random.fold_in(key, step), batch)


def add_and_apply(
    state: TrainState, per_core: list, *, optimizer, layer_grad_norms: bool = False
) -> tuple[TrainState, dict]:
    """The optimizer step on the sum of the cores' shares, added in core order."""
    total = per_core[0]
    for result in per_core[1:]:
        total = jax.tree.map(jnp.add, total, result)
    measured, grads = total
    return apply_gradients(state, measured, grads, optimizer=optimizer, layer_grad_norms=layer_grad_norms)


class CoreParallelStep:
    """`train_step`'s update of a one-device state on the first of `devices`, computed from a
    batch sharded over `devices` (`batch_mesh`), one single-device program per device."""

    what = "the gradient program of each CPU core, and the update"  # for the line that says it compiled

    def __init__(self, program: TrainingProgram, devices: list):
        """`program`'s train.batch_size is the whole batch's, split over `devices` in order."""
        self.devices = list(devices)
        self.batch_mesh = sharding.data_mesh(self.devices)  # a batch's rows, split over the cores
        self.device_meshes = [sharding.data_mesh([d]) for d in self.devices]  # one core's own (evaluation)
        t = program.run.train
        self._gradients = jax.jit(
            partial(core_gradients, model=program.model, microbatches=t.microbatches, batch_rows=t.batch_size)
        )
        self._whole_batch_weight = jax.jit(partial(whole_batch_weight, model=program.model))
        update = partial(add_and_apply, optimizer=program.optimizer, layer_grad_norms=t.log_layer_grad_norms)
        self._apply = jax.jit(update, donate_argnums=0)
        self._core_ids = [jax.device_put(np.int32(i), d) for i, d in enumerate(self.devices)]
        self._eval_loss = jax.jit(program.eval_step)
        self._lowered: tuple | None = None  # (each core's gradient program, the update), traced
        self._compiled_gradients: dict | None = None
        self._compiled_apply = None

    def _gradient_inputs(self, state, batch) -> list[tuple]:
        """Per core: its copy of (params, key, step), its rows, its index, the batch's weight."""
        home = self.devices[0]
        weight = None
        if "weights" in batch:  # the whole batch on the first core, counted there
            weight = self._whole_batch_weight(state.rng, state.step, jax.device_put(batch, home))
        shared = (state.params, state.rng, state.step)
        inputs = []
        for i, device in enumerate(self.devices):
            rows = {name: core_rows(array, device) for name, array in batch.items()}
            # every core's copy on its device alone, the first's too (no copy there): its state's
            # mesh sharding would give its program other input types and a second tracing
            mine = jax.device_put((*shared, weight), device)
            inputs.append((*mine[:3], rows, self._core_ids[i], mine[3]))
        return inputs

    def __call__(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        gradients_on = self._compiled_gradients or {d: self._gradients for d in self.devices}
        inputs = self._gradient_inputs(state, batch)
        results = [gradients_on[d](*args) for d, args in zip(self.devices, inputs, strict=True)]
        home = self.devices[0]
        results = [results[0]] + [jax.device_put(r, home) for r in results[1:]]  # runs when each core is done
        return (self._compiled_apply or self._apply)(state, results)

    def eval_losses(self, params, make_batch, count: int) -> list[dict[str, jax.Array]]:
        """The loss of each of `count` batches, batch i built by make_batch(i, mesh) on core
        i % cores and evaluated there: the same numbers as on one device, computed side by side."""
        copies = [params] + [jax.device_put(params, d) for d in self.devices[1:]]
        n = len(self.devices)
        return [self._eval_loss(copies[i % n], make_batch(i, self.device_meshes[i % n])) for i in range(count)]

    def trace(self, state: TrainState, batch: dict) -> CoreParallelStep:
        """Trace every core's gradient program and the update to StableHLO; returns self."""
        if self._lowered is None:
            inputs = self._gradient_inputs(state, batch)
            gradients = [self._gradients.lower(*args) for args in inputs]  # tracing: once, then cached
            home = jax.sharding.SingleDeviceSharding(self.devices[0])
            result = jax.eval_shape(self._gradients, *inputs[0])
            result = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=home), result)
            self._lowered = gradients, self._apply.lower(state, [result] * len(self.devices))
        return self

    def compile(self, state: TrainState, batch: dict) -> CoreParallelStep:
        """Compile every core's program ahead of time, all at once (XLA compiles without the
        GIL, one compilation per core), and the update, unless already; returns self."""
        if self._compiled_gradients is None:
            gradients, update = self.trace(state, batch)._lowered
            with ThreadPoolExecutor(len(gradients)) as pool:
                compiled = list(pool.map(lambda program: program.compile(), gradients))
            self._compiled_gradients = dict(zip(self.devices, compiled, strict=True))
            self._compiled_apply = update.compile()
        return self

    def memory_analysis(self):
        """XLA's memory analysis of one core's compiled program (after `compile`)."""
        return next(iter(self._compiled_gradients.values())).memory_analysis()

    def cost_analysis(self) -> dict:
        """XLA's cost analysis of one core's compiled gradient program (after `compile`): its
        FLOPs and bytes, per device as the mesh step's are."""
        cost = next(iter(self._compiled_gradients.values())).cost_analysis()
        return cost[0] if isinstance(cost, list) else cost

    def program_texts(self, state: TrainState, batch: dict) -> list[str]:
        """The compiled programs' HLO (each core's, then the update's): for checking that none
        holds a collective. Compiles them first unless `compile` already has."""
        self.compile(state, batch)
        return [c.as_text() for c in self._compiled_gradients.values()] + [self._compiled_apply.as_text()]


def core_rows(array: jax.Array, device) -> jax.Array:
    """The rows of a batch array sharded over the cores that live on `device`."""
    return next(shard.data for shard in array.addressable_shards if shard.device == device)
