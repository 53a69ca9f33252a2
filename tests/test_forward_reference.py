"""Norms, activations, MLPs and whole blocks against float64 NumPy written here, from the papers'
formulas: forward tests that need none of the optional extras (torch, transformers).

Parameters are drawn at unit scale rather than the 0.02 init, so that pre-activations span
about [-4, 4]: there the activations differ from each other (tanh GELU from erf GELU by up to
3e-4, far above the tolerance) and a swapped formula fails. Tolerance: float32 sums of ~100
products of unit-sized terms, each off by ~6e-8 relative, land within ~1e-6 of float64; 1e-5
leaves room for XLA's fused orderings."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt.config import ModelConfig
from jaxgpt.model.layers import MLP, make_norm
from jaxgpt.model.transformer import Block

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

TOLERANCE = 1e-5
D_MODEL = 32
erf = np.vectorize(math.erf)


def config(**changes) -> ModelConfig:
    base = dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, d_model=D_MODEL, position="learned")
    return ModelConfig(**(base | changes))


def unit_scale(params, seed: int):
    """Every parameter redrawn: matrices N(0, 1/fan_in), so each output has unit variance for
    unit inputs; norm scales around 1; biases N(0, 0.1)."""
    rng = np.random.default_rng(seed)

    def redraw(path, leaf):
        name = path[-1].key
        if name == "scale":
            return jnp.asarray(1 + 0.2 * rng.standard_normal(leaf.shape), jnp.float32)
        if name == "bias":
            return jnp.asarray(0.1 * rng.standard_normal(leaf.shape), jnp.float32)
        fan_in = leaf.shape[0] if path[-2].key != "out" else math.prod(leaf.shape[:-1])
        return jnp.asarray(rng.standard_normal(leaf.shape) / math.sqrt(fan_in), jnp.float32)

    return jax.tree_util.tree_map_with_path(redraw, params)


def inputs(seed: int, scale: float = 2.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).standard_normal((2, 16, D_MODEL))).astype(np.float32)


def f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


# ---------------------------------------------------------------- references, float64 NumPy


def layer_norm(x, p, eps):
    centred = x - x.mean(-1, keepdims=True)
    out = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * p["scale"]
    return out + p["bias"] if "bias" in p else out


def rms_norm(x, p, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * p["scale"]


def norm(c: ModelConfig, x, p):
    return rms_norm(x, p, c.norm_eps) if c.norm == "rmsnorm" else layer_norm(x, p, c.norm_eps)


ACTIVATIONS = {
    "gelu": lambda h: 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))),  # GPT-2's
    "gelu_exact": lambda h: h * 0.5 * (1 + erf(h / math.sqrt(2))),  # x Phi(x)
    "relu": lambda h: np.maximum(h, 0),
    "relu2": lambda h: np.maximum(h, 0) ** 2,
}


def silu(h):
    return h / (1 + np.exp(-h))


def dense(x, p, contract=1):
    """x's last `contract` axes against the kernel's first ones, plus the bias if any."""
    kernel = p["kernel"]
    axes = (list(range(x.ndim - contract, x.ndim)), list(range(contract)))
    return np.tensordot(x, kernel, axes=axes) + p.get("bias", 0)


def mlp(c: ModelConfig, x, p):
    if c.activation == "swiglu":  # Shazeer 2020: down(silu(gate x) * (up x))
        gate_up = dense(x, p["up"])  # (b, t, 2, hidden)
        return dense(silu(gate_up[..., 0, :]) * gate_up[..., 1, :], p["down"])
    return dense(ACTIVATIONS[c.activation](dense(x, p["up"])), p["down"])


def causal_attention(c: ModelConfig, x, p):
    """Vaswani et al.: softmax(q k^T / sqrt(d_head)) v over the past, query head h reading
    key/value head h // group; then the output projection."""
    qkv = dense(x, p["qkv"])  # (b, t, kv_heads, group + 2, head_dim)
    g = c.group_size
    q, k, v = qkv[:, :, :, :g], qkv[:, :, :, g], qkv[:, :, :, g + 1]
    scores = np.einsum("btkgh,bskh->bkgts", q, k) / math.sqrt(c.head_dim)
    t = x.shape[1]
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = np.einsum("bkgts,bskh->btkgh", weights, v)
    return dense(y, p["out"], contract=3)


