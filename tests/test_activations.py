"""Named activation sites (jaxgpt/model/sites.py, jaxgpt/lab/activations.py): what each caches is
what the model computes there, checked by the identities that bind the sites to each other and to
the parameters (numpy, from the params tree), and an intervention does what it says: zeroing a
head's output is the head mask's removal, patching a whole site from another run gives that
run's logits, a sweep is the loop of single runs, and scanned or rematerialised layers change
nothing."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt.config import ModelConfig
from jaxgpt.lab import activations as A
from jaxgpt.model.transformer import GPT, init_params, stack_blocks

# float32 sums of a few hundred products of O(1) numbers, computed in another order: ~1e-6
CLOSE = dict(rtol=1e-5, atol=1e-5)


def model(**changes):
    base = dict(vocab_size=40, n_layer=2, n_head=4, d_model=32, block_size=16, init_std=0.2)
    config = ModelConfig(**(base | changes))
    return config, init_params(config, jax.random.key(1))


def tokens(batch=2, t=9, seed=0):
    return np.random.default_rng(seed).integers(0, 40, (batch, t)).astype(np.int32)


def every_site(config, params, ids, **inputs):
    names = tuple(A.site_shapes(config, ids, **inputs))
    return A.run_with_cache(config, params, ids, names, **inputs)


def test_the_table_names_every_site_and_the_shapes_it_gives():
    config, params = model(n_kv_head=2, activation="swiglu", position="rope")
    shapes = A.site_shapes(config, tokens())
    documented = set(re.split(r"[\s,.]+", A.__doc__))
    assert all(name.rsplit(".", 1)[-1] in documented for name in shapes)
    assert shapes["blocks.1.attn.hook_q"] == (2, 9, 4, 8) and shapes["blocks.1.attn.hook_k"] == (2, 9, 2, 8)
    assert shapes["blocks.0.attn.hook_pattern"] == (2, 4, 9, 9) and shapes["blocks.0.mlp.hook_pre_linear"][-1] == 128
    assert "hook_pos_embed" not in shapes and "blocks.0.attn.hook_rot_k" in shapes  # rope acts inside attention
    assert list(shapes)[0] == "hook_embed" and list(shapes)[-1] == "ln_final.hook_out"  # the forward order
    with pytest.raises(ValueError, match="no site named blocks.0.attn.hook_nope in this model; its sites: "):
        A.run_with_cache(config, params, tokens(), ["blocks.0.attn.hook_nope"])


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["heads", "grouped"])
def test_the_cached_sites_are_what_the_parameters_compute(kv_heads):
    """numpy from the params tree: each head's output is its pattern times its value head (query
    head h reads value head h // group); attention's output is the heads through W_O plus the
    bias; the stream adds each branch's output; the logits are the final norm's readout."""
    config, params = model(n_kv_head=kv_heads)
    ids = tokens()
    logits, cache = every_site(config, params, ids)
    group = 4 // kv_heads
    for layer in range(2):
        at = lambda name, layer=layer: np.asarray(cache[f"blocks.{layer}.{name}"], np.float64)  # noqa: E731
        pattern, v, z = at("attn.hook_pattern"), at("attn.hook_v"), at("attn.hook_z")
        np.testing.assert_allclose(pattern.sum(-1), 1.0, **CLOSE)
        assert np.all(np.triu(pattern, 1) == 0)  # causal: nothing above the diagonal
        want_z = np.einsum("bhts,bshd->bthd", pattern, np.repeat(v, group, axis=2))
        np.testing.assert_allclose(z, want_z, **CLOSE)
        out = params[f"block_{layer}"]["attn"]["out"]
        w_o = np.asarray(out["kernel"]).reshape(4, 8, 32)
        np.testing.assert_allclose(at("hook_attn_out"), np.einsum("bthd,hdm->btm", z, w_o) + out["bias"], **CLOSE)
        np.testing.assert_allclose(at("hook_resid_mid"), at("hook_resid_pre") + at("hook_attn_out"), **CLOSE)
        np.testing.assert_allclose(at("hook_resid_post"), at("hook_resid_mid") + at("hook_mlp_out"), **CLOSE)
        scores = at("attn.hook_attn_scores")
        shifted = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(pattern, shifted / shifted.sum(-1, keepdims=True), **CLOSE)
    np.testing.assert_array_equal(cache["blocks.0.hook_resid_post"], cache["blocks.1.hook_resid_pre"])
    stream = np.asarray(cache["blocks.1.hook_resid_post"], np.float64)
    normed = (stream - stream.mean(-1, keepdims=True)) / np.sqrt(stream.var(-1, keepdims=True) + config.norm_eps)
    normed = normed * params["norm_f"]["scale"] + params["norm_f"]["bias"]
    np.testing.assert_allclose(cache["ln_final.hook_out"], normed, **CLOSE)
    np.testing.assert_allclose(logits, normed @ np.asarray(params["wte"]["embedding"]).T, **CLOSE)
    np.testing.assert_allclose(logits, GPT(config).apply({"params": params}, ids), **CLOSE)  # nothing changed


def test_zeroing_a_heads_output_is_removing_its_rows_of_the_output_projection():
    """A head reaches the stream only through its rows of W_O (query head h is key/value group
    h // 2, member h % 2 here); removed_heads (evaluate's) is the same edit."""
    config, params = model(n_kv_head=2)
    ids = tokens()
    shape = A.site_shapes(config, ids)["blocks.1.attn.hook_z"]
    edits = {"blocks.1.attn.hook_z": A.zero(shape, "blocks.1.attn.hook_z", heads=[1, 2])}
    without = jax.tree.map(jnp.copy, params)
    kernel = without["block_1"]["attn"]["out"]["kernel"]  # (kv heads, group, head_dim, d_model)
    without["block_1"]["attn"]["out"]["kernel"] = kernel.at[0, 1].set(0).at[1, 0].set(0)
    removed = GPT(config).apply({"params": without}, ids)
    zeroed = A.run_with_interventions(config, params, ids, edits)
    keep = np.ones((2, 4))
    keep[1, [1, 2]] = 0
    np.testing.assert_array_equal(zeroed, A.run_with_interventions(config, params, ids, A.removed_heads(config, keep)))
    np.testing.assert_allclose(zeroed, removed, **CLOSE)
    assert np.abs(zeroed - GPT(config).apply({"params": params}, ids)).max() > 1e-3  # it did something


@pytest.mark.parametrize("site", ["hook_embed", "blocks.1.hook_resid_pre", "ln_final.hook_out"])
def test_patching_a_whole_site_from_another_run_gives_that_runs_logits(site):
    """Everything after these sites reads only what they hold (and the positions, the same in
    both), so replacing all of one turns run A into run B; a mask of 0 leaves A exactly."""
    config, params = model(position="learned")
    a, b = tokens(seed=1), tokens(seed=2)
    b_logits, b_cache = A.run_with_cache(config, params, b, [site])
    shape = b_cache[site].shape
    patched = A.run_with_interventions(config, params, a, {site: A.replace(shape, site, b_cache[site])})
    np.testing.assert_allclose(patched, b_logits, **CLOSE)
    kept = A.Edit(value=b_cache[site])
    np.testing.assert_array_equal(
        A.run_with_interventions(config, params, a, {site: kept}), A.run_with_interventions(config, params, a, {})
    )


def test_scores_are_replaced_and_blended_with_their_minus_infinities_intact():
    """A masked score is -inf: replacing the scores with a run's own (mask 1) gives its logits,
    and halfway to another run's (mask 0.5) stays finite: -inf + 0 * inf would be NaN."""
    config, params = model()
    a, b = tokens(seed=1), tokens(seed=2)
    site = "blocks.0.attn.hook_attn_scores"
    a_logits, a_cache = A.run_with_cache(config, params, a, [site])
    _, b_cache = A.run_with_cache(config, params, b, [site])
    assert np.isinf(a_cache[site]).any()
    own = A.run_with_interventions(config, params, a, {site: A.replace(a_cache[site].shape, site, a_cache[site])})
    np.testing.assert_allclose(own, a_logits, **CLOSE)
    half = A.Edit(0.5, b_cache[site])
    blended = A.run_with_interventions(config, params, a, {site: half})
    assert np.isfinite(blended).all() and np.abs(blended - a_logits).max() > 1e-4


def test_mean_ablation_puts_the_reference_batchs_mean_at_the_chosen_head():
    """The site as the rest of the pass reads it (sown after the edit): the mean of the
    reference rows at head 2, untouched elsewhere."""
    config, params = model()
    site = "blocks.0.attn.hook_z"
    _, reference = A.run_with_cache(config, params, tokens(batch=3, seed=7), [site])
    ids = tokens(batch=1)
    _, plain = A.run_with_cache(config, params, ids, [site])
    edit = A.mean_ablate(reference[site], site, heads=[2])
    _, ablated = A.run_with_cache(config, params, ids, [site], {site: edit})
    np.testing.assert_allclose(
        ablated[site][:, :, 2], np.asarray(reference[site][:, :, 2]).mean(0, keepdims=True), **CLOSE
    )
    np.testing.assert_array_equal(np.delete(ablated[site], 2, axis=2), np.delete(plain[site], 2, axis=2))


def test_steering_the_last_stream_moves_the_logits_by_the_vector_read_out():
    """Without a final norm the readout is linear: adding v at one position of the last block's
    output adds v @ W_U to that position's logits and nothing elsewhere."""
    config, params = model(norm="none")
    ids = tokens()
    site = "blocks.1.hook_resid_post"
    vector = np.random.default_rng(3).normal(size=32).astype(np.float32)
    shape = A.site_shapes(config, ids)[site]
    steered = A.run_with_interventions(config, params, ids, {site: A.steer(shape, site, vector, positions=[4])})
    change = np.asarray(steered - A.run_with_interventions(config, params, ids, {}))
    np.testing.assert_allclose(
        change[:, 4], np.broadcast_to(vector @ np.asarray(params["wte"]["embedding"]).T, (2, 40)), **CLOSE
    )
    assert np.abs(np.delete(change, 4, axis=1)).max() == 0


def test_scanned_and_rematerialised_layers_cache_and_intervene_as_unscanned_ones():
    config, params = model()
    ids = tokens()
    names = ("blocks.0.attn.hook_pattern", "blocks.1.hook_mlp_out", "ln_final.hook_out")
    shape = A.site_shapes(config, ids)["blocks.1.attn.hook_z"]
    edits = {"blocks.1.attn.hook_z": A.zero(shape, "blocks.1.attn.hook_z", heads=[0], positions=[2, 5])}
    plain_logits, plain = A.run_with_cache(config, params, ids, names, edits)
    scanned = config.replace(scan_layers=True, remat="full")
    logits, cache = A.run_with_cache(scanned, stack_blocks(params, 2), ids, names, edits)
    np.testing.assert_allclose(logits, plain_logits, **CLOSE)
    for name in names:
        np.testing.assert_allclose(cache[name], plain[name], **CLOSE)
    assert list(A.site_shapes(scanned, ids)) == list(A.site_shapes(config, ids))


def test_a_sweep_is_the_loop_of_single_interventions():
    config, params = model()
    ids = tokens(batch=1)
    site = "blocks.0.hook_attn_out"
    shape = A.site_shapes(config, ids)[site]

    def nth(i):
        return {site: A.Edit(mask=(jnp.arange(9) == i).astype(jnp.float32)[None, :, None])}

    swept = A.sweep(lambda logits: logits[0, -1], config, params, ids, nth, 9, batch_size=4)
    for i in (0, 4, 8):
        alone = A.run_with_interventions(config, params, ids, {site: A.zero(shape, site, positions=[i])})
        np.testing.assert_allclose(swept[i], alone[0, -1], **CLOSE)


def test_an_encoder_decoder_has_its_encoders_and_cross_attentions_sites():
    config, params = model(encoder_layers=1, position="learned")
    ids, sources = tokens(), tokens(seed=5)
    shapes = A.site_shapes(config, ids, sources=sources)
    assert shapes["encoder.blocks.0.attn.hook_pattern"] == (2, 4, 9, 9)
    assert shapes["blocks.1.cross_attn.hook_pattern"] == (2, 4, 9, 9)
    names = list(shapes)
    assert names.index("encoder.ln_final.hook_out") < names.index("hook_embed")  # the encoder runs first
    block = [n for n in names if n.startswith("blocks.0.")]
    assert block.index("blocks.0.hook_resid_mid") < block.index("blocks.0.cross_attn.hook_q")
    assert block.index("blocks.0.cross_attn.hook_z") < block.index("blocks.0.hook_cross_attn_out")
    # the encoder's output from other sources turns the decoder's answer into theirs
    other = tokens(seed=6)
    site = "encoder.ln_final.hook_out"
    want, cache = A.run_with_cache(config, params, ids, [site], sources=other)
    patched = A.run_with_interventions(
        config, params, ids, {site: A.replace(shapes[site], site, cache[site])}, sources=sources
    )
    np.testing.assert_allclose(patched, want, **CLOSE)


def test_the_command_lists_every_site_and_saves_the_named_ones(trained_small_run, tmp_path, capsys):
    from jaxgpt.commands import activations
    from jaxgpt.job.checkpoint import load_latest

    run, params, tokenizer, _ = load_latest(trained_small_run)
    activations.main(["--workdir", str(trained_small_run), "--prompt", "import os"])
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == "29 sites (step 20, 9 tokens); --names picks some to print and save"  # 2 + 13 a layer + 1
    assert listed[3].split() == ["blocks.0.hook_resid_pre", "(1,", "9,", "32)"]
    names = "blocks.1.attn.hook_pattern,blocks.0.hook_mlp_out"
    out = tmp_path / "acts.npz"
    activations.main(
        ["--workdir", str(trained_small_run), "--prompt", "import os", "--names", names, "--out", str(out)]
    )
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "2 activations (step 20, 9 tokens)" and printed[-1].startswith(f"wrote {out}")
    saved = np.load(out)
    ids = np.asarray([tokenizer.encode("import os")])
    _, cache = A.run_with_cache(run.model, params, ids, names.split(","))
    np.testing.assert_array_equal(saved["tokens"], ids[0])
    for name in names.split(","):
        np.testing.assert_array_equal(saved[name], cache[name])


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--names", "blocks.0.attn.hook_patern"],
            "no site named blocks.0.attn.hook_patern in this model (did you mean ",
        ),
        (["--names", "hook_embed", "--out", "acts.txt"], "does not end in .npz"),
        (["--names", "hook_embed", "--out", "/sys/jaxgpt/acts.npz"], "cannot write /sys/jaxgpt/acts.npz ("),
    ],
    ids=["misspelt", "not-npz", "unwritable"],
)
def test_the_command_refuses_a_name_or_file_it_cannot_use_in_one_line(trained_small_run, capsys, flags, message):
    from jaxgpt.commands import activations

    with pytest.raises(SystemExit) as exit_status:
        activations.main(["--workdir", str(trained_small_run), "--prompt", "import os", *flags])
    error = capsys.readouterr().err.strip()
    assert exit_status.value.code == 2 and "\n" not in error and message in error, error


