"""Looking inside the model: one forward pass that keeps what every layer computed.

`capture(config, params, tokens)` runs the model once with Flax's "intermediates" collection
and the named sites' mutable. Each attention layer's pre-softmax scores and weights are its
sites hook_attn_scores and hook_pattern (jaxgpt/lab/activations.py), and the decoder sows the
residual stream before the first block and after each, and the logit lens: its own readout
(final norm and LM head) applied to each of those residuals, which shows what the model would
predict if it stopped at that layer (nostalgebraist 2020). Nothing is computed twice and
nothing changes when not capturing.

In a mixture of experts each MoE layer also sows the experts each token was routed to and
their weights, and `expert_table` prints them token by token.

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
from jaxgpt.model.sites import CACHE
from jaxgpt.model.transformer import GPT, unstack_blocks


class Captured(NamedTuple):
    """One forward pass of tokens (batch, t), everything float32, query heads numbered as in
    the model (head h is key/value group h // group_size)."""

    logits: np.ndarray  # (batch, t, vocab)
    scores: np.ndarray  # (n_layer, batch, n_head, t, t): q.k / sqrt(d) + mask; -inf where masked
    weights: np.ndarray  # (n_layer, batch, n_head, t, t): softmax of scores
    residual: np.ndarray  # (n_layer + 1, batch, t, d_model): before block 0, then after each block
    logit_lens: np.ndarray  # (n_layer + 1, batch, t, vocab): the readout of each residual
    # A mixture of experts (jaxgpt/model/moe.py), per MoE layer (config.moe_layers; none in a dense
    # model): the experts each token was routed to, most probable first, and their weights
    # (renormalised over the chosen where model.moe.renormalize; an assignment dropped at
    # capacity keeps its weight here).
    experts: np.ndarray  # (moe layers, batch, t, top_k) int
    expert_weights: np.ndarray  # (moe layers, batch, t, top_k)


def capture(config: ModelConfig, params, tokens, beside: dict | None = None) -> Captured:
    """Run `tokens` (batch, t) through the model once and keep every layer's intermediates;
    `beside`: what else the model reads (a Vision Transformer's pixels, jaxgpt/data/images.py).

    Runs unscanned (a scanned checkpoint is unstacked: sown values come out per block) in
    float32, whatever the run trained in. A classifier has no logit lens (its (L + 1, b, t, 0))."""
    if config.scan_layers:
        params = unstack_blocks(params)
    config = config.replace(scan_layers=False, dtype="float32", remat="none")
    tokens = jnp.asarray(tokens, jnp.int32)
    return Captured(*(np.asarray(a) for a in _capture(config, params, tokens, beside or {})))


@partial(jax.jit, static_argnums=0)
def _capture(config: ModelConfig, params, tokens: jax.Array, beside: dict) -> Captured:
    logits, state = GPT(config).apply({"params": params}, tokens, **beside, mutable=["intermediates", CACHE])
    sown = state["intermediates"]
    no_lens = jnp.zeros((*sown["residual"][0].shape[:-1], 0))

    def per_layer(name):  # the named site of every layer: (n_layer, batch, n_head, t, s)
        return attention_site(config, state[CACHE], name)

    def per_moe_layer(name):
        batch, t = tokens.shape
        empty = jnp.zeros((0, batch, t, 0), jnp.int32 if name == "experts" else jnp.float32)
        return jnp.stack([sown[f"block_{i}"]["moe"][name][0] for i in config.moe_layers]) if config.moe else empty

    return Captured(
        logits,
        per_layer("hook_attn_scores"),
        per_layer("hook_pattern"),
        sown["residual"][0],
        sown["logit_lens"][0] if "logit_lens" in sown else no_lens,
        per_moe_layer("experts"),
        per_moe_layer("expert_weights"),
    )


def attention_site(config: ModelConfig, sites, name: str) -> jnp.ndarray:
    """The attention site `name` of every layer from a forward pass's sown sites, (L, b, H, t, s);
    no heads (H = 0) where a convolution mixes the positions (model.token_mixer), so a capture
    or a layer measure of such a model still runs."""
    if config.token_mixer != "attention":
        b, t = sites["block_0"]["hook_resid_pre"][0].shape[:2]
        return jnp.zeros((config.n_layer, b, 0, t, t), jnp.float32)
    return jnp.stack([sites[f"block_{i}"]["attn"][name][0] for i in range(config.n_layer)])


def lens_log_probabilities(logit_lens: np.ndarray) -> np.ndarray:
    """The logit lens's readouts as log-probabilities over the vocabulary, in float64 (a stable
    log-softmax of the last axis): what the lens table scores and its page lists."""
    logits = np.asarray(logit_lens, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def expert_table(captured: Captured, pieces: list[str], layers: list[int]) -> str:
    """Which experts each token of one sequence went to, a line per token: its text (`pieces`,
    one per token) and, per MoE layer (`layers`, their block numbers), the chosen experts with
    their weights."""
    header = "token".ljust(12) + "".join(f"block_{layer}".ljust(24) for layer in layers)
    lines = [header]
    for i, piece in enumerate(pieces):
        cells = [
            " ".join(
                f"{e}:{w:.2f}" for e, w in zip(captured.experts[j, 0, i], captured.expert_weights[j, 0, i], strict=True)
            )
            for j in range(len(layers))
        ]
        lines.append(repr(piece)[:11].ljust(12) + "".join(cell.ljust(24) for cell in cells))
    return "\n".join(lines)


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


def first_token_share(weights: np.ndarray) -> np.ndarray:
    """Per layer, the attention the queries pay the first token, mean over heads, rows and the
    queries after it (the first sees only itself): the attention sink (Xiao et al. 2024), which
    Qiu et al. 2025 report falling from 46.7% to 4.8% of attention with a gate on each head.
    weights (n_layer, batch, n_head, t, t) -> (n_layer,)."""
    return weights[..., 1:, 0].mean(axis=(1, 2, 3))


def sink_line(weights: np.ndarray) -> str:
    """One line of `first_token_share`, layer by layer and over the model."""
    shares = first_token_share(weights)
    layers = ", ".join(f"{share:.1%}" for share in shares)
    return f"attention on the first token (the sink), mean over heads and later queries: {shares.mean():.1%} ({layers})"


def model_induction_scores(config: ModelConfig, params, half: int | None = None, batch: int = 8) -> np.ndarray:
    """(n_layer, n_head) induction scores of a model on repeated random tokens (the whole
    vocabulary; each half as long as fits: block_size // 2, at most 64)."""
    half = half or min(config.block_size // 2, 64)
    tokens = repeated_random_tokens(config.vocab_size, half, batch)
    return induction_scores(capture(config, params, tokens).weights)
