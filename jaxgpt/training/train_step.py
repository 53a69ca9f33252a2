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
from jaxgpt.training.batch import MODEL_INPUTS, as_batch, length_of, rows_of, scored_weight
from jaxgpt.training.cross_entropy import softmax_cross_entropy
from jaxgpt.training.masked import example_keys, hidden_count, mask_examples

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


def cross_entropy(model: GPT, params, batch, rng: jax.Array | None = None) -> jax.Array:
    """Mean next-token cross-entropy over the positions a batch scores (its weights'
    average, where it has weights): the training loss."""
    batch = as_batch(batch)
    losses = token_losses(model, params, batch, rng)
    if "weights" not in batch:
        return losses.mean()
    return (losses * batch["weights"]).sum() / jnp.maximum(scored_weight(batch), 1.0)


def batch_weight(config: ModelConfig, rng: jax.Array, batch, batch_rows: int | None = None) -> jax.Array | float:
    """How many tokens a whole batch scores, what every piece's share of its loss is divided
    by: the sum of its weights (rows x seq where it has none) for the next-token objective; for
    the masked, the hidden positions (weighted, where the batch has weights). Without weights
    the count needs only the batch's shape and the keys, so a piece of a batch of `batch_rows`
    rows counts the whole batch's without the others' rows; with weights it needs them all."""
    batch = as_batch(batch)
    rows, length = rows_of(batch), length_of(batch)
    if batch_rows is not None and batch_rows != rows:
        assert "weights" not in batch, "a piece of a batch with weights is told the whole batch's weight"
        rows = batch_rows
    if config.objective != "masked":
        return scored_weight(batch) if "weights" in batch else float(rows * length)
    keys = example_keys(rng, jnp.arange(rows))
    if "weights" in batch:
        hidden = mask_examples(jnp.zeros((rows, length), jnp.int32), keys, config)[1]
        count = (hidden * batch["weights"]).sum()
    else:
        count = hidden_count(keys, length, config)
    return jnp.maximum(count, 1).astype(jnp.float32)


def scored(
    model: GPT,
    params,
    batch,
    rng: jax.Array,
    *,
    example_ids: jax.Array | None = None,
    batch_rows: int | None = None,
    weight: jax.Array | float | None = None,
    dropout_rng: jax.Array | None = None,
    answers: bool = False,
) -> tuple[jax.Array, dict]:
    """(the objective to differentiate, what was measured) of a batch (jaxgpt/training/batch.py; an array
    of windows (rows, seq + 1) will do), a piece of a batch of `batch_rows` rows (default: the
    piece is the whole batch) at places `example_ids` in it (default 0, 1, ...) that scores
    `weight` tokens in all (batch_weight; default: this piece's, when it is the whole batch).
    rng is the step's key (the masked objective's blanks, per example); training, with dropout
    drawn from dropout_rng, when that is given.

    Every term is the piece's share of the batch's value: a sum over the piece divided by what
    the whole batch counts. The loss is summed over the tokens scored (every position, or the
    hidden ones, each times its weight where the batch has weights) and divided by the batch's
    weight; a mixture of experts' router losses, the
    mean over the piece's sequences of each (jaxgpt/model/moe.py, averaged over the MoE layers and
    scaled by its coefficient), count each sequence once. So the shares of every piece
    (microbatches, CPU cores, devices) add up to the batch's objective whatever the pieces are,
    and the engine only adds them: a masked batch's gradient does not depend on how it is split
    (up to float32 summation order), and where every piece scores alike (next-token) the sum is
    the mean of the pieces' means. Measured: "loss" (the cross-entropy, without the router
    losses), "accuracy" for the masked objective, "router" for a mixture of experts
    (router_statistics), each as the same share. With `answers`, for a batch of examples
    (weights and segments: text pairs), the "accuracy" of the scored tokens and `exact_matches`."""
    config = model.config
    batch = as_batch(batch)
    rows = rows_of(batch)
    batch_rows = rows if batch_rows is None else batch_rows
    weight = batch_weight(config, rng, batch, batch_rows) if weight is None else weight
    tokens, weights = batch["inputs"], batch.get("weights")
    if config.objective == "masked":
        ids = jnp.arange(rows) if example_ids is None else example_ids
        inputs, hidden = mask_examples(tokens, example_keys(rng, ids), config)
        targets, scores = tokens, hidden.astype(jnp.float32)
        scores = scores if weights is None else scores * weights
    else:
        inputs, targets, scores = tokens, batch["targets"], weights
    examples = answers and weights is not None and "segments" in batch
    predict = config.objective == "masked" or examples
    train = dropout_rng is not None
    apply = partial(
        model.apply,
        {"params": params},
        inputs,
        **model_inputs(batch),
        train=train,
        rngs={"dropout": dropout_rng} if train else None,
        head=not config.loss_chunk,
    )
    outputs, sown = apply(mutable=["router"]) if config.moe is not None else (apply(), None)
    if config.loss_chunk:  # the head's input: logits and losses a chunk of positions at a time
        losses, predictions = chunked_losses(config, params, outputs, targets, predict=predict)
    else:
        losses = softmax_cross_entropy(outputs, targets)
        predictions = jnp.argmax(outputs, axis=-1) if predict else None
    loss = (losses if scores is None else losses * scores).sum() / weight
    measured = {"loss": loss}
    if predict:
        measured["accuracy"] = ((predictions == targets) * scores).sum() / weight
    if examples:
        measured |= exact_matches(predictions == targets, scores, batch["segments"])
    objective = loss
    if sown is not None:
        share = rows / batch_rows  # of the batch's sequences, each a routing group of its own
        router = jax.tree.map(lambda x: x * share, router_statistics(sown["router"], config))
        moe = config.moe
        objective = objective + moe.aux_loss * router["aux_loss"].mean() + moe.z_loss * router["z_loss"].mean()
        measured["router"] = router
    return objective, measured


