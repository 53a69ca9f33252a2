"""A causal depthwise convolution in attention's place (model.token_mixer="convolution"): the
teaching texts' question "what if attention were replaced with something else?", answered by
training it.

    v = x W_v                                   (b, t, D) the values, as attention's
    y_t[j] = sum_{i < w} taps[i, j] v_{t-i}[j]  each feature its own w weights over the last w
    out = y W_out                               back into the residual stream

So each feature mixes the positions by a fixed pattern of distances, learned but the same for
every input: attention with its pattern frozen per feature and w tokens long. Where attention
can look up any earlier token by what it is (an induction head copies the token after the
previous occurrence of this one), this can only reach the last w - 1 tokens, by how far back
they are. Packed segments are respected (a feature reads no value of another sequence), and
decoding keeps the values of the last block_size positions in the "cache" collection, rolling
as the KV cache does (jaxgpt/model/kv_cache.py), so a step costs one position's work.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model.layers import projection_keywords, residual_output_init
from jaxgpt.model.sites import site


def shifted(x: jnp.ndarray, by: int) -> jnp.ndarray:
    """x (b, t, ...) moved `by` positions later along t, zeros in front: row t holds x_{t - by}."""
    if by == 0:
        return x
    pad = [(0, 0), (by, 0)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad)[:, : x.shape[1]]


def causal_depthwise(v: jnp.ndarray, taps: jnp.ndarray, segments: jnp.ndarray | None = None) -> jnp.ndarray:
    """sum_i taps[i] * v_{t-i} over the i < w with t - i >= 0 in t's own segment (segments
    (b, t), contiguous; None: one sequence a row). v (b, t, D), taps (w, D) -> (b, t, D)."""
    y = jnp.zeros_like(v)
    for i in range(taps.shape[0]):
        term = taps[i].astype(v.dtype) * shifted(v, i)
        if segments is not None and i:
            same = segments == shifted(segments, i)  # (where t - i < 0 the shifted v is 0 already)
            term = jnp.where(same[..., None], term, 0)
        y = y + term
    return y


class CausalConvolution(nn.Module):
    """The token mixer `convolution`: values, a causal depthwise convolution of model.conv_width
    taps, an output projection. Sites: hook_conv_in (the values) and hook_conv_out (the
    convolution's output, before the projection), both (b, t, d_model)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray, cache_index: jnp.ndarray | None, segments: jnp.ndarray | None) -> jnp.ndarray:
        c = self.config
        dense = dict(use_bias=c.bias, **projection_keywords(c))
        v = nn.Dense(c.d_model, name="value", kernel_init=nn.initializers.normal(c.init_std), **dense)(x)
        v = site(self, "hook_conv_in", v)
        # fan-in w: each output reads w values, so 1/sqrt(w) keeps its variance that of one value
        taps = self.param(
            "taps", nn.initializers.normal(c.conv_width**-0.5), (c.conv_width, c.d_model), jnp.dtype(c.param_dtype)
        )
        y = causal_depthwise(v, taps, segments) if cache_index is None else self.decoded(v, taps, cache_index)
        y = site(self, "hook_conv_out", y)
        return nn.Dense(c.d_model, name="conv_out", kernel_init=residual_output_init(c), **dense)(y)

    def decoded(self, v: jnp.ndarray, taps: jnp.ndarray, cache_index: jnp.ndarray) -> jnp.ndarray:
        """The convolution of this call's t values at positions [cache_index, cache_index + t),
        reading the earlier positions' values from the cache (written there by earlier calls;
        position p in slot p % block_size, as the KV cache keeps them)."""
        slots = self.config.block_size
        cached = self.variable("cache", "values", jnp.zeros, (v.shape[0], slots, v.shape[2]), v.dtype)
        positions = cache_index + jnp.arange(v.shape[1])
        cached.value = cached.value.at[:, jnp.mod(positions, slots)].set(v)
        y = jnp.zeros_like(v)
        for i in range(taps.shape[0]):
            earlier = cached.value[:, jnp.mod(positions - i, slots)]  # (b, t, D)
            y = y + jnp.where((positions - i >= 0)[None, :, None], taps[i].astype(v.dtype) * earlier, 0)
        return y
