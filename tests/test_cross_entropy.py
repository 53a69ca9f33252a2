"""jaxgpt/training/cross_entropy.py: the loss and its hand-written gradient against optax's
(log_softmax, then the target's entry, differentiated by JAX), and against the formula."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxgpt.training.cross_entropy import softmax_cross_entropy

pytestmark = pytest.mark.gpu


def random_logits(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(3 * rng.standard_normal(shape), dtype)  # a spread a trained model's logits have
    targets = jnp.asarray(rng.integers(0, shape[-1], shape[:-1]), jnp.int32)
    weights = jnp.asarray(rng.random(shape[:-1]), jnp.float32)  # a cotangent other than ones
    return logits, targets, weights


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_losses_and_gradients_match_optax(dtype):
    logits, targets, weights = random_logits((3, 7, 50), dtype)

    def weighted(loss_fn):
        return lambda x: jnp.sum(loss_fn(x, targets) * weights)

    ours = softmax_cross_entropy(logits, targets)
    reference = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    # both in float32 from the same inputs: the same sums in another order, a few float32 ulps
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-6)
    assert ours.dtype == jnp.float32

    grad = jax.grad(weighted(softmax_cross_entropy))(logits)
    assert grad.dtype == dtype  # the gradient comes back in the logits' own dtype
    reference_grad = jax.grad(weighted(optax.softmax_cross_entropy_with_integer_labels))(logits.astype(jnp.float32))
    # float32: rounding of a softmax (entries <= 1); bfloat16: one rounding to 8 bits of the result
    tolerance = 1e-6 if dtype == jnp.float32 else 2**-8
    np.testing.assert_allclose(grad.astype(jnp.float32), reference_grad, rtol=tolerance, atol=tolerance)


def test_a_hand_computed_case():
    """Two tokens, logits (0, ln 3): softmax (1/4, 3/4). Target 0: loss ln 4, gradient
    (1/4 - 1, 3/4) = (-3/4, 3/4)."""
    logits = jnp.array([[0.0, np.log(3.0)]], jnp.float32)
    targets = jnp.array([0])
    loss, grad = jax.value_and_grad(lambda x: softmax_cross_entropy(x, targets).sum())(logits)
    np.testing.assert_allclose(loss, np.log(4.0), rtol=1e-6)
    np.testing.assert_allclose(grad, [[-0.75, 0.75]], rtol=1e-6)


def test_the_gradient_is_elementwise_without_a_scatter():
    """What the module is for: differentiating the target's pick as a scatter is what made XLA
    write the gradient three times; the gradient program here has no scatter (optax's has)."""
    logits, targets, weights = random_logits((2, 4, 16), jnp.bfloat16)

    def gradient_program(loss_fn):
        grad = jax.grad(lambda x: jnp.sum(loss_fn(x, targets) * weights))
        return jax.jit(grad).lower(logits).as_text()

    assert "scatter" not in gradient_program(softmax_cross_entropy)
    assert "scatter" in gradient_program(optax.softmax_cross_entropy_with_integer_labels)


def test_under_vmap_and_checkpoint_as_the_chunked_loss_uses_it():
    logits, targets, weights = random_logits((4, 3, 11), jnp.float32, seed=1)
    per_row = jax.checkpoint(lambda x, t: softmax_cross_entropy(x, t))
    mapped = jax.grad(lambda x: jnp.sum(jax.lax.map(lambda a: per_row(*a), (x, targets)) * weights))(logits)
    whole = jax.grad(lambda x: jnp.sum(softmax_cross_entropy(x, targets) * weights))(logits)
    # the same arithmetic per element, however grouped (a GPU may reduce a row in another order)
    np.testing.assert_allclose(mapped, whole, rtol=1e-6, atol=1e-7)
