"""Data parallelism over a CPU's cores, with no collective in any program.

One XLA CPU device runs a small model's step mostly on one core: XLA spreads a large matmul
over its thread pool but runs the many small elementwise ops, the softmax and the optimizer
one after another. Splitting the batch over one device per core uses them all, but as one
SPMD program it ends every step in an all-reduce, and XLA's in-process collectives can abort
the process on a busy machine (jaxgpt/hardware/runtime.py says how). So the cores only compute
their shares, and the host joins them:

    params  --copy-->  every other core            (a memcpy; the runtime's, not XLA's)
    each core: its share of (loss, gradient)        (`train_step.gradients`, its microbatches)
    results --copy-->  the first core; added there in a fixed order, then the optimizer

What crosses between cores is few arrays each way (`Packing`): every leaf of 32 KiB or more
(the matrices) as it is, the small ones (biases, norms' scales) raveled into one array; the
parameters packed on the first core (`shared_inputs`), each core's gradient packed where it was
computed (`packed_core_gradients`). Why both: the host's Python puts every array on its core at
a fixed cost a leaf, on the cores the step runs on, so fewer arrays are a faster step; but a
raveled leaf is copied inside every core's program, and large ones would fill the temporaries
that decide the microbatches. The matrices are few and hold nearly all the bytes, so they travel
alone and only the small leaves are copied (the measurements: git log -p -- docs/benchmarks.md).

The state lives on the first core, in exactly the layout of a one-device run, so checkpoints
do not depend on the core count. No thread ever waits for another inside XLA: a starved core
only makes the step slower. The update equals the one-device step's up to float32 summation
order (each core's share is its rows' sums over the whole batch's count, train_step.scored);
dropout draws from fold_in(step key, core).

Which programs compute the shares is the run's choice (`train.one_program_for_cores`):

  - ProgramPerCore (the default): the one-device program, compiled once for each core's device.
    JAX dispatches a one-device program asynchronously, so the host's work between two steps
    (the parameters put on the other cores, their shares put back, the update dispatched)
    overlaps the cores' work.
  - OneProgramOverCores: one program over all the cores (`each_core`: shard_map with nothing
    exchanged), compiled once however many cores there are: a fresh start compiles less. But
    JAX's CPU client runs a program over several devices synchronously, so the host's work then
    lies between the steps: worth it for a short run whose step has few parameter arrays (scanned
    layers), not a long one (docs/benchmarks.md measures both).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from jaxgpt import sharding
from jaxgpt.model import lora
from jaxgpt.training.batch import as_batch, rows_of
from jaxgpt.training.program import TrainingProgram
from jaxgpt.training.train_step import TrainState, apply_gradients, batch_weight, gradients


def core_gradients(
    params, key, step, rows, core, weight=None, *, model, microbatches: int, batch_rows: int, objective=None
):
    """One core's share of the step's measurements and gradient (train_step.gradients): its
    `rows` (a batch, jaxgpt/training/batch.py) are the batch's core * n, core * n + 1, ... (the batch is
    split over the cores in order), `weight` the whole batch's (`whole_batch_weight`; None
    where the core can count it alone), and its dropout draws from fold_in(step key, core)."""
    step_key = jax.random.fold_in(key, step)
    rows = as_batch(rows)
    n = rows_of(rows)
    return gradients(
        params, rows, step_key, model=model, microbatches=microbatches, example_ids=core * n + jnp.arange(n),
        batch_rows=batch_rows, weight=weight, dropout_rng=jax.random.fold_in(step_key, core), objective=objective,
    )  # fmt: skip


# A leaf of at least this many elements (32 KiB of float32) travels between the cores as it is;
# smaller ones are raveled together (the module's docstring says why).
TRAVELS_ALONE = 2**13


def data_mesh(devices) -> jax.sharding.Mesh:
    """A mesh over `devices` on the data axis alone: a batch's rows split over the cores, every
    parameter whole on each."""
    grid = np.array(devices).reshape(len(devices), 1, 1, 1)
    return jax.sharding.Mesh(grid, sharding.AXES, axis_types=sharding.AXIS_TYPES)


class Packing:
    """How trees laid out as `layout` (arrays or their shapes) cross between the cores: `pack`
    gives (the leaves of TRAVELS_ALONE elements or more, as they are; the others raveled into
    one array, jax.flatten_util.ravel_pytree), `unpack` the tree back. Which leaf goes which way
    is decided here, once, from the layout."""

    def __init__(self, layout):
        leaves, self._treedef = jax.tree.flatten(layout)
        self._alone = [math.prod(x.shape) >= TRAVELS_ALONE for x in leaves]
        found = []  # ravel_pytree's inverse holds only sizes, shapes and dtypes: an abstract evaluation gives it
        jax.eval_shape(lambda small: found.append(ravel_pytree(small)[1]), self._split(leaves)[1])
        self._unravel_small = found[0]

    def _split(self, leaves: list) -> tuple[list, list]:
        """(the leaves that travel alone, the small ones), each in tree order."""
        parts = ([], [])
        for x, alone in zip(leaves, self._alone, strict=True):
            parts[0 if alone else 1].append(x)
        return parts

    def pack(self, tree) -> tuple[list, jax.Array]:
        alone, small = self._split(jax.tree.leaves(tree))
        return alone, ravel_pytree(small)[0]

    def unpack(self, pack: tuple[list, jax.Array]):
        big, small = iter(pack[0]), iter(self._unravel_small(pack[1]))
        return self._treedef.unflatten([next(big) if alone else next(small) for alone in self._alone])


def shared_inputs(params, key, step, *, pack) -> tuple:
    """What every core's program reads alike, as few arrays: the parameters packed (`pack`,
    Packing.pack), the key as its data, the step."""
    return pack(params), jax.random.key_data(key), step


def packed_core_gradients(params_pack, key_data, step, rows, core, weight=None, *, share, params, grads):
    """`share` (core_gradients) reading `shared_inputs`' arrays, its gradient packed: `params`
    and `grads` are the two trees' Packings. The key is the run's (train_step.run_keys), of
    JAX's default kind."""
    key = jax.random.wrap_key_data(key_data)
    measured, gradient = share(params.unpack(params_pack), key, step, rows, core, weight)
    return measured, grads.pack(gradient)


