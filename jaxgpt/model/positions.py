"""How a token's position enters the model: RoPE, sinusoidal tables and ALiBi slopes.

All of these are computed from positions on the fly, never stored as parameters, so a model
using them can run on sequences longer than it was trained on. (The learned table is an
`nn.Embed` in the decoder.)
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxgpt.config import RopeScaling


def rope_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None = None, block_size: int | None = None
) -> tuple[np.ndarray, float]:
    """RoPE's rotation frequencies and the logit scale that goes with them.

    Returns (inv_freq, attention_scale): inv_freq[i] is the angle per position step of the
    i-th pair of dimensions, theta ** (-2i / head_dim), adjusted by `scaling`; the scale
    multiplies cos and sin (so q.k by its square) and is 1 except for YaRN and LongRoPE.
    block_size: the model's context, which picks LongRoPE's long or short factors.
    """
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim  # (head_dim/2,)
    inv_freq = theta**-exponents
    if scaling is None:
        return inv_freq.astype(np.float32), 1.0
    s = scaling.factor
    if scaling.kind == "linear":
        return (inv_freq / s).astype(np.float32), 1.0
    if scaling.kind == "ntk":
        return ((theta * s ** (head_dim / (head_dim - 2))) ** -exponents).astype(np.float32), 1.0
    if scaling.kind == "yarn":
        return _yarn(inv_freq, head_dim, theta, scaling)
    if scaling.kind == "llama3":
        return _llama3(inv_freq, scaling).astype(np.float32), 1.0
    if scaling.kind == "longrope":
        return _longrope(exponents, theta, scaling, block_size)
    raise ValueError(f"unknown rope_scaling.kind {scaling.kind!r}")


def _yarn(inv_freq: np.ndarray, head_dim: int, theta: float, scaling: RopeScaling) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023, section 3.2).

    A pair whose wavelength fits many times in the original window (more than beta_fast
    rotations) keeps its frequency: those dimensions encode local order and were trained on
    every angle they will meet. A pair completing fewer than beta_slow rotations is
    interpolated (divided by the factor), as in linear scaling. Between the two, a linear ramp
    over the pair index blends the two.
    """
    s, original = scaling.factor, scaling.original_block_size

    def pair_index_for(rotations: float) -> float:
        # Solve original * inv_freq[i] / (2 pi) = rotations for the pair index i.
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(pair_index_for(scaling.beta_fast)), 0)
    high = min(math.ceil(pair_index_for(scaling.beta_slow)), head_dim - 1)
    if high == low:
        high += 0.001  # avoid a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1: extrapolate (keep frequency), 0: interpolate
    blended = inv_freq / s * (1.0 - keep) + inv_freq * keep
    return blended.astype(np.float32), 0.1 * math.log(s) + 1.0


def _llama3(inv_freq: np.ndarray, scaling: RopeScaling) -> np.ndarray:
    """Llama 3.1's rule: a pair completing at least high_freq_factor rotations within the
    original window keeps its frequency, one completing at most low_freq_factor is
    interpolated (divided by the factor), and in between the frequency is a blend weighted by
    where the pair's rotation count lies between the two."""
    rotations = scaling.original_block_size * inv_freq / (2 * math.pi)  # per original window
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    keep = np.clip((rotations - low) / (high - low), 0.0, 1.0)  # 1: keep, 0: interpolate
    return inv_freq * keep + inv_freq / scaling.factor * (1.0 - keep)


def _longrope(exponents: np.ndarray, theta: float, scaling: RopeScaling, block_size: int | None):
    """LongRoPE (Ding et al. 2024): pair i turns at 1 / (factor_i * theta ** (2i / head_dim)),
    its factor found by search rather than by a rule, one set for contexts within the original
    window and one for those past it. The attention scale sqrt(1 + ln s / ln L) (s the
    stretch, L the original window) offsets the flatter softmax of a longer context."""
    original = scaling.original_block_size
    long = block_size is not None and block_size > original
    factors = np.asarray(scaling.long_factor if long else scaling.short_factor, np.float32)
    # float32 throughout, as transformers computes these, so imported models agree to the bit.
    inv_freq = 1.0 / (factors * np.float32(theta) ** exponents.astype(np.float32))
    s = scaling.factor
    scale = 1.0 if s <= 1.0 else math.sqrt(1 + math.log(s) / math.log(original))
    return inv_freq.astype(np.float32), scale


def apply_rope(
    x: jnp.ndarray, positions: jnp.ndarray, inv_freq: np.ndarray, scale: float = 1.0, *, interleaved: bool = False
) -> jnp.ndarray:
    """Rotate each pair of dimensions of x by position * frequency.

    x: (batch, seq, *heads, head_dim); positions: (seq,) or (batch, seq).
    Pairs are (x[i], x[i + head_dim/2]) — the "rotate half" layout of GPT-NeoX and Hugging Face
    Llama checkpoints — so their q/k projections load without permutation; interleaved=True
    pairs neighbours (x[2i], x[2i + 1]) as the RoPE paper and GPT-J do. The two are the same
    rotation of permuted features, so a model trains the same with either; only checkpoints
    care. Angles are computed in float32 whatever x's dtype, since position * frequency loses
    whole turns in bfloat16.
    """
    n_head_axes = x.ndim - 3
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)  # (..., seq, hd/2)
    angles = angles.reshape(angles.shape[:-1] + (1,) * n_head_axes + angles.shape[-1:])
    cos, sin = jnp.cos(angles) * scale, jnp.sin(angles) * scale
    x32 = x.astype(jnp.float32)
    if interleaved:
        x1, x2 = x32[..., 0::2], x32[..., 1::2]
        rotated = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(x.shape)
    else:
        x1, x2 = jnp.split(x32, 2, axis=-1)
        rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def sinusoidal_embedding(positions: jnp.ndarray, d_model: int) -> jnp.ndarray:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same).

    positions: (seq,) or (batch, seq) -> (..., d_model), float32.
    """
    inv_freq = 10000.0 ** -(np.arange(0, d_model, 2) / d_model)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d_model)


def alibi_slopes(n_head: int) -> np.ndarray:
    """ALiBi's per-head slopes m_h (Press et al. 2022, section 3).

    For n heads, a power of two, the slopes are the geometric sequence 2^(-8/n), 2^(-16/n),
    ..., 2^(-8). Otherwise the paper takes the slopes of the largest power of two p below n,
    then every other slope of 2p for the remaining heads.
    """

    def geometric(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    p = 2 ** math.floor(math.log2(n_head))
    slopes = geometric(p) + geometric(2 * p)[0::2][: n_head - p]
    return np.asarray(slopes, np.float32)
