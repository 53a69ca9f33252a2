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
from jaxgpt.model import lora
from jaxgpt.model.transformer import GPT, head_logits, head_weights, init_params, zeros_shaped
from jaxgpt.training.batch import MODEL_INPUTS, as_batch, rows_of
from jaxgpt.training.cross_entropy import softmax_cross_entropy
from jaxgpt.training.objectives import Objective, Scored, auxiliary_terms, objective_of, sown_collections

EVALUATION_MASKS = 0  # the key of what an objective draws at evaluation (the masked one's hidden positions)


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


def create_train_state(
    config: ModelConfig, optimizer: optax.GradientTransformation, seed: int | jax.Array
) -> TrainState:
    init_key, dropout_key = run_keys(seed)
    params = init_params(config, init_key)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), dropout_key)


def model_inputs(batch: dict) -> dict:
    """The batch's fields the model reads beside its tokens (segments, positions, an
    encoder–decoder's sources), where given."""
    return {name: batch[name] for name in MODEL_INPUTS if name in batch}


def token_losses(
    model: GPT, params, batch, rng: jax.Array | None = None, interventions: dict | None = None
) -> jax.Array:
    """Next-token cross-entropy (rows, seq) at each position of a batch (jaxgpt/training/batch.py; an
    array of windows (rows, seq + 1) will do), unweighted; dropout when rng is given;
    interventions (jaxgpt/model/sites.py; `jaxgpt.lab.activations.interventions_collection`)
    change named activations, evaluate's head removal among them. With model.loss_chunk dividing seq,
    the logits are computed a chunk at a time, as training computes them: an evaluation never
    needs more memory for them than a training step."""
    batch = as_batch(batch)
    inputs, targets = batch["inputs"], batch["targets"]
    train = rng is not None
    variables = {"params": params} | ({"interventions": interventions} if interventions is not None else {})
    chunk = model.config.loss_chunk
    chunked = bool(chunk) and inputs.shape[1] % chunk == 0
    outputs = model.apply(
        variables,
        inputs,
        **model_inputs(batch),
        train=train,
        rngs={"dropout": rng} if train else None,
        head=not chunked,
    )
    if chunked:
        return chunked_losses(model.config, params, outputs, targets)[0]
    return softmax_cross_entropy(outputs, targets)


def batch_weight(
    config: ModelConfig, rng: jax.Array, batch, batch_rows: int | None = None, objective: Objective | None = None
) -> jax.Array | float:
    """What the whole batch scores under `objective` (default: the model's; `Objective.weight`),
    what every piece's share of its loss is divided by."""
    return (objective or objective_of(config)).weight(config, rng, as_batch(batch), batch_rows)


def scored(
    model: GPT,
    params,
    batch,
    rng: jax.Array,
    *,
    objective: Objective | None = None,
    example_ids: jax.Array | None = None,
    batch_rows: int | None = None,
    weight: jax.Array | float | None = None,
    dropout_rng: jax.Array | None = None,
    evaluating: bool = False,
) -> tuple[jax.Array, dict]:
    """(the value to differentiate, what was measured) of a batch (jaxgpt/training/batch.py; an
    array of windows (rows, seq + 1) will do) under `objective` (default: the model's), or of a
    piece of `batch_rows` rows of a batch, at places `example_ids` in it, that scores `weight`
    in all (default: this piece's, when it is the whole batch). rng is the step's key; dropout
    draws from dropout_rng where given (training). The loss is the objective's weighted sum
    over the positions it scores divided by the batch's weight, plus the auxiliary terms, each
    the piece's share of the batch's (jaxgpt/training/objectives.py): the pieces' shares of
    any split (microbatches, CPU cores, devices) add up to the batch's. Measured: "loss"
    (without the auxiliary terms), what the objective measures of its predictions, and the
    auxiliary terms' statistics."""
    config, batch = model.config, as_batch(batch)
    objective = objective or objective_of(config)
    rows = rows_of(batch)
    batch_rows = rows if batch_rows is None else batch_rows
    weight = objective.weight(config, rng, batch, batch_rows) if weight is None else weight
    inputs, targets, scores = objective.read(config, batch, rng, example_ids)
    predict = objective.predicts(batch, evaluating)
    outputs, sown = forward(model, params, inputs, batch, dropout_rng, sown_collections(config, evaluating))
    losses, predictions = per_position(config, params, outputs, targets, predict)
    weighted, sums = objective.position_losses(losses, scores, batch)
    loss = weighted.sum() / weight
    said = {name: total / weight for name, total in sums.items()}
    measured = {"loss": loss} | said | objective.measured(config, predictions, targets, scores, batch, weight)
    losses_of = partial(head_losses, config, params)
    beside = Scored(targets, scores, batch.get("segments"), weight, rows / batch_rows, losses_of)
    added, statistics = auxiliary_terms(config, sown, beside)
    return loss + added, measured | statistics


