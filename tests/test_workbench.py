"""The switches from the records since GPT-2 (QK-norm, ReLU², zero-initialised output
projections, logit soft-capping, sliding-window attention), each against an independent
computation: a float64 reference, a closed form, or a property the switch must have."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import attend, matrix
from test_attention import TOL, attention_config, init_layer, normal, random_qkv, run_layer
from test_model import closed_form_count, forward, params_for, random_tokens, tiny

from jaxgpt.config import ConfigError, ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.job.resume import resume_conflicts
from jaxgpt.model.attention import CausalSelfAttention, causal_score_bias
from jaxgpt.model.layers import MLP
from jaxgpt.model.transformer import GPT, count_params, init_params


def reference_attention(
    x, params, config, window=0, qk_norm_eps=None, score_scale=None, value_embedding=None, gate=None
):
    """Causal attention head by head in float64, with an optional sliding window (key j visible
    to query i when i - window < j <= i), optional RMS normalisation of each q and k head,
    optional value embeddings (b, t, n_kv_head * head_dim) mixed into the values by value_mix,
    and an optional gate (b, t, n_head, head_dim or 1) multiplying each head's output."""
    x = np.asarray(x, np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    H, G, D = config.n_head, config.group_size, config.head_dim
    w, b = p["qkv"]["kernel"], p["qkv"]["bias"]
    q = (np.einsum("btm,mkgd->btkgd", x, w[:, :, :G]) + b[:, :G]).reshape(*x.shape[:2], H, D)
    k = np.einsum("btm,mkd->btkd", x, w[:, :, G]) + b[:, G]
    v = np.einsum("btm,mkd->btkd", x, w[:, :, G + 1]) + b[:, G + 1]
    if qk_norm_eps is not None:
        rms = lambda a, scale: a / np.sqrt(np.mean(a * a, -1, keepdims=True) + qk_norm_eps) * scale  # noqa: E731
        q, k = rms(q, p["q_norm"]["scale"]), rms(k, p["k_norm"]["scale"])
    if value_embedding is not None:
        a, b = p["value_mix"]
        v = a * v + b * np.asarray(value_embedding, np.float64).reshape(v.shape)
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) * (1 / math.sqrt(D) if score_scale is None else score_scale)
    i, j = np.arange(x.shape[1])[:, None], np.arange(x.shape[1])[None, :]
    visible = (j <= i) & ((j > i - window) if window else True)
    scores = np.where(visible, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = np.einsum("bhts,bshd->bthd", weights, v)
    if gate is not None:
        heads = heads * gate
    return np.einsum("bthd,hdm->btm", heads, p["out"]["kernel"].reshape(H, D, -1)) + p["out"]["bias"]


# ----------------------------------------------------------------------------- sliding window


@pytest.mark.parametrize("n_kv_head, window", matrix({"MHA": 4, "GQA": 2}, {str(w): w for w in (1, 3, 7)}))
def test_sliding_window_layer_matches_a_banded_mask_reference(n_kv_head, window):
    config = attention_config(n_kv_head, attention_window=window)
    layer, params, x = init_layer(config)
    np.testing.assert_allclose(run_layer(layer, params, x), reference_attention(x, params, config, window), **TOL)


def test_a_window_of_one_sees_only_itself():
    visible = np.isfinite(np.asarray(causal_score_bias(4, 4, None, None, window=1)))[0, 0, 0]
    np.testing.assert_array_equal(visible, np.eye(4, dtype=bool))


def test_a_window_as_long_as_the_sequence_is_full_attention():
    q, k, v = random_qkv()  # 10 positions
    full = jax.jit(partial(attend, kernel="xla"))(q, k, v)
    windowed = jax.jit(partial(attend, kernel="xla", window=10))(q, k, v)
    np.testing.assert_array_equal(windowed, full)  # the same -inf entries: the same numbers


@pytest.mark.parametrize("cache", [False, True])
def test_kernels_agree_under_a_window(cache):
    q, k, v = random_qkv(s=16 if cache else 10)
    kw = dict(window=4, cache_index=jnp.asarray(4) if cache else None)
    xla = jax.jit(partial(attend, kernel="xla", **kw))(q, k, v)
    dot = jax.jit(partial(attend, kernel="dot_product", **kw))(q, k, v)
    np.testing.assert_allclose(xla, dot, atol=1e-5, rtol=1e-5)  # same float32 math reassociated


def test_windowed_kv_cache_decoding_matches_the_full_forward():
    from test_model import decode_stepwise, forward, params_for

    config = tiny(attention_window=3, position="rope", block_size=16)
    params = params_for(config)
    tokens = random_tokens(config, (2, 12))
    np.testing.assert_allclose(decode_stepwise(config, params, tokens, 5), forward(config, params, tokens), atol=1e-5)


# ----------------------------------------------------------------------------- QK-norm


def test_qk_norm_layer_matches_reference():
    config = attention_config(2, qk_norm=True)
    layer, params, x = init_layer(config)
    assert params["q_norm"]["scale"].shape == params["k_norm"]["scale"].shape == (config.head_dim,)
    want = reference_attention(x, params, config, qk_norm_eps=config.norm_eps)
    np.testing.assert_allclose(run_layer(layer, params, x), want, **TOL)


def test_qk_norm_makes_attention_blind_to_the_scale_of_q_and_k():
    """RMS normalisation divides out any scale of q and k: multiplying their projections by 50
    changes nothing but epsilon's share of the mean square (1e-5 against squares of O(1) to
    O(2500)), a relative change below 1e-5 in the logits."""
    config = attention_config(2, qk_norm=True, bias=False)
    layer, params, x = init_layer(config)
    group = config.group_size
    scaled = jax.tree.map(lambda a: a, params)
    scaled["qkv"]["kernel"] = params["qkv"]["kernel"].copy()
    scaled["qkv"]["kernel"][:, :, : group + 1] *= 50.0  # queries and keys, not values
    np.testing.assert_allclose(run_layer(layer, scaled, x), run_layer(layer, params, x), rtol=1e-4, atol=1e-4)
    plain = attention_config(2, bias=False)
    plain_params = {k: v for k, v in params.items() if k in ("qkv", "out")}
    unnormalised = jax.jit(layer.__class__(plain).apply)
    before = unnormalised({"params": plain_params}, x, jnp.arange(x.shape[1]), None)
    after = unnormalised({"params": {**plain_params, "qkv": scaled["qkv"]}}, x, jnp.arange(x.shape[1]), None)
    assert np.abs(np.asarray(after) - np.asarray(before)).max() > 0.1  # without the norm, the scale matters


# ----------------------------------------------------------------------------- ReLU², zero init


def test_relu2_mlp_is_down_of_relu_squared():
    config = tiny(activation="relu2")
    x = normal((2, 5, config.d_model), 3)
    mlp = MLP(config)
    params = mlp.init(jax.random.key(1), x)["params"]
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    hidden = np.maximum(np.asarray(x, np.float64) @ p["up"]["kernel"] + p["up"]["bias"], 0.0) ** 2
    want = hidden @ p["down"]["kernel"] + p["down"]["bias"]
    np.testing.assert_allclose(jax.jit(mlp.apply)({"params": params}, x), want, rtol=1e-5, atol=1e-5)
    assert count_params(init_params(config, jax.random.key(0))) == closed_form_count(config)


def test_zero_initialised_blocks_start_as_the_identity():
    """With both output projections at zero (and zero biases, as initialised), every block adds
    nothing: the logits are the embeddings through the final LayerNorm (unit scale, zero bias
    at init) and the tied head, computed here by hand in float64."""
    config = tiny(zero_init_residual=True)
    params = init_params(config, jax.random.key(0))
    for i in range(config.n_layer):
        assert not np.any(params[f"block_{i}"]["attn"]["out"]["kernel"])
        assert not np.any(params[f"block_{i}"]["mlp"]["down"]["kernel"])
    tokens = random_tokens(config, (2, 9))
    wte, wpe = (np.asarray(params[n]["embedding"], np.float64) for n in ("wte", "wpe"))
    x = wte[np.asarray(tokens)] + wpe[:9]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + config.norm_eps)
    logits = GPT(config).apply({"params": params}, tokens)
    np.testing.assert_allclose(logits, x @ wte.T, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- x0 mix


def with_mixes(params, mixes):
    """`params` (unscanned) with block i's x0_mix set to mixes[i] = (a, b)."""
    params = jax.tree.map(lambda a: a, params)  # a copy: the caller's tree stays as it was
    for i, mix in enumerate(mixes):
        params[f"block_{i}"]["x0_mix"] = jnp.asarray(mix, jnp.float32)
    return params


def test_x0_mix_starts_as_the_plain_model_and_learns():
    """At a = 1, b = 0 every block reads 1 * x + 0 * x0 = x exactly: the model without the
    switch, given the same other weights, to the bit. The gradient reaches b at once."""
    plain, mixed = tiny(), tiny(x0_mix=True)
    params = params_for(mixed)
    assert [params[f"block_{i}"]["x0_mix"].tolist() for i in range(2)] == [[1.0, 0.0]] * 2
    others = {
        k: ({n: p for n, p in v.items() if n != "x0_mix"} if k.startswith("block_") else v) for k, v in params.items()
    }
    tokens = random_tokens(plain, (2, 9))
    np.testing.assert_array_equal(forward(mixed, params, tokens), forward(plain, others, tokens))
    grads = jax.jit(jax.grad(lambda p: forward(mixed, p, tokens).std()))(params)  # any function of the logits
    assert all(grads[f"block_{i}"]["x0_mix"][1] != 0 for i in range(2))


def test_a_block_reading_only_x0_discards_the_blocks_before_it():
    """With the last block's mix at a = 0, b = 1 it reads the embeddings alone, so a 3-layer
    model's logits are those of a 1-layer model holding just that block: an independent
    computation by a model of another depth, equal up to float32 rounding of the same ops."""
    deep, shallow = tiny(n_layer=3, x0_mix=True), tiny(n_layer=1, x0_mix=True)
    params = with_mixes(params_for(deep), [(0.7, 0.4), (1.3, -0.2), (0.0, 1.0)])
    one = {k: v for k, v in params.items() if not k.startswith("block_")} | {"block_0": params["block_2"]}
    tokens = random_tokens(deep, (2, 9))
    want = forward(shallow, one, tokens)
    np.testing.assert_allclose(forward(deep, params, tokens), want, atol=1e-6)
    params["block_0"]["x0_mix"] = jnp.asarray([0.1, 2.0])  # blocks before it change nothing
    np.testing.assert_allclose(forward(deep, params, tokens), want, atol=1e-6)


def test_x0_mix_scanned_and_decoded_matches_the_full_forward():
    """Mixed blocks stacked under scan_layers give the unscanned model's logits, and decoding
    one token at a time through the KV cache (x0 the new tokens' embeddings) the full pass's."""
    config = tiny(x0_mix=True, block_size=16)
    assert_scanned_and_decoded_match_the_full_forward(config, with_mixes(params_for(config), [(0.8, 0.5), (1.2, -0.3)]))


def assert_scanned_and_decoded_match_the_full_forward(config, params):
    """`params` (unscanned) stacked under scan_layers give the same logits (float32 of the same
    ops, 1e-6), and the KV-cache decode, a prompt of 3 then one token at a time, the full pass's."""
    from test_model import decode_stepwise

    from jaxgpt.model.transformer import stack_blocks

    tokens = random_tokens(config, (2, 16))
    full = forward(config, params, tokens)
    stacked = stack_blocks(params, config.n_layer)
    np.testing.assert_allclose(forward(config.replace(scan_layers=True), stacked, tokens), full, atol=1e-6)
    np.testing.assert_allclose(decode_stepwise(config, params, tokens, 3), full, atol=1e-5)


# ----------------------------------------------------------------------------- value embeddings


@pytest.mark.parametrize("n_kv_head", [4, 2], ids=["MHA", "GQA"])
def test_value_embeddings_enter_the_values_as_the_reference_mixes_them(n_kv_head):
    """The layer given each token's value embedding row: attention whose values are a * v + b * e,
    written out in float64 (a key/value head's slice of e shared by its group of query heads)."""
    config = attention_config(n_kv_head)
    x, rows = normal((2, 10, config.d_model), 0), normal((2, 10, n_kv_head * config.head_dim), 1)
    layer = CausalSelfAttention(config)
    shapes = jax.eval_shape(layer.init, jax.random.key(0), x, jnp.arange(10), None, None, rows)["params"]
    leaves, tree = jax.tree.flatten(shapes)
    params = jax.tree.unflatten(tree, [0.3 * normal(a.shape, 2 + i) for i, a in enumerate(leaves)])
    params["value_mix"] = jnp.asarray([0.7, -1.3])
    ours = jax.jit(layer.apply)({"params": params}, x, jnp.arange(10), None, None, rows)
    np.testing.assert_allclose(ours, reference_attention(x, params, config, value_embedding=rows), **TOL)


def with_value_mixes(params, mixes):
    """`params` (unscanned) with block i's value_mix set to mixes[i] = (a, b)."""
    params = jax.tree.map(lambda a: a, params)
    for i, mix in enumerate(mixes):
        params[f"block_{i}"]["attn"]["value_mix"] = jnp.asarray(mix, jnp.float32)
    return params


def without_value_embeddings(tree, mix=None):
    """`tree` with every block's value table and mix removed, or with each mix set to `mix`."""
    if not isinstance(tree, dict):
        return tree
    if mix is None:
        tree = {k: v for k, v in tree.items() if k not in ("value_embed", "value_mix")}
    elif "value_mix" in tree:
        tree = {**tree, "value_mix": jnp.asarray(mix, jnp.float32)}
    return {k: without_value_embeddings(v, mix) for k, v in tree.items()}


@pytest.mark.parametrize(
    "encoder_layers",
    [0, pytest.param(1, marks=pytest.mark.slow)],  # the encoder–decoder's: 8-9 s on a Zen 3
    ids=["decoder", "encoder-decoder"],
)
def test_value_embeddings_start_at_half_and_half_and_at_one_and_zero_are_the_plain_model(encoder_layers):
    """Each block's table is (vocab, kv width) and its mix starts at (1/2, 1/2), so the tables
    learn from the first step; set to a = 1, b = 0 every block's values are 1 * v + 0 * e = v
    exactly: the model without the switch, given the same other weights, to the bit (an
    encoder's blocks look up the sources, a decoder's the targets)."""
    plain = tiny(n_kv_head=2, encoder_layers=encoder_layers)
    embedded = plain.replace(value_embeddings=True)
    params = params_for(embedded)
    width = embedded.n_kv_head * embedded.head_dim

    def blocks_of(tree):  # the decoder's two blocks and the encoder's one
        return [tree[f"block_{i}"] for i in range(2)] + ([tree["encoder"]["block_0"]] if encoder_layers else [])

    for block in blocks_of(params):
        assert block["value_embed"]["embedding"].shape == (embedded.vocab_size, width)
        assert block["attn"]["value_mix"].tolist() == [0.5, 0.5]
    tokens = random_tokens(plain, (2, 9))
    sources = dict(sources=random_tokens(plain, (2, 7), seed=1)) if encoder_layers else {}

    applies = {config: jax.jit(partial(GPT(config).apply, **sources)) for config in (plain, embedded)}  # compiled once

    def logits(config, params):
        return applies[config]({"params": params}, tokens)

    grads = jax.jit(jax.grad(lambda p: logits(embedded, p).std()))(params)  # any function of the logits
    assert all(np.any(block["value_embed"]["embedding"]) for block in blocks_of(grads))
    switched_off = without_value_embeddings(params, mix=(1.0, 0.0))
    np.testing.assert_array_equal(logits(embedded, switched_off), logits(plain, without_value_embeddings(params)))
    if encoder_layers:  # the encoder's table is read at the sources' tokens, and only there
        unread = sorted(set(range(plain.vocab_size)) - set(np.asarray(sources["sources"]).ravel().tolist()))
        for token, changes in ((unread[0], False), (int(sources["sources"][0, 0]), True)):
            moved = jax.tree.map(lambda a: a, params)
            table = moved["encoder"]["block_0"]["value_embed"]["embedding"]
            moved["encoder"]["block_0"]["value_embed"]["embedding"] = table.at[token].add(1.0)
            assert np.any(logits(embedded, moved) != logits(embedded, params)) == changes


def test_value_embeddings_are_counted_as_parameters_but_not_as_flops():
    """Each block's table adds vocab x kv width parameters (and its mix two), but a lookup
    multiplies nothing: the FLOPs per token are the plain model's plus 6 per mix number."""
    from jaxgpt.model.transformer import flops_per_token

    plain, embedded = tiny(n_kv_head=2), tiny(n_kv_head=2, value_embeddings=True)
    added = count_params(params_for(embedded)) - count_params(params_for(plain))
    assert added == plain.n_layer * (plain.vocab_size * 2 * plain.head_dim + 2)
    assert flops_per_token(embedded) == flops_per_token(plain) + 6 * plain.n_layer * 2


def test_value_embeddings_scanned_and_decoded_match_the_full_forward():
    """Tables stacked under scan_layers give the unscanned model's logits; decoding one token at a
    time through the KV cache (each step's values mixed with that token's rows) the full pass's."""
    config = tiny(value_embeddings=True, block_size=16, position="rope")
    params = with_value_mixes(params_for(config), [(0.8, 0.5), (1.2, -0.3)])
    assert_scanned_and_decoded_match_the_full_forward(config, params)


def test_a_grown_vocabulary_grows_each_blocks_value_table_and_keeps_the_trained_logits():
    """Rows added for new tokens (grow_vocabulary): each block's value table gains the mean of
    its rows, as the embedding does, and on text of the old tokens the logits are the old ones."""
    from jaxgpt.model.transformer import grow_vocabulary, stack_blocks

    for scanned in (False, True):
        config = tiny(value_embeddings=True, scan_layers=scanned)
        params = params_for(tiny(value_embeddings=True))
        params = stack_blocks(params, 2) if scanned else params
        grown = grow_vocabulary(config, params, 36)
        block = "blocks" if scanned else "block_1"
        tables, old = (tree[block]["value_embed"]["embedding"] for tree in (grown, params))
        assert tables.shape[-2] == 36
        np.testing.assert_allclose(tables[..., 32:, :], np.repeat(old.mean(-2, keepdims=True), 4, -2), rtol=1e-6)
        tokens = random_tokens(config, (2, 9))
        after = forward(config.replace(vocab_size=36), grown, tokens)
        np.testing.assert_allclose(after[..., :32], forward(config, params, tokens), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- soft-capping


def test_soft_capped_logits_are_cap_tanh_of_the_plain_logits():
    """The same parameters with and without the cap: capped = cap * tanh(plain / cap), elementwise
    in float32 (a few ulps of O(cap) values), and never beyond the cap."""
    cap = 2.0
    plain_config, capped_config = tiny(), tiny(logit_softcap=cap)
    params = init_params(plain_config, jax.random.key(0))
    params["wte"]["embedding"] = params["wte"]["embedding"] * 200  # logits well past the cap
    tokens = random_tokens(plain_config, (2, 8))
    plain = np.asarray(GPT(plain_config).apply({"params": params}, tokens), np.float64)
    capped = np.asarray(GPT(capped_config).apply({"params": params}, tokens))
    assert np.abs(plain).max() > 5 * cap
    np.testing.assert_allclose(capped, cap * np.tanh(plain / cap), rtol=1e-6, atol=1e-6)
    assert np.abs(capped).max() <= cap


# ----------------------------------------------------------------------------- config, export, resume


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(attention_window=-1), "model.attention_window=-1"),
        (dict(attention_window=2.5), "model.attention_window=2.5"),
        (dict(logit_softcap=-1.0), "model.logit_softcap=-1.0 must be >= 0"),
        (dict(activation="relu3"), "'relu2'"),
    ],
)
def test_bad_switch_values_are_named(changes, message):
    with pytest.raises(ConfigError, match="invalid config") as error:
        ModelConfig(**changes)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "switch",
    [dict(qk_norm=True), dict(logit_softcap=30.0), dict(attention_window=8), dict(x0_mix=True)]
    + [dict(value_embeddings=True), dict(attention_gate="elementwise"), dict(token_mixer="convolution")],
)
def test_a_model_with_a_switch_on_is_not_exported_as_gpt2(tmp_path, switch):
    from jaxgpt.hf import save_pretrained

    config = tiny(**switch)
    with pytest.raises(UserError, match=f"model.{next(iter(switch))}="):
        save_pretrained(config, init_params(config, jax.random.key(0)), tmp_path)