def block(c: ModelConfig, x, p):
    if c.norm_position == "pre":  # GPT-2
        x = x + causal_attention(c, norm(c, x, p["norm_1"]), p["attn"])
        return x + mlp(c, norm(c, x, p["norm_2"]), p["mlp"])
    x = norm(c, x + causal_attention(c, x, p["attn"]), p["norm_1"])  # the original transformer
    return norm(c, x + mlp(c, x, p["mlp"]), p["norm_2"])


# ------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("kind, bias", [("layernorm", True), ("layernorm", False), ("rmsnorm", False)])
def test_norms(kind, bias):
    c = config(norm=kind, bias=bias)
    module = make_norm(c, "norm")
    x = inputs(0) + 3.0  # an offset LayerNorm must remove and RMSNorm must not
    params = unit_scale(module.init(jax.random.key(0), x)["params"], 1)
    got = jax.jit(module.apply)({"params": params}, x)
    np.testing.assert_allclose(got, norm(c, f64(x), f64(params)), rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_norms_at_the_models_own_scale_feel_their_epsilon(kind):
    """At unit scale epsilon vanishes; at the 0.02 std of a fresh residual stream mean(x^2) is
    4e-4, so eps = 1e-5 moves every output by about 1.2%. The norm must match the reference
    with its epsilon, and the reference without it must differ by far more than the tolerance:
    a norm that dropped or misplaced epsilon fails here."""
    c = config(norm=kind, bias=False)
    module = make_norm(c, "norm")
    x = inputs(0, scale=0.02)
    params = module.init(jax.random.key(0), x)["params"]
    got = np.asarray(jax.jit(module.apply)({"params": params}, x))
    np.testing.assert_allclose(got, norm(c, f64(x), f64(params)), rtol=TOLERANCE, atol=TOLERANCE)
    without = norm(c.replace(norm_eps=1e-30), f64(x), f64(params))  # no epsilon to speak of (0 is refused)
    assert np.abs(got - without).max() > 100 * TOLERANCE


@pytest.mark.parametrize("activation", ["gelu", "gelu_exact", "relu", "relu2", "swiglu"])
def test_mlps(activation):
    c = config(activation=activation)
    module = MLP(c)
    x = inputs(2)
    params = unit_scale(module.init(jax.random.key(0), x)["params"], 3)
    got = np.asarray(jax.jit(module.apply)({"params": params}, x))
    want = mlp(c, f64(x), f64(params))
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * scale)


def test_the_two_gelus_differ_far_above_the_tolerance_on_these_inputs():
    """So test_mlps fails if either formula is swapped for the other: the pre-activations
    reach the range where tanh's approximation is off by ~1e-4 and more."""
    pre = dense(f64(inputs(2)), f64(unit_scale(MLP(config()).init(jax.random.key(0), inputs(2))["params"], 3))["up"])
    gap = np.abs(ACTIVATIONS["gelu"](pre) - ACTIVATIONS["gelu_exact"](pre)).max()
    assert gap > 20 * TOLERANCE, gap


@pytest.mark.parametrize(
    "changes",
    [
        dict(norm_position="pre"),
        dict(norm_position="post", activation="relu"),
        dict(norm_position="pre", norm="rmsnorm", activation="swiglu", n_kv_head=2, bias=False),
        dict(norm_position="post", n_kv_head=1, activation="gelu_exact"),
    ],
    ids=["pre-LN GPT-2", "post-LN ReLU", "pre-RMSNorm SwiGLU GQA", "post-LN MQA exact GELU"],
)
def test_a_whole_block(changes):
    c = config(**changes)
    module = Block(c)
    x = inputs(4, scale=1.0)
    positions = jnp.arange(x.shape[1])[None]
    params = unit_scale(module.init(jax.random.key(0), x, positions, None)["params"], 5)
    got = np.asarray(jax.jit(lambda p, x: module.apply({"params": p}, x, positions, None))(params, x))
    want = block(c, f64(x), f64(params))
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * np.abs(want).max())
