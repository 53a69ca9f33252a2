"""The decoder as a whole: sanity losses, causality, the KV cache, layer scanning and
rematerialisation, parameter counts, initialisation and mixed precision."""

import json
import math
from functools import partial

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import matrix

from jaxgpt.config import ModelConfig
from jaxgpt.hf import pretrained_config
from jaxgpt.model.transformer import (
    GPT,
    count_params,
    flops_per_token,
    init_cache,
    init_params,
    stack_blocks,
    unstack_blocks,
)

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

GPT2_STYLE = dict()  # the defaults: MHA, learned positions, LayerNorm, GELU, biases, tied
LLAMA_STYLE = dict(n_kv_head=2, position="rope", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False)
POSITIONS = ["rope", "learned", "sinusoidal", "alibi", "none"]
REMAT_POLICIES = ["full", "dots", "dots_no_batch"]


def tiny(**changes) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=32, block_size=32, n_layer=2, n_head=4, d_model=32), **changes})


def random_tokens(config, shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, config.vocab_size, shape), jnp.int32)


@partial(jax.jit, static_argnums=(0,))
def params_for(config, seed=0):
    return init_params(config, jax.random.key(seed))


@partial(jax.jit, static_argnums=(0,))
def forward(config, params, tokens):
    return GPT(config).apply({"params": params}, tokens)


def loss(config, params, tokens):
    logits = GPT(config).apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


@pytest.mark.parametrize("style", [GPT2_STYLE, LLAMA_STYLE], ids=["gpt2", "llama"])
def test_initial_loss_is_log_vocab(style):
    # At init the logits are nearly uniform: logit std sigma ~ init_std * sqrt(d_model) ~ 0.23
    # makes the expected loss ln V + sigma^2 / 2 ~ ln V + 0.03, and tokens are random.
    config = tiny(vocab_size=256, d_model=128, **style)
    tokens = random_tokens(config, (8, 33))
    value = float(jax.jit(loss, static_argnums=0)(config, params_for(config), tokens))
    assert abs(value - math.log(256)) < 0.06