def test_a_run_saved_before_the_switches_existed_resumes():
    from jaxgpt.config import DataConfig, RunConfig, TrainConfig

    current = RunConfig(tiny(), DataConfig(), TrainConfig()).to_dict()
    saved = {section: dict(values) for section, values in current.items()}
    for field in ("qk_norm", "zero_init_residual", "logit_softcap", "attention_window", "x0_mix", "value_embeddings"):
        del saved["model"][field]
    assert resume_conflicts(saved, current) == []
    switched = {**current, "model": {**current["model"], "qk_norm": True}}
    assert resume_conflicts(saved, switched) == ["model.qk_norm: False -> True"]


# ----------------------------------------------------------------------------- ablations


@pytest.mark.parametrize("kernel", ["xla", "dot_product"])
def test_unscaled_attention_matches_the_reference_without_the_sqrt(kernel):
    config = attention_config(2, scale_attention=False, attention=kernel)
    layer, params, x = init_layer(config)
    want = reference_attention(x, params, config, score_scale=1.0)
    np.testing.assert_allclose(run_layer(layer, params, x), want, **TOL)


def test_without_the_causal_mask_every_written_key_is_visible():
    everything = np.isfinite(np.asarray(causal_score_bias(4, 4, None, None, causal=False)))[0, 0, 0]
    assert everything.all()
    # Decoding still hides the cache slots not yet written: queries at 3 and 4 of 6 slots see 0..4.
    decoding = np.isfinite(np.asarray(causal_score_bias(2, 6, jnp.asarray(3), None, causal=False)))[0, 0, 0]
    np.testing.assert_array_equal(decoding, [[1, 1, 1, 1, 1, 0]] * 2)


