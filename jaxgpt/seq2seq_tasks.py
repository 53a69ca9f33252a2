"""Sequence-to-sequence tasks for the encoder–decoder (jaxgpt/encoder_decoder.py), and how it
is trained and decoded: teacher forcing, then greedy decoding with the caches.

The tasks are digit strings, generated, so nothing is downloaded and every answer is known:
  reverse   "31415926" -> "62951413": output position i reads source position L - 1 - i, so
            cross-attention learns an anti-diagonal (the paper's alignment, made visible).
  sort      "31415926" -> "11234569": each output digit depends on the whole source (how
            many of each digit it holds), so no single source position answers it.
Source and target are `length` digits; the decoder reads BOS then the target's first
length - 1 digits and predicts the target (teacher forcing: the true previous digit, not
its own guess, at every position in training).
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgpt.config import ModelConfig
from jaxgpt.encoder_decoder import EncoderDecoder
from jaxgpt.errors import UserError
from jaxgpt.model import zeros_shaped

TASKS = ("reverse", "sort")
DIGITS = 10
BOS = DIGITS  # the token that starts every decoder input
VOCAB = DIGITS + 1
TRAINING, HELD_OUT = 1, 0  # the example streams (numpy seed sequences (seed, stream, ...))


def examples(task: str, count: int, length: int, seed: int | tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(source, target), each (count, length) digits, the target the task's answer; `seed` is
    numpy's (an int or a tuple of them, each tuple its own stream)."""
    source = np.random.default_rng(seed).integers(0, DIGITS, (count, length)).astype(np.int32)
    if task == "reverse":
        return source, source[:, ::-1].copy()
    if task == "sort":
        return source, np.sort(source, axis=1)
    raise ValueError(f"unknown task {task!r}; one of {TASKS}")


def decoder_input(target: jnp.ndarray) -> jnp.ndarray:
    """BOS then all but the last target token: position i sees target[:i] and predicts target[i]."""
    return jnp.concatenate([jnp.full((target.shape[0], 1), BOS, target.dtype), target[:, :-1]], axis=1)


def teacher_forcing_loss(config: ModelConfig, params, source: jnp.ndarray, target: jnp.ndarray) -> jnp.ndarray:
    """Mean cross-entropy of every target token given the source and the true tokens before it."""
    logits = EncoderDecoder(config).apply({"params": params}, source, decoder_input(target))
    return optax.softmax_cross_entropy_with_integer_labels(logits, target).mean()


@partial(jax.jit, static_argnums=(0, 2))
def init(config: ModelConfig, seed: int, length: int) -> dict:
    """Fresh parameters (the "params" collection) of the encoder–decoder `config` describes."""
    source = jnp.zeros((1, length), jnp.int32)
    return EncoderDecoder(config).init(jax.random.key(seed), source, source)["params"]


@partial(jax.jit, static_argnums=(0, 3))
def greedy_decode(config: ModelConfig, params, source: jnp.ndarray, length: int) -> jnp.ndarray:
    """(batch, length) tokens, each the most likely given the source and the tokens chosen
    before it. The source is encoded once; the first step hands the memory to every
    cross-attention layer, which caches its keys and values; each later step feeds one token
    and reads both caches, so a step costs one position's work."""
    model = EncoderDecoder(config)
    memory = model.apply({"params": params}, source, method="encode")
    start = jnp.full((source.shape[0], 1), BOS, jnp.int32)
    cache = empty_cache(config, memory, start)
    logits, variables = model.apply(
        {"params": params, "cache": cache}, start, memory, True, method="decode", mutable=["cache"]
    )
    token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]

    def step(carry, _):
        token, cache = carry
        logits, variables = model.apply(
            {"params": params, "cache": cache}, token, None, True, method="decode", mutable=["cache"]
        )
        following = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
        return (following, variables["cache"]), token[:, 0]

    (last, _), tokens = jax.lax.scan(step, (token, variables["cache"]), None, length=length - 1)
    return jnp.concatenate([tokens.T, last], axis=1)


