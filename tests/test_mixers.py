"""The switches that change what a block's first branch computes: the gate on attention's heads
(model.attention_gate, Qiu et al. 2025), a causal convolution in attention's place
(model.token_mixer), and heads that start identical (model.init_heads_identical), each against
an independent computation or a property it must have, and each trained through the engine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import SEQ, TOL, attention_config, init_layer, normal, run_layer
from test_composition import trains_and_resumes_exactly, two_cores  # noqa: F401  (the fixture)
from test_model import forward, params_for, random_tokens, tiny
from test_workbench import reference_attention

from jaxgpt.config import ConfigError, ModelConfig
from jaxgpt.lab.activations import run_with_cache
from jaxgpt.model.convolution import causal_depthwise
from jaxgpt.model.transformer import count_params


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ----------------------------------------------------------------------------- the attention gate


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
@pytest.mark.parametrize("n_kv_head", [4, 2], ids=["MHA", "GQA"])
def test_the_gate_multiplies_each_heads_output_by_a_sigmoid_of_the_layers_input(gate, n_kv_head):
    """Gated: out(z_h * sigmoid(x W_g,h + b_g,h)) summed over heads, z_h the plain head's output,
    every feature of a head by its own gate (elementwise) or by one (headwise), against the
    float64 reference with the gate written out."""
    config = attention_config(n_kv_head, attention_gate=gate)
    layer, params, x = init_layer(config)
    H, D = config.n_head, config.head_dim
    width = D if gate == "elementwise" else 1
    assert params["gate"]["kernel"].shape == (config.d_model, n_kv_head, config.group_size, width)
    g = sigmoid(np.einsum("btm,mkgw->btkgw", x, params["gate"]["kernel"]) + params["gate"]["bias"])
    g = g.reshape(*x.shape[:2], H, width)
    plain = {k: v for k, v in params.items() if k != "gate"}
    want = reference_attention(x, plain, config, gate=g)
    np.testing.assert_allclose(run_layer(layer, params, x), want, **TOL)


def test_a_closed_gate_of_one_half_is_the_plain_model_with_its_output_halved():
    """With the gate's weights 0 every gate is sigmoid(0) = 1/2: the gated model computes the
    plain one whose output projections are halved, to the bit (halving is exact in float)."""
    gated, plain = tiny(attention_gate="headwise"), tiny()
    params = jax.tree.map(np.asarray, params_for(gated))
    for i in range(gated.n_layer):
        block = params[f"block_{i}"]["attn"]
        block["gate"] = jax.tree.map(np.zeros_like, block["gate"])
    halved = {name: dict(part) for name, part in params.items()}  # copied containers: params stays the gated model's
    for i in range(plain.n_layer):
        attn = halved[f"block_{i}"]["attn"] = dict(params[f"block_{i}"]["attn"])
        del attn["gate"]
        attn["out"] = {"kernel": attn["out"]["kernel"] * 0.5, "bias": attn["out"]["bias"]}
    tokens = random_tokens(plain, (2, 16))
    np.testing.assert_array_equal(forward(gated, params, tokens), forward(plain, halved, tokens))


def test_the_gate_is_a_site_and_decodes_and_scans_like_the_full_forward():
    """hook_attn_gate shows (b, t, n_head, head_dim) in (0, 1); the KV-cache decode and the
    scanned layers give the full forward's logits."""
    from test_workbench import assert_scanned_and_decoded_match_the_full_forward

    config = tiny(attention_gate="elementwise", n_kv_head=2, block_size=16, position="rope")
    params = params_for(config)
    tokens = random_tokens(config, (2, 16))
    _, cache = run_with_cache(config, params, tokens, ["blocks.1.attn.hook_attn_gate"])
    gate = cache["blocks.1.attn.hook_attn_gate"]
    assert gate.shape == (2, 16, 4, 8) and bool(jnp.all((gate > 0) & (gate < 1)))
    assert_scanned_and_decoded_match_the_full_forward(config, params)


# ----------------------------------------------------------------------------- the convolution


