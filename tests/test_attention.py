"""Attention: the layer against an explicit float64 reference, ALiBi's bias, kernel agreement,
and float32 softmax under bfloat16 compute."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import attend

from jaxgpt.config import ModelConfig
from jaxgpt.model.attention import CausalSelfAttention, attention_scores, attention_weights, causal_score_bias
from jaxgpt.model.positions import alibi_slopes

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

SEQ = 10


def attention_config(n_kv_head, **changes):
    return ModelConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, **changes)


def reference_attention(x, params, config, alibi=None):
    """Multi-head causal attention written out head by head in float64, sharing each key/value
    head with its group of query heads by an explicit copy (np.repeat), as in Ainslie et al."""
    x = np.asarray(x, np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    H, G, D = config.n_head, config.group_size, config.head_dim
    w, b = p["qkv"]["kernel"], p["qkv"]["bias"]  # (d_model, K, G + 2, D), (K, G + 2, D)
    q = np.einsum("btm,mkgd->btkgd", x, w[:, :, :G]) + b[:, :G]
    q = q.reshape(*x.shape[:2], H, D)  # query head h = k * G + g
    k = np.einsum("btm,mkd->btkd", x, w[:, :, G]) + b[:, G]
    v = np.einsum("btm,mkd->btkd", x, w[:, :, G + 1]) + b[:, G + 1]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # head h reads kv head h // G
    scores = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
    i, j = np.arange(x.shape[1])[:, None], np.arange(x.shape[1])[None, :]
    if alibi is not None:
        scores = scores - alibi[None, :, None, None] * (i - j)
    scores = np.where(j <= i, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = np.einsum("bhts,bshd->bthd", weights, v)
    wo = p["out"]["kernel"].reshape(H, D, -1)
    return np.einsum("bthd,hdm->btm", heads, wo) + p["out"]["bias"]


def normal(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def init_layer(config, seed=0):
    """The layer, random parameters (biases too, so the reference checks where each lands), input."""
    x = normal((2, SEQ, config.d_model), seed)
    layer = CausalSelfAttention(config)
    shapes = jax.eval_shape(layer.init, jax.random.key(0), x, jnp.arange(SEQ), None)["params"]
    leaves, tree = jax.tree.flatten(shapes)
    params = jax.tree.unflatten(tree, [0.3 * normal(a.shape, seed + 1 + i) for i, a in enumerate(leaves)])
    return layer, params, x


def run_layer(layer, params, x):
    return jax.jit(layer.apply)({"params": params}, x, jnp.arange(x.shape[1]), None)


# float32 against float64: inputs and weights O(1), sums of 32 products; float32 rounding
# leaves ~1e-6 relative error per step, a few steps deep -> 1e-4 absolute on O(1)-O(10) outputs.
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_layer_matches_repeat_kv_reference(n_kv_head):
    config = attention_config(n_kv_head)
    layer, params, x = init_layer(config)
    ours = run_layer(layer, params, x)
    np.testing.assert_allclose(ours, reference_attention(x, params, config), **TOL)


@pytest.mark.parametrize("head_dim", [16, 4], ids=["wider", "narrower"])
def test_heads_of_a_width_of_their_own_match_the_reference(head_dim):
    """model.head_dim other than d_model / n_head (Qwen3's and Gemma's wider heads, or narrower):
    queries n_head x head_dim, keys and values n_kv_head x head_dim, and the output projection
    back to d_model; the float64 reference reads the same parameters head by head."""
    config = attention_config(2, head_dim=head_dim)
    layer, params, x = init_layer(config)
    assert params["qkv"]["kernel"].shape == (32, 2, 4, head_dim) and params["out"]["kernel"].shape == (
        2,
        2,
        head_dim,
        32,
    )
    np.testing.assert_allclose(run_layer(layer, params, x), reference_attention(x, params, config), **TOL)


def test_alibi_layer_matches_reference():
    config = attention_config(2, position="alibi")
    layer, params, x = init_layer(config)
    ours = run_layer(layer, params, x)
    np.testing.assert_allclose(ours, reference_attention(x, params, config, alibi_slopes(4)), **TOL)


def test_alibi_bias_is_minus_slope_times_distance():
    slopes = jnp.asarray(alibi_slopes(4)).reshape(2, 2)  # (kv heads, group)
    bias = np.asarray(causal_score_bias(5, 5, None, slopes))[0]  # (2, 2, 5, 5)
    m = alibi_slopes(4).reshape(2, 2)
    for h_kv in range(2):
        for g in range(2):
            for i in range(5):
                for j in range(5):
                    expected = -m[h_kv, g] * (i - j) if j <= i else -np.inf
                    assert bias[h_kv, g, i, j] == pytest.approx(expected)


def test_cache_index_shifts_the_causal_diagonal():
    # Two queries at positions 3 and 4 of a 6-slot cache see keys 0..3 and 0..4.
    visible = np.isfinite(np.asarray(causal_score_bias(2, 6, jnp.asarray(3), None)))[0, 0, 0]
    np.testing.assert_array_equal(visible, [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]])


def random_qkv(dtype=jnp.float32, t=SEQ, s=SEQ):
    q = normal((2, t, 2, 3, 8), 1)  # (b, t, k, g, d)
    k, v = normal((2, s, 2, 8), 2), normal((2, s, 2, 8), 3)
    return (jnp.asarray(a, dtype) for a in (q, k, v))


@pytest.mark.parametrize(
    "case",
    ["causal", "alibi", "cache", "window"],
)
def test_kernels_agree(case):
    q, k, v = random_qkv(s=16 if case == "cache" else SEQ)
    kw, window = {}, 3 if case == "window" else 0  # a window's length is static: it shapes the mask
    if case == "alibi":
        kw["slopes"] = jnp.asarray(alibi_slopes(6)).reshape(2, 3)
    if case == "cache":  # queries at positions 4..13 of a 16-slot cache
        kw["cache_index"] = jnp.asarray(4)
    xla = jax.jit(partial(attend, kernel="xla", window=window))(q, k, v, **kw)
    dot = jax.jit(partial(attend, kernel="dot_product", window=window))(q, k, v, **kw)
    # Same float32 math in a different association order: a few ulps of O(1) values.
    np.testing.assert_allclose(xla, dot, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 3, SEQ - 1])
def test_a_sliding_window_in_jax_nn_words_is_our_window(window):
    """cuDNN is told our window as jax.nn's local_window_size with is_causal; jax.nn's XLA
    implementation reads those arguments the same way (its docs: keys from i - left to i + right),
    so on a CPU it checks the translation against our own kernel's window mask. Float32 both,
    different association orders: a few ulps."""
    from jaxgpt.model.attention import Mask, xla_attention
    from jaxgpt.model.kernels import local_window_size

    q, k, v = random_qkv()
    mask = Mask(window=window)
    b, t, n_kv, group, d = q.shape
    theirs = jax.nn.dot_product_attention(
        q.reshape(b, t, n_kv * group, d), k, v, is_causal=True, local_window_size=local_window_size(mask)
    )
    ours = xla_attention(q, k, v, mask, None)
    np.testing.assert_allclose(theirs.reshape(ours.shape), ours, atol=1e-5, rtol=1e-5)


@jax.jit
def causal_weights(q, k):
    """The attention pattern the lab shows (hook_pattern) under the causal mask."""
    return attention_weights(attention_scores(q, k, causal_score_bias(SEQ, SEQ, None, None)))


def test_weights_are_a_causal_distribution():
    q, k, _ = random_qkv()
    w = np.asarray(causal_weights(q, k))
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    assert np.all(np.triu(w, k=1) == 0.0)


def test_softmax_is_float32_under_bfloat16_inputs():
    q, k, _ = random_qkv(jnp.bfloat16)
    w = causal_weights(q, k)
    assert w.dtype == jnp.float32
    # A bfloat16 softmax could only normalise to within ~2^-8 = 4e-3.
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)


PACKED = np.repeat(np.array([[1, 2, 3], [1, 1, 0]]), [40, 50, 38], axis=1)  # 3 sequences; 2 and padding


@pytest.mark.parametrize(
    "segments", [pytest.param(None, id="one-sequence"), pytest.param(PACKED, id="packed", marks=pytest.mark.slow)]
)
def test_pallas_tpu_flash_attention_matches_the_xla_kernel_with_gradients(segments):
    """The TPU kernel, run on the CPU in Pallas's TPU interpret mode (which simulates the TPU's
    memories and executes the same kernel code), against the readable kernel: outputs and the
    gradients of q, k and v under grouped-query attention (2 kv heads x 3 queries each), over
    one sequence a row and over rows of packed sequences and padding (the batch's segments as
    the kernel's segment ids; slow: 20 s of interpreted kernel). Both are float32 with a
    float32 softmax; the flash kernel's running max and rescaled partial sums reorder the
    additions, a few ulps on O(1) values, and the backward pass's recomputed softmax adds a few
    more: 1e-5 absolute."""
    from jax.experimental.pallas import tpu as pltpu

    q, k, v = random_qkv(t=128, s=128)  # the kernel's block is 128 positions
    segments = None if segments is None else jnp.asarray(segments, jnp.int32)

    def loss(kernel, q, k, v):
        out = attend(q, k, v, kernel=kernel, segments=segments)
        return jnp.sum(out * jnp.cos(out)), out  # a nonlinear loss: the gradients are not just out

    with pltpu.force_tpu_interpret_mode():
        (_, flash), flash_grads = jax.jit(jax.value_and_grad(partial(loss, "flash_tpu"), (0, 1, 2), has_aux=True))(
            q, k, v
        )
    (_, xla), xla_grads = jax.jit(jax.value_and_grad(partial(loss, "xla"), (0, 1, 2), has_aux=True))(q, k, v)
    np.testing.assert_allclose(flash, xla, atol=1e-5)
    for got, want in zip(flash_grads, xla_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_attention_without_projections_weighs_tokens_by_their_own_likeness():
    """qkv_projections=False: each head's slice x_h of the input is its query, key and value, so
    head h computes softmax(causal(x_h x_h^T / sqrt(d))) x_h, then the output projection mixes
    the heads. Against that formula in float64 (float32 sums of 8 products: 1e-5)."""
    c = ModelConfig(vocab_size=8, block_size=6, n_layer=1, n_head=2, d_model=16, position="none", qkv_projections=False)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 6, 16)), jnp.float32)
    layer = CausalSelfAttention(c)
    params = layer.init(jax.random.key(0), x, jnp.arange(6), None)["params"]
    assert set(params) == {"out"}  # no query, key or value weights to learn
    got = layer.apply({"params": params}, x, jnp.arange(6), None)
    heads = np.asarray(x, np.float64).reshape(2, 6, 2, 8)
    scores = np.einsum("bqhd,bkhd->bhqk", heads, heads) / math.sqrt(8)
    scores = np.where(np.tril(np.ones((6, 6), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    mixed = np.einsum("bhqk,bkhd->bqhd", weights, heads)  # (b, t, heads, head_dim)
    kernel = np.asarray(params["out"]["kernel"], np.float64).reshape(2, 8, 16)  # (heads, head_dim, d_model)
    want = np.einsum("bqhd,hde->bqe", mixed, kernel) + np.asarray(params["out"]["bias"], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="qkv_projections"):
        c.replace(n_kv_head=1)
