"""Hugging Face interop against transformers itself: logits, greedy generation, export, round trip.

Needs the optional extras (pip install -r requirements-hf.txt); skipped without them.
"""

import dataclasses
import json
import re
import shutil
from functools import partial
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch", reason="the parity tests need torch: pip install -r requirements-hf.txt")
transformers = pytest.importorskip(
    "transformers", reason="the parity tests need transformers: pip install -r requirements-hf.txt"
)

from jaxgpt.config import MixtureOfExperts, ModelConfig, RopeScaling  # noqa: E402
from jaxgpt.errors import UserError  # noqa: E402
from jaxgpt.hf import load_pretrained, save_pretrained  # noqa: E402
from jaxgpt.model.sampling import SamplingConfig, encode, generate  # noqa: E402
from jaxgpt.model.transformer import GPT, init_params  # noqa: E402

VOCAB = 64


def with_visible_weights(model, seed: int = 0):
    """Re-draw every weight with std 0.3, not the 0.02 of a fresh init, so logits vary by whole
    units and any misplaced weight shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


LLAMA = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention: 4 query heads share 2 key/value heads
    max_position_embeddings=32,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=0,
)
# Llama 3.1's scaling with head_dim 8 and theta 500: over the 32-token original window the four
# rotary pairs turn 5.1, 1.07, 0.23 and 0.05 times, so one pair keeps its frequency (>= 4), one
# is blended (between 1 and 4) and two are divided by the factor (<= 1): every branch is used.
LLAMA_31_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


# LongRoPE as Phi-3 writes it, on Llama: per-pair divisors for the 4 rotary pairs, unlike each
# other so a pair read in the wrong place shows; a 4-token original window stretched to 32, so the
# 16-token inputs and 5-token prompts are past it and transformers uses the long factors from the
# first token on, as jaxgpt does for a 32-token block_size.
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 500.0,
    "original_max_position_embeddings": 4,
    "long_factor": [1.0, 1.9, 4.7, 7.3],
    "short_factor": [1.0, 1.2, 1.5, 2.1],
}


# Gemma 3's text model, small: three layers, two windowed (4 tokens, well inside the 16-token
# inputs) and the third global, each kind with its RoPE (the global one's stretched linearly, the
# windowed ones' at a base of their own); heads 16 wide over 32, scores scaled by 24 ** -0.5
# rather than head_dim's 16 ** -0.5, the embedding tied (Gemma's default)
GEMMA3 = LLAMA | dict(
    tie_word_embeddings=True,
    num_hidden_layers=3,
    head_dim=16,
    query_pre_attn_scalar=24,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    sliding_window=4,
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
    },
)


def reference_model(kind: str):
    """A small random transformers model."""
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
        )
        return with_visible_weights(transformers.GPT2LMHeadModel(config))
    if kind == "llama":
        config = transformers.LlamaConfig(**LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
        return with_visible_weights(transformers.LlamaForCausalLM(config))
    if kind == "llama3.1":
        config = transformers.LlamaConfig(**LLAMA | {"max_position_embeddings": 128}, rope_parameters=LLAMA_31_ROPE)
        return with_visible_weights(transformers.LlamaForCausalLM(config))
    if kind == "longrope":
        config = transformers.LlamaConfig(**LLAMA, rope_parameters=LONGROPE)
        return with_visible_weights(transformers.LlamaForCausalLM(config))
    if kind == "llama-head_dim":  # heads wider than hidden_size / heads (Qwen3's, Gemma's): 4 x 16 over 32
        config = transformers.LlamaConfig(
            **LLAMA, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 500.0}
        )
        return with_visible_weights(transformers.LlamaForCausalLM(config))
    if kind == "qwen3":  # Llama plus an RMSNorm over each head's queries and keys, heads 16 wide over 32
        config = transformers.Qwen3Config(
            **LLAMA, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 500.0}
        )
        return with_visible_weights(transformers.Qwen3ForCausalLM(config))
    if kind == "gemma3":  # four norms a block, GeGLU, windowed and global layers (GEMMA3)
        return with_visible_weights(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**GEMMA3)))
    if kind == "qwen2":  # Llama plus biases on the query, key and value projections
        config = transformers.Qwen2Config(**LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
        return with_visible_weights(transformers.Qwen2ForCausalLM(config))
    if kind == "mixtral":  # Mistral's attention with 4 experts, each token routed to 2
        config = transformers.MixtralConfig(**LLAMA, num_local_experts=4, num_experts_per_tok=2, rope_theta=500.0)
        return with_visible_weights(transformers.MixtralForCausalLM(config))
    assert kind == "mistral"  # Llama plus a sliding window of 4 tokens, well inside the 16-token inputs
    config = transformers.MistralConfig(**LLAMA, sliding_window=4, rope_theta=500.0)
    return with_visible_weights(transformers.MistralForCausalLM(config))


def tokens(shape=(2, 16), seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, shape)


@pytest.fixture(
    scope="module",
    params=[
        "gpt2",
        "llama",
        "llama3.1",
        "longrope",
        "mistral",
        "qwen2",
        "mixtral",
        "llama-head_dim",
        "qwen3",
        "gemma3",
    ],
)
def saved(request, tmp_path_factory):
    model = reference_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    return request.param, model, directory


def test_logits_equal_transformers(saved):
    _, model, directory = saved
    config, params, _ = load_pretrained(str(directory))
    ids = tokens()
    ours = np.asarray(jax.jit(GPT(config).apply)({"params": params}, jnp.asarray(ids)))
    with torch.no_grad():
        theirs = model(torch.tensor(ids)).logits.numpy()
    assert np.abs(theirs).max() > 1.0  # logits that really vary
    # Two float32 implementations of the same math: O(1e-6) relative apart on logits of O(10).
    assert np.abs(ours - theirs).max() < 1e-4


@pytest.mark.parametrize(
    "kind, without, config_field",
    [
        ("llama3.1", {"rope_scaling": None}, "rope scaling"),
        ("longrope", {"rope_scaling": None}, "rope scaling"),
        ("mistral", {"attention_window": 0}, "sliding window"),
        ("qwen3", {"qk_norm": False}, "each head's query and key norm"),
        ("gemma3", {"norm_position": "pre"}, "the norms after each branch"),
        ("gemma3", {"activation": "swiglu"}, "the GELU gate"),
        ("gemma3", {"scale_embeddings": False}, "the embedding's sqrt(d_model)"),
        ("gemma3", {"attention_scale_dim": None}, "query_pre_attn_scalar"),
        ("gemma3", {"global_every": 0, "rope_local_theta": 0.0}, "the global layer"),
        ("gemma3", {"rope_local_theta": 0.0}, "the windowed layers' RoPE base"),
        ("gemma3", {"rope_scaling": None}, "the global layer's RoPE scaling"),
    ],
)
def test_the_parity_depends_on_the_feature_under_test(kind, without, config_field, tmp_path):
    """Without the scaling or the window the same weights give other logits (by whole units),
    so the parity above is a check of each feature, not of plain Llama."""
    reference_model(kind).save_pretrained(tmp_path)
    config, params, _ = load_pretrained(str(tmp_path))
    ids = jnp.asarray(tokens())
    logits = lambda c: np.asarray(GPT(c).apply({"params": params}, ids))  # noqa: E731
    assert np.abs(logits(config) - logits(config.replace(**without))).max() > 0.1, config_field


def test_qwen2s_parity_depends_on_its_query_key_value_biases(tmp_path):
    """The biases are read, and placed where they act: without them the logits move by whole units."""
    reference_model("qwen2").save_pretrained(tmp_path)
    config, params, _ = load_pretrained(str(tmp_path))
    assert config.qkv_bias and not config.bias
    unbiased = jax.tree_util.tree_map_with_path(
        lambda path, a: np.zeros_like(a) if "qkv" in str(path) and "bias" in str(path) else a, params
    )
    ids = jnp.asarray(tokens())
    logits = lambda p: np.asarray(GPT(config).apply({"params": p}, ids))  # noqa: E731
    assert np.abs(logits(params) - logits(unbiased)).max() > 0.1


def test_gemma3s_norms_are_read_as_one_plus_their_weights(tmp_path):
    """Gemma's RMSNorm multiplies by 1 + w: each of a block's four norms, the query and key
    norms and the final one read as scale = 1 + w, to the bit (and written back as w)."""
    reference_model("gemma3").save_pretrained(tmp_path)
    _, params, _ = load_pretrained(str(tmp_path))
    stored = load_file(tmp_path / "model.safetensors")
    read = {"input_layernorm": "norm_1", "post_attention_layernorm": "norm_1_out",
            "pre_feedforward_layernorm": "norm_2", "post_feedforward_layernorm": "norm_2_out"}  # fmt: skip
    for theirs, ours in read.items():
        np.testing.assert_array_equal(params["block_1"][ours]["scale"], 1.0 + stored[f"model.layers.1.{theirs}.weight"])
    np.testing.assert_array_equal(
        params["block_2"]["attn"]["k_norm"]["scale"], 1 + stored["model.layers.2.self_attn.k_norm.weight"]
    )
    np.testing.assert_array_equal(params["norm_f"]["scale"], 1.0 + stored["model.norm.weight"])


def gemma3_multimodal(directory, seed: int = 0):
    """Gemma3ForConditionalGeneration (the 4B checkpoints' class) with GEMMA3's text model beside a
    small SigLIP vision tower, saved by transformers (the Hub's `language_model.model.` names)."""
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=GEMMA3, vision_config=vision, mm_tokens_per_image=4, image_token_index=63, boi_token_index=61,
        eoi_token_index=62,
    )  # fmt: skip
    model = with_visible_weights(transformers.Gemma3ForConditionalGeneration(config), seed)
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("layout", ["hub", "transformers-5"])
def test_gemma3s_text_model_loads_from_beside_its_vision_tower(layout, tmp_path, capsys):
    """A 4B-style folder (model_type gemma3, the text model's config in text_config): its text model
    is read, with transformers' logits on text alone, from the Hub's names (`language_model.model.`)
    and from transformers 5's own (`model.language_model.`, which it reads too); the vision tower's
    weights are named as not loaded."""
    model = gemma3_multimodal(tmp_path)
    if layout == "transformers-5":

        def rename(name):  # transformers 5's own names for the parts of the model
            name = re.sub(r"^(vision_tower|multi_modal_projector)\.", r"model.\1.", name)
            return re.sub(r"^language_model\.model\.", "model.language_model.", name)

        rewrite_weights(tmp_path, lambda w: {rename(n): a for n, a in w.items()})
        assert any(n.startswith("model.language_model.layers.") for n in load_file(tmp_path / "model.safetensors"))
        model = transformers.Gemma3ForConditionalGeneration.from_pretrained(tmp_path).eval()
    config, params, family = load_pretrained(str(tmp_path))
    assert family == "gemma3" and (config.global_every, config.rope_local_theta) == (3, 50.0)
    assert re.search(
        r"the \d+ weights of the rest \(multi_modal_projector, vision_tower\) are not loaded", capsys.readouterr().err
    )
    ids = tokens()
    ours = np.asarray(GPT(config).apply({"params": params}, jnp.asarray(ids)))
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(ids)).logits.numpy()
    assert np.abs(theirs).max() > 1.0 and np.abs(ours - theirs).max() < 1e-4


