"""Causal self-attention: the mask, the scores and their softmax, the readable kernel, and the
layer around them. The faster kernels (cuDNN through jax.nn, Pallas on TPU) live in kernels.py,
and the KV cache decoding keeps in kv_cache.py; the lab's named sites (sites.py) are marked
where they sit.

Shapes use these letters: b batch, t query positions, s key positions, k key/value heads,
g query heads per key/value head (the group), d head_dim. Query heads are numbered k * g + g',
so query head h reads key/value head h // group — the layout of grouped-query attention
(Ainslie et al. 2023) and of Hugging Face's `repeat_kv`. Keeping queries as (b, t, k, g, d)
lets one einsum serve a whole group without copying the key/value heads.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model import kv_cache
from jaxgpt.model.layers import dtypes, projection_keywords, residual_output_init
from jaxgpt.model.positions import alibi_slopes, apply_rope, rope_frequencies
from jaxgpt.model.sites import changes_site, reads_site, site


def causal_score_bias(
    q_len: int,
    kv_len: int,
    cache_index: jnp.ndarray | None,
    slopes: jnp.ndarray | None,
    window: int = 0,
    causal: bool = True,
    segments: jnp.ndarray | None = None,
    key_segments: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """What is added to the attention scores: -inf above the diagonal, ALiBi's -m_h (i - j).

    Query i sits at position cache_index + i (cache_index None means 0: queries and keys are
    the same tokens). Key j is position j, or, in a KV cache, the position its slot holds
    (`kv_cache.slot_positions`). A key is visible to a query when it was written and its position
    is not after the query's, and, with a sliding window, when it is one of the `window`
    positions ending there. causal=False shows every written key to every query: an
    encoder's attention, which reads both sides (or, in a decoder, the ablation that lets
    training see the future).

    segments (b, t), for queries and keys that are the same tokens: a key is visible only to
    queries of its own segment (packed sequences, padding; jaxgpt/training/batch.py). A segment's tokens
    are contiguous, so distances within it (causality, the window, ALiBi's) are the row's.
    key_segments (b, s): the keys' own, where they are other tokens (cross-attention to an
    encoder's output): a query sees the keys of its segment, and one whose segment has none
    (padding) sees every key, so its softmax stays finite; its output is never scored.
    Returns (1, 1, 1, q_len, kv_len), (1, k, g, q_len, kv_len) with ALiBi slopes of shape
    (k, g), or b rows in place of the first 1 with segments: broadcastable to the scores.
    """
    offset = 0 if cache_index is None else cache_index
    q_pos = offset + jnp.arange(q_len)[:, None]  # (t, 1)
    if cache_index is None:
        kv_pos = jnp.arange(kv_len)[None, :]  # (1, s)
    else:
        kv_pos = kv_cache.slot_positions(kv_len, offset + q_len - 1)[None, :]
    visible = jnp.broadcast_to(kv_pos >= 0, (q_len, kv_len))
    if causal:
        visible &= kv_pos <= q_pos
    if window:
        visible &= kv_pos > q_pos - window
    visible = visible[None]  # (1, t, s)
    if key_segments is not None:
        visible = visible & (segments[:, :, None] == key_segments[:, None, :])  # (b, t, s)
        visible = visible | ~visible.any(axis=-1, keepdims=True)
    elif segments is not None:
        assert cache_index is None, "segments describe a batch of whole sequences, not a KV-cache step"
        visible = visible & (segments[:, :, None] == segments[:, None, :])  # (b, t, s)
    bias = jnp.where(visible, 0.0, -jnp.inf).astype(jnp.float32)[:, None, None]
    if slopes is not None:
        distance = (q_pos - kv_pos).astype(jnp.float32)
        bias = bias - slopes[:, :, None, None] * distance
    return bias


class Mask(NamedTuple):
    """Which keys each query sees, and ALiBi's bias on them: what every kernel is told.

    cache_index: None when queries and keys are the same t tokens (training, or a forward pass
        without a cache); otherwise the position of the first query in a KV cache.
    slopes: ALiBi's per-head slopes (k, g), or None for no ALiBi.
    window: a sliding window's length in tokens, or 0 for the whole prefix.
    causal: False for an encoder, which sees both sides (and the ablation that lets a
        decoder's training see the future).
    segments: (b, t) each token's sequence, where a row holds several sequences or padding
        (jaxgpt/training/batch.py); None for one sequence a row.
    key_segments: (b, s) the keys' sequences where they are not the queries' tokens
        (cross-attention, `CrossAttention`); None for self-attention.
    """

    cache_index: jnp.ndarray | None = None
    slopes: jnp.ndarray | None = None
    window: int = 0
    causal: bool = True
    segments: jnp.ndarray | None = None
    key_segments: jnp.ndarray | None = None

    @property
    def plain_causal(self) -> bool:
        """The lower-triangular mask alone: what fused kernels implement natively."""
        return self.causal_only and not self.window

    @property
    def causal_only(self) -> bool:
        """Causal self-attention over one sequence a row, with or without a sliding window."""
        return self.cache_index is None and self.slopes is None and self.causal and self.segments is None

    def bias(self, q_len: int, kv_len: int) -> jnp.ndarray:
        return causal_score_bias(
            q_len, kv_len, self.cache_index, self.slopes, self.window, self.causal, self.segments, self.key_segments
        )


def attention_scores(q: jnp.ndarray, k: jnp.ndarray, bias: jnp.ndarray, scale: float | None = None) -> jnp.ndarray:
    """q k^T * scale + bias, the softmax's input, in float32 whatever the inputs' dtype; scale
    defaults to 1/sqrt(d), which keeps the scores' variance near 1 whatever the head width.
    Keys a query may not see score -inf.

    q: (b, t, k, g, d); k: (b, s, k, d); bias broadcastable to (b, k, g, t, s).
    Returns (b, k, g, t, s) float32.
    """
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    # Divided, not multiplied by 1/sqrt(d): the two round differently, and runs stay bit-identical
    # to those trained before the scale became a setting.
    scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    return scores + bias


def attention_weights(scores: jnp.ndarray) -> jnp.ndarray:
    """softmax over keys of `attention_scores` (float32: bfloat16 has 8 bits of mantissa, too
    few to normalise hundreds of exponentials without visibly biasing the weights): the
    attention pattern the lab shows (hook_pattern). The kernel below computes the same
    attention without forming it."""
    return jax.nn.softmax(scores, axis=-1)


# Every kernel takes the same arguments and computes the same attention:
#   q (b, t, k, g, d); k, v (b, s, k, d) -> (b, t, k, g, d), under a Mask, scores times `scale`
#   (None: divided by sqrt(head_dim), the standard scaling).
# Only this readable one is needed to understand the model; kernels.py holds the others, which
# are faster on some hardware and fall back to this one where they cannot run.


def xla_attention(q, k, v, mask: Mask, scale: float | None):
    """The readable kernel: two einsums around a float32 softmax."""
    return softmax_weighted_values(attention_scores(q, k, mask.bias(q.shape[1], k.shape[1]), scale), v)


def softmax_weighted_values(scores: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
    """softmax(scores) @ v, with the softmax's division by each row's sum applied to the einsum's
    output (t x d) instead of to the weights (t x s): the same attention up to rounding, and
    the backward pass then sums over the head's d outputs, not over the s keys (those sums took
    an eighth of a CPU step, docs/benchmarks.md). scores (b, k, g, t, s) -> (b, t, k, g, d)."""
    exps = jnp.exp(scores - jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True)))
    sums = jnp.einsum("bkgts->btkg", exps)[..., None]  # never 0: every row sees a key
    out = jnp.einsum("bkgts,bskd->btkgd", exps.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return (out / sums).astype(v.dtype)


def heads_view(x: jnp.ndarray) -> tuple[int, ...]:
    """How a site shows grouped query heads (b, t, k, g, d): (b, t, n_head, d), query head
    h = kv * group + g', the order the tables print them in."""
    return (*x.shape[:2], x.shape[2] * x.shape[3], x.shape[4])


def head_sites(layer, q, k, v):
    """The queries (b, t, n_head, d as a site), keys and values (b, s, kv heads, d) as they
    leave the projections: TransformerLens's hook_q, hook_k, hook_v (before rotary positions)."""
    return site(layer, "hook_q", q, heads_view(q)), site(layer, "hook_k", k), site(layer, "hook_v", v)


def attend(layer, name: str, q, k, v, mask: Mask, scale: float | None):
    """The kernel `name`'s attention; where the scores or pattern are read or changed (the lab),
    the readable one's two einsums with the sites hook_attn_scores (b, n_head, t, s; -inf where
    masked) and hook_pattern between them."""
    if not reads_site(layer, "hook_attn_scores", "hook_pattern"):
        return kernel(name)(q, k, v, mask, scale)
    scores = attention_scores(q, k, mask.bias(q.shape[1], k.shape[1]), scale)  # (b, k, g, t, s)
    view = (scores.shape[0], scores.shape[1] * scores.shape[2], *scores.shape[3:])
    scores = site(layer, "hook_attn_scores", scores, view)
    weights = site(layer, "hook_pattern", attention_weights(scores), view)
    if not changes_site(layer, "hook_pattern"):  # read only: the output is the kernel's, to the bit
        return softmax_weighted_values(scores, v)
    return jnp.einsum("bkgts,bskd->btkgd", weights.astype(v.dtype), v)


def kernel(name: str):
    """The kernel model.attention names. The default needs nothing beyond this file; the others
    are imported only when a config asks for them, and are handed this one for what they
    cannot run (kernels.py imports nothing from here)."""
    if name == "xla":
        return xla_attention
    from jaxgpt.model.kernels import KERNELS

    return partial(KERNELS[name], fallback=xla_attention)


def split_qkv(qkv: jnp.ndarray, group: int) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """The fused projection's output -> queries, keys, values.

    qkv is (b, t, k, g + 2, d): for each of the k key/value heads, its g query heads, then
    its key head, then its value head:

        kv head 0: [ q_0 ... q_{g-1} | key | value ]
        kv head 1: [ q_g ... q_{2g-1} | key | value ]
        ...

    so query head h = kv * g + i reads key/value head kv = h // g. Multi-head attention is the
    case g = 1 ([q | k | v] per head); multi-query attention is k = 1. Returns q (b, t, k, g, d)
    and k, v (b, t, k, d).
    """
    return qkv[:, :, :, :group], qkv[:, :, :, group], qkv[:, :, :, group + 1]


def rotated(module: nn.Module, q: jnp.ndarray, k: jnp.ndarray, positions: jnp.ndarray) -> tuple:
    """Queries and keys rotated by their positions (RoPE, jaxgpt/model/positions.py), each
    shown at its site: a windowed block between global ones (model.global_every) by plain RoPE
    at its own base, the others as model.rope_theta and rope_scaling say."""
    c = module.config
    if c.global_every and module.windowed:
        inv_freq, rope_scale = rope_frequencies(c.head_dim, c.rope_local_theta or c.rope_theta)
    else:
        inv_freq, rope_scale = rope_frequencies(c.head_dim, c.rope_theta, c.rope_scaling, c.block_size)
    interleaved = c.rope_pairing == "interleaved"
    q = apply_rope(q, positions, inv_freq, rope_scale, interleaved=interleaved)
    k = apply_rope(k, positions, inv_freq, rope_scale, interleaved=interleaved)
    return site(module, "hook_rot_q", q, heads_view(q)), site(module, "hook_rot_k", k)


def attention_mask(c: ModelConfig, cache_index, segments, windowed: bool = True) -> tuple[Mask, float | None]:
    """(what each query may see, the scores' scale: None for the standard 1/sqrt(head_dim)).
    windowed: whether the layer keeps to model.attention_window (global_every's global ones do not)."""
    slopes = None
    if c.position == "alibi":
        slopes = jnp.asarray(alibi_slopes(c.n_head)).reshape(c.n_kv_head, c.group_size)
    scale = None if c.attention_scale_dim is None else c.attention_scale_dim**-0.5  # Gemma's query_pre_attn_scalar
    scale = scale if c.scale_attention else 1.0
    if c.uniform_attention:  # scores times 0: the softmax of the mask alone, 1/t over t visible keys
        scale = 0.0
    return Mask(cache_index, slopes, c.attention_window if windowed else 0, c.causal, segments), scale


def heads_init(c: ModelConfig, init, shape: tuple[int, ...], heads_axes: tuple[int, ...], queries_axis=None):
    """`init`, or with model.init_heads_identical the same weights for every head: one head's
    drawn (size 1 on `heads_axes` of the kernel's `shape`) and repeated over them.
    `queries_axis`: the fused projection's (g + 2) axis (split_qkv), whose first g entries, the
    group's queries, get one draw and whose key and value keep their own. Every head of the
    layer is then the same function; nothing but the initialisation could have told them
    apart. (DenseGeneral asks for its kernel flattened to (inputs, outputs): so is this one.)"""
    if not c.init_heads_identical:
        return init

    def identical(key, flat_shape, dtype=jnp.float32):
        one = [1 if axis in heads_axes else n for axis, n in enumerate(shape)]
        if queries_axis is not None:
            one[queries_axis] = 3  # a query, the key, the value
        drawn = init(key, tuple(one), dtype)
        if queries_axis is not None:  # the group's queries are copies of the one drawn
            query, key_value = jnp.split(drawn, [1], axis=queries_axis)
            queries = jnp.repeat(query, shape[queries_axis] - 2, axis=queries_axis)
            drawn = jnp.concatenate([queries, key_value], axis=queries_axis)
        return jnp.broadcast_to(drawn, shape).reshape(flat_shape)

    return identical


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-/multi-query) self-attention with an optional KV cache: causal
    in a decoder, over both sides in an encoder (config.causal=False; the name keeps the case
    the teaching texts start from).

    `cache_index` is the one sign of decoding. None: the t tokens attend to each other
    (training, scoring). An int32 scalar: the layer writes this call's t tokens' keys and
    values into its cache at positions [cache_index, cache_index + t) (kv_cache.py) and attends
    over the whole cache, the mask hiding unwritten slots. Prefill is one call with the prompt;
    each decode step a call with one token. Static shapes: one compilation for every step.
    `windowed`: whether it keeps to model.attention_window (the block's, `Block.windowed`).
    """

    config: ModelConfig
    windowed: bool = True

    @nn.compact
    def __call__(
        self,
        x: jnp.ndarray,
        positions: jnp.ndarray,
        cache_index: jnp.ndarray | None,
        segments: jnp.ndarray | None = None,
        value_embedding: jnp.ndarray | None = None,
    ) -> jnp.ndarray:
        """value_embedding: None, or the tokens' rows (b, t, n_kv_head * head_dim) of the block's
        value embedding table (config.value_embeddings), mixed into the values."""
        c = self.config
        # One matmul makes all three (layout in split_qkv). Grouping by key/value head keeps a
        # group's queries next to their keys when the head axis is split over devices.
        if c.qkv_projections:
            qkv = nn.DenseGeneral(
                name="qkv",
                features=(c.n_kv_head, c.group_size + 2, c.head_dim),
                use_bias=c.bias or c.qkv_bias,
                kernel_init=heads_init(
                    c,
                    nn.initializers.normal(c.init_std),
                    (c.d_model, c.n_kv_head, c.group_size + 2, c.head_dim),
                    (1,),
                    2,
                ),
                **projection_keywords(c),
            )(x)
            q, k, v = split_qkv(qkv, c.group_size)
        else:  # the ablation: each head's slice of the input is its query, key and value
            heads = x.reshape(*x.shape[:2], c.n_head, c.head_dim)
            q, k, v = heads[:, :, :, None, :], heads, heads
        if c.qk_norm:  # over each head's head_dim features, with a learned scale per feature
            norm = dict(epsilon=c.norm_eps, **dtypes(c))
            q, k = nn.RMSNorm(**norm, name="q_norm")(q), nn.RMSNorm(**norm, name="k_norm")(k)
        if value_embedding is not None:  # a * v + b * e, from a = b = 1/2 as modded-nanogpt starts them
            mix = self.param("value_mix", lambda _: jnp.asarray([0.5, 0.5], c.param_dtype))
            v = mix[0].astype(v.dtype) * v + mix[1].astype(v.dtype) * value_embedding.reshape(v.shape)
        q, k, v = head_sites(self, q, k, v)

        if c.position == "rope":
            q, k = rotated(self, q, k, positions)
        if cache_index is not None:
            k, v = kv_cache.extend(self, k, v, cache_index)
        mask, scale = attention_mask(c, cache_index, segments, self.windowed)
        y = attend(self, c.attention, q, k, v, mask, scale)  # (b, t, k, g, d)
        if c.attention_gate != "none":
            y = y * self.gate(x)
        y = site(self, "hook_z", y, heads_view(y))  # what the output projection reads (gated, if gated)

        return nn.DenseGeneral(
            name="out",
            features=c.d_model,
            axis=(-3, -2, -1),
            use_bias=c.bias,
            kernel_init=heads_init(
                c, residual_output_init(c), (c.n_kv_head, c.group_size, c.head_dim, c.d_model), (0, 1)
            ),
            **projection_keywords(c),
        )(y)

    def gate(self, x: jnp.ndarray) -> jnp.ndarray:
        """sigmoid(x W_g) (b, t, k, g, head_dim or 1) from the attention's input x: how open each
        head's output is, per feature (elementwise) or per head (headwise); the site
        hook_attn_gate (b, t, n_head, head_dim or 1)."""
        c = self.config
        width = c.head_dim if c.attention_gate == "elementwise" else 1
        logits = nn.DenseGeneral(
            name="gate",
            features=(c.n_kv_head, c.group_size, width),
            use_bias=c.bias,
            kernel_init=heads_init(
                c, nn.initializers.normal(c.init_std), (c.d_model, c.n_kv_head, c.group_size, width), (1, 2)
            ),
            **projection_keywords(c),
        )(x)
        gate = jax.nn.sigmoid(logits)
        return site(self, "hook_attn_gate", gate, heads_view(gate))


class CrossAttention(nn.Module):
    """The encoder–decoder's second attention (Vaswani et al. 2017, section 3.2.3): queries from
    the decoder's tokens, keys and values from the encoder's output (`memory`, (b, s, d_model)),
    no causal mask (the whole source is known) and no positions (source and target positions
    are not on one axis; each side's own attention has placed them). With segments, a target
    token sees only its own example's source (`Mask.key_segments`)."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self, x: jnp.ndarray, memory: jnp.ndarray, segments: jnp.ndarray | None, memory_segments: jnp.ndarray | None
    ) -> jnp.ndarray:
        c = self.config
        init = nn.initializers.normal(c.init_std)
        q = nn.DenseGeneral(
            name="q",
            features=(c.n_kv_head, c.group_size, c.head_dim),
            use_bias=c.bias,
            kernel_init=init,
            **projection_keywords(c),
        )(x)
        kv = nn.DenseGeneral(
            name="kv",
            features=(c.n_kv_head, 2, c.head_dim),
            use_bias=c.bias,
            kernel_init=init,
            **projection_keywords(c),
        )(memory)
        k, v = kv[:, :, :, 0], kv[:, :, :, 1]  # (b, s, k, d)
        q, k, v = head_sites(self, q, k, v)
        paired = segments is not None and memory_segments is not None
        mask = Mask(
            causal=False, segments=segments if paired else None, key_segments=memory_segments if paired else None
        )
        y = attend(self, c.attention, q, k, v, mask, None)  # (b, t, k, g, d)
        y = site(self, "hook_z", y, heads_view(y))
        out = dict(features=c.d_model, axis=(-3, -2, -1), use_bias=c.bias, kernel_init=residual_output_init(c))
        return nn.DenseGeneral(name="out", **out, **projection_keywords(c))(y)