def reference_convolution(v, taps, segments=None):
    """sum_i taps[i] v[t - i], position by position in float64, within t's segment."""
    v, taps = np.asarray(v, np.float64), np.asarray(taps, np.float64)
    out = np.zeros_like(v)
    for b in range(v.shape[0]):
        for t in range(v.shape[1]):
            for i in range(min(taps.shape[0], t + 1)):
                if segments is None or segments[b, t - i] == segments[b, t]:
                    out[b, t] += taps[i] * v[b, t - i]
    return out


@pytest.mark.parametrize("packed", [False, True])
def test_the_causal_depthwise_convolution_matches_the_reference(packed):
    v, taps = normal((2, SEQ, 6), 1), normal((3, 6), 2)
    segments = np.asarray([[0] * 5 + [1] * (SEQ - 5), [0] * 2 + [1] * 3 + [2] * (SEQ - 5)]) if packed else None
    ours = causal_depthwise(jnp.asarray(v), jnp.asarray(taps), None if segments is None else jnp.asarray(segments))
    np.testing.assert_allclose(ours, reference_convolution(v, taps, segments), **TOL)


def test_a_convolution_layer_reads_exactly_its_width_of_past_tokens():
    """One block, no positions, width 3: the logits at t change with tokens t-2..t and with no
    other (the future, or a token 3 back): the receptive field is the width, to the bit."""
    config = tiny(n_layer=1, token_mixer="convolution", conv_width=3, position="none")
    params = params_for(config)
    tokens = random_tokens(config, (1, 12))
    base = np.asarray(forward(config, params, tokens))[0]
    for changed in range(12):
        moved = tokens.at[0, changed].set((tokens[0, changed] + 1) % config.vocab_size)
        differs = np.any(np.asarray(forward(config, params, moved))[0] != base, axis=-1)
        np.testing.assert_array_equal(np.flatnonzero(differs), [t for t in range(changed, min(changed + 3, 12))])


def test_a_convolution_model_decodes_and_scans_like_the_full_forward():
    from test_workbench import assert_scanned_and_decoded_match_the_full_forward

    config = tiny(token_mixer="convolution", conv_width=4, block_size=16, position="rope")
    assert_scanned_and_decoded_match_the_full_forward(config, params_for(config))


def test_a_convolution_model_counts_its_parameters_its_cache_and_its_flops():
    """Per block 2 D^2 + 2 D (values and output, biases) + w D taps in place of attention's
    4 D^2 + 4 D; a decoding cache of D numbers a position a layer, not 2 D; 6 FLOPs a token per
    parameter that multiplies, and no attention scores (12 L d T) to add."""
    from jaxgpt.model.kv_cache import cache_bytes

    D, w = 32, 4
    conv, attention = tiny(token_mixer="convolution", conv_width=w), tiny()
    params = lambda c: count_params(params_for(c))  # noqa: E731
    assert params(attention) - params(conv) == conv.n_layer * ((4 * D * D + 4 * D) - (2 * D * D + 2 * D + w * D))
    assert cache_bytes(conv, 10) * 2 == cache_bytes(attention, 10) == 2 * 2 * 10 * D * 4
    # FLOPs: 6 per parameter that multiplies (all but the learned position table), and no scores
    from jaxgpt.model.transformer import flops_per_token

    assert flops_per_token(conv) == 6 * (params(conv) - conv.block_size * D)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(causal=False), "token_mixer='convolution' is causal"),
        (dict(encoder_layers=1), "token_mixer='convolution' is causal"),
        (dict(attention_gate="headwise"), "attention_gate='headwise' is a setting of attention"),
        (dict(qk_norm=True), "qk_norm=True is a setting of attention"),
        (dict(qkv_projections=False), "qkv_projections=False is a setting of attention"),
        (dict(lora_rank=2), "lora_targets='qkv,out,up,down' adapts attention's projections"),
        (dict(conv_width=0), "conv_width=0 must be a positive integer"),
    ],
)
def test_what_a_convolution_cannot_be_combined_with_is_named(changes, message):
    with pytest.raises(ConfigError, match="invalid config") as error:
        ModelConfig(token_mixer="convolution", **changes)
    assert message in str(error.value)


def test_unknown_mixers_and_gates_are_named():
    with pytest.raises(ConfigError, match="model.token_mixer='mamba' is not one of 'attention', 'convolution'"):
        ModelConfig(token_mixer="mamba")
    with pytest.raises(ConfigError, match="model.attention_gate='sigmoid' is not one of 'none', 'elementwise'"):
        ModelConfig(attention_gate="sigmoid")