def test_gemma3s_config_as_the_hub_writes_it_loads_as_transformers_reads_it(tmp_path):
    """gemma-3-1b's config.json predates layer_types and rope_parameters: a sliding_window_pattern,
    rope_theta and rope_local_base_freq, and what equals Gemma's defaults left out. transformers
    reads that file to the model jaxgpt reads from it."""
    reference_model("gemma3").save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    for key in ("layer_types", "rope_parameters", "query_pre_attn_scalar", "rms_norm_eps"):
        del hf[key]
    hf |= {"sliding_window_pattern": 3, "rope_theta": 1000.0, "rope_local_base_freq": 50.0, "rope_scaling": None}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    config, params, _ = load_pretrained(str(tmp_path))
    assert (config.global_every, config.rope_local_theta, config.rope_theta) == (3, 50.0, 1000.0)
    assert (config.attention_scale_dim, config.norm_eps, config.rope_scaling) == (256, 1e-6, None)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = tokens()
    ours = np.asarray(GPT(config).apply({"params": params}, jnp.asarray(ids)))
    with torch.no_grad():
        theirs = model(torch.tensor(ids)).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-4


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping is set (Gemma 2's cap on attention scores)"),
        ({"layer_types": ["full_attention", "sliding_attention", "sliding_attention"]},
         "jaxgpt interleaves one global layer every k (model.global_every), and these are not so"),
        ({"hidden_activation": "gelu"}, "config.json hidden_activation='gelu'"),
        ({"rope_parameters": GEMMA3["rope_parameters"] | {"sliding_attention": {"rope_type": "linear", "factor": 2.0,
          "rope_theta": 50.0}}}, "config.json scales the windowed layers' RoPE"),
    ],
)  # fmt: skip
def test_an_unsupported_gemma_variant_is_refused_naming_the_field(edit, message, tmp_path):
    reference_model("gemma3").save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | edit))
    with pytest.raises(UserError, match=re.escape(message)):
        load_pretrained(str(tmp_path))