def test_windowed_and_global_blocks_interleave_with_their_own_rotary_bases():
    """global_every=3 over 6 blocks: blocks 2 and 5 see the whole prefix, the others the window of
    2 (each query itself and the one before: exactly 0 further back, on the pattern the lab
    reads); the windowed blocks rotate at rope_local_theta's base, the global ones at rope_theta's
    (hook_rot_q against numpy's rotation of hook_q at each base)."""
    config, params = model(n_layer=6, position="rope", attention_window=2, global_every=3, rope_local_theta=100.0,
                           rope_theta=10000.0)  # fmt: skip
    _, cache = every_site(config, params, tokens())
    distance = np.arange(9)[:, None] - np.arange(9)[None, :]
    for layer in range(6):
        pattern = np.asarray(cache[f"blocks.{layer}.attn.hook_pattern"])
        far = pattern[..., distance >= 2]
        assert np.all(far == 0) if layer in (0, 1, 3, 4) else np.all(far > 0), layer
        q, rotated = (np.asarray(cache[f"blocks.{layer}.attn.{n}"], np.float64) for n in ("hook_q", "hook_rot_q"))
        base = 10000.0 if layer in (2, 5) else 100.0
        angles = np.arange(9)[:, None] * base ** -(np.arange(0, 8, 2) / 8)  # (t, pairs)
        cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]
        x1, x2 = q[..., :4], q[..., 4:]
        np.testing.assert_allclose(rotated, np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1), **CLOSE)


def test_a_sandwich_block_writes_its_branches_normed():
    """norm_position=sandwich (Gemma's four norms a block): what each branch adds to the stream
    (hook_attn_out, hook_mlp_out) is RMS-normed, the output norms' scales at their init of 1: a
    root mean square of 1 at every position; and the stream still adds them."""
    config, params = model(norm="rmsnorm", norm_position="sandwich", activation="geglu", norm_eps=1e-12)
    _, cache = every_site(config, params, tokens())
    assert set(params["block_0"]) >= {"norm_1", "norm_1_out", "norm_2", "norm_2_out"}
    for layer in range(2):
        at = lambda name, layer=layer: np.asarray(cache[f"blocks.{layer}.{name}"], np.float64)  # noqa: E731
        for written in ("hook_attn_out", "hook_mlp_out"):
            np.testing.assert_allclose(np.sqrt(np.mean(at(written) ** 2, -1)), 1.0, **CLOSE)
        np.testing.assert_allclose(at("hook_resid_mid"), at("hook_resid_pre") + at("hook_attn_out"), **CLOSE)
        np.testing.assert_allclose(at("hook_resid_post"), at("hook_resid_mid") + at("hook_mlp_out"), **CLOSE)
