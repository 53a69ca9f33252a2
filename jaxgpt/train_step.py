"""The pure core of training: a state pytree and the compiled step functions over it.

Nothing here does I/O or reads the clock, so `train_step` can be jit-compiled, sharded and
tested as a plain function of its inputs.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgpt import sharding
from jaxgpt.config import ModelConfig, RunConfig
from jaxgpt.errors import UserError
from jaxgpt.model import GPT, init_params
from jaxgpt.optimizer import make_optimizer


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training: step, parameters, optimizer moments, and the
    key from which each step's dropout randomness is derived (fold_in(rng, step))."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def run_keys(seed: int | jax.Array) -> tuple[jax.Array, jax.Array]:
    """A run's two keys from train.seed (or the key data of jax.random.key(seed)): the
    parameters' initialisation, and dropout's."""
    key = jax.random.key(seed) if isinstance(seed, int) else jax.random.wrap_key_data(seed)
    init_key, dropout_key = jax.random.split(key)
    return init_key, dropout_key


def seed_key_data(seed: int) -> np.ndarray:
    """jax.random.key(seed)'s bits, as the argument a compiled initialisation takes: with the
    seed outside the program, runs that differ only in seed share one (`compare --seeds`)."""
    return np.asarray(jax.random.key_data(jax.random.key(seed)))


def create_train_state(
    config: ModelConfig, optimizer: optax.GradientTransformation, seed: int | jax.Array
) -> TrainState:
    init_key, dropout_key = run_keys(seed)
    params = init_params(config, init_key)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), dropout_key)


def token_losses(
    model: GPT, params, windows: jax.Array, rng: jax.Array | None = None, head_mask: dict | None = None
) -> jax.Array:
    """Next-token cross-entropy (batch, seq) at each position of windows (batch, seq + 1);
    dropout when rng is given; head_mask (`jaxgpt.model.head_mask`) silences attention heads."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    train = rng is not None
    variables = {"params": params} | ({"head_mask": head_mask} if head_mask is not None else {})
    logits = model.apply(variables, inputs, train=train, rngs={"dropout": rng} if train else None)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets)


def cross_entropy(model: GPT, params, windows: jax.Array, rng: jax.Array | None = None) -> jax.Array:
    """Mean next-token cross-entropy over windows (batch, seq + 1): the training loss."""
    return token_losses(model, params, windows, rng).mean()


def gradients(params, windows: jax.Array, rng: jax.Array, *, model: GPT, microbatches: int = 1):
    """(mean loss, mean gradient) over a batch of windows (batch, seq + 1).

    With microbatches > 1 the batch is split and gradients are averaged over the pieces in a
    scan: the same result as the whole batch (up to float32 summation order), with the
    activation memory of one piece. Piece i takes rows i, i + m, i + 2m, ... so that under data
    parallelism every device keeps its own rows in every piece (contiguous pieces would each
    sit on one device, and XLA would move rows between devices for every piece).
    """
    loss_and_grads = jax.value_and_grad(lambda p, w, r: cross_entropy(model, p, w, r))
    if microbatches == 1:
        return loss_and_grads(params, windows, rng)
    pieces = windows.reshape(-1, microbatches, windows.shape[-1]).swapaxes(0, 1)

    def accumulate(total, xs):
        i, piece = xs
        loss, grads = loss_and_grads(params, piece, jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, total, (loss, grads)), None

    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(microbatches), pieces))
    return jax.tree.map(lambda x: x / microbatches, (loss, grads))


def gradient_norms(grads) -> dict:
    """Gradient norm per top-level parameter group (embeddings, each block, final norm); a
    layer-scanned "blocks" group gives one norm per layer. Traced into the step's program: on a
    mesh, many small eager reductions in flight at once can starve each other of threads."""

    def squares(group, keep_layer_axis):
        return sum(
            jnp.sum(jnp.square(g.astype(jnp.float32)), axis=tuple(range(1 if keep_layer_axis else 0, g.ndim)))
            for g in jax.tree.leaves(group)
        )

    return {name: jnp.sqrt(squares(group, name == "blocks")) for name, group in grads.items()}


def per_layer(norms: dict) -> dict[str, float]:
    """`gradient_norms`' arrays as floats by name, a scanned "blocks" group as block_0, block_1, ..."""
    out = {}
    for name, value in norms.items():
        if name == "blocks":
            out |= {f"block_{i}": float(v) for i, v in enumerate(np.asarray(value))}
        else:
            out[name] = float(value)
    return out