def exact_matches(right: jax.Array, weights: jax.Array, segments: jax.Array) -> dict[str, jax.Array]:
    """{"exact_matches": how many examples have every scored token right, "examples": how many
    have a scored token}, of rows (b, t) whose examples are their segments. Every scored
    token's most likely continuation right is what greedy decoding needs to write the whole
    answer, so this is greedy decoding's exact match, read off one forward pass."""
    rows, length = segments.shape
    ids = (jnp.arange(rows)[:, None] * (length + 1) + segments).ravel()  # (row, segment): one id each
    scored = weights.ravel() > 0
    wrong = jax.ops.segment_sum((scored & ~right.ravel()).astype(jnp.int32), ids, rows * (length + 1))
    has_answer = jax.ops.segment_sum(scored.astype(jnp.int32), ids, rows * (length + 1)) > 0
    return {
        "exact_matches": jnp.sum(has_answer & (wrong == 0)).astype(jnp.float32),
        "examples": jnp.sum(has_answer).astype(jnp.float32),
    }


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


def router_statistics(router: dict, config: ModelConfig) -> dict[str, jax.Array]:
    """What each MoE layer sowed in the "router" collection (jaxgpt/model/moe.py: its two losses, the
    load per expert, the dropped fraction, the routing entropy), each stacked over the MoE
    layers in order (config.moe_layers)."""
    if config.scan_layers:  # one stack of identical layers: already (n_layer, ...)
        return {name: value[0] for name, value in router["blocks"]["moe"].items()}
    layers = [router[f"block_{i}"]["moe"] for i in config.moe_layers]
    return {name: jnp.stack([layer[name][0] for layer in layers]) for name in layers[0]}


def trained_and_fixed(config: ModelConfig, params) -> tuple:
    """(what the step differentiates, what it keeps fixed, or None): the gradient's tree is the
    first's. An adapted model's gradient is its adapters' alone (lora.split: None at each frozen
    weight; `apply_gradients`); any other model's is every parameter's. `params` may be shapes."""
    return lora.split(config, params) if config.lora_rank else (params, None)


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
):
    """(what was measured, gradient) of the objective (`scored`) over a batch: the whole batch,
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
    if model.config.objective != "masked":  # what scores a row does not depend on its place
        example_ids = None
    elif example_ids is None:
        example_ids = jnp.arange(rows)
    dropout_rng = rng if dropout_rng is None else dropout_rng
    weight = batch_weight(model.config, rng, batch, batch_rows) if weight is None else weight

    trained, fixed = trained_and_fixed(model.config, params)

    def measured_and_grads(piece, ids, piece_dropout):
        def objective(t):
            p = t if fixed is None else lora.joined(t, fixed)
            return scored(
                model, p, piece, rng, example_ids=ids, batch_rows=batch_rows, weight=weight, dropout_rng=piece_dropout
            )

        (_, measured), grads = jax.value_and_grad(objective, has_aux=True)(trained)
        return measured, grads

    if microbatches == 1:
        return measured_and_grads(batch, example_ids, dropout_rng)

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
) -> tuple[TrainState, dict]:
    """One optimizer step on a batch (jaxgpt/training/batch.py); dropout draws from fold_in(state.rng,
    step), so a step's randomness does not depend on the steps before it."""
    rng = jax.random.fold_in(state.rng, state.step)
    measured, grads = gradients(state.params, batch, rng, model=model, microbatches=microbatches)
    return apply_gradients(state, measured, grads, optimizer=optimizer, layer_grad_norms=layer_grad_norms)


def eval_step(params, batch, *, model: GPT) -> dict[str, jax.Array]:
    """{"loss": the mean loss over the positions the batch scores}; for the masked objective its
    "accuracy" too (jaxgpt/training/masked.py), and "scored", the hidden tokens both are means over,
    which differ from batch to batch (as the scored positions of a batch with weights do: then
    "scored" is their weight).
    For a model trained without the causal mask (which sees
    the token it predicts) "past_only_loss": the same weights under the causal mask, each
    position predicted from the tokens before it alone, as in generation (the KV-cache
    decode, where no later token is written yet, computes the same)."""
    batch = as_batch(batch)
    if model.config.objective == "masked":  # the same hidden positions at every evaluation
        key = jax.random.key(EVALUATION_MASKS)
        hidden = batch_weight(model.config, key, batch)
        return scored(model, params, batch, key, weight=hidden)[1] | {"scored": hidden}
    if "weights" in batch:  # examples with what they score: the loss, accuracy, exact matches
        measured = scored(model, params, batch, jax.random.key(EVALUATION_MASKS), answers=True)[1]
        return measured | {"scored": scored_weight(batch)}
    losses = {"loss": cross_entropy(model, params, batch)}
    if not model.config.causal:
        losses["past_only_loss"] = cross_entropy(GPT(model.config.replace(causal=True)), params, batch)
    return losses