@pytest.mark.parametrize("style", [GPT2_STYLE, LLAMA_STYLE], ids=["gpt2", "llama"])
def test_overfits_one_batch(style):
    config = tiny(d_model=64, **style)
    tokens = random_tokens(config, (4, 33))
    optimizer = optax.adam(3e-3)
    params = params_for(config)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state):
        value, grads = jax.value_and_grad(partial(loss, config))(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    first = None
    for _ in range(120):  # the loss crosses 0.05 near step 50 in both styles (measured on a Zen 3)
        params, opt_state, value = step(params, opt_state)
        first = first if first is not None else float(value)
    assert first > 3.0  # started near ln 32 = 3.47
    assert float(value) < 0.05  # memorised: ~0.02 measured at step 100, 0.013 at step 300


@pytest.mark.parametrize("kernel, position", matrix({k: k for k in ("xla", "dot_product")}, {p: p for p in POSITIONS}))
def test_future_tokens_do_not_change_the_past(kernel, position):
    config = tiny(position=position, attention=kernel)
    params = params_for(config)
    tokens = random_tokens(config, (2, 16))
    changed = tokens.at[:, 9:].set((tokens[:, 9:] + 1) % config.vocab_size)
    before, after = forward(config, params, tokens), forward(config, params, changed)
    # Masked scores are -inf, so future tokens add exact zeros: bit-identical past.
    np.testing.assert_array_equal(before[:, :9], after[:, :9])
    assert not np.allclose(before[:, 9:], after[:, 9:])


@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal", "none"])
def test_runs_past_block_size_without_a_position_table(position):
    config = tiny(block_size=8, position=position)
    params = params_for(config)
    tokens = random_tokens(config, (2, 24))
    long = forward(config, params, tokens)
    assert np.isfinite(long).all()
    # Causality makes the first 8 positions of the long run those of an 8-token run.
    np.testing.assert_allclose(long[:, :8], forward(config, params, tokens[:, :8]), atol=1e-5)


def test_learned_positions_refuse_sequences_past_block_size():
    config = tiny(block_size=8)
    with pytest.raises(ValueError, match="longer than block_size=8"):
        forward(config, params_for(config), random_tokens(config, (1, 9)))


def decode_stepwise(config, params, tokens, prompt_len):
    """Prefill tokens[:, :prompt_len] in one call, then feed the rest one token at a time."""
    apply = jax.jit(partial(GPT(config).apply, decode=True, mutable=["cache"]))
    logits, state = apply({"params": params, "cache": init_cache(config, tokens.shape[0])}, tokens[:, :prompt_len])
    steps = [logits]
    for t in range(prompt_len, tokens.shape[1]):
        logits, state = apply({"params": params, "cache": state["cache"]}, tokens[:, t : t + 1])
        steps.append(logits)
    return jnp.concatenate(steps, axis=1)


@pytest.mark.parametrize("n_kv_head, position", matrix({"MHA": 4, "GQA": 2, "MQA": 1}, {p: p for p in POSITIONS}))
def test_kv_cache_decoding_matches_full_forward(n_kv_head, position):
    config = tiny(n_kv_head=n_kv_head, position=position, block_size=16)
    params = params_for(config)
    tokens = random_tokens(config, (2, 12))
    # Same float32 math over a 16-slot cache instead of 12 keys: the extra slots add exact
    # zeros, but sums re-associate, so agreement is to float32 rounding of O(1) logits.
    np.testing.assert_allclose(decode_stepwise(config, params, tokens, 5), forward(config, params, tokens), atol=1e-5)


HEADS_OF_THEIR_OWN = dict(LLAMA_STYLE, n_kv_head=2, head_dim=24)  # 4 heads x 24 = 96 wide over a 32-wide stream


@pytest.mark.parametrize(
    "changes",
    [dict(scan_layers=True), dict(attention="dot_product"), LLAMA_STYLE, HEADS_OF_THEIR_OWN],
    ids=["scanned", "dot_product", "llama", "head_dim"],
)
def test_kv_cache_decoding_matches_full_forward_in_other_layouts(changes):
    config = tiny(block_size=16, **changes)
    params = params_for(config)
    tokens = random_tokens(config, (3, 16))  # fills the cache to the last slot
    np.testing.assert_allclose(decode_stepwise(config, params, tokens, 1), forward(config, params, tokens), atol=1e-5)


def loss_and_grads(config, params, tokens):
    return jax.jit(jax.value_and_grad(partial(loss, config)))(params, tokens)


def test_scanned_layers_match_unscanned():
    config = tiny(n_layer=3, **LLAMA_STYLE)
    scanned = config.replace(scan_layers=True)
    params = params_for(config)
    tokens = random_tokens(config, (2, 17))
    stacked = stack_blocks(params, config.n_layer)
    assert jax.tree.structure(stacked) == jax.tree.structure(params_for(scanned))
    np.testing.assert_allclose(forward(scanned, stacked, tokens), forward(config, params, tokens), atol=1e-6)
    value, grads = loss_and_grads(config, params, tokens)
    value_s, grads_s = loss_and_grads(scanned, stacked, tokens)
    assert float(value_s) == pytest.approx(float(value), abs=1e-6)
    jax.tree.map(partial(np.testing.assert_allclose, atol=1e-6), unstack_blocks(grads_s), grads)
    jax.tree.map(np.testing.assert_array_equal, unstack_blocks(stacked), params)  # exact round trip


@pytest.mark.parametrize("scan, policy", matrix({"False": False, "True": True}, {p: p for p in REMAT_POLICIES}))
def test_remat_changes_memory_not_math(scan, policy):
    config = tiny(scan_layers=scan)
    params = params_for(config)
    tokens = random_tokens(config, (2, 17))
    value, grads = loss_and_grads(config, params, tokens)
    value_r, grads_r = loss_and_grads(config.replace(remat=policy), params, tokens)
    # Recomputation repeats the same float32 ops; XLA may fuse them differently.
    assert float(value_r) == pytest.approx(float(value), abs=1e-6)
    jax.tree.map(partial(np.testing.assert_allclose, atol=1e-6), grads_r, grads)


def closed_form_count(c: ModelConfig) -> int:
    """Parameters of the architecture, counted by hand from its definition."""
    D, V, L, F = c.d_model, c.vocab_size, c.n_layer, c.mlp_hidden
    qkv_width = (c.n_head + 2 * c.n_kv_head) * c.head_dim
    up_width = 2 * F if c.activation == "swiglu" else F  # gate and up
    per_layer = (
        D * qkv_width
        + (qkv_width if c.bias else 0)  # fused q, k, v
        + D * D
        + (D if c.bias else 0)  # output projection (n_head * head_dim = D)
        + D * up_width
        + (up_width if c.bias else 0)
        + F * D
        + (D if c.bias else 0)
    )
    norm = 2 * D if c.norm == "layernorm" and c.bias else D  # scale (+ bias)
    return (
        V * D  # token embedding
        + (c.block_size * D if c.position == "learned" else 0)
        + L * (per_layer + 2 * norm)
        + (norm if c.norm_position == "pre" else 0)  # final norm
        + (0 if c.tie_embeddings else V * D)  # LM head
    )


@pytest.mark.parametrize(
    "changes",
    [
        GPT2_STYLE,
        dict(tie_embeddings=False),
        LLAMA_STYLE,
        dict(LLAMA_STYLE, tie_embeddings=True, n_kv_head=1),
        dict(norm_position="post", position="alibi", activation="relu"),
        dict(bias=False, mlp_hidden=48),
    ],
)
def test_parameter_count_matches_closed_form(changes):
    config = tiny(**changes)
    params = jax.eval_shape(params_for, config)
    assert count_params(params) == closed_form_count(config)
    if config.tie_embeddings:
        assert "lm_head" not in params  # one matrix serves both ends


def test_flops_per_token_follows_the_stated_convention():
    config = tiny(tie_embeddings=False)
    # Matmul parameters: all but the position table and the (untied) embedding lookup.
    n = closed_form_count(config) - config.block_size * config.d_model - config.vocab_size * config.d_model
    expected = 6 * n + 12 * config.n_layer * config.d_model * 20
    assert flops_per_token(config, seq_len=20) == expected


def test_initialisation_follows_gpt2():
    config = tiny(n_layer=4, d_model=128, vocab_size=512)
    params = params_for(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    expected = {
        ("wte", "embedding"): 0.02,
        ("wpe", "embedding"): 0.02,
        ("attn", "qkv", "kernel"): 0.02,
        ("attn", "out", "kernel"): residual_std,
        ("mlp", "up", "kernel"): 0.02,
        ("mlp", "down", "kernel"): residual_std,
    }
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = tuple(k.key for k in path)
        value = np.asarray(leaf)
        if names[-1] == "bias":
            assert np.all(value == 0), names
        elif names[-1] == "scale":
            assert np.all(value == 1), names
        else:
            std = expected[names[1:] if names[0].startswith("block_") else names]
            # The sample std of n >= 16k normal draws is within 1/sqrt(2n) < 0.6% of the
            # truth per sigma; 5% is > 8 sigma away, while a wrong scheme misses by > 40%.
            assert abs(value.std() / std - 1) < 0.05, (names, value.std(), std)
            assert abs(value.mean()) < 5 * std / math.sqrt(value.size), names


@pytest.mark.parametrize("style", [GPT2_STYLE, LLAMA_STYLE], ids=["gpt2", "llama"])
def test_bfloat16_compute_tracks_float32(style):
    config = tiny(**style)
    params = params_for(config)
    tokens = random_tokens(config, (2, 16))
    full = np.asarray(forward(config, params, tokens))
    half = forward(config.replace(dtype="bfloat16"), params, tokens)
    assert half.dtype == jnp.float32  # logits are returned in float32 for the loss
    # bfloat16 rounds to 2^-9 relative; over ~20 roundings on the path from embedding to
    # logit, errors grow like their square root: ~1% of the logits' scale.
    scale = np.abs(full).max()
    assert np.abs(np.asarray(half) - full).max() < 0.03 * scale
    assert np.abs(np.asarray(half) - full).max() > 0  # bfloat16 was really used


def test_bfloat16_model_takes_every_exponential_in_float32():
    config = tiny(dtype="bfloat16", **LLAMA_STYLE)
    params = jax.eval_shape(params_for, config)
    jaxpr = jax.make_jaxpr(partial(GPT(config).apply))({"params": params}, jnp.zeros((1, 8), jnp.int32))

    def exponentials(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "exp":
                yield eqn.outvars[0].aval.dtype
        for sub in jax.extend.core.subjaxprs(jaxpr):
            yield from exponentials(sub)

    dtypes = list(exponentials(jaxpr.jaxpr))
    assert dtypes and all(d == jnp.float32 for d in dtypes)  # softmax's exp, one per layer


def test_dropout_only_in_training():
    config = tiny(dropout=0.5)
    params = params_for(config)
    tokens = random_tokens(config, (2, 16))
    apply = jax.jit(GPT(config).apply, static_argnames="train")
    np.testing.assert_array_equal(apply({"params": params}, tokens), forward(config, params, tokens))
    a = apply({"params": params}, tokens, train=True, rngs={"dropout": jax.random.key(1)})
    b = apply({"params": params}, tokens, train=True, rngs={"dropout": jax.random.key(1)})
    c = apply({"params": params}, tokens, train=True, rngs={"dropout": jax.random.key(2)})
    np.testing.assert_array_equal(a, b)  # reproducible from the rng
    assert not np.allclose(a, c)


def test_without_positions_or_mask_attention_is_permutation_equivariant():
    """With no positional information and no causal mask, nothing in the model knows the
    order: shuffling the tokens shuffles the logits the same way (the sums inside attention are
    reordered, so float32's 1e-6 relative is the tolerance). Learned positions break it, which
    shows the check can fail."""
    config = ModelConfig(vocab_size=40, block_size=12, n_layer=2, n_head=2, d_model=32, position="none", causal=False)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 12)))
    order = np.random.default_rng(1).permutation(12)
    for position, equivariant in (("none", True), ("learned", False)):
        c = config.replace(position=position)
        logits = jax.jit(GPT(c).apply)
        params = jax.jit(init_params, static_argnums=0)(c, jax.random.key(0))
        shuffled, original = logits({"params": params}, tokens[:, order]), logits({"params": params}, tokens)[:, order]
        assert np.allclose(shuffled, original, rtol=1e-5, atol=1e-6) == equivariant, position