def apply_gradients(
    state: TrainState,
    loss: jax.Array,
    grads,
    *,
    optimizer: optax.GradientTransformation,
    layer_grad_norms: bool = False,
) -> tuple[TrainState, dict]:
    """The optimizer's update of `state` by `grads`, and the step's metrics (with
    layer_grad_norms, `gradient_norms` too)."""
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    if layer_grad_norms:
        metrics["layer_grad_norms"] = gradient_norms(grads)
    return new_state, metrics


def train_step(
    state: TrainState,
    windows: jax.Array,
    *,
    model: GPT,
    optimizer: optax.GradientTransformation,
    microbatches: int = 1,
    layer_grad_norms: bool = False,
) -> tuple[TrainState, dict]:
    """One optimizer step on a batch of windows (batch, seq + 1); dropout draws from
    fold_in(state.rng, step), so a step's randomness does not depend on the steps before it."""
    rng = jax.random.fold_in(state.rng, state.step)
    loss, grads = gradients(state.params, windows, rng, model=model, microbatches=microbatches)
    return apply_gradients(state, loss, grads, optimizer=optimizer, layer_grad_norms=layer_grad_norms)


def eval_step(params, windows: jax.Array, *, model: GPT) -> dict[str, jax.Array]:
    """{"loss": the mean loss}, and for a model trained without the causal mask (which sees
    the token it predicts) "past_only_loss": the same weights under the causal mask, each
    position predicted from the tokens before it alone, as in generation (the KV-cache
    decode, where no later token is written yet, computes the same)."""
    losses = {"loss": cross_entropy(model, params, windows)}
    if not model.config.causal:
        losses["past_only_loss"] = cross_entropy(GPT(model.config.replace(causal=True)), params, windows)
    return losses


def state_layout(run: RunConfig, mesh):
    """The train state's shapes, dtypes and shardings (nothing allocated), and the function
    that creates it: the compiled initialisation (`.func`) applied to the seed's key data."""
    create = partial(create_train_state, run.model, make_optimizer(run.train))
    key_data = seed_key_data(run.train.seed)
    shapes = jax.eval_shape(create, key_data)
    layout = sharding.laid_out(shapes, mesh)
    shardings = jax.tree.map(lambda s: s.sharding, layout)
    return layout, partial(jax.jit(create, out_shardings=shardings), key_data)


def jit_train_step(run: RunConfig, mesh):
    """`train_step` for this run, jitted with the shardings of its state and batches. The old
    state's buffers are donated to the new one."""
    layout, _ = state_layout(run, mesh)
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
    """`train_step` jitted over a device mesh: one SPMD program, the collectives inserted by
    GSPMD from the shardings. The other implementation of the same interface runs one program
    per CPU core (jaxgpt/hardware/core_parallel.py); jaxgpt/hardware/step_choice.py chooses between them."""

    def __init__(self, run: RunConfig, mesh, compiled=None):
        self.batch_mesh = mesh  # batches are sharded over the mesh's data axes
        layout, _ = state_layout(run, mesh)
        self._step = jit_train_step(run, mesh)
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


def check_batch_fits_mesh(run: RunConfig, mesh) -> None:
    parallel = sharding.data_parallel_size(mesh)
    per_microbatch = run.train.batch_size // run.train.microbatches
    if per_microbatch % parallel or run.train.batch_size % jax.process_count():
        unit = parallel * run.train.microbatches  # the batch sizes that split are its multiples
        sizes = sorted({max(run.train.batch_size // unit, 1) * unit, -(-run.train.batch_size // unit) * unit})
        fewer = max(d for d in range(1, parallel + 1) if parallel % d == 0 and per_microbatch % d == 0)
        mesh_fix = f" or --config.mesh.data={fewer}" if mesh.shape.get("fsdp", 1) == 1 and fewer > 1 else ""
        raise UserError(
            f"train.batch_size={run.train.batch_size} (over {run.train.microbatches} microbatches) does not split "
            f"over the {parallel} data-parallel devices of mesh {dict(mesh.shape)}; make batch_size / microbatches "
            f"a multiple of {parallel} (--config.train.batch_size={' or '.join(map(str, sizes))}){mesh_fix}"
        )
