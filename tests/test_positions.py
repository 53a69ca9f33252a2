"""Positions: RoPE against a complex-number reference and its defining properties, RoPE
scalings against hand-computed frequencies, sinusoidal tables, ALiBi slopes."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt.config import RopeScaling
from jaxgpt.model.positions import alibi_slopes, apply_rope, rope_frequencies, sinusoidal_embedding

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

HEAD_DIM = 16


def rope_reference(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """RoPE as in the paper (Su et al. 2021, eq. 34), in float64 complex arithmetic.

    Pair i is the complex number x[i] + 1j * x[i + d/2] (the rotate-half layout), multiplied
    by exp(1j * position * theta ** (-2i / d)).
    """
    half = x.shape[-1] // 2
    z = x[..., :half] + 1j * x[..., half:]
    freqs = theta ** (-np.arange(half) * 2.0 / x.shape[-1])
    z = z * np.exp(1j * positions[:, None, None] * freqs)  # x: (seq, heads, d)
    return np.concatenate([z.real, z.imag], axis=-1)


def random(shape, seed=0):
    return np.asarray(jax.random.normal(jax.random.key(seed), shape), np.float64)


def test_rope_matches_complex_reference():
    x = random((1, 12, 3, HEAD_DIM))  # (batch, seq, heads, head_dim)
    positions = np.arange(12)
    inv_freq, scale = rope_frequencies(HEAD_DIM, 10000.0)
    ours = apply_rope(jnp.asarray(x, jnp.float32), jnp.asarray(positions), inv_freq, scale)
    # float32 angles up to 11 rad carry ~1e-6 absolute error; values are O(1).
    np.testing.assert_allclose(ours[0], rope_reference(x[0], positions, 10000.0), atol=1e-5)


def test_rope_preserves_norms():
    x = random((2, 20, 4, HEAD_DIM))
    inv_freq, _ = rope_frequencies(HEAD_DIM, 10000.0)
    rotated = apply_rope(jnp.asarray(x, jnp.float32), jnp.arange(20), inv_freq)
    # A rotation is an isometry; float32 rounding of a 16-term sum is ~1e-7 relative.
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    q, k = random((1, 10, 1, HEAD_DIM), 1), random((1, 10, 1, HEAD_DIM), 2)
    inv_freq, _ = rope_frequencies(HEAD_DIM, 10000.0)

    def scores(offset):
        positions = jnp.arange(10) + offset
        rq = apply_rope(jnp.asarray(q, jnp.float32), positions, inv_freq)
        rk = apply_rope(jnp.asarray(k, jnp.float32), positions, inv_freq)
        return np.einsum("btd,bsd->bts", rq[:, :, 0], rk[:, :, 0])

    # Angles reach ~60 rad at offset 50, where a float32 angle is off by ~4e-6 rad; scores
    # are sums of 16 products of O(1) numbers, so they agree to ~1e-4 absolute.
    np.testing.assert_allclose(scores(50), scores(0), atol=2e-4)
    assert not np.allclose(scores(0)[0, 5, 2], scores(0)[0, 5, 3])  # yet position matters


def test_linear_scaling_is_unscaled_rope_at_positions_over_factor():
    x = jnp.asarray(random((1, 12, 2, HEAD_DIM)), jnp.float32)
    positions = jnp.arange(12)
    scaled, scale = rope_frequencies(HEAD_DIM, 10000.0, RopeScaling("linear", 4.0))
    plain, _ = rope_frequencies(HEAD_DIM, 10000.0)
    assert scale == 1.0
    np.testing.assert_allclose(apply_rope(x, positions, scaled), apply_rope(x, positions / 4.0, plain), atol=1e-6)


def test_ntk_frequencies_match_hand_computation():
    # head_dim 8, theta 1e4, factor 4: base' = 1e4 * 4^(8/6), and pair i has base'^(-i/4),
    # so the frequencies are 1, 1/(10 * 4^(1/3)), 1/(100 * 4^(2/3)), 1/(1000 * 4).
    inv_freq, scale = rope_frequencies(8, 10000.0, RopeScaling("ntk", 4.0))
    expected = [1.0, 1 / (10 * 4 ** (1 / 3)), 1 / (100 * 4 ** (2 / 3)), 1 / 4000]
    np.testing.assert_allclose(inv_freq, expected, rtol=1e-6)
    assert scale == 1.0


def test_yarn_frequencies_match_hand_computation():
    # head_dim 8, theta 1e4: plain frequencies 1, 0.1, 0.01, 0.001. Original window 64.
    # Pair index completing r rotations in 64 tokens: 8 ln(64 / (2 pi r)) / (2 ln 1e4):
    #   r = 32 (beta_fast) -> -0.497, floored and clipped to 0;
    #   r = 1  (beta_slow) ->  1.008, ceiled to 2.
    # Ramp (i - 0) / (2 - 0) clipped to [0, 1]: 0, 0.5, 1, 1 -> share interpolated.
    # Pair 0 keeps 1; pair 1 is 0.1 * (0.5 / 4 + 0.5) = 0.0625; pairs 2, 3 are divided by 4.
    inv_freq, scale = rope_frequencies(8, 10000.0, RopeScaling("yarn", 4.0, original_block_size=64))
    np.testing.assert_allclose(inv_freq, [1.0, 0.0625, 0.0025, 0.00025], rtol=1e-6)
    assert scale == pytest.approx(1 + 0.1 * math.log(4))


def test_llama3_frequencies_match_hand_computation():
    # head_dim 8, theta 1e4: plain frequencies 1, 0.1, 0.01, 0.001. Original window 100, so
    # pair i turns 100 * f / (2 pi) = 15.9, 1.59, 0.159, 0.0159 times in it. Llama 3.1's bounds
    # 1 and 4: pair 0 (>= 4) keeps 1; pairs 2, 3 (<= 1) are divided by the factor 8; pair 1
    # blends with weight w = (1.5915494 - 1) / 3 = 0.1971831 on keeping:
    # 0.1 * (w + (1 - w) / 8) = 0.02975352.
    inv_freq, scale = rope_frequencies(8, 10000.0, RopeScaling("llama3", 8.0, original_block_size=100))
    np.testing.assert_allclose(inv_freq, [1.0, 0.02975352, 0.00125, 0.000125], rtol=1e-6)
    assert scale == 1.0


def test_sinusoidal_matches_vaswani_formula():
    table = np.asarray(sinusoidal_embedding(jnp.arange(3), 4))
    # d = 4: PE[p] = [sin(p), cos(p), sin(p / 100), cos(p / 100)].
    expected = [[math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)] for p in range(3)]
    np.testing.assert_allclose(table, expected, atol=1e-6)


@pytest.mark.parametrize(
    "n_head, expected",
    [
        (8, [2.0**-k for k in range(1, 9)]),  # 2^(-8/8 * h)
        (4, [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]),  # 2^(-8/4 * h)
        # Not a power of two: the 4-head slopes, then every other 8-head slope (2^-1, 2^-3).
        (6, [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]),
    ],
)
def test_alibi_slopes_follow_the_paper(n_head, expected):
    np.testing.assert_allclose(alibi_slopes(n_head), expected, rtol=1e-7)


def test_sinusoidal_positions_are_relative_a_fixed_rotation_apart():
    """Vaswani et al.'s reason for the table: PE(p + k) is a linear function of PE(p) that does
    not depend on p (each (sin, cos) pair of frequency w turns by the angle w k), so
    PE(p) . PE(p + k) = sum_i cos(w_i k) depends on the offset k alone. Checked against
    rotations built from the frequencies, for every p of 0..200 and offsets up to 50, in float64
    on float32 tables: angles up to 250 rad carry float32 rounding of ~1.5e-5 per entry."""
    d = 64
    frequencies = 10000.0 ** -(np.arange(0, d, 2) / d)
    table = np.asarray(sinusoidal_embedding(jnp.arange(251), d), np.float64)
    for k in (1, 7, 50):
        turn = np.zeros((d, d))
        for i, w in enumerate(frequencies):  # [sin(a + wk), cos(a + wk)] = R(wk) [sin a, cos a]
            c, s = math.cos(w * k), math.sin(w * k)
            turn[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
        np.testing.assert_allclose(table[k : 201 + k], table[:201] @ turn.T, atol=1e-4)
        dots = np.einsum("pd,pd->p", table[:201], table[k : 201 + k])
        np.testing.assert_allclose(dots, np.sum(np.cos(frequencies * k)), atol=1e-3)


def test_longrope_frequencies_and_scale_match_hand_computation():
    # head_dim 8, theta 1e4: theta ** (2i / 8) = 1, 10, 100, 1000. Original window 4, stretch 8.
    # Past the window (block_size 32) the long factors 1, 2, 4, 8 divide the plain frequencies:
    # 1, 1/20, 1/400, 1/8000; within it (block_size 4) the short factors, all 1, leave them.
    # The scale sqrt(1 + ln 8 / ln 4) = sqrt(2.5) either way (it follows the stretch).
    scaling = RopeScaling("longrope", 8.0, 4, long_factor=(1.0, 2.0, 4.0, 8.0), short_factor=(1.0,) * 4)
    long, long_scale = rope_frequencies(8, 10000.0, scaling, block_size=32)
    short, short_scale = rope_frequencies(8, 10000.0, scaling, block_size=4)
    np.testing.assert_allclose(long, [1.0, 1 / 20, 1 / 400, 1 / 8000], rtol=1e-6)
    np.testing.assert_allclose(short, [1.0, 0.1, 0.01, 0.001], rtol=1e-6)
    assert long_scale == short_scale == pytest.approx(math.sqrt(2.5))
    assert rope_frequencies(8, 10000.0, dataclasses.replace(scaling, factor=1.0), block_size=32)[1] == 1.0  # no stretch


def test_the_longrope_scale_reaches_the_attention_scores():
    """A LongRoPE model whose factors are all 1 rotates as plain RoPE does, so its attention
    scores are plain RoPE's times the square of its scale (cos and sin are scaled, so q and k
    are each scaled by it): sqrt(2.5) squared, 2.5, on every visible score."""
    from jaxgpt.config import ModelConfig
    from jaxgpt.lab.capture import capture
    from jaxgpt.model.transformer import init_params

    plain = ModelConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=16, position="rope")
    ones = RopeScaling("longrope", 8.0, 4, long_factor=(1.0,) * 4, short_factor=(1.0,) * 4)
    longrope = plain.replace(rope_scaling=ones)
    params = init_params(plain, jax.random.key(0))
    tokens = np.arange(8)[None] % 16
    want, got = capture(plain, params, tokens).scores, capture(longrope, params, tokens).scores
    visible = np.isfinite(want)
    np.testing.assert_allclose(got[visible], 2.5 * want[visible], rtol=1e-5, atol=1e-6)