# ----------------------------------------------------------------------------- identical heads


def head_slices(config, block):
    """Each query head's (query, key, value, output) weights, as one flat vector per head."""
    qkv, out = block["attn"]["qkv"]["kernel"], block["attn"]["out"]["kernel"]
    G = config.group_size
    heads = []
    for h in range(config.n_head):
        kv, g = divmod(h, G)
        parts = (qkv[:, kv, g], qkv[:, kv, G], qkv[:, kv, G + 1], out[kv, g])
        heads.append(np.concatenate([np.ravel(p) for p in parts]))
    return np.stack(heads)


def test_heads_that_start_identical_compute_identical_patterns():
    config = tiny(init_heads_identical=True, n_kv_head=2, position="rope")
    params = params_for(config)
    heads = head_slices(config, params["block_0"])
    assert np.all(heads == heads[0]) and np.std(heads[0]) > 0.01  # drawn, then copied
    _, cache = run_with_cache(config, params, random_tokens(config, (2, 16)), ["blocks.1.attn.hook_pattern"])
    pattern = np.asarray(cache["blocks.1.attn.hook_pattern"])
    np.testing.assert_array_equal(pattern, np.broadcast_to(pattern[:, :1], pattern.shape))
    other = head_slices(tiny(), params_for(tiny())["block_0"])  # random heads: all different
    assert len({tuple(np.round(h, 6)) for h in other}) == tiny().n_head


# ----------------------------------------------------------------------------- through the engine


ARCHITECTURES = {
    "gated-identical-heads": {"model.attention_gate": "elementwise", "model.init_heads_identical": True},
    "convolution": {"model.token_mixer": "convolution", "model.conv_width": 3},
}


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_the_new_architectures_train_and_resume_on_two_cores_bit_for_bit(architecture, tmp_path, request):
    """Through train_and_evaluate, the batch split over two CPU cores, evaluations on the way:
    continued from its checkpoint at step 2, a run ends at the same losses and weights."""
    trains_and_resumes_exactly("next-token", "2-cpu-cores", tmp_path, request, ARCHITECTURES[architecture])


def test_identical_heads_stay_identical_through_training(tmp_path):
    """The engine's own steps (AdamW, gradient clipping, 2 microbatches): after them every
    head's weights are still the first head's, to the bit, and they have moved."""
    from conftest import small_run_config

    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.job.trainer import train_and_evaluate

    config = small_run_config(steps=6, eval_every=6, checkpoint_every=3)
    config.update_from_flattened_dict({"model.init_heads_identical": True, "train.microbatches": 2, "mesh.data": 1})
    train_and_evaluate(config, tmp_path, progress=False)
    seen = []
    for step in (3, 6):
        run, params, _, _ = load_latest(tmp_path, step=step)
        for i in range(run.model.n_layer):
            heads = head_slices(run.model, jax.tree.map(np.asarray, params[f"block_{i}"]))
            np.testing.assert_array_equal(heads, np.broadcast_to(heads[0], heads.shape))
        seen.append(heads)
    assert not np.array_equal(*seen)  # trained between the two


def test_a_convolution_run_is_measured_by_layer_and_refused_head_measures_in_one_line(tmp_path):
    """train.lab's layer measures (logit lens, norms, probe) run on a convolution model at its
    evaluations; a head measure is refused when the config is read, naming the ones it may take."""
    from conftest import small_run_config

    from jaxgpt.job.trainer import train_and_evaluate

    config = small_run_config(steps=4, eval_every=4, checkpoint_every=4)
    config.update_from_flattened_dict({"model.token_mixer": "convolution", "mesh.data": 1, "train.lab": "all"})
    with pytest.raises(ConfigError, match=r"measures heads \(induction, previous_token, dla, entropy\)"):
        train_and_evaluate(config, tmp_path / "refused", progress=False)
    config.train.lab = "logit_lens,norms,probe"
    train_and_evaluate(config, tmp_path / "run", progress=False)
    import json

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    measured = {k for r in records for k in r if k.startswith("lab_")}
    assert {"lab_logit_lens", "lab_norms", "lab_probe"} <= measured and "lab_induction" not in measured, measured
