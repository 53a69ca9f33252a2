"""Next-token cross-entropy, and on a GPU a backward pass of one elementwise sweep over the logits.

For GPT-2's 50,304-token vocabulary the logits are the largest tensor of a step (64 x 1024 x
50,304 is 3.3 G numbers), so each pass over them costs as much as a layer's matmuls. The usual
way, log_softmax and then picking the target's entry (optax.softmax_cross_entropy_with_integer_labels),
differentiates the pick as a scatter into a zero tensor of the logits' shape; on a GPU XLA then
writes the softmax's gradient in float32, scatters into it and converts the result: three
kernels, and a float32 tensor of the logits' shape held at the step's peak.

`one_pass_cross_entropy` writes the gradient down instead, softmax(logits) - onehot(target)
times the incoming gradient, which XLA's GPU backend fuses into one kernel that reads the
logits and writes their gradient in their own dtype (less memory at the peak; the H200's figures
are in docs/benchmarks.md). XLA's CPU backend does the opposite with it: it evaluates the
expression inside both of the head's backward matmuls' operands, one of them transposed, and
the step runs slower than with optax's; an optimisation barrier did not stop it. So a GPU gets
the one-pass gradient and every other backend optax's, decided when the step is traced, as the
attention kernels are (model/kernels.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def softmax_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """-log softmax(logits)[target] at each position: logits (..., vocab), integer targets (...)
    -> float32 losses (...). The same numbers either way, up to float32 summation order."""
    if jax.default_backend() == "gpu":
        return one_pass_cross_entropy(logits, targets)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


@jax.custom_vjp
def one_pass_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """The cross-entropy whose gradient is one elementwise expression (no scatter)."""
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


one_pass_cross_entropy.defvjp(_forward, _backward)
