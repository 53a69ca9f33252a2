"""Next-token cross-entropy with a backward pass of one elementwise sweep over the logits.

For GPT-2's 50,304-token vocabulary the logits are the largest tensor of a step (64 x 1024 x
50,304 is 3.3 G numbers), so each pass over them costs as much as a layer's matmuls. The usual
way, log_softmax and then picking the target's entry (optax.softmax_cross_entropy_with_integer_labels),
differentiates the pick as a scatter into a zero tensor of the logits' shape; measured on an H200
(docs/benchmarks.md), XLA then wrote the softmax's gradient in float32, scattered into it and
converted the result to the logits' bfloat16 in three kernels, about 10 ms of a 150 ms step.

Here the gradient is written down instead, softmax(logits) - onehot(target) times the incoming
gradient, as one expression XLA fuses into a single pass that reads the logits and writes their
gradient in their own dtype. The forward pass is the same arithmetic as optax's, in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def softmax_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """-log softmax(logits)[target] at each position: logits (..., vocab) in any float dtype,
    integer targets (...) -> float32 losses (...)."""
    return _forward(logits, targets)[0]


def _forward(logits, targets):
    x = logits.astype(jnp.float32)
    log_normaliser = jax.nn.logsumexp(x, axis=-1)
    target_logit = jnp.take_along_axis(x, targets[..., None], axis=-1)[..., 0]
    return log_normaliser - target_logit, (logits, targets, log_normaliser)


def _backward(residuals, incoming):
    logits, targets, log_normaliser = residuals
    softmax = jnp.exp(logits.astype(jnp.float32) - log_normaliser[..., None])
    is_target = jnp.arange(logits.shape[-1]) == targets[..., None]
    gradient = (softmax - is_target) * incoming[..., None]
    return gradient.astype(logits.dtype), None  # integer targets have no gradient


softmax_cross_entropy.defvjp(_forward, _backward)