@pytest.mark.parametrize("block_size, which", [(32, "long_factor"), (4, "short_factor")])
def test_longrope_frequencies_equal_transformers(block_size, which):
    """Past the original window the long factors, within it the short ones; and the attention
    scale sqrt(1 + ln 8 / ln 4) for the 8-fold stretch, whichever set."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from jaxgpt.model.positions import rope_frequencies

    hf = transformers.LlamaConfig(**LLAMA, rope_parameters=LONGROPE)
    theirs, their_scale = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=block_size)
    scaling = RopeScaling("longrope", 8.0, original_block_size=4, long_factor=(1.0, 1.9, 4.7, 7.3),
                          short_factor=(1.0, 1.2, 1.5, 2.1))  # fmt: skip
    ours, scale = rope_frequencies(8, 500.0, scaling, block_size)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)
    np.testing.assert_allclose(ours * np.asarray(LONGROPE[which]), 500.0 ** -(np.arange(0, 8, 2) / 8), rtol=1e-6)
    assert scale == pytest.approx(their_scale) and scale == pytest.approx(np.sqrt(1 + np.log(8) / np.log(4)))


def test_llama_31s_config_as_the_hub_writes_it_loads_with_its_scaling(tmp_path):
    """Llama 3.1's config.json on the Hub predates `rope_parameters`: rope_theta sits beside a
    `rope_scaling` section. Both spellings give the same model."""
    reference_model("llama3.1").save_pretrained(tmp_path)
    current, _, _ = load_pretrained(str(tmp_path))
    hf = json.loads((tmp_path / "config.json").read_text())
    rope = hf.pop("rope_parameters")
    hf |= {"rope_theta": rope.pop("rope_theta"), "rope_scaling": rope}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    hub, _, _ = load_pretrained(str(tmp_path))
    assert hub == current and hub.rope_scaling.kind == "llama3" and hub.rope_scaling.original_block_size == 32


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0}},
            "config.json rope_parameters.rope_type='yarn' is not supported",
        ),
        (
            {"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "config.json rope_scaling.rope_type='dynamic' is not supported",
        ),
        ({"hidden_act": "gelu"}, "config.json hidden_act='gelu'"),
    ],
)
def test_an_unsupported_llama_variant_is_refused_naming_the_field(edit, message, tmp_path):
    reference_model("llama").save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | edit))
    with pytest.raises(UserError, match=re.escape(message)):
        load_pretrained(str(tmp_path))


def test_cached_greedy_generation_equals_transformers_generate(saved):
    _, model, directory = saved
    config, params, _ = load_pretrained(str(directory))
    prompt = tokens((2, 5), seed=1)
    ours = generate(
        config,
        params,
        jnp.asarray(prompt),
        jax.random.key(0),
        max_new_tokens=12,
        sampling=SamplingConfig(temperature=0.0),
        eot_id=0,  # the models' eos_token_id: a row that writes it ends, in both
    )
    with torch.no_grad():
        theirs = model.generate(torch.tensor(prompt), max_new_tokens=12, do_sample=False, pad_token_id=0)
    theirs = np.pad(theirs[:, 5:].numpy(), ((0, 0), (0, 12 - (theirs.shape[1] - 5))))  # ended rows padded with 0
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_export_loads_in_transformers_with_the_same_logits(saved, tmp_path):
    _, model, directory = saved
    config, params, _ = load_pretrained(str(directory))
    save_pretrained(config, params, tmp_path)
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor(tokens())
    with torch.no_grad():
        np.testing.assert_array_equal(exported(ids).logits.numpy(), model(ids).logits.numpy())


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=4, d_model=32),
        ModelConfig(
            vocab_size=VOCAB,
            block_size=32,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            d_model=32,
            position="rope",
            norm="rmsnorm",
            activation="swiglu",
            bias=False,
            tie_embeddings=False,
        ),
        ModelConfig(
            vocab_size=VOCAB,
            block_size=64,
            n_layer=1,
            n_head=4,
            n_kv_head=1,
            d_model=32,
            position="rope",
            norm="rmsnorm",
            activation="swiglu",
            bias=False,
            tie_embeddings=False,
            attention_window=8,
            rope_scaling=RopeScaling("llama3", 2.0, original_block_size=32),
        ),
        ModelConfig(
            vocab_size=VOCAB,
            block_size=64,
            n_layer=4,
            n_head=4,
            n_kv_head=2,
            d_model=32,
            head_dim=16,
            position="rope",
            norm="rmsnorm",
            norm_position="sandwich",
            activation="geglu",
            bias=False,
            qk_norm=True,
            scale_embeddings=True,
            attention_scale_dim=12,
            attention_window=8,
            global_every=2,
            rope_local_theta=100.0,
            rope_scaling=RopeScaling("linear", 4.0),
            logit_softcap=30.0,
        ),  # fmt: skip
    ],
    ids=["gpt2", "llama", "mistral-with-llama3-rope", "gemma3"],
)
def test_round_trip_through_a_hugging_face_directory_is_exact(config, tmp_path):
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(3))
    save_pretrained(config, params, tmp_path)
    loaded_config, loaded, _ = load_pretrained(str(tmp_path))
    assert loaded_config.replace(norm_eps=config.norm_eps) == config
    jax.tree.map(np.testing.assert_array_equal, loaded, jax.device_get(params))


def test_weights_that_do_not_fit_the_config_are_a_clear_error(tmp_path):
    reference_model("gpt2").save_pretrained(tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf_config | {"n_inner": 100}))
    with pytest.raises(
        UserError, match=r"weight block_0/mlp/down/kernel has shape \(128, 32\), but config.json implies \(100, 32\)"
    ):
        load_pretrained(str(tmp_path))


def test_a_model_without_a_hugging_face_twin_is_refused(tmp_path):
    config = ModelConfig(vocab_size=VOCAB, block_size=32, n_layer=1, n_head=4, d_model=32, position="alibi")
    with pytest.raises(UserError, match="neither GPT-2 .* nor Llama"):  # refused before any weight is read
        save_pretrained(config, jax.eval_shape(partial(init_params, config), jax.random.key(0)), tmp_path)


def rewrite_weights(directory, edit) -> None:
    """The folder's model.safetensors with `edit(weights) -> weights` applied, as a checkpoint
    written by another version of transformers would hold them."""
    weights = edit(load_file(directory / "model.safetensors"))
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})


def with_gpt2_buffers(layers: int, block_size: int):
    """GPT-2's weights as the Hub's file holds them: beside each layer's weights its causal mask
    (`h.N.attn.bias`, a lower-triangular table) and `h.N.attn.masked_bias` (-1e4), buffers that
    today's transformers neither writes nor needs."""

    def edit(weights):
        mask = np.tril(np.ones((block_size, block_size), np.float32))[None, None]
        for i in range(layers):
            weights[f"h.{i}.attn.bias"] = mask
            weights[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
        return weights

    return edit


def gpt2_hub_folder(directory, vocab_size: int = VOCAB, seed: int = 0):
    """A small random GPT-2 stored as openai-community/gpt2 is: GPT2Model's names, no head (it is
    tied), the mask buffers. Returns transformers' GPT2LMHeadModel read from it."""
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    with_visible_weights(transformers.GPT2Model(config), seed).save_pretrained(directory)
    rewrite_weights(directory, with_gpt2_buffers(2, 32))
    return transformers.GPT2LMHeadModel.from_pretrained(directory).eval()


@pytest.fixture
def gpt2_directory(tmp_path, gpt2_bpe):
    """A small random GPT-2 with the real 50,257-token vocabulary, stored as the Hub's gpt2 is."""
    gpt2_hub_folder(tmp_path / "gpt2", vocab_size=50257, seed=1)
    return tmp_path / "gpt2"


def test_attention_maps_of_hugging_face_weights(gpt2_directory, tmp_path, capsys):
    from jaxgpt.commands import attention_maps

    out = tmp_path / "maps.png"
    attention_maps.main(["--init_from", str(gpt2_directory), "--prompt", "Hello world", "--out", str(out)])
    assert f"({gpt2_directory}, 2 tokens, 2 layer(s) x 4 heads)" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def finetune_config(directory, **model):
    from conftest import small_run_config

    config = small_run_config(steps=2, warmup_steps=1, lr=1e-9, min_lr=0.0, eval_batches=1, checkpoint_every=2)
    config.model.update(dict(n_layer=2, n_head=4, d_model=32, block_size=32) | model)
    config.data.tokenizer = "gpt2"
    config.train.init_from = str(directory)
    return config


def test_fine_tuning_starts_from_the_pretrained_weights(gpt2_directory, tmp_path):
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.job.trainer import train_and_evaluate

    train_and_evaluate(finetune_config(gpt2_directory), tmp_path / "run", progress=False)
    _, trained, _, _ = load_latest(tmp_path / "run")
    _, pretrained, _ = load_pretrained(str(gpt2_directory))
    # Two Adam steps of size ~lr = 1e-9 move no weight by more than ~2e-9; a random init would
    # differ from the checkpoint by ~0.3.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), trained, pretrained)


def test_fine_tuning_a_llama_folder_reads_text_with_its_own_tokenizer(tmp_path):
    """train.init_from and data.tokenizer both a Llama folder (a byte-level BPE with its own
    end-of-text token, id 0, and an embedding padded to 320 rows past the tokenizer's count, as
    Qwen2's is): the corpus is prepared with that token between documents, the model takes the
    checkpoint's 320 rows, and training starts from its weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from jaxgpt.data.prepared import prepare
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.job.trainer import train_and_evaluate

    text = "the cat sat on the mat; the dog sat on the log. " * 40
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=290, special_tokens=["</s>"], initial_alphabet=alphabet)
    bpe.train_from_iterator([text], trainer)
    folder = tmp_path / "llama"
    config = transformers.LlamaConfig(**LLAMA | {"vocab_size": 320, "max_position_embeddings": 64})
    with_visible_weights(transformers.LlamaForCausalLM(config)).save_pretrained(folder)
    bpe.save(str(folder / "tokenizer.json"))
    for name in ("a", "b"):
        (tmp_path / "text").mkdir(exist_ok=True)
        (tmp_path / "text" / f"{name}.txt").write_text(text)

    run = finetune_config(folder, n_kv_head=2, mlp_hidden=64, activation="swiglu", norm="rmsnorm", norm_eps=1e-6)
    run.model.update(position="rope", rope_theta=500.0, bias=False, tie_embeddings=False)
    run.data.update(source=f"text:{tmp_path / 'text'}", tokenizer=str(folder), val_fraction=0.5)
    train_and_evaluate(run, tmp_path / "run", progress=False)
    trained_run, trained, tokenizer, _ = load_latest(tmp_path / "run")
    assert (tokenizer.name, tokenizer.eot_id, trained_run.model.vocab_size) == ("huggingface", 0, 320)
    dataset = prepare(trained_run.data, progress=False)
    tokens = np.concatenate([dataset.train, dataset.val])
    assert bpe.token_to_id("</s>") == 0 and (tokens == 0).sum() == len(dataset.documents) == 2
    _, pretrained, _ = load_pretrained(str(folder))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), trained, pretrained)


@pytest.mark.slow
def test_chat_fine_tuning_of_hugging_face_weights_with_adapters_grows_the_vocabulary(gpt2_directory, tmp_path):
    """GPT-2's weights fine-tuned on conversations with low-rank adapters: the chat template's
    four tokens are rows 50257 to 50260 of the embedding, each the mean of GPT-2's rows, and
    the base being frozen, after training every base weight is GPT-2's (the old rows) or that
    mean (the new ones), exactly; only the adapters moved. Slow: 15 s, a 50k-token head."""

    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.job.trainer import train_and_evaluate

    def conversation(a: int) -> str:
        turns = [{"role": "user", "content": f"{a} plus 1?"}, {"role": "assistant", "content": f"{a + 1}"}]
        return json.dumps({"messages": turns}) + "\n"

    (tmp_path / "chat.jsonl").write_text("".join(conversation(a) for a in range(60)))
    config = finetune_config(gpt2_directory, lora_rank=2)
    config.update_from_flattened_dict({"data.source": f"chat:{tmp_path / 'chat.jsonl'}", "train.lr": 1e-2})
    train_and_evaluate(config, tmp_path / "run", progress=False)
    run, trained, tokenizer, _ = load_latest(tmp_path / "run")
    _, pretrained, _ = load_pretrained(str(gpt2_directory))
    table, gpt2_table = trained["wte"]["embedding"], pretrained["wte"]["embedding"]
    assert run.model.vocab_size == 50261 and tokenizer.special_ids["<|end|>"] == 50260
    np.testing.assert_array_equal(table[:50257], gpt2_table)
    np.testing.assert_array_equal(table[50257:], np.broadcast_to(jnp.mean(gpt2_table, axis=0), (4, 32)))
    base = {k: v for k, v in trained.items() if k != "wte"}
    moved = [p for path, p in jax.tree_util.tree_leaves_with_path(base) if path[-1].key == "lora_b"]
    assert moved and all(float(jnp.abs(b).max()) > 0 for b in moved)

    def without_adapters(tree):
        if not isinstance(tree, dict):
            return tree
        return {k: without_adapters(v) for k, v in tree.items() if k not in ("lora_a", "lora_b")}

    gpt2_base = {k: v for k, v in pretrained.items() if k != "wte"}
    jax.tree.map(np.testing.assert_array_equal, without_adapters(base), gpt2_base)


def test_sample_py_writes_from_hugging_face_weights(gpt2_directory):
    from conftest import run_script

    result = run_script(
        "sample.py", f"--init_from={gpt2_directory}", "--prompt=def f", "--max_new_tokens=8", "--temperature=0"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("def f") and len(result.stdout.strip()) > len("def f")


def test_mixtral_in_transformers_5s_fused_layout_loads_with_the_same_logits(tmp_path):
    """transformers 5 holds each layer's experts as one gate_up_proj and one down_proj tensor
    (its state_dict, which some tools save as is); the loader reads that layout too."""
    model = reference_model("mixtral")
    model.save_pretrained(tmp_path)  # config.json, and the Hub's per-expert layout
    fused = {k: v.numpy() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused
    save_file(fused, tmp_path / "model.safetensors")
    config, params, _ = load_pretrained(str(tmp_path))
    ids = tokens()
    ours = np.asarray(GPT(config).apply({"params": params}, jnp.asarray(ids)))
    with torch.no_grad():
        theirs = model(torch.tensor(ids)).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-4


def test_mixtral_parity_depends_on_the_routing(tmp_path):
    """One expert per token instead of two gives other logits: the parity checks the routing."""
    reference_model("mixtral").save_pretrained(tmp_path)
    config, params, _ = load_pretrained(str(tmp_path))
    ids = jnp.asarray(tokens())
    logits = lambda c: np.asarray(GPT(c).apply({"params": params}, ids))  # noqa: E731
    one_expert = config.replace(moe=dataclasses.replace(config.moe, top_k=1))
    assert np.abs(logits(config) - logits(one_expert)).max() > 0.1


def test_a_mixtral_routing_variant_is_refused_naming_the_field(tmp_path):
    reference_model("mixtral").save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | {"router_jitter_noise": 0.1}))
    with pytest.raises(
        UserError, match=re.escape("config.json router_jitter_noise=0.1: jaxgpt's router adds no noise")
    ):
        load_pretrained(str(tmp_path))


MIXTURE = ModelConfig(
    vocab_size=VOCAB, block_size=32, n_layer=2, n_head=4, n_kv_head=2, d_model=32, mlp_hidden=48, position="rope",
    norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False,
    moe=MixtureOfExperts(experts=4, top_k=2, expert_hidden=48, aux_loss=0.02, z_loss=0.0),
)  # fmt: skip


def test_a_mixture_of_experts_round_trips_through_mixtral_exactly(tmp_path):
    params = jax.jit(init_params, static_argnums=0)(MIXTURE, jax.random.key(3))
    save_pretrained(MIXTURE, params, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["MixtralForCausalLM"]
    loaded_config, loaded, family = load_pretrained(str(tmp_path))
    assert family == "mixtral" and loaded_config == MIXTURE
    jax.tree.map(np.testing.assert_array_equal, loaded, jax.device_get(params))


@pytest.mark.parametrize(
    "moe, message",
    [
        ({"capacity_factor": 1.25}, "model.moe.capacity_factor=1.25 has no counterpart in Hugging Face's Mixtral"),
        ({"shared_experts": 1}, "model.moe.shared_experts=1 has no counterpart"),
        ({"renormalize": False}, "model.moe.renormalize=False has no counterpart"),
    ],
)
def test_a_mixture_mixtral_cannot_describe_is_refused_naming_the_setting(moe, message, tmp_path):
    config = MIXTURE.replace(moe=dataclasses.replace(MIXTURE.moe, **moe))
    with pytest.raises(UserError, match=re.escape(message)):  # refused before any weight is read: shapes do
        save_pretrained(config, jax.eval_shape(partial(init_params, config), jax.random.key(0)), tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


# ----------------------------------------------------------------------------- BERT


def bert_model(seed: int = 0, **changes):
    """A small random BertForMaskedLM: 2 post-norm layers of 4 heads, every weight visible."""
    config = transformers.BertConfig(
        **dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=32) | changes
    )  # fmt: skip
    return with_visible_weights(transformers.BertForMaskedLM(config), seed)


@pytest.fixture(scope="module")
def bert_directory(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    model = bert_model()
    model.save_pretrained(directory)
    vocab = [f"[unused{i}]" for i in range(VOCAB)]
    vocab[5] = "[MASK]"
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return model, directory


def bert_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def test_bert_logits_equal_transformers(bert_directory):
    """Every position's masked-token logits, segment embeddings and embedding LayerNorm, post-norm
    blocks, exact GELU and the prediction head included; the mask token read from vocab.txt."""
    model, directory = bert_directory
    config, params, family = load_pretrained(str(directory))
    assert family == "bert" and config.objective == "masked" and not config.causal and config.mask_token == 5
    ids = tokens()
    ours = np.asarray(jax.jit(GPT(config).apply)({"params": params}, jnp.asarray(ids)))
    theirs = bert_logits(model, ids)
    assert np.abs(theirs).max() > 1.0
    np.testing.assert_allclose(ours, theirs, atol=1e-4)  # two float32 implementations, logits of O(10)


def test_bert_parity_depends_on_the_segment_embedding_and_the_head(bert_directory):
    """The same weights without segment 0 folded into the positions, or without the
    prediction head's bias, give other logits by whole units: each part is read and used."""
    _, directory = bert_directory
    config, params, _ = load_pretrained(str(directory))
    ids = jnp.asarray(tokens())
    logits = lambda p: np.asarray(GPT(config).apply({"params": p}, ids))  # noqa: E731
    weights = transformers.BertForMaskedLM.from_pretrained(directory).state_dict()
    without_segment = params | {"wpe": {"embedding": weights["bert.embeddings.position_embeddings.weight"].numpy()}}
    without_bias = params | {"head_bias": np.zeros_like(params["head_bias"])}
    assert np.abs(logits(params) - logits(without_segment)).max() > 0.1
    assert np.abs(logits(params) - logits(without_bias)).max() > 0.1


def test_an_encoder_exports_as_bert_and_loads_in_transformers_with_the_same_logits(bert_directory, tmp_path):
    model, directory = bert_directory
    config, params, _ = load_pretrained(str(directory))
    save_pretrained(config, params, tmp_path)
    exported = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    ids = tokens()
    np.testing.assert_allclose(bert_logits(exported, ids), bert_logits(model, ids), atol=1e-5)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"hidden_act": "silu"}, "config.json hidden_act='silu'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ],
)
def test_an_unsupported_bert_variant_is_refused_naming_the_field(bert_directory, edit, message, tmp_path):
    _, directory = bert_directory
    (tmp_path / "config.json").write_text(json.dumps(json.loads((directory / "config.json").read_text()) | edit))
    with pytest.raises(UserError, match=re.escape(message)):
        load_pretrained(str(tmp_path))


