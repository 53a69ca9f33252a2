"""The KV cache that decoding keeps: every position's keys and values, written once and read at
every later step, so generating a token costs one position's work rather than the prefix's.

The cache is a static (batch, block_size, n_kv_head, head_dim) array per layer, in Flax's
"cache" collection, and it rolls: position p goes to slot p % block_size. Generation can then
go on past block_size, each query seeing the last block_size positions; the mask reads which
position each slot holds (`slot_positions`). That is sliding-window attention with a window of
block_size, which only models with relative positions (rope, alibi, none) can use;
`jaxgpt.model.sampling.check_length` keeps the others inside block_size, where nothing wraps.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model.products import compute_dtype


def slot_positions(slots: int, last: jnp.ndarray) -> jnp.ndarray:
    """The position each slot of the cache holds once position `last` is written.

    Position p is written to slot p % slots, so slot j holds the latest p <= last with
    p = j (mod slots): last - ((last - j) mod slots). A slot not yet written comes out
    negative. Until the cache wraps (last < slots) this is just j for the written slots.
    """
    return last - jnp.mod(last - jnp.arange(slots), slots)


def extend(layer, k: jnp.ndarray, v: jnp.ndarray, cache_index: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Write an attention layer's keys/values for positions [cache_index, cache_index + t) into
    its cache (the Flax module `layer`'s "cache" collection); return the whole cache."""
    slots = layer.config.block_size
    if k.shape[1] > slots:
        raise ValueError(f"{k.shape[1]} tokens in one call do not fit a KV cache of block_size={slots} slots")
    shape = (k.shape[0], slots, *k.shape[2:])
    cached_k = layer.variable("cache", "key", jnp.zeros, shape, k.dtype)
    cached_v = layer.variable("cache", "value", jnp.zeros, shape, v.dtype)
    written = jnp.mod(cache_index + jnp.arange(k.shape[1]), slots)
    cached_k.value = cached_k.value.at[:, written].set(k)
    cached_v.value = cached_v.value.at[:, written].set(v)
    return cached_k.value, cached_v.value


def cache_bytes(config: ModelConfig, tokens: int, batch_size: int = 1) -> int:
    """Bytes of the cache that holds `tokens` positions of `batch_size` sequences: a key and a
    value vector of head_dim per key/value head, per layer, per position. This is what
    grouped-query (n_kv_head < n_head) and multi-query (n_kv_head = 1) attention shrink. A
    convolution in attention's place (model.token_mixer) keeps one vector of d_model instead."""
    width = config.d_model if config.token_mixer == "convolution" else 2 * config.n_kv_head * config.head_dim
    per_position = config.n_layer * width * compute_dtype(config).itemsize
    return per_position * tokens * batch_size