@pytest.mark.slow  # quick: the past-only score of a run without the mask (below, and test_trainer)
def test_the_missing_mask_leaks_the_future_into_training_and_fails_at_generation():
    """On uniformly random tokens nothing is predictable: a causal model's loss cannot go below
    ln V. Without the mask the model sees the token it must predict and learns to copy it, so
    its training loss collapses; asked to predict from the past alone, as when generating (the
    KV-cache decode, where the future is not written yet), it does worse than the causal model."""
    import optax
    from test_model import decode_stepwise

    vocab, seq, ln_v = 16, 12, math.log(16)

    def train(config):
        params = init_params(config, jax.random.key(0))
        optimizer = optax.adam(3e-3)

        def loss_fn(params, tokens):
            logits = GPT(config).apply({"params": params}, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        @jax.jit
        def step(params, opt_state, tokens):
            loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
            updates, opt_state = optimizer.update(grads, opt_state)
            return optax.apply_updates(params, updates), opt_state, loss

        opt_state, losses = optimizer.init(params), []
        for i in range(150):
            params, opt_state, loss = step(params, opt_state, random_tokens(config, (16, seq + 1), seed=i))
            losses.append(float(loss))
        return params, float(np.mean(losses[-20:]))

    def loss_from_the_past_only(config, params):
        tokens = random_tokens(config, (16, seq + 1), seed=10_000)
        logits = decode_stepwise(config, params, tokens[:, :-1], 1)
        return float(optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean())

    causal, leaky = tiny(vocab_size=vocab, block_size=seq), tiny(vocab_size=vocab, block_size=seq, causal=False)
    causal_params, causal_train = train(causal)
    leaky_params, leaky_train = train(leaky)
    assert causal_train > 0.95 * ln_v  # nothing to learn from the past
    assert leaky_train < 0.5 * ln_v  # the future copied
    assert loss_from_the_past_only(leaky, leaky_params) > loss_from_the_past_only(causal, causal_params) + 0.1


def test_blocks_without_residuals_replace_their_input():
    """Zero-initialised output projections make each branch output zero; with the residual
    connections that leaves the embeddings (the test above), without them nothing: every block
    outputs exactly zero, the final LayerNorm maps zero to its zero bias, and the logits are 0."""
    config = tiny(zero_init_residual=True, residual=False)
    logits = GPT(config).apply({"params": init_params(config, jax.random.key(0))}, random_tokens(config, (2, 9)))
    assert not np.any(np.asarray(logits))


def test_a_model_without_norms_has_no_norm_parameters_and_adds_the_branches_directly():
    config = tiny(norm="none", zero_init_residual=True)
    params = init_params(config, jax.random.key(0))
    assert not [p for p in jax.tree_util.tree_flatten_with_path(params)[0] if "norm" in jax.tree_util.keystr(p[0])]
    tokens = random_tokens(config, (2, 9))
    wte, wpe = (np.asarray(params[n]["embedding"], np.float64) for n in ("wte", "wpe"))
    want = (wte[np.asarray(tokens)] + wpe[:9]) @ wte.T  # zero branches, no final norm: the embeddings
    np.testing.assert_allclose(GPT(config).apply({"params": params}, tokens), want, rtol=1e-5, atol=1e-6)


def test_attention_only_blocks_have_no_mlp_and_compute_the_full_model_with_a_silent_mlp():
    """Attention-only (mlp=False) is the standard pre-LN model whose MLP adds exactly zero: the
    same logits as the full model given the attention-only weights and an MLP whose output
    projection (kernel and bias) is zero."""
    attention_only, full = tiny(mlp=False), tiny()
    params = init_params(attention_only, jax.random.key(0))
    assert not [k for k in params["block_0"] if k in ("mlp", "norm_2")]
    silent = jax.tree.map(jnp.copy, init_params(full, jax.random.key(1)))
    for i in range(full.n_layer):
        block = silent[f"block_{i}"]
        block["mlp"]["down"] = jax.tree.map(jnp.zeros_like, block["mlp"]["down"])
        silent[f"block_{i}"] = {**block, **params[f"block_{i}"]}  # the attention-only model's attention and norm_1
    silent |= {k: v for k, v in params.items() if not k.startswith("block_")}
    tokens = random_tokens(full, (2, 9))
    np.testing.assert_array_equal(
        GPT(attention_only).apply({"params": params}, tokens), GPT(full).apply({"params": silent}, tokens)
    )
    mlp_params = count_params(init_params(full, jax.random.key(0))) - count_params(params)
    d, hidden, n_layer = full.d_model, full.mlp_hidden, full.n_layer
    assert mlp_params == n_layer * ((d * hidden + hidden) + (hidden * d + d) + 2 * d)  # up, down, norm_2


def test_uniform_attention_gives_every_visible_key_weight_one_over_t():
    """Query i sees keys 0..i: each gets exactly 1/(i + 1) (the scores are multiplied by 0, so
    the softmax is of zeros), and the layer's output is the out-projection of the running mean
    of the values, which the float64 reference computes with a zero score scale."""
    config = attention_config(2, uniform_attention=True)
    layer, params, x = init_layer(config)
    out, state = jax.jit(partial(layer.apply, mutable=["sites"]))({"params": params}, x, jnp.arange(x.shape[1]), None)
    (weights,) = state["sites"]["hook_pattern"]  # (b, heads, t, s)
    t = x.shape[1]
    want = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    np.testing.assert_array_equal(np.asarray(weights), np.broadcast_to(want, weights.shape).astype(np.float32))
    np.testing.assert_allclose(out, reference_attention(x, params, config, score_scale=0.0), **TOL)


def test_uniform_attention_refuses_alibi():
    with pytest.raises(ConfigError, match="uniform_attention ignores"):
        ModelConfig(position="alibi", uniform_attention=True)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_removing_a_head_is_zeroing_its_rows_of_the_output_projection(scan_layers):
    """A head's output reaches the residual stream only through its rows of the out
    projection, so masking query head h of layer l must give the logits of the model whose
    out kernel has those rows zeroed. Grouped-query (4 heads over 2 key/value heads) checks
    the numbering: head h is group h // 2, member h % 2."""
    from jaxgpt.lab.activations import interventions_collection, removed_heads
    from jaxgpt.model.transformer import stack_blocks

    config = tiny(n_kv_head=2)
    params = init_params(config, jax.random.key(0))
    tokens = random_tokens(config, (2, 9))
    layer, head = 1, 3
    keep = np.ones((config.n_layer, config.n_head), np.float32)
    keep[layer, head] = 0
    zeroed = jax.tree.map(jnp.copy, params)
    out = zeroed[f"block_{layer}"]["attn"]["out"]
    out["kernel"] = out["kernel"].at[head // 2, head % 2].set(0)  # (k, g, d, d_model)
    want = GPT(config).apply({"params": zeroed}, tokens)
    model = config.replace(scan_layers=scan_layers)
    if scan_layers:
        params = stack_blocks(params, config.n_layer)
    removed = interventions_collection(model, removed_heads(model, keep))
    masked = GPT(model).apply({"params": params, "interventions": removed}, tokens)
    np.testing.assert_allclose(masked, want, rtol=1e-6, atol=1e-6)
    unmasked = GPT(model).apply({"params": params}, tokens)
    assert np.abs(np.asarray(masked - unmasked)).max() > 1e-3  # the head mattered


def test_a_model_without_the_mask_is_scored_from_the_past_as_the_kv_cache_decode_scores_it():
    """eval_step's past_only_loss for a causal=False model: the loss the same weights get when
    every token is predicted through the KV cache, one token at a time (nothing later is
    written yet). float32 sums over 9 positions x 32 classes: 1e-5 relative."""
    import optax
    from test_model import decode_stepwise

    from jaxgpt.training.train_step import eval_step

    config = tiny(causal=False)
    params = init_params(config, jax.random.key(0))
    params = jax.tree.map(lambda a: 20 * a, params)  # weights far from init, so the future matters
    windows = random_tokens(config, (3, 10))
    losses = jax.jit(partial(eval_step, model=GPT(config)))(params, windows)
    logits = decode_stepwise(config, params, windows[:, :-1], 1)
    by_cache = float(optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]).mean())
    assert float(losses["past_only_loss"]) == pytest.approx(by_cache, rel=1e-5)
    assert abs(float(losses["loss"]) - by_cache) > 0.01  # seeing the future changed the loss
    assert list(jax.jit(partial(eval_step, model=GPT(tiny())))(params, windows)) == ["loss"]