def empty_cache(config: ModelConfig, memory: jnp.ndarray, start: jnp.ndarray) -> dict:
    """Zeroed caches shaped for this batch: the self-attention's of block_size positions and
    the cross-attention's of the memory's length."""
    model = EncoderDecoder(config)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), start, memory, True, method="decode")["cache"])
    return zeros_shaped(shapes)


def cross_attention_weights(config: ModelConfig, params, source, target) -> np.ndarray:
    """(n_layer, batch, n_head, t, s) float32: how much each decoder position, reading the
    target under teacher forcing, attends to each source position, in every decoder block."""
    _, state = EncoderDecoder(config).apply(
        {"params": params}, jnp.asarray(source), decoder_input(jnp.asarray(target)), mutable=["intermediates"]
    )
    blocks = state["intermediates"]["decoder"]
    layers = [blocks[f"block_{i}"]["cross"]["attention_weights"][0] for i in range(config.n_layer)]
    return np.stack([np.asarray(a).reshape(a.shape[0], config.n_head, *a.shape[-2:]) for a in layers])


class Accuracy(NamedTuple):
    sequences: float  # the share of outputs right in every position
    tokens: float  # the share of output tokens right


def accuracy(decoded: np.ndarray, target: np.ndarray) -> Accuracy:
    right = np.asarray(decoded) == np.asarray(target)
    return Accuracy(float(right.all(axis=1).mean()), float(right.mean()))


def train(
    config: ModelConfig,
    task: str,
    *,
    steps: int,
    length: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    report=None,
    report_every: int = 100,
) -> dict:
    """Parameters trained by AdamW with teacher forcing on fresh examples every step (batch i
    from the stream (seed, TRAINING, i); `held_out` reads (seed, HELD_OUT), which training
    never does), warmup over the first 5% and cosine decay to a tenth. `report(step, loss)` is
    called every report_every steps."""
    params = init(config, seed, length)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr / 10)
    optimizer = optax.adamw(schedule, b2=0.95, weight_decay=0.01)

    @jax.jit
    def step(params, opt_state, source, target):
        loss, grads = jax.value_and_grad(lambda p: teacher_forcing_loss(config, p, source, target))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = optimizer.init(params)
    for i in range(steps):
        source, target = examples(task, batch_size, length, (seed, TRAINING, i))
        params, opt_state, loss = step(params, opt_state, source, target)
        if report and ((i + 1) % report_every == 0 or i + 1 == steps):
            report(i + 1, float(loss))
    return params


def held_out(task: str, length: int, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Examples from a stream `train` never draws from."""
    return examples(task, count, length, (seed, HELD_OUT))


SAVED_CONFIG, SAVED_PARAMS = "seq2seq.json", "params.msgpack"


def save(directory: Path, config: ModelConfig, task: str, params) -> None:
    """The trained model in `directory`, for `attention-maps --workdir`: its config and task as
    JSON, its parameters in flax's msgpack serialisation."""
    from flax import serialization

    directory.mkdir(parents=True, exist_ok=True)
    (directory / SAVED_PARAMS).write_bytes(serialization.to_bytes(jax.device_get(params)))
    (directory / SAVED_CONFIG).write_text(json.dumps({"task": task, "model": dataclasses.asdict(config)}, indent=2))


def is_saved(directory: Path) -> bool:
    return (Path(directory) / SAVED_CONFIG).is_file()


def load(directory: Path) -> tuple[ModelConfig, str, dict]:
    """(config, task, params) that `save` wrote; one line if they cannot be read."""
    from flax import serialization

    try:
        saved = json.loads((directory / SAVED_CONFIG).read_text())
        config = ModelConfig(**saved["model"])
        template = init(config, 0, config.block_size)
        params = serialization.from_bytes(template, (directory / SAVED_PARAMS).read_bytes())
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{directory} holds no readable seq2seq model ({type(error).__name__}: {error})") from None
    return config, saved["task"], params