def forward(model: GPT, params, inputs: jax.Array, batch: dict, dropout_rng: jax.Array | None, collections: list):
    """(the model's outputs, what its layers sowed in `collections` for the terms beside the
    objective's loss, or {}): logits, or with model.loss_chunk the head's input features
    (`per_position` reads them)."""
    train = dropout_rng is not None
    apply = partial(
        model.apply,
        {"params": params},
        inputs,
        **model_inputs(batch),
        train=train,
        rngs={"dropout": dropout_rng} if train else None,
        head=not model.config.loss_chunk,
    )
    return apply(mutable=collections) if collections else (apply(), {})


def per_position(config: ModelConfig, params, outputs: jax.Array, targets: jax.Array, predict: bool):
    """(each position's cross-entropy, with `predict` its most likely token else None) of the
    model's outputs: logits, or with model.loss_chunk the head's input features."""
    if config.loss_chunk:  # the head's input: logits and losses a chunk of positions at a time
        return chunked_losses(config, params, outputs, targets, predict=predict)
    return softmax_cross_entropy(outputs, targets), jnp.argmax(outputs, axis=-1) if predict else None


def head_losses(config: ModelConfig, params, features: jax.Array, targets: jax.Array) -> jax.Array:
    """Each position's cross-entropy of the LM head reading `features` (batch, seq, d_model),
    a chunk at a time with model.loss_chunk, as the objective's."""
    if config.loss_chunk:
        return chunked_losses(config, params, features, targets)[0]
    return softmax_cross_entropy(head_logits(config, head_weights(config, params), features), targets)


def chunked_losses(
    config: ModelConfig, params, features: jax.Array, targets: jax.Array, predict: bool = False
) -> tuple[jax.Array, jax.Array | None]:
    """(cross-entropy, with `predict` the most likely token else None), each (batch, seq), from
    the LM head's input features (batch, seq, d_model), config.loss_chunk positions at a time:
    one chunk's logits exist at a time, and the backward pass recomputes each chunk's from its
    features (jax.checkpoint) instead of keeping them all. The same numbers as the whole
    logits' up to float32 summation order."""
    b, t, d = features.shape
    chunks = t // config.loss_chunk
    head = head_weights(config, params)

    @jax.checkpoint
    def one_chunk(piece):
        chunk_features, chunk_targets = piece  # (b, chunk, d), (b, chunk)
        logits = head_logits(config, head, chunk_features)
        losses = softmax_cross_entropy(logits, chunk_targets)
        return losses, jnp.argmax(logits, axis=-1) if predict else None

    def by_chunk(x):  # (b, t, ...) -> (chunks, b, chunk, ...)
        return x.reshape(b, chunks, config.loss_chunk, *x.shape[2:]).swapaxes(0, 1)

    def unchunked(x):
        return None if x is None else x.swapaxes(0, 1).reshape(b, t)

    losses, predictions = jax.lax.map(one_chunk, (by_chunk(features), by_chunk(targets)))
    return unchunked(losses), unchunked(predictions)


def gradients(
    params,
    batch,
    rng: jax.Array,
    *,
    model: GPT,
    microbatches: int = 1,
    example_ids: jax.Array | None = None,
    batch_rows: int | None = None,
    weight: jax.Array | float | None = None,
    dropout_rng: jax.Array | None = None,
    objective: Objective | None = None,
):
    """(what was measured, gradient) of `objective` (default: the model's; `scored`) over a batch: the whole batch,
    or with `example_ids`, `batch_rows` and the whole batch's `weight` (batch_weight) one core's
    share of it, whose measurements and gradient then add to the other cores' to give the
    batch's. rng is the step's key; dropout draws from dropout_rng (default rng).

    With microbatches > 1 the rows are split and the pieces' shares added in a scan: the same
    result as the whole (up to float32 summation order), with the activation memory of one
    piece. The batch's weight is counted once, before the split. Piece i takes rows i, i + m,
    i + 2m, ... so that under data parallelism every device keeps its own rows in every piece
    (contiguous pieces would each sit on one device, and XLA would move rows between devices
    for every piece); its dropout draws from fold_in(dropout_rng, i).
    """
    batch = as_batch(batch)
    rows = rows_of(batch)
    batch_rows = rows if batch_rows is None else batch_rows
    objective = objective or objective_of(model.config)
    example_ids = objective.example_ids(rows, example_ids)
    dropout_rng = rng if dropout_rng is None else dropout_rng
    weight = batch_weight(model.config, rng, batch, batch_rows, objective) if weight is None else weight

    trained, fixed = lora.split(model.config, params)

    def measured_and_grads(piece, ids, piece_dropout):
        def loss(t):
            p = t if fixed is None else lora.joined(t, fixed)
            return scored(
                model, p, piece, rng, objective=objective, example_ids=ids, batch_rows=batch_rows, weight=weight,
                dropout_rng=piece_dropout,
            )  # fmt: skip

        (_, measured), grads = jax.value_and_grad(loss, has_aux=True)(trained)
        return measured, grads

    if microbatches == 1:
        return measured_and_grads(batch, example_ids, dropout_rng)
    return summed_over_pieces(measured_and_grads, batch, example_ids, dropout_rng, microbatches)