# Qwen2-0.5B's config.json as published (fields that do not shape the model left out).
QWEN2_05B = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": 131072,
    "max_window_layers": 24,
}


def test_a_real_models_config_reads_to_its_published_parameter_count(tmp_path):
    """The texts' exercise: read Qwen2-0.5B's config and count its parameters, no weights needed.
    By hand, with head_dim 896 / 14 = 64 and 2 key/value heads of 128 features:
      per layer  q 896x896 + 896 bias, k and v 896x128 + 128 each, o 896x896 (no bias),
                 SwiGLU 3 x 896 x 4864, two RMSNorm scales of 896          = 14,912,384
      24 layers                                                             = 357,897,216
      tied embedding 151,936 x 896 = 136,134,656, final norm 896
      total                                                                 = 494,032,768
    the "0.49B" Qwen publish."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_05B))
    config, family = pretrained_config(tmp_path / "config.json")
    assert family == "qwen2" and config.qkv_bias and not config.bias and config.attention_window == 0
    assert (config.head_dim, config.group_size, config.tie_embeddings) == (64, 7, True)
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    assert count_params(shapes) == 494_032_768


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_scaled_embeddings_are_the_embedding_table_times_sqrt_d_model(position):
    """scale_embeddings multiplies what the token lookup returns by sqrt(d_model) = sqrt(32),
    and nothing else: the same model with the table itself scaled (untied, so the head keeps
    its own matrix) gives the same logits, and positions are not scaled. Not to the bit: XLA
    fuses the multiply differently in the two programs, which moves float32 logits of O(0.1)
    by a few ulps (1e-7 measured), far inside 1e-6; a wrong scale moves them by 1e-3 or more."""
    scaled = tiny(position=position, tie_embeddings=False, scale_embeddings=True)
    params = params_for(scaled)
    tokens = random_tokens(scaled, (2, 16))
    table_scaled = params | {"wte": {"embedding": params["wte"]["embedding"] * np.float32(math.sqrt(32))}}
    plain = scaled.replace(scale_embeddings=False)
    np.testing.assert_allclose(forward(scaled, params, tokens), forward(plain, table_scaled, tokens), atol=1e-6)
    assert np.abs(forward(scaled, params, tokens) - forward(plain, params, tokens)).max() > 1e-3
