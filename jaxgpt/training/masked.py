"""The encoder's objective: masked-token prediction (Devlin et al. 2019, BERT, section 3.1).

A bidirectional model (model.causal=false) sees the whole window, so predicting the next token
would be copying it. Instead some tokens are hidden and the model predicts them from both
sides: each position is chosen with probability `rate` (BERT: 15%); a chosen token becomes
the mask token 80% of the time, a random token 10%, and stays itself 10% (so the model cannot
learn that only [MASK] positions matter, and must keep a useful representation of every
token). The loss is the cross-entropy at the chosen positions alone (jaxgpt/training/train_step.py's
objective), and it is not comparable with a next-token loss: the model sees both sides of each
blank, and only 15% of the tokens are scored. Each example draws its blanks from its own key,
so they do not depend on how a batch is split into microbatches or over cores.

The mask token is the last id of the model's vocabulary (model.vocab_size - 1) unless
model.mask_token names another (an imported BERT's [MASK]): a run whose vocab_size comes from
the tokenizer gets one id more than the tokenizer has, which no text encodes to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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


# fold_in(step key, this) roots the blanks; a step's pieces fold small numbers into the same key
# for their dropout, so the two streams never meet
BLANKS_STREAM = 2**30


def example_keys(rng: jax.Array, example_ids: jax.Array) -> jax.Array:
    """Each example's key for its blanks, from the step's key and the example's place in the
    batch: the blanks of a window do not depend on the microbatch or the core that runs it."""
    root = jax.random.fold_in(rng, BLANKS_STREAM)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(root, example_ids)


def mask_examples(tokens: jax.Array, keys: jax.Array, config: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """`mask_tokens` of each row of tokens (rows, seq) with its own key (`example_keys`)."""
    return jax.vmap(mask_tokens, in_axes=(0, 0, None))(tokens, keys, config)


def hidden_count(keys: jax.Array, length: int, config: ModelConfig) -> jax.Array:
    """How many positions `mask_examples` hides in examples of `length` tokens with these
    keys: the chosen draws alone (they depend on the key, not on the tokens), so any piece of a
    batch can count the whole batch's blanks without its rows."""
    dummy = jnp.zeros((keys.shape[0], length), jnp.int32)
    return mask_examples(dummy, keys, config)[1].sum()
