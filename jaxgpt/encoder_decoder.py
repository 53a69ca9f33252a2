"""The encoder–decoder (Vaswani et al. 2017): the original Transformer, for sequence-to-sequence
tasks such as translation, where the whole input is known before the output begins.

    source ──► embed ──► encoder blocks (bidirectional) ──► norm ──► memory (b, s, d)
                                                                        │ keys and values
    target ──► embed ──► decoder blocks: causal self-attention,         ▼
                                         cross-attention to the memory ◄┘,
                                         MLP ──► norm ──► logits (b, t, vocab)

The encoder is the decoder-only model's block stack without the causal mask (jaxgpt/model.py's
`Block`, model.causal=false); each decoder block adds a cross-attention layer between its
self-attention and its MLP, whose queries come from the target and whose keys and values come
from the encoder's output. One token embedding serves the source, the target and the output
head (the paper's three-way tying; source and target share a vocabulary).

Decoding keeps two caches per decoder block: the self-attention's KV cache, which grows by a
token each step (jaxgpt/kv_cache.py), and the cross-attention's keys and values of the memory,
computed once at the first step and read at every later one (`CrossAttention`).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxgpt import probes
from jaxgpt.attention import CausalSelfAttention, Mask, attention_scores, kernel
from jaxgpt.config import ModelConfig
from jaxgpt.layers import MLP, dtypes, make_norm, residual_output_init
from jaxgpt.model import Block, embedding_init, input_embeddings, token_positions


class CrossAttention(nn.Module):
    """Each target position attends to every source position: queries from x, keys and values
    from the memory, no mask (the whole source is known) and no rotary positions (source and
    target positions are not on one axis; absolute positions in the embeddings carry order).

    memory None (decoding, after the first step): the keys and values computed at the first
    step are read from the "cache" collection instead of being recomputed from the memory.
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray, memory: jnp.ndarray | None, decode: bool) -> jnp.ndarray:
        c = self.config
        init = nn.initializers.normal(c.init_std)
        q = nn.DenseGeneral(
            (c.n_kv_head, c.group_size, c.head_dim), use_bias=c.bias, kernel_init=init, name="q", **dtypes(c)
        )(x)
        if memory is not None:
            kv = nn.DenseGeneral(
                (c.n_kv_head, 2, c.head_dim), use_bias=c.bias, kernel_init=init, name="kv", **dtypes(c)
            )(memory)
            k, v = kv[:, :, :, 0], kv[:, :, :, 1]  # (b, s, k, d)
            if decode:  # the first step: keep them for the steps after
                self.variable("cache", "key", jnp.zeros, k.shape, k.dtype).value = k
                self.variable("cache", "value", jnp.zeros, v.shape, v.dtype).value = v
        else:
            k, v = self.get_variable("cache", "key"), self.get_variable("cache", "value")
        mask = Mask(causal=False)
        y = kernel(c.attention)(q, k, v, mask, None)  # (b, t, k, g, d)
        probes.record_attention(self, lambda: attention_scores(q, k, mask.bias(q.shape[1], k.shape[1])))
        return nn.DenseGeneral(
            c.d_model, axis=(-3, -2, -1), use_bias=c.bias, kernel_init=residual_output_init(c), name="out", **dtypes(c)
        )(y)


class DecoderBlock(nn.Module):
    """Pre-norm: x + self_attention(norm(x)), then x + cross_attention(norm(x), memory), then
    x + mlp(norm(x))."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, memory, positions, cache_index) -> jnp.ndarray:
        c = self.config
        x = x + CausalSelfAttention(c, name="attn")(make_norm(c, "norm_1")(x), positions, cache_index)
        x = x + CrossAttention(c, name="cross")(make_norm(c, "norm_cross")(x), memory, cache_index is not None)
        return x + MLP(c, name="mlp")(make_norm(c, "norm_2")(x))


class Encoder(nn.Module):
    """source (b, s) -> memory (b, s, d_model): the blocks without the causal mask."""

    config: ModelConfig
    wte: nn.Embed

    @nn.compact
    def __call__(self, source: jnp.ndarray) -> jnp.ndarray:
        c = self.config.replace(causal=False)
        positions = jnp.arange(source.shape[1])
        x = input_embeddings(c, self.wte, source, positions)
        for i in range(c.n_layer):
            x = Block(c, name=f"block_{i}")(x, positions, None)
        return make_norm(c, "norm_f")(x)


class Decoder(nn.Module):
    """target (b, t), memory (b, s, d_model) or None (decoding after the first step) -> logits
    (b, t, vocab) float32, read out through the shared embedding."""

    config: ModelConfig
    wte: nn.Embed

    @nn.compact
    def __call__(self, tokens: jnp.ndarray, memory: jnp.ndarray | None, decode: bool = False) -> jnp.ndarray:
        c = self.config
        positions, cache_index = token_positions(self, c, tokens.shape[1], decode)
        x = input_embeddings(c, self.wte, tokens, positions)
        for i in range(c.n_layer):
            x = DecoderBlock(c, name=f"block_{i}")(x, memory, positions, cache_index)
        return self.wte.attend(make_norm(c, "norm_f")(x)).astype(jnp.float32)


class EncoderDecoder(nn.Module):
    """`apply(variables, source, target)` gives the logits for target (teacher forcing: the
    target as input, each position predicting the next); `method="encode"` and
    `method="decode"` run the two halves on their own, for decoding with caches. The encoder
    and decoder each have config.n_layer blocks; config.causal is ignored (the encoder never
    masks, the decoder always does)."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.wte = nn.Embed(c.vocab_size, c.d_model, embedding_init=embedding_init(c), **dtypes(c))
        self.encoder = Encoder(c, self.wte)
        self.decoder = Decoder(c.replace(causal=True), self.wte)

    def __call__(self, source: jnp.ndarray, target: jnp.ndarray) -> jnp.ndarray:
        return self.decoder(target, self.encoder(source))

    def encode(self, source: jnp.ndarray) -> jnp.ndarray:
        return self.encoder(source)

    def decode(self, tokens: jnp.ndarray, memory: jnp.ndarray | None, decode: bool = False) -> jnp.ndarray:
        return self.decoder(tokens, memory, decode)
