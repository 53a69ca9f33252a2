"""jaxgpt/training/cross_entropy.py: the one-pass gradient against optax's (log_softmax, then the
target's entry, differentiated by JAX) and against the formula, and which one each backend gets."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxgpt.training.cross_entropy import one_pass_cross_entropy, softmax_cross_entropy

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

    ours = one_pass_cross_entropy(logits, targets)
    reference = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    # both in float32 from the same inputs: the same sums in another order, a few float32 ulps
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-6)
    assert ours.dtype == jnp.float32

    grad = jax.grad(weighted(one_pass_cross_entropy))(logits)
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
    loss, grad = jax.value_and_grad(lambda x: one_pass_cross_entropy(x, targets).sum())(logits)
    np.testing.assert_allclose(loss, np.log(4.0), rtol=1e-6)
    np.testing.assert_allclose(grad, [[-0.75, 0.75]], rtol=1e-6)


def test_the_gradient_is_elementwise_without_a_scatter():
    """What it is for: differentiating the target's pick as a scatter is what made XLA write the
    gradient three times on a GPU; the gradient program here has no scatter (optax's has)."""
    logits, targets, weights = random_logits((2, 4, 16), jnp.bfloat16)

    def gradient_program(loss_fn):
        grad = jax.grad(lambda x: jnp.sum(loss_fn(x, targets) * weights))
        return jax.jit(grad).lower(logits).as_text()

    assert "scatter" not in gradient_program(one_pass_cross_entropy)
    assert "scatter" in gradient_program(optax.softmax_cross_entropy_with_integer_labels)


def test_under_map_and_checkpoint_as_the_chunked_loss_uses_it():
    logits, targets, weights = random_logits((4, 3, 11), jnp.float32, seed=1)
    per_row = jax.checkpoint(lambda x, t: one_pass_cross_entropy(x, t))
    mapped = jax.grad(lambda x: jnp.sum(jax.lax.map(lambda a: per_row(*a), (x, targets)) * weights))(logits)
    whole = jax.grad(lambda x: jnp.sum(one_pass_cross_entropy(x, targets) * weights))(logits)
    # the same arithmetic per element, however grouped (a GPU may reduce a row in another order)
    np.testing.assert_allclose(mapped, whole, rtol=1e-6, atol=1e-7)


def test_a_gpu_gets_the_one_pass_gradient_and_other_backends_optax():
    """The training loss's choice, made when the step is traced: bit for bit the chosen one."""
    logits, targets, weights = random_logits((2, 5, 13), jnp.float32, seed=2)
    optax_loss = optax.softmax_cross_entropy_with_integer_labels
    chosen = one_pass_cross_entropy if jax.default_backend() == "gpu" else optax_loss
    np.testing.assert_array_equal(softmax_cross_entropy(logits, targets), chosen(logits, targets))
    loss = lambda fn: jax.grad(lambda x: jnp.sum(fn(x, targets) * weights))(logits)  # noqa: E731
    np.testing.assert_array_equal(loss(softmax_cross_entropy), loss(chosen))