def test_an_encoder_bert_cannot_describe_is_refused_naming_the_setting(tmp_path):
    config = ModelConfig(vocab_size=VOCAB, block_size=32, n_layer=1, n_head=4, d_model=32, causal=False,
                         objective="masked", position="rope")  # fmt: skip
    with pytest.raises(UserError, match="model.position='rope': a masked-token encoder exports as BertForMaskedLM"):
        save_pretrained(config, jax.eval_shape(partial(init_params, config), jax.random.key(0)), tmp_path)


def test_fill_reads_a_bert_directory_with_its_wordpiece_tokenizer(tmp_path, capsys):
    """fill --init_from on BERT weights beside a WordPiece tokenizer.json: [MASK] is the
    tokenizer's (id 4 here, read from tokenizer.json), and each blank gets candidates."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from jaxgpt.commands import fill

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyz")
    vocab = {w: i for i, w in enumerate(words + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + ["the", "."])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    bert_model().save_pretrained(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert load_pretrained(str(tmp_path))[0].mask_token == 4
    fill.main(["--init_from", str(tmp_path), "--prompt", "[CLS] the [MASK] . [SEP]", "--top", "2"])
    printed = capsys.readouterr().out
    assert printed.startswith(f"filled ({tmp_path}): ") and re.search(
        r"^blank 1 \(token 2\): '\S+' 0\.\d+", printed, re.M
    )


def bart_model(seed: int = 0, **changes):
    """A small random BartForConditionalGeneration: 2 encoder and 3 decoder post-norm layers of 4
    heads, every weight visible: drawn with std 0.3 (final_logits_bias too), the LayerNorms'
    scales about 1 and their biases small, so the logits vary from position to position rather
    than follow the norms' biases (with every norm weight drawn about 0, greedy decoding repeats one
    token whatever the source)."""
    config = transformers.BartConfig(
        **dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32) | changes
    )  # fmt: skip
    model = with_visible_weights(transformers.BartForConditionalGeneration(config), seed)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.3)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3) if name.endswith("weight") else p.normal_(0.0, 0.05)
    return model


BART_START = 2  # BART's decoder_start_token_id: its decoder reads </s> first


class Bart(NamedTuple):
    model: object  # transformers' BartForConditionalGeneration
    directory: Path
    config: ModelConfig
    params: dict
    apply: object  # the loaded model's forward pass, compiled once for the module's tests


@pytest.fixture(scope="module")
def bart(tmp_path_factory) -> Bart:
    directory = tmp_path_factory.mktemp("bart")
    model = bart_model()
    model.save_pretrained(directory)
    config, params, family = load_pretrained(str(directory))
    assert family == "bart"
    return Bart(model, directory, config, params, jax.jit(GPT(config).apply))


def bart_pair(seed: int = 0, rows: int = 3):
    """Sources of 10 tokens and decoder inputs of 7 starting at BART_START, none of them BART's
    pad (1) or start, which transformers treats specially."""
    rng = np.random.default_rng(seed)
    sources, targets = rng.integers(3, VOCAB, (rows, 10)), rng.integers(3, VOCAB, (rows, 7))
    targets[:, 0] = BART_START
    return sources, targets


def bart_logits(model, sources, targets, source_mask=None) -> np.ndarray:
    mask = None if source_mask is None else torch.tensor(source_mask)
    ids = dict(input_ids=torch.tensor(sources), attention_mask=mask, decoder_input_ids=torch.tensor(targets))
    with torch.no_grad():
        return model(**ids).logits.numpy()


def test_bart_logits_equal_transformers(bart):
    """Every decoder position's logits: the encoder, cross-attention, BART's offset position
    tables, embedding LayerNorms, post-norm blocks, exact GELU and final_logits_bias."""
    assert (bart.config.encoder_layers, bart.config.n_layer) == (2, 3) and bart.config.logits_bias
    sources, targets = bart_pair()
    ours = np.asarray(bart.apply({"params": bart.params}, jnp.asarray(targets), sources=jnp.asarray(sources)))
    theirs = bart_logits(bart.model, sources, targets)
    assert np.abs(theirs).max() > 1.0 and len(np.unique(theirs.argmax(-1))) > 3  # logits that really vary
    np.testing.assert_allclose(ours, theirs, atol=1e-4)  # two float32 implementations, logits of O(5)


def test_bart_logits_with_padded_sources_equal_transformers(bart):
    """Sources of unequal length, padded on the right: transformers' attention mask is jaxgpt's
    source segments (1 a source token, 0 padding), in the encoder's attention and the decoder's
    cross-attention, and the logits agree wherever the decoder reads."""
    sources, targets = bart_pair(seed=1)
    source_mask = (np.arange(10) < np.array([10, 6, 3])[:, None]).astype(np.int32)
    padded = np.where(source_mask, sources, 1)  # BART's pad token
    ours = bart.apply(
        {"params": bart.params},
        jnp.asarray(targets),
        segments=jnp.ones(targets.shape, jnp.int32),
        sources=jnp.asarray(padded),
        source_segments=jnp.asarray(source_mask),
    )
    theirs = bart_logits(bart.model, padded, targets, source_mask)
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)
    unpadded = bart_logits(bart.model, sources[1:2, :6], targets[1:2])  # the padding changed nothing
    np.testing.assert_allclose(theirs[1:2], unpadded, atol=1e-5)


def test_bart_greedy_generation_equals_transformers_generate(bart):
    """jaxgpt's KV-cache decoding (the sources encoded once) against transformers' generate,
    token for token, every row starting from BART's decoder start token."""
    config, params = bart.config, bart.params
    sources, _ = bart_pair(seed=2)
    start = np.full((len(sources), 1), BART_START)
    ours = generate(
        config, params, jnp.asarray(start), jax.random.key(0), max_new_tokens=12,
        sampling=SamplingConfig(temperature=0.0), memory=encode(config, params, jnp.asarray(sources)),
    )  # fmt: skip
    with torch.no_grad():
        theirs = bart.model.generate(
            input_ids=torch.tensor(sources), decoder_input_ids=torch.tensor(start), max_new_tokens=12,
            min_new_tokens=12, do_sample=False, num_beams=1, forced_eos_token_id=None,
        )  # fmt: skip
    assert len({tuple(row) for row in np.asarray(ours).tolist()}) == len(sources)  # each answer its source's
    np.testing.assert_array_equal(np.asarray(ours), theirs[:, 1:].numpy())


