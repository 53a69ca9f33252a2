"""AdamW with warmup + cosine decay, global-norm clipping, and decay on matrices only."""

from __future__ import annotations

import jax
import optax

from jaxgpt.config import TrainConfig


def learning_rate_schedule(train: TrainConfig) -> optax.Schedule:
    """Linear warmup from 0 to lr over warmup_steps, cosine decay to min_lr at decay_steps
    (train.steps when 0), then min_lr (optax holds the end value past decay_steps)."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=train.lr,
        warmup_steps=train.warmup_steps,
        decay_steps=train.decay_steps or train.steps,
        end_value=train.min_lr,
    )


def weight_decay_mask(params, decay_embeddings: bool = False):
    """True for the parameters weight decay applies to: every matmul kernel, and the
    embeddings only if asked. Decided by name, not by ndim, because scanned layers give norm
    scales and biases a leading layer axis that makes them look like matrices."""

    def decays(path, _):
        name = path[-1].key
        return name == "kernel" or (name == "embedding" and decay_embeddings)

    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(train: TrainConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(
        learning_rate_schedule(train),
        b1=train.beta1,
        b2=train.beta2,
        weight_decay=train.weight_decay,
        mask=lambda params: weight_decay_mask(params, train.decay_embeddings),
    )
    if train.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(train.grad_clip), adamw)
    return adamw