def test_exact_gelu_is_x_times_the_normal_cdf():
    config = tiny(activation="gelu_exact", bias=False)
    x = normal((2, 5, config.d_model), 3)
    mlp = MLP(config)
    params = mlp.init(jax.random.key(1), x)["params"]
    # weights far above the 0.02 init, so the pre-activations reach |x| ~ 3, where the tanh
    # form is off by ~1e-4 (at init they stay near 0, where the two agree to 1e-7)
    params = {"up": {"kernel": 20 * params["up"]["kernel"]}, "down": {"kernel": 50 * params["down"]["kernel"]}}
    pre = np.asarray(x, np.float64) @ np.asarray(params["up"]["kernel"], np.float64)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
    want = (pre * cdf) @ np.asarray(params["down"]["kernel"], np.float64)
    np.testing.assert_allclose(jax.jit(mlp.apply)({"params": params}, x), want, rtol=1e-5, atol=1e-5)
    assert np.abs(pre).max() > 2.5
    tanh_config = tiny(activation="gelu", bias=False)  # what a swapped formula would compute
    assert not np.allclose(MLP(tanh_config).apply({"params": params}, x), want, rtol=1e-5, atol=1e-5)


def test_interleaved_rope_is_rotate_half_on_permuted_features():
    """Pairing neighbours (2i, 2i+1) instead of (i, i + d/2) is the same rotation after moving
    the even features to the front half and the odd to the back."""
    from jaxgpt.model.positions import apply_rope, rope_frequencies

    x = jnp.asarray(normal((2, 7, 3, 8), 5))
    inv_freq, _ = rope_frequencies(8, 10000.0)
    positions = jnp.arange(7)
    to_half = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])  # interleaved -> half layout
    interleaved = apply_rope(x, positions, inv_freq, interleaved=True)
    via_half = apply_rope(x[..., to_half], positions, inv_freq)
    np.testing.assert_allclose(np.asarray(interleaved)[..., to_half], via_half, rtol=1e-6, atol=1e-6)


