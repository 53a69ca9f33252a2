"""The encoder's objective: masked-token prediction (Devlin et al. 2019, BERT, section 3.1).

A bidirectional model (model.causal=false) sees the whole window, so predicting the next token
would be copying it. Instead some tokens are hidden and the model predicts them from both
sides: each position is chosen with probability `rate` (BERT: 15%); a chosen token becomes
the mask token 80% of the time, a random token 10%, and stays itself 10% (so the model cannot
learn that only [MASK] positions matter, and must keep a useful representation of every
token). The loss is the cross-entropy at the chosen positions alone, and it is not comparable
with a next-token loss: the model sees both sides of each blank, and only 15% of the tokens
are scored.

The mask token is the last id of the model's vocabulary (model.vocab_size - 1) unless
model.mask_token names another (an imported BERT's [MASK]): a run whose vocab_size comes from
the tokenizer gets one id more than the tokenizer has, which no text encodes to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxgpt.config import ModelConfig

# How BERT replaces a chosen token: by the mask token, by a random token, or not at all.
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1


def mask_token(config: ModelConfig) -> int:
    """The id that stands for a hidden token: config.mask_token (an imported BERT's [MASK]),
    else the vocabulary's last."""
    return config.vocab_size - 1 if config.mask_token is None else config.mask_token


def mask_tokens(tokens: jax.Array, rng: jax.Array, config: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """(the corrupted input, which positions were chosen) for tokens (batch, seq): each position
    chosen with probability config.mask_rate, then replaced 80/10/10 as BERT does. A random
    replacement is drawn from the vocabulary without the mask token."""
    choose, kind, random = jax.random.split(rng, 3)
    chosen = jax.random.bernoulli(choose, config.mask_rate, tokens.shape)
    u = jax.random.uniform(kind, tokens.shape)
    # any id but the mask token: draw from one fewer and step over it
    replacements = jax.random.randint(random, tokens.shape, 0, config.vocab_size - 1, tokens.dtype)
    replacements = jnp.where(replacements >= mask_token(config), replacements + 1, replacements)
    kept_or_random = jnp.where(u < MASK_SHARE + RANDOM_SHARE, replacements, tokens)
    corrupted = jnp.where(u < MASK_SHARE, mask_token(config), kept_or_random)
    return jnp.where(chosen, corrupted, tokens), chosen


def masked_token_loss(
    model, params, windows: jax.Array, rng: jax.Array, *, train: bool = False
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(mean cross-entropy over the chosen positions, {"loss", "accuracy"}) on windows
    (batch, seq + 1), whose first seq tokens are the text (the last is there for the next-token
    objective's targets and is not used). rng draws the masks (and, training, dropout): the
    training step passes its per-step key, evaluation a fixed one, so every evaluation hides
    the same positions. Accuracy is the share of chosen positions whose most likely token is
    the original one."""
    tokens = windows[:, :-1]
    mask_rng, dropout_rng = jax.random.split(rng)
    inputs, chosen = mask_tokens(tokens, mask_rng, model.config)
    logits = model.apply({"params": params}, inputs, train=train, rngs={"dropout": dropout_rng} if train else None)
    weights = chosen.astype(jnp.float32)
    count = jnp.maximum(weights.sum(), 1.0)  # a window with nothing chosen scores nothing
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, tokens)
    right = (jnp.argmax(logits, axis=-1) == tokens).astype(jnp.float32)
    loss = (losses * weights).sum() / count
    return loss, {"loss": loss, "accuracy": (right * weights).sum() / count}