def summed_over_pieces(measured_and_grads, batch, example_ids, dropout_rng, microbatches: int):
    """measured_and_grads(piece, its example ids, its dropout key) of each of `microbatches`
    pieces of the batch, added in a scan (`gradients` says how the rows are split)."""

    def split(x):  # piece i: rows i, i + m, i + 2m, ...
        return None if x is None else x.reshape(-1, microbatches, *x.shape[1:]).swapaxes(0, 1)

    pieces, piece_ids = jax.tree.map(split, batch), split(example_ids)

    def accumulate(total, xs):
        i, piece, ids = xs
        return jax.tree.map(jnp.add, total, measured_and_grads(piece, ids, jax.random.fold_in(dropout_rng, i))), None

    first_ids = None if piece_ids is None else piece_ids[0]
    first = jax.tree.map(lambda x: x[0], pieces)
    zeros = zeros_shaped(jax.eval_shape(measured_and_grads, first, first_ids, dropout_rng))
    total, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(microbatches), pieces, piece_ids))
    return total


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
    layer_grad_norms, `gradient_norms` too). A None gradient (a frozen weight's, never computed)
    is zero to the optimizer, whose update leaves that weight as it is; the norms leave it out."""

    def zero_where_none(g, p):
        return jnp.zeros_like(p) if g is None else g

    whole = jax.tree.map(zero_where_none, grads, state.params, is_leaf=lambda x: x is None)
    updates, opt_state = optimizer.update(whole, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = measured | {"grad_norm": optax.tree.norm(grads)}
    if layer_grad_norms:
        metrics["layer_grad_norms"] = gradient_norms(grads)
    return new_state, metrics


def train_step(
    state: TrainState,
    batch,
    *,
    model: GPT,
    optimizer: optax.GradientTransformation,
    microbatches: int = 1,
    layer_grad_norms: bool = False,
    objective: Objective | None = None,
) -> tuple[TrainState, dict]:
    """One optimizer step on a batch (jaxgpt/training/batch.py) under `objective` (default: the
    model's); dropout draws from fold_in(state.rng, step), so a step's randomness does not
    depend on the steps before it."""
    rng = jax.random.fold_in(state.rng, state.step)
    measured, grads = gradients(state.params, batch, rng, model=model, microbatches=microbatches, objective=objective)
    return apply_gradients(state, measured, grads, optimizer=optimizer, layer_grad_norms=layer_grad_norms)


def eval_step(params, batch, *, model: GPT, objective: Objective | None = None) -> dict[str, jax.Array]:
    """What `objective` (default: the model's) measures of a batch, the model deterministic:
    "loss", the mean over the positions the batch scores (the masked objective's are the same
    at every evaluation), what it measures of its predictions, and "scored", the weight those
    means are over, where batches score unequal numbers of positions. For a model trained
    without the causal mask (which sees the token it predicts) "past_only_loss": the same
    weights under the causal mask, each position predicted from the tokens before it alone, as
    in generation (the KV-cache decode, where no later token is written yet, computes the same)."""
    batch, config = as_batch(batch), model.config
    objective = objective or objective_of(config)
    key = jax.random.key(EVALUATION_MASKS)
    weight = objective.weight(config, key, batch)
    measured = scored(model, params, batch, key, objective=objective, weight=weight, evaluating=True)[1]
    if objective.counts_scored(batch):
        measured["scored"] = weight
    if not config.causal and objective.reads_the_past:
        causal = GPT(config.replace(causal=True))
        measured["past_only_loss"] = scored(causal, params, batch, key, objective=objective, weight=weight)[1]["loss"]
    return measured