def test_rope_scaling_can_be_set_from_the_command_line():
    from jaxgpt.config import RopeScaling
    from jaxgpt.config_files import base_config, resolve

    config = base_config()
    assert resolve(config, vocab_size=96).model.rope_scaling is None  # off unless a kind is set
    config.model.position = "rope"
    config.model.rope_scaling.kind = "linear"  # what --config.model.rope_scaling.kind=linear does
    config.model.rope_scaling.factor = 2.0
    assert resolve(config, vocab_size=96).model.rope_scaling == RopeScaling("linear", 2.0)


# ----------------------------------------------------------------------------- Muon


def newton_schulz(g: np.ndarray, steps: int = 5) -> np.ndarray:
    """The quintic Newton-Schulz iteration of the Muon write-up (Jordan et al. 2024), float64:
    X <- aX + (bA + cA^2)X with A = XX^T, from X = G/||G||_F, on the wide orientation."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / np.linalg.norm(g)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def test_muon_orthogonalises_the_blocks_matrices_and_leaves_the_rest_to_adamw():
    """One step from zero momentum (momentum 0, no decay, no clipping, no warmup): each block
    matrix moves by -muon_lr * sqrt(max(1, fan_out / fan_in)) * NS(gradient) (the scale is
    optax's, keeping the update's RMS steady across shapes), reshaped to (inputs, outputs);
    the embedding moves by the first step of optax Muon's Adam, which uses Nesterov momentum
    (NAdam): m_hat = g, and the step looks ahead, b1 * m / (1 - b1^2) + (1 - b1) g / (1 - b1),
    = (1 + b1 (1 - b1) / (1 - b1^2)) g, divided by sqrt(v_hat) = |g|."""
    from jaxgpt.config import TrainConfig
    from jaxgpt.training.optimizer import make_optimizer

    config = tiny(n_kv_head=2)
    params = init_params(config, jax.random.key(0))
    grads = jax.tree.map(lambda p: jnp.asarray(normal(p.shape, p.size % 97)), params)
    train = TrainConfig(optimizer="muon", muon_momentum=0.0, weight_decay=0.0, grad_clip=0.0, warmup_steps=0)
    optimizer = make_optimizer(train)
    updates, _ = jax.jit(optimizer.update)(grads, optimizer.init(params), params)

    block = updates["block_0"]
    for name, update, fan_in in (
        ("down", block["mlp"]["down"]["kernel"], config.mlp_hidden),
        ("qkv", block["attn"]["qkv"]["kernel"], config.d_model),
        ("out", block["attn"]["out"]["kernel"], config.d_model),
    ):
        g = np.asarray(grads["block_0"]["mlp" if name == "down" else "attn"][name]["kernel"], np.float64)
        g = g.reshape(fan_in, -1)
        scale = math.sqrt(max(1.0, g.shape[1] / g.shape[0]))
        got = -np.asarray(update, np.float64).reshape(fan_in, -1) / (train.muon_lr * scale)
        np.testing.assert_allclose(got, newton_schulz(g), atol=2e-4, err_msg=name)  # float32 iteration
        singular = np.linalg.svd(got, compute_uv=False)
        assert 0.6 < singular.min() and singular.max() < 1.25, name  # the quintic's band around 1

    g = np.asarray(grads["wte"]["embedding"])
    b1 = train.beta1
    want = -train.lr * (1 + b1 * (1 - b1) / (1 - b1**2)) * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(updates["wte"]["embedding"], want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("warmup, want", [(0, (0.1, 0.19, 0.271)), (2, (0.5, 0.65, 0.685))])
def test_muons_momentum_rises_over_its_warmup(warmup, want):
    """Muon's momentum is an average, mu <- beta mu + (1 - beta) g. Warmed up over 2 steps from
    0.5 to 0.9, beta is 0.5, 0.7, then 0.9, so three steps of a constant gradient g leave mu at
    0.5 g, 0.3 g + 0.7 * 0.5 g = 0.65 g, then 0.1 g + 0.9 * 0.65 g = 0.685 g; held at 0.9 from the
    start: 0.1 g, 0.19 g, 0.271 g."""
    from jaxgpt.config import TrainConfig
    from jaxgpt.training.optimizer import make_optimizer

    config = tiny()
    params = init_params(config, jax.random.key(0))
    grads = jax.tree.map(lambda p: jnp.asarray(normal(p.shape, p.size % 97)), params)
    train = TrainConfig(
        optimizer="muon", muon_momentum=0.9, muon_momentum_start=0.5, muon_momentum_warmup=warmup, grad_clip=0.0
    )
    optimizer = make_optimizer(train)
    state, update = optimizer.init(params), jax.jit(optimizer.update)
    g = np.asarray(grads["block_0"]["mlp"]["down"]["kernel"])

    def momentum(state) -> np.ndarray:  # Muon's average for that matrix (Adam's state holds none of it)
        leaves = jax.tree_util.tree_flatten_with_path(state)[0]
        where = "['muon'].inner_state[0].mu['block_0']['mlp']['down']['kernel']"
        (leaf,) = [leaf for path, leaf in leaves if jax.tree_util.keystr(path).endswith(where)]
        return np.asarray(leaf)

    for step, fraction in enumerate(want):
        _, state = update(grads, state, params)
        np.testing.assert_allclose(momentum(state), fraction * g, rtol=1e-5, atol=1e-7, err_msg=f"step {step}")


@pytest.mark.slow
def test_a_run_trains_with_muon(tmp_path):
    from conftest import small_run_config

    from jaxgpt.job.metrics import read_metrics
    from jaxgpt.job.trainer import train_and_evaluate

    train_and_evaluate(small_run_config(optimizer="muon", steps=30), tmp_path, progress=False)
    records = read_metrics(tmp_path)
    assert records[-1]["val_loss"] < records[0]["train_loss"] - 0.8