def test_bart_parity_depends_on_the_position_offset_and_the_logits_bias(bart):
    """The same weights read from row 0 of the position tables (BART reads row position + 2),
    or without final_logits_bias, give other logits by whole units: each part is read and used."""
    sources, targets = (jnp.asarray(a) for a in bart_pair())
    logits = lambda p: np.asarray(bart.apply({"params": p}, targets, sources=sources))  # noqa: E731
    weights = transformers.BartForConditionalGeneration.from_pretrained(bart.directory).state_dict()
    table = weights["model.decoder.embed_positions.weight"].numpy()[: bart.config.block_size]
    unshifted = bart.params | {"wpe": {"embedding": table}}
    without_bias = bart.params | {"head_bias": np.zeros_like(bart.params["head_bias"])}
    assert np.abs(logits(bart.params) - logits(unshifted)).max() > 0.1
    assert np.abs(logits(bart.params) - logits(without_bias)).max() > 0.1


def test_an_encoder_decoder_exports_as_bart_and_loads_in_transformers_with_the_same_logits(bart, tmp_path):
    save_pretrained(bart.config, bart.params, tmp_path, {"decoder_start_token_id": BART_START})
    exported = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert exported.generation_config.decoder_start_token_id == BART_START
    sources, targets = bart_pair()
    np.testing.assert_array_equal(bart_logits(exported, sources, targets), bart_logits(bart.model, sources, targets))