def whole_batch_weight(key, step, batch, *, model, objective=None):
    """What the whole batch scores (train_step.batch_weight), for a batch with weights: no core
    can count it from its own rows."""
    return batch_weight(model.config, jax.random.fold_in(key, step), batch, objective=objective)


def add_and_apply(
    state: TrainState, per_core: list, *, optimizer, grads: Packing, layer_grad_norms: bool = False
) -> tuple[TrainState, dict]:
    """The optimizer step on the sum of the cores' shares (packed_core_gradients', each with a
    leading axis of one, as both ways of computing them return it), added in core order."""
    total = per_core[0]
    for result in per_core[1:]:
        total = jax.tree.map(jnp.add, total, result)
    measured, grads_pack = jax.tree.map(lambda x: x[0], total)
    gradient = grads.unpack(grads_pack)
    return apply_gradients(state, measured, gradient, optimizer=optimizer, layer_grad_norms=layer_grad_norms)


# Every so many steps the host waits, asleep, until the cores have finished the step: left to run
# ahead, it waits inside the runtime's copies of arrays not yet computed, and that wait spins on
# a core the step needs (docs/benchmarks.md). Draining costs one step's dispatch per WAIT_EVERY.
WAIT_EVERY = 20


class CoreParallelStep:
    """`train_step`'s update of a one-device state on the first of `devices`, computed from a
    batch sharded over `devices` (`batch_mesh`): every core's share (ProgramPerCore or
    OneProgramOverCores, as train.one_program_for_cores says), then the update on the first core."""

    def __init__(self, program: TrainingProgram, devices: list, layout: TrainState):
        """`program`'s train.batch_size is the whole batch's, split over `devices` in order; its
        state is laid out as `layout` (mesh_step.state_layout's shapes, or a state)."""
        self.devices = list(devices)
        self.batch_mesh = data_mesh(self.devices)  # a batch's rows, split over the cores
        t = program.run.train
        share = partial(
            core_gradients, model=program.model, microbatches=t.microbatches, batch_rows=t.batch_size,
            objective=program.objective,
        )  # fmt: skip
        params, grads = Packing(layout.params), Packing(lora.split(program.run.model, layout.params)[0])
        packed_share = partial(packed_core_gradients, share=share, params=params, grads=grads)
        shares = OneProgramOverCores if t.one_program_for_cores else ProgramPerCore
        self.shares = shares(packed_share, program.eval_step, self.batch_mesh)
        self.what = f"{self.shares.what}, and the update"  # for the line that says it compiled
        self._shared_inputs = jax.jit(partial(shared_inputs, pack=params.pack))  # on the first core, where the state is
        self._whole_batch_weight = jax.jit(
            partial(whole_batch_weight, model=program.model, objective=program.objective)
        )
        layer_norms = t.log_layer_grad_norms
        update = partial(add_and_apply, optimizer=program.optimizer, grads=grads, layer_grad_norms=layer_norms)
        self._apply = jax.jit(update, donate_argnums=0)
        self._lowered: tuple | None = None  # (the shares' programs, the update), traced
        self._first_share = None  # the first core's program (or the one over the cores), compiled
        self._compiled_apply = None
        self._steps_run = 0

    def _share_inputs(self, state, batch) -> tuple:
        """(packed params, key data, step, batch, the whole batch's weight or None): what the
        shares read (shared_inputs), on the first core."""
        weight = None
        if "weights" in batch:  # the whole batch on the first core, counted there
            weight = run_or_shape(self._whole_batch_weight, batch)(
                state.rng, state.step, placed(batch, SingleDeviceSharding(self.devices[0]))
            )
        return (*run_or_shape(self._shared_inputs, state)(state.params, state.rng, state.step), batch, weight)

    def __call__(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        per_core = self.shares(*self._share_inputs(state, batch))
        state, metrics = (self._compiled_apply or self._apply)(state, per_core)
        self._steps_run += 1
        if self._steps_run % WAIT_EVERY == 0:
            jax.block_until_ready(metrics)  # the host idle, not spinning: see WAIT_EVERY
        return state, metrics

    def eval_losses(self, params, make_batch, count: int) -> list[dict]:
        """The loss of each of `count` batches, batch i built by make_batch(i, mesh) on core
        i % cores and evaluated there: the same numbers as on one device, computed side by side."""
        return self.shares.eval_losses(params, make_batch, count)

    def trace(self, state: TrainState, batch: dict) -> CoreParallelStep:
        """Trace the shares' programs and the update to StableHLO; returns self. `state` and
        `batch` may be their shapes alone (mesh_step.state_layout's, batch_layout's): what the
        programs are compiled for is the same."""
        if self._lowered is None:
            inputs = self._share_inputs(state, batch)
            home = SingleDeviceSharding(self.devices[0])
            one = jax.tree.map(lambda x: x.update(sharding=home), self.shares.share_layout(*inputs))
            self._lowered = self.shares.lower(*inputs), self._apply.lower(state, [one] * len(self.devices))
        return self

    def compile(self, state: TrainState, batch: dict) -> CoreParallelStep:
        """Compile the shares' programs and the update ahead of time, all at once (XLA compiles
        without the GIL), unless already; returns self."""
        if self._compiled_apply is None:
            shares, update = self.trace(state, batch)._lowered
            kept = [] if self._first_share is None else [self._first_share]  # compile_first_share's
            pending = [*shares[len(kept) :], update]
            with ThreadPoolExecutor(len(pending)) as pool:
                *compiled, self._compiled_apply = pool.map(lambda program: program.compile(), pending)
            self.shares.compiled = kept + compiled
        return self

    def compile_first_share(self, state: TrainState, batch: dict) -> CoreParallelStep:
        """Compile the first core's program alone (with OneProgramOverCores, the one program),
        unless already; returns self. Its memory analysis is what decides whether the step fits
        the CPU's cache (step_choice.plan), and `compile` then compiles only the rest."""
        if self._first_share is None and self._compiled_apply is None:
            self._first_share = self.trace(state, batch)._lowered[0][0].compile()
        return self

    def memory_analysis(self):
        """XLA's memory analysis of a compiled share program, one core's (after `compile` or
        `compile_first_share`)."""
        return (self._first_share or self.shares.compiled[0]).memory_analysis()

    def cost_analysis(self) -> dict:
        """XLA's cost analysis of a compiled share program (after `compile`): its FLOPs and
        bytes, per device as the mesh step's are."""
        cost = self.shares.compiled[0].cost_analysis()
        return cost[0] if isinstance(cost, list) else cost

    def program_texts(self, state: TrainState, batch: dict) -> list[str]:
        """The compiled programs' HLO (the shares', then the update's): for checking that none
        holds a collective. Compiles them first unless `compile` already has."""
        self.compile(state, batch)
        return [c.as_text() for c in self.shares.compiled] + [self._compiled_apply.as_text()]


class ProgramPerCore:
    """Each core's share by the one-device program compiled for that core's device; evaluation
    likewise, batch by batch."""

    what = "the gradient program of each CPU core"

    def __init__(self, share, eval_step, mesh):
        self.devices = list(mesh.devices.flat)
        self._share = jax.jit(with_core_axis(share))
        self._eval_loss = jax.jit(eval_step)
        self._device_meshes = [data_mesh([d]) for d in self.devices]  # one core's own (evaluation)
        self._core_ids = [jax.device_put(np.int32(i), d) for i, d in enumerate(self.devices)]
        self.compiled: list | None = None  # one per core, in core order

    def _per_core(self, params_pack, key_data, step, batch, weight) -> list[tuple]:
        """Per core: its copy of (packed params, key data, step), its rows, its index, the batch's
        weight."""
        inputs = []
        for i, device in enumerate(self.devices):
            rows = {name: core_rows(array, device, len(self.devices)) for name, array in batch.items()}
            # every core's copy on its device alone, the first's too (no copy there): the state's
            # mesh sharding would give its program other input types and a second tracing
            mine = placed((params_pack, key_data, step, weight), SingleDeviceSharding(device))
            inputs.append((*mine[:3], rows, self._core_ids[i], mine[3]))
        return inputs

    def lower(self, *inputs) -> list:
        return [self._share.lower(*args) for args in self._per_core(*inputs)]  # traced once, then cached

    def share_layout(self, *inputs):
        """One core's share: its shapes."""
        return jax.eval_shape(self._share, *self._per_core(*inputs)[0])

    def __call__(self, *inputs) -> list:
        """Every core's share, on the first core."""
        programs = self.compiled or [self._share] * len(self.devices)
        shares = [run(*args) for run, args in zip(programs, self._per_core(*inputs), strict=True)]
        return [shares[0]] + [jax.device_put(s, self.devices[0]) for s in shares[1:]]  # each as its core is done

    def eval_losses(self, params, make_batch, count: int) -> list[dict[str, jax.Array]]:
        copies = [params] + [jax.device_put(params, d) for d in self.devices[1:]]
        n = len(self.devices)
        return [self._eval_loss(copies[i % n], make_batch(i, self._device_meshes[i % n])) for i in range(count)]


class OneProgramOverCores:
    """Every core's share by one program over the cores (`each_core`), compiled once; evaluation
    likewise, a batch a core at a time."""

    what = "one gradient program over the CPU cores"

    def __init__(self, share, eval_step, mesh):
        self.devices = list(mesh.devices.flat)
        self._mesh = mesh
        self._everywhere = NamedSharding(mesh, PartitionSpec())  # a whole copy on every core
        everywhere, split = PartitionSpec(), PartitionSpec(sharding.BATCH)
        self._share = jax.jit(each_core(share_of_this_core(share), mesh, (everywhere,) * 3 + (split, everywhere)))
        self._eval_losses = jax.jit(each_core(eval_step, mesh, (everywhere, split)))
        self._device_meshes = [data_mesh([d]) for d in self.devices]
        self.compiled: list | None = None  # the one program

    def _inputs(self, params_pack, key_data, step, batch, weight) -> tuple:
        """(packed params, key data, step) and the batch's weight copied to every core; the batch
        as it is (its rows already split over the cores)."""
        params_pack, key_data, step, weight = placed((params_pack, key_data, step, weight), self._everywhere)
        return params_pack, key_data, step, batch, weight

    def lower(self, *inputs) -> list:
        return [self._share.lower(*self._inputs(*inputs))]

    def share_layout(self, *inputs):
        """One core's share: its shapes (the program's results hold every core's, stacked)."""
        shares = jax.eval_shape(self._share, *self._inputs(*inputs))
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype), shares)

    def __call__(self, *inputs) -> list:
        """Every core's share, on the first core."""
        shares = (self.compiled[0] if self.compiled else self._share)(*self._inputs(*inputs))
        first, *others = range(len(self.devices))
        # only the other cores' shares are put (each put costs the host, whose Python shares
        # the cores with the step, tens of microseconds a leaf)
        return [core_share(shares, first)] + [jax.device_put(core_share(shares, i), self.devices[0]) for i in others]

    def eval_losses(self, params, make_batch, count: int) -> list[dict[str, np.ndarray]]:
        copies = jax.device_put(params, self._everywhere)
        cores, rounds = len(self.devices), []
        for first in range(0, count, cores):
            # a short last round repeats its last batch on the cores left over; their losses are dropped
            parts = [make_batch(min(first + i, count - 1), mesh) for i, mesh in enumerate(self._device_meshes)]
            rounds.append(self._eval_losses(copies, jax.tree.map(partial(side_by_side, self._mesh), *parts)))
        per_core = [jax.tree.map(lambda x, i=i: x[i], r) for r in jax.device_get(rounds) for i in range(cores)]
        return per_core[:count]


