"""The pure core of training: a state pytree and the compiled step functions over it.

Nothing here does I/O or reads the clock, so `train_step` can be jit-compiled, sharded and
tested as a plain function of its inputs.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxgpt.config import ModelConfig
from jaxgpt.model import GPT, init_params


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training: step, parameters, optimizer moments, and the
    key from which each step's dropout randomness is derived (fold_in(rng, step))."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def create_train_state(config: ModelConfig, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    params = init_params(config, init_key)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), dropout_key)


def cross_entropy(model: GPT, params, windows: jax.Array, rng: jax.Array | None = None) -> jax.Array:
    """Mean next-token cross-entropy over windows (batch, seq + 1); dropout when rng is given."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    train = rng is not None
    logits = model.apply({"params": params}, inputs, train=train, rngs={"dropout": rng} if train else None)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def train_step(
    state: TrainState, windows: jax.Array, *, model: GPT, optimizer: optax.GradientTransformation, microbatches: int = 1
) -> tuple[TrainState, dict]:
    """One optimizer step on a batch of windows (batch, seq + 1).

    With microbatches > 1 the batch is split and gradients are averaged over the pieces in a
    scan inside the step: the same update as the whole batch (up to float32 summation order),
    with the activation memory of one piece. Piece i takes rows i, i + m, i + 2m, ... so that
    under data parallelism every device keeps its own rows in every piece (contiguous pieces
    would each sit on one device, and XLA would move rows between devices for every piece).
    """
    rng = jax.random.fold_in(state.rng, state.step)
    loss_and_grads = jax.value_and_grad(lambda p, w, r: cross_entropy(model, p, w, r))
    if microbatches == 1:
        loss, grads = loss_and_grads(state.params, windows, rng)
    else:
        pieces = windows.reshape(-1, microbatches, windows.shape[-1]).swapaxes(0, 1)

        def accumulate(total, xs):
            i, piece = xs
            loss, grads = loss_and_grads(state.params, piece, jax.random.fold_in(rng, i))
            return jax.tree.map(jnp.add, total, (loss, grads)), None

        zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, state.params))
        (loss, grads), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(microbatches), pieces))
        loss, grads = jax.tree.map(lambda x: x / microbatches, (loss, grads))
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def eval_step(params, windows: jax.Array, *, model: GPT) -> jax.Array:
    return cross_entropy(model, params, windows)
