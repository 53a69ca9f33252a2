"""The pure core of training: a state pytree and the functions over it (the loss, its
gradients, the update, and `train_step`, which is the three in order).

Nothing here does I/O, reads the clock or knows about devices, so each function can be
jit-compiled, sharded and tested as a plain function of its inputs. How they are compiled and
run on the machine's devices is jaxgpt/hardware/: over a mesh (mesh_step.py) or one program
per CPU core (core_parallel.py), chosen in step_choice.py.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgpt.config import ModelConfig
from jaxgpt.masked import masked_token_loss
from jaxgpt.model import GPT, init_params, zeros_shaped

EVALUATION_MASKS = 0  # the seed of the positions the masked objective hides at evaluation


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


def mixture_of_experts_objective(model: GPT, params, windows: jax.Array, rng: jax.Array) -> tuple[jax.Array, dict]:
    """(the objective a mixture of experts trains on, what it measured): the cross-entropy plus
    each router loss, averaged over the MoE layers, times its coefficient
    (config.MixtureOfExperts); measured are the cross-entropy ("loss") and the MoE layers'
    router statistics ("router": router_statistics)."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    logits, sown = model.apply({"params": params}, inputs, train=True, rngs={"dropout": rng}, mutable=["router"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    router = router_statistics(sown["router"], model.config)
    moe = model.config.moe
    objective = loss + moe.aux_loss * router["aux_loss"].mean() + moe.z_loss * router["z_loss"].mean()
    return objective, {"loss": loss, "router": router}


def router_statistics(router: dict, config: ModelConfig) -> dict[str, jax.Array]:
    """What each MoE layer sowed in the "router" collection (jaxgpt/moe.py: its two losses, the
    load per expert, the dropped fraction, the routing entropy), each stacked over the MoE
    layers in order (config.moe_layers)."""
    if config.scan_layers:  # one stack of identical layers: already (n_layer, ...)
        return {name: value[0] for name, value in router["blocks"]["moe"].items()}
    layers = [router[f"block_{i}"]["moe"] for i in config.moe_layers]
    return {name: jnp.stack([layer[name][0] for layer in layers]) for name in layers[0]}


def gradients(params, windows: jax.Array, rng: jax.Array, *, model: GPT, microbatches: int = 1):
    """(what was measured, mean gradient) over a batch of windows (batch, seq + 1); measured is
    {"loss": the mean cross-entropy}, and for a mixture of experts its router statistics too
    (mixture_of_experts_objective: the gradient is then the objective's, with the router losses);
    for the masked objective the loss and accuracy on the hidden tokens (jaxgpt/masked.py).

    With microbatches > 1 the batch is split and gradients are averaged over the pieces in a
    scan: the same result as the whole batch (up to float32 summation order), with the
    activation memory of one piece. Piece i takes rows i, i + m, i + 2m, ... so that under data
    parallelism every device keeps its own rows in every piece (contiguous pieces would each
    sit on one device, and XLA would move rows between devices for every piece).
    """
    if model.config.objective == "masked":

        def measured_and_grads(p, w, r):
            (_, measured), grads = jax.value_and_grad(partial(masked_token_loss, train=True), argnums=1, has_aux=True)(
                model, p, w, r
            )
            return measured, grads
    elif model.config.moe is None:
        loss_and_grads = jax.value_and_grad(lambda p, w, r: cross_entropy(model, p, w, r))

        def measured_and_grads(p, w, r):
            loss, grads = loss_and_grads(p, w, r)
            return {"loss": loss}, grads
    else:

        def measured_and_grads(p, w, r):
            (_, measured), grads = jax.value_and_grad(mixture_of_experts_objective, argnums=1, has_aux=True)(
                model, p, w, r
            )
            return measured, grads

    if microbatches == 1:
        return measured_and_grads(params, windows, rng)
    pieces = windows.reshape(-1, microbatches, windows.shape[-1]).swapaxes(0, 1)

    def accumulate(total, xs):
        i, piece = xs
        return jax.tree.map(jnp.add, total, measured_and_grads(params, piece, jax.random.fold_in(rng, i))), None

    shapes = jax.eval_shape(measured_and_grads, params, pieces[0], rng)
    zeros = zeros_shaped(shapes)
    total, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(microbatches), pieces))
    return jax.tree.map(lambda x: x / microbatches, total)


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
    measured: dict,
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
    metrics = measured | {"grad_norm": optax.tree.norm(grads)}
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
    measured, grads = gradients(state.params, windows, rng, model=model, microbatches=microbatches)
    return apply_gradients(state, measured, grads, optimizer=optimizer, layer_grad_norms=layer_grad_norms)


def eval_step(params, windows: jax.Array, *, model: GPT) -> dict[str, jax.Array]:
    """{"loss": the mean loss}; for the masked objective its "accuracy" too (jaxgpt/masked.py).
    For a model trained without the causal mask (which sees
    the token it predicts) "past_only_loss": the same weights under the causal mask, each
    position predicted from the tokens before it alone, as in generation (the KV-cache
    decode, where no later token is written yet, computes the same)."""
    if model.config.objective == "masked":  # the same hidden positions at every evaluation
        return masked_token_loss(model, params, windows, jax.random.key(EVALUATION_MASKS))[1]
    losses = {"loss": cross_entropy(model, params, windows)}
    if not model.config.causal:
        losses["past_only_loss"] = cross_entropy(GPT(model.config.replace(causal=True)), params, windows)
    return losses
