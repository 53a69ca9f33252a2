"""Looking inside the model: one forward pass that keeps what every layer computed.

`capture(config, params, tokens)` runs the model once with Flax's "intermediates" collection
mutable. Each attention layer then sows its pre-softmax scores and its weights
(jaxgpt/attention.py), and the decoder sows the residual stream before the first block and
after each, and the logit lens: its own readout (final norm and LM head) applied to each of
those residuals, which shows what the model would predict if it stopped at that layer
(nostalgebraist 2020). Nothing is computed twice and nothing changes when not capturing.

`induction_scores` measures, per head, the behaviour of an induction head (Olsson et al.
2022): on random tokens repeated twice, how much attention each token of the second copy pays
to the token that followed its earlier occurrence, the one to copy next.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.model import GPT, unstack_blocks


class Captured(NamedTuple):
    """One forward pass of tokens (batch, t), everything float32, query heads numbered as in
    the model (head h is key/value group h // group_size)."""

    logits: np.ndarray  # (batch, t, vocab)
    scores: np.ndarray  # (n_layer, batch, n_head, t, t): q.k / sqrt(d) + mask; -inf where masked
    weights: np.ndarray  # (n_layer, batch, n_head, t, t): softmax of scores
    residual: np.ndarray  # (n_layer + 1, batch, t, d_model): before block 0, then after each block
    logit_lens: np.ndarray  # (n_layer + 1, batch, t, vocab): the readout of each residual


def capture(config: ModelConfig, params, tokens) -> Captured:
    """Run `tokens` (batch, t) through the model once and keep every layer's intermediates.

    Runs unscanned (a scanned checkpoint is unstacked: sown values come out per block) in
    float32, whatever the run trained in."""
    if config.scan_layers:
        params = unstack_blocks(params)
    config = config.replace(scan_layers=False, dtype="float32", remat="none")
    return Captured(*(np.asarray(a) for a in _capture(config, params, jnp.asarray(tokens, jnp.int32))))


@partial(jax.jit, static_argnums=0)
def _capture(config: ModelConfig, params, tokens: jax.Array) -> Captured:
    logits, state = GPT(config).apply({"params": params}, tokens, mutable=["intermediates"])
    sown = state["intermediates"]

    def per_layer(name):  # each layer's (batch, kv_heads, group, t, s) -> (n_layer, batch, n_head, t, s)
        layers = [sown[f"block_{i}"]["attn"][name][0] for i in range(config.n_layer)]
        return jnp.stack([a.reshape(a.shape[0], config.n_head, *a.shape[-2:]) for a in layers])

    return Captured(
        logits,
        per_layer("attention_scores"),
        per_layer("attention_weights"),
        sown["residual"][0],
        sown["logit_lens"][0],
    )


def repeated_random_tokens(vocab_size: int, half: int, batch: int, seed: int = 0) -> np.ndarray:
    """(batch, 2 * half) int32: `half` uniformly random tokens, then the same tokens again."""
    first = np.random.default_rng(seed).integers(0, vocab_size, (batch, half))
    return np.concatenate([first, first], axis=1).astype(np.int32)


def induction_scores(weights: np.ndarray) -> np.ndarray:
    """Per layer and head, the mean attention from each token of the second copy of a
    repeated sequence to the token after that token's earlier occurrence.

    weights: (n_layer, batch, n_head, 2h, 2h) on `repeated_random_tokens`. The query at
    position h + i (i = 0 .. h - 1) is token i again; the token after its first occurrence is
    at i + 1. A perfect induction head scores 1; attention spread evenly over the visible keys scores
    about ln(2) / h.
    """
    half = weights.shape[-1] // 2
    queries = np.arange(half, 2 * half)
    return weights[..., queries, queries - half + 1].mean(axis=(1, -1))


def model_induction_scores(config: ModelConfig, params, half: int | None = None, batch: int = 8) -> np.ndarray:
    """(n_layer, n_head) induction scores of a model on repeated random tokens (the whole
    vocabulary; each half as long as fits: block_size // 2, at most 64)."""
    half = half or min(config.block_size // 2, 64)
    tokens = repeated_random_tokens(config.vocab_size, half, batch)
    return induction_scores(capture(config, params, tokens).weights)
