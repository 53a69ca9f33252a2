"""Continuous batching's two compiled programs: decode a token for every slot at once, and put a
new request's prompt into a free slot.

A server decodes many requests together. Each slot is one sequence with its own KV cache, its
own position and its own sampling settings; a request joins a free slot between steps and
leaves when it ends, while the others go on. The model's decoding call (jaxgpt/model/sampling.py,
a KV cache whose position is one number) is vmapped over the slots, so each slot is exactly
`sample`'s one-row decode with its own cache index: the matmuls batch over the slots (a weight
matrix is read once a step for all of them), and no slot sees another's keys.

A prompt is prefilled alone, padded on the right to the next of a few compiled lengths
(`prefill_lengths`): causal attention keeps the padding out of every real position, and the
slot's position is then set to the prompt's length, so the first decoded token overwrites the
padding's keys. Step i of a request draws its randomness from fold_in(key(seed), i), as
`sample --seed` does, so a request's tokens do not depend on which slot it gets or who else is
being served.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model.sampling import sample_rows
from jaxgpt.model.transformer import GPT, init_cache

# How many alternatives a response's logprobs may list per token (OpenAI's top_logprobs allows 20).
MOST_TOP_LOGPROBS = 20


class Slots(NamedTuple):
    """Everything the device keeps of the slots between steps, one row a slot."""

    cache: dict  # the model's "cache" collection, a leading slot axis on each leaf
    token: jax.Array  # (slots,) int32: the token each slot feeds next
    step: jax.Array  # (slots,) int32: the step whose token it samples next
    key: jax.Array  # (slots,) random keys: key(seed) of the request it serves
    temperature: jax.Array  # (slots,) float32; 0 is greedy
    top_k: jax.Array  # (slots,) int32; 0 keeps every token
    top_p: jax.Array  # (slots,) float32; 1 keeps every token


class Drawn(NamedTuple):
    """What one position's prediction gives a response: the token drawn (or read, in a prompt),
    its log-probability under the model's distribution (before temperature, top-k and top-p),
    and the most likely alternatives."""

    token: jax.Array
    logprob: jax.Array
    top_ids: jax.Array  # (..., MOST_TOP_LOGPROBS)
    top_logprobs: jax.Array


def prefill_lengths(context: int, shortest: int = 16) -> tuple[int, ...]:
    """The compiled prompt lengths: 16, 64, 256, ... (each four times the last), then the whole
    context. A prompt pads to the next one, so at most 4x its work is wasted, and a handful of
    programs serve every length."""
    lengths, n = [], shortest
    while n < context:
        lengths.append(n)
        n *= 4
    return (*lengths, context)


def empty_slots(config: ModelConfig, count: int) -> Slots:
    """`count` free slots, each a one-row KV cache of config.block_size positions."""
    one = init_cache(config, 1)
    return Slots(
        cache=jax.tree.map(lambda leaf: jnp.zeros((count, *leaf.shape), leaf.dtype), one),
        token=jnp.zeros((count,), jnp.int32),
        step=jnp.zeros((count,), jnp.int32),
        key=jax.random.split(jax.random.key(0), count),
        temperature=jnp.zeros((count,), jnp.float32),
        top_k=jnp.zeros((count,), jnp.int32),
        top_p=jnp.ones((count,), jnp.float32),
    )


def _drawn(logits: jax.Array, token: jax.Array) -> Drawn:
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    top_logprobs, top_ids = jax.lax.top_k(logprobs, MOST_TOP_LOGPROBS)
    chosen = jnp.take_along_axis(logprobs, token[..., None], axis=-1)[..., 0]
    return Drawn(token, chosen, top_ids.astype(jnp.int32), top_logprobs)


@partial(jax.jit, static_argnames=("config",), donate_argnums=(2,))
def decode_slots(config: ModelConfig, params, slots: Slots) -> tuple[Slots, Drawn]:
    """Every slot feeds its token and draws the next: one compiled step for all of them. A free
    slot computes too (its answer is ignored): the step's shapes never change. (A step over only
    the busy slots, a slice of the cache out and back, cost more than the whole step once the
    cache outgrew a few megabytes: XLA wrote the whole cache back, docs/serving.md.)"""

    def one_row(cache, token):
        logits, state = GPT(config).apply(
            {"params": params, "cache": cache}, token[None, None], decode=True, mutable=["cache"]
        )
        return logits[0, -1], state["cache"]

    logits, cache = jax.vmap(one_row)(slots.cache, slots.token)
    keys = jax.vmap(jax.random.fold_in)(slots.key, slots.step)
    token = sample_rows(logits, keys, slots.temperature, slots.top_k, slots.top_p)
    return slots._replace(cache=cache, token=token, step=slots.step + 1), _drawn(logits, token)


@partial(jax.jit, static_argnames=("config",), donate_argnums=(2,))
def join_slot(
    config: ModelConfig, params, slots: Slots, slot, prompt, length, key, temperature, top_k, top_p
) -> tuple[Slots, Drawn, Drawn]:
    """Prefill `prompt` (1, padded length) int32, whose first `length` tokens are real, into slot
    `slot`, and draw the request's first token (step 0). Returns (slots, the first token's Drawn,
    the prompt's: for each position after the first, its own token read as a prediction of the
    one before, which is what `echo` with logprobs reports)."""
    fresh = init_cache(config, 1)
    logits, state = GPT(config).apply({"params": params, "cache": fresh}, prompt, decode=True, mutable=["cache"])
    cache = dict(state["cache"], index=jnp.asarray(length, jnp.int32))  # the padding's keys get overwritten
    last = jax.lax.dynamic_index_in_dim(logits[0], length - 1, keepdims=False)
    first = sample_rows(last[None], jax.random.fold_in(key, 0)[None], temperature[None], top_k[None], top_p[None])[0]
    put = lambda whole, row: jax.lax.dynamic_update_index_in_dim(whole, row, slot, 0)  # noqa: E731
    slots = Slots(
        cache=jax.tree.map(put, slots.cache, cache),
        token=slots.token.at[slot].set(first),
        step=slots.step.at[slot].set(1),
        key=slots.key.at[slot].set(key),
        temperature=slots.temperature.at[slot].set(temperature),
        top_k=slots.top_k.at[slot].set(top_k),
        top_p=slots.top_p.at[slot].set(top_p),
    )
    prompt_read = _drawn(logits[0, :-1], prompt[0, 1:])
    return slots, _drawn(last, first), prompt_read