def with_core_axis(fn):
    """`fn` returning its arrays with a leading axis of one: a core's share as
    OneProgramOverCores's program returns it, so the update reads both alike."""

    def on_one_core(*args):  # the name the compiled program carries
        return jax.tree.map(lambda x: x[None], fn(*args))

    return on_one_core


def core_rows(array: jax.Array, device, cores: int) -> jax.Array:
    """The rows of a batch array split over `cores` cores that live on `device` (for shapes
    alone, their shapes there)."""
    if isinstance(array, jax.ShapeDtypeStruct):
        shape = (array.shape[0] // cores, *array.shape[1:])
        return jax.ShapeDtypeStruct(shape, array.dtype, sharding=SingleDeviceSharding(device))
    return next(shard.data for shard in array.addressable_shards if shard.device == device)


def is_shapes(tree) -> bool:
    """Whether `tree` holds shapes alone (jax.ShapeDtypeStruct), as lowering before any array exists does."""
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def run_or_shape(fn, tree):
    """`fn`, or its abstract evaluation (jax.eval_shape) where `tree` holds shapes alone."""
    return partial(jax.eval_shape, fn) if is_shapes(tree) else fn


def placed(tree, where):
    """`tree` put on `where` (a sharding); shapes alone are given `where` as their sharding."""
    if is_shapes(tree):
        return jax.tree.map(lambda s: s.update(sharding=where), tree)
    return jax.device_put(tree, where)


def share_of_this_core(share):
    """share(params, key, step, rows, core, weight), given the index of the core it runs on."""
    return lambda params, key, step, rows, weight: share(params, key, step, rows, jax.lax.axis_index("data"), weight)


def each_core(fn, mesh, in_specs: tuple):
    """`fn` run on every core of `mesh` (its data axis) at once, each on its part of the inputs
    (`in_specs`: split over the data axis, or a whole copy on every core). One SPMD program, so
    compiled once, not once per core, and with no collective in it: each core's results are
    its own, stacked along a new leading axis, one entry per core (`core_share` takes one)."""
    # check_vma=False: with it, a gradient taken inside with respect to a copy every core holds
    # alike would be summed over the cores (an all-reduce); each core's own share is wanted here.
    split = PartitionSpec(sharding.BATCH)
    return jax.shard_map(with_core_axis(fn), mesh=mesh, in_specs=in_specs, out_specs=split, check_vma=False)


def core_share(shares, core: int):
    """Entry `core` of `shares` (each_core's stacked results): the arrays that core computed,
    on its device, no copy."""
    return jax.tree.map(lambda x: x.addressable_data(core), shares)


def side_by_side(mesh, *parts: jax.Array) -> jax.Array:
    """One array of `parts` (one per device of `mesh`, in its order, each on its device) laid
    end to end along the first axis, split over the mesh's data axis as they already are: no copy."""
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    return jax.make_array_from_single_device_arrays(shape, sharding.batch_sharding(mesh), list(parts))