def test_a_jaxgpt_encoder_decoder_round_trips_through_bart_exactly(tmp_path):
    config = ModelConfig(
        vocab_size=VOCAB, block_size=32, n_layer=2, encoder_layers=1, n_head=4, d_model=32, norm_position="post",
        activation="gelu_exact", embedding_norm=True, logits_bias=True,
    )  # fmt: skip
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(3))
    save_pretrained(config, params, tmp_path)
    loaded_config, loaded, family = load_pretrained(str(tmp_path))
    assert family == "bart" and loaded_config == config
    jax.tree.map(np.testing.assert_array_equal, loaded, jax.device_get(params))


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"tie_word_embeddings": False}, "tie_word_embeddings=false"),
        ({"decoder_ffn_dim": 48}, "encoder_ffn_dim=64 but decoder_ffn_dim=48"),
        ({"activation_function": "silu"}, "activation_function='silu'"),
    ],
)
def test_an_unsupported_bart_variant_is_refused_naming_the_field(bart, edit, message, tmp_path):
    saved = json.loads((bart.directory / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(saved | edit))
    with pytest.raises(UserError, match=re.escape(message)):
        load_pretrained(str(tmp_path))


def test_an_encoder_decoder_bart_cannot_describe_is_refused_naming_the_setting(tmp_path):
    config = ModelConfig(vocab_size=VOCAB, block_size=32, n_layer=1, encoder_layers=1, n_head=4, d_model=32)
    with pytest.raises(UserError, match=r"model.norm_position='pre': an encoder–decoder exports as Bart"):
        save_pretrained(config, {}, tmp_path)  # refused before its weights are read
    assert not (tmp_path / "model.safetensors").exists()


def test_the_logit_lens_of_a_head_with_a_bias_per_token_reads_out_every_layer(bert_directory):
    """BERT's head (its bias per token a parameter of its own) read after every block: the last
    readout is the model's logits (the head's parameters are made once however often it reads)."""
    from jaxgpt.lab.capture import capture

    _, directory = bert_directory
    config, params, _ = load_pretrained(str(directory))
    captured = capture(config, params, tokens())
    assert captured.logit_lens.shape[0] == config.n_layer + 1
    np.testing.assert_allclose(captured.logit_lens[-1], captured.logits, atol=1e-5)


def bart_with_a_tokenizer(bart, directory):
    """The BART fixture's folder with a tokenizer.json of its 64 ids: BART's <s>, <pad> and </s>
    at 0, 1 and 2 (config.json's bos, pad and eos), then words w3 ... w63."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(bart.directory, directory)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<s>", "<pad>", "</s>"])
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.mark.slow
def test_the_commands_answer_a_source_with_barts_weights_as_transformers_does(bart, tmp_path, capsys):
    """sample --init_from a BART folder: the source framed by <s> and </s>, the decoder started
    from decoder_start_token_id, the greedy answer ended by </s> — transformers' generate's
    tokens; attention-maps draws its cross-attention and activations names its encoder's sites.
    Slow: 9 s on a Zen 5, three commands' compiles."""
    from jaxgpt.commands import activations, attention_maps, sample

    folder = str(bart_with_a_tokenizer(bart, tmp_path / "bart"))
    source = "w7 w19 w3 w40 w22 w9"
    sample.main(["--init_from", folder, "--prompt", source, "--temperature", "0", "--max_new_tokens", "12"])
    written = capsys.readouterr().out
    ids = [0] + [int(word[1:]) for word in source.split()] + [2]
    with torch.no_grad():
        theirs = bart.model.generate(
            input_ids=torch.tensor([ids]), decoder_start_token_id=2, max_new_tokens=12, do_sample=False, num_beams=1,
            forced_eos_token_id=None,
        )[0, 1:].tolist()  # fmt: skip
    answer = theirs[: theirs.index(2)] if 2 in theirs else theirs
    assert len(answer) > 2 and written == f"{source}\t{' '.join(f'w{i}' for i in answer)}\n"
    attention_maps.main(["--init_from", folder, "--prompt", source, "--out", str(tmp_path / "maps.png")])
    assert "(cross-attention: 3 decoder layer(s) x 4 heads)" in capsys.readouterr().out
    assert (tmp_path / "maps_encoder.png").is_file() and (tmp_path / "maps_decoder.png").is_file()
    activations.main(["--init_from", folder, "--prompt", source])
    assert "encoder.blocks.1.attn.hook_pattern" in capsys.readouterr().out


def test_the_commands_that_read_a_decoder_alone_refuse_barts_weights_in_one_line(bart, tmp_path):
    from jaxgpt.commands import logit_lens

    folder = str(bart_with_a_tokenizer(bart, tmp_path / "bart"))
    with pytest.raises(SystemExit) as exited:
        logit_lens.main(["--init_from", folder, "--prompt", "w3 w4"])
    assert exited.value.code == 2


FOLDERS = {  # a family's small model, as test_the_new_families_folders_run_every_lab_command_and_fine_tune saves it
    "qwen3": lambda: transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**LLAMA | {"vocab_size": 320, "max_position_embeddings": 64}, head_dim=16)
    ),
    "gemma3": lambda: transformers.Gemma3ForCausalLM(
        transformers.Gemma3TextConfig(**GEMMA3 | {"vocab_size": 320, "max_position_embeddings": 64})
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FOLDERS))
def test_the_new_families_folders_run_every_lab_command_and_fine_tune(family, tmp_path, capsys):
    """Qwen3 (per-head query and key norms, heads 16 wide over a 32-wide stream) and Gemma 3 (its
    four norms a block, GeGLU, windowed and global layers) beside a byte-level BPE tokenizer.json:
    activations lists TransformerLens's names with the heads' own width (hook_q: 4 heads x 16),
    logit-lens, attention-maps and patch run on it, and train.init_from fine-tunes it from its own
    weights (two steps at lr 1e-9 leave them within 1e-6), its architecture kept. About 35 s a
    family on 2 cores."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from jaxgpt.commands import activations, attention_maps, logit_lens, patch
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.job.trainer import train_and_evaluate

    text = "the cat sat on the mat; the dog sat on the log. " * 40
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=290, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([text], trainer)
    folder = tmp_path / family
    with_visible_weights(FOLDERS[family]()).save_pretrained(folder)
    bpe.save(str(folder / "tokenizer.json"))
    source = ["--init_from", str(folder)]
    activations.main([*source, "--prompt", "the cat sat"])
    listed = capsys.readouterr().out
    assert re.search(r"blocks\.0\.attn\.hook_q\s+\(1, \d+, 4, 16\)", listed), listed
    logit_lens.main([*source, "--prompt", "the cat sat on the"])
    assert "layer" in capsys.readouterr().out
    attention_maps.main([*source, "--prompt", "the cat sat", "--out", str(tmp_path / "maps.png")])
    assert (tmp_path / "maps.png").stat().st_size > 0
    patch.main([*source, "--clean", "the cat sat on the", "--corrupted", "the dog sat on the", "--answer", " mat",
                "--wrong", " log", "--out", str(tmp_path / "patching")])  # fmt: skip
    assert (tmp_path / "patching" / "patching.json").exists()
    (tmp_path / "text").mkdir()
    for name in ("a", "b"):
        (tmp_path / "text" / f"{name}.txt").write_text(text)
    run = finetune_config(folder)
    run.data.update(source=f"text:{tmp_path / 'text'}", tokenizer=str(folder), val_fraction=0.5)
    train_and_evaluate(run, tmp_path / "run", progress=False)
    trained_run, trained, _, _ = load_latest(tmp_path / "run")
    imported, pretrained, _ = load_pretrained(str(folder))
    assert trained_run.model == imported.replace(block_size=trained_run.model.block_size)
    assert (trained_run.model.qk_norm, trained_run.model.head_dim) == (True, 16)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), trained, pretrained)
