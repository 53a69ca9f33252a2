"""The optimizer's contract, each part against arithmetic worked by hand: weight decay on the
matmul kernels alone, and global-norm clipping that scales a gradient down to the limit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgpt.config import ModelConfig, TrainConfig
from jaxgpt.model.transformer import init_params
from jaxgpt.training.optimizer import make_optimizer

CONFIG = ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, d_model=32)


def step(train: TrainConfig, params, grads):
    optimizer = make_optimizer(train)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    return optax.apply_updates(params, updates)


def test_at_zero_gradient_adamw_shrinks_the_kernels_by_lr_times_decay_and_nothing_else():
    """Adam's own update of a zero gradient is 0 / (0 + eps) = 0, so all that moves a weight is
    the decay, p <- p - lr * wd * p, on the kernels (and not on norm scales, biases or the
    embedding: those stay bit for bit). Planted, a decay mask left out of AdamW shrinks them all."""
    params = init_params(CONFIG, jax.random.key(0))
    params = jax.tree.map(lambda p: p + 0.5, params)  # norm scales of 1.5, biases of 0.5: all nonzero
    train = TrainConfig(steps=10, warmup_steps=0, lr=0.1, min_lr=0.1, weight_decay=0.2)
    after = step(train, params, jax.tree.map(jnp.zeros_like, params))
    for path, before in jax.tree_util.tree_leaves_with_path(params):
        moved = np.asarray(dict(jax.tree_util.tree_leaves_with_path(after))[path])
        if path[-1].key == "kernel":
            # one float32 multiply-add from p: within a rounding of p * (1 - 0.02)
            np.testing.assert_allclose(moved, np.asarray(before) * (1 - 0.1 * 0.2), rtol=2e-7)
        else:
            np.testing.assert_array_equal(moved, before)


def test_a_gradient_above_the_clip_steps_as_that_gradient_scaled_down_to_it():
    """grad_clip=1, a first gradient of global norm 8 and a second of 0.5: the clipped
    optimizer's two updates equal those of clipping off fed the first divided by 8 and the
    second as it is. (Adam is blind to a gradient's scale when every step has the same one, so
    the test makes the two steps' norms differ: the first's scale reaches the second's update
    through the moments.) Planted, clipping left out gives the second update of the raw pair."""
    params = init_params(CONFIG, jax.random.key(0))
    ones = jax.tree.map(jnp.ones_like, params)
    unit = float(optax.tree.norm(ones))
    first = jax.tree.map(lambda g: g * (8.0 / unit), ones)
    second = jax.tree.map(lambda p: jnp.sign(p + 1e-3) * (0.5 / unit), params)  # norm 0.5, another direction
    settings = dict(steps=10, warmup_steps=0, lr=0.1, min_lr=0.1, weight_decay=0.0)
    clipped, plain = (
        make_optimizer(TrainConfig(**settings, grad_clip=1.0)),
        make_optimizer(TrainConfig(**settings, grad_clip=0.0)),
    )

    def updates(optimizer, gradients):
        state, out = optimizer.init(params), []
        for g in gradients:
            update, state = optimizer.update(g, state, params)
            out.append(update)
        return out

    by_clipping = updates(clipped, [first, second])
    by_hand = updates(plain, [jax.tree.map(lambda g: g / 8.0, first), second])
    raw = updates(plain, [first, second])
    for got, want in zip(by_clipping, by_hand, strict=True):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9), got, want)
    pairs = zip(jax.tree.leaves(raw[1]), jax.tree.leaves(by_hand[1]), strict=True)
    largest = max(float(jnp.abs(a - b).max()) for a, b in pairs)
    assert largest > 1e-3  # the clip changes the second step: the test could fail
