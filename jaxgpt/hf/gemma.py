"""Gemma3ForCausalLM (model_type gemma3_text, as the 1B checkpoint stores it) and the text model
inside Gemma3ForConditionalGeneration (model_type gemma3: the 4B and larger checkpoints, whose
vision tower jaxgpt does not load).

Gemma 3 is Llama's attention (grouped queries, RoPE, each head's queries and keys normed as in
Qwen3) with these changes, each a jaxgpt switch:

  token embeddings times sqrt(d_model)          scale_embeddings
  a norm before and after each branch           norm_position="sandwich" (four a block)
  scores times query_pre_attn_scalar ** -0.5    attention_scale_dim
  a GELU-gated MLP (tanh GELU)                  activation="geglu"
  windowed layers, every sixth one global       attention_window, global_every
  the windowed layers' own RoPE base            rope_local_theta (rope_scaling: the global ones')

Its RMSNorms compute x * (1 + w) with w stored (zero at init); jaxgpt's compute x * scale, so
the weights are read as scale = 1 + w and written back as w = scale - 1, both exact in float32
(Sterbenz: 1 + w and scale - 1 lose nothing for scales in [0.5, 2], and elsewhere round once,
as transformers' own 1 + w does): the same products to the bit. Gemma 2's soft cap on the
attention scores has no jaxgpt counterpart, so Gemma 2 is not read.
"""

from __future__ import annotations

import re

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.hf import llama
from jaxgpt.hf.family import BaseModel, Family, read_sizes, untied_head, written_sizes

# transformers' Gemma3TextConfig defaults: the Hub's files leave out what equals them (the 4B's
# text_config names neither its heads nor its vocabulary)
DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6, "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}  # fmt: skip
SIZES = llama.SIZES
WINDOWED, GLOBAL = "sliding_attention", "full_attention"
NORMS = {  # each block's four norms, Gemma's names -> jaxgpt's
    "input_layernorm": "norm_1", "post_attention_layernorm": "norm_1_out",
    "pre_feedforward_layernorm": "norm_2", "post_feedforward_layernorm": "norm_2_out",
}  # fmt: skip


def read_config(hf: dict) -> ModelConfig:
    """Gemma3ForCausalLM's config.json (gemma3_text)."""
    hf = DEFAULTS | {k: v for k, v in hf.items() if v is not None}
    if hf.get("attn_logit_softcapping") is not None:
        raise UserError(
            "config.json attn_logit_softcapping is set (Gemma 2's cap on attention scores): jaxgpt's attention has "
            "no soft cap on its scores; convert a Gemma 3 model"
        )
    if hf.get("use_bidirectional_attention"):
        raise UserError("config.json use_bidirectional_attention=true (EmbeddingGemma): jaxgpt reads causal Gemma")
    if hf.get("hidden_activation", hf.get("hidden_act")) != "gelu_pytorch_tanh":
        raise UserError(
            f"config.json hidden_activation={hf.get('hidden_activation')!r}: jaxgpt's Gemma is GeGLU with the tanh "
            "GELU ('gelu_pytorch_tanh')"
        )
    if hf["attention_bias"]:
        raise UserError("config.json attention_bias=true: Gemma's projections have no biases in jaxgpt's reading")
    layers = local_and_global(hf)
    return ModelConfig(
        **read_sizes(hf, SIZES),
        n_kv_head=hf["num_key_value_heads"],
        head_dim=hf["head_dim"],
        mlp_hidden=hf["intermediate_size"],
        activation="geglu",
        norm="rmsnorm",
        norm_position="sandwich",
        norm_eps=hf["rms_norm_eps"],
        position="rope",
        attention_scale_dim=hf["query_pre_attn_scalar"],
        bias=False,
        qk_norm=True,
        scale_embeddings=True,
        tie_embeddings=hf["tie_word_embeddings"],
        logit_softcap=hf.get("final_logit_softcapping") or 0.0,
        **layers,
    )


def local_and_global(hf: dict) -> dict:
    """The windowed and global layers' pattern and RoPE as ModelConfig fields: `layer_types` (or
    the older sliding_window_pattern), with transformers 5's `rope_parameters` per layer type
    or the older rope_theta, rope_local_base_freq and rope_scaling (the global layers')."""
    n = hf["num_hidden_layers"]
    every = hf["sliding_window_pattern"]
    types = hf.get("layer_types") or [WINDOWED if (i + 1) % every else GLOBAL for i in range(n)]
    global_layers = [i for i, kind in enumerate(types) if kind == GLOBAL]
    every = global_layers[0] + 1 if global_layers else 0
    if len(types) != n or types != [WINDOWED if every == 0 or (i + 1) % every else GLOBAL for i in range(n)]:
        raise UserError(
            f"config.json layer_types {types}: jaxgpt interleaves one global layer every k (model.global_every), "
            "and these are not so"
        )
    by_type = hf.get("rope_parameters") or {}
    if GLOBAL in by_type or WINDOWED in by_type:  # transformers 5
        global_rope = llama.read_rope(
            {"rope_parameters": by_type.get(GLOBAL) or {"rope_theta": DEFAULTS["rope_theta"]}}
        )
        local = by_type.get(WINDOWED) or {"rope_theta": DEFAULTS["rope_local_base_freq"]}
        local_rope = llama.read_rope({"rope_parameters": local})
    else:
        global_rope = llama.read_rope(hf)
        local_rope = (hf["rope_local_base_freq"], None)
    if every == 0:  # windowed throughout: their RoPE alone
        return dict(attention_window=hf["sliding_window"], rope_theta=local_rope[0], rope_scaling=local_rope[1])
    if every == 1:  # global throughout
        return dict(rope_theta=global_rope[0], rope_scaling=global_rope[1])
    if local_rope[1] is not None:
        raise UserError(
            "config.json scales the windowed layers' RoPE: jaxgpt's windowed layers between global ones use plain "
            "RoPE (model.rope_local_theta); convert a model whose sliding_attention rope_type is 'default'"
        )
    return dict(
        attention_window=hf["sliding_window"], global_every=every, rope_local_theta=float(local_rope[0]),
        rope_theta=global_rope[0], rope_scaling=global_rope[1],
    )  # fmt: skip


def read_multimodal_config(hf: dict) -> ModelConfig:
    """Gemma3ForConditionalGeneration's config.json (gemma3): the text model its text_config
    describes, the embedding tied unless the file says otherwise."""
    text = dict(hf.get("text_config") or {})
    text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", True))
    return read_config(text)


def plus_one(array):
    return 1.0 + array


def to_params(c: ModelConfig, w: dict) -> dict:
    def layer(i):
        p = f"model.layers.{i}."
        attn = llama.attention(c, w, p)
        for name in ("q_norm", "k_norm"):
            attn[name]["scale"] = plus_one(attn[name]["scale"])
        norms = {ours: {"scale": plus_one(w[p + theirs + ".weight"])} for theirs, ours in NORMS.items()}
        return llama.dense_mlp(c, w, p) | {"attn": attn} | norms

    params = {f"block_{i}": layer(i) for i in range(c.n_layer)} | llama.embedding_and_head(c, w)
    params["norm_f"]["scale"] = plus_one(params["norm_f"]["scale"])
    return params


def to_weights(c: ModelConfig, params: dict) -> dict:
    w = llama.embedding_and_head_weights(c, params)
    w["model.norm.weight"] = w["model.norm.weight"] - 1.0
    for i in range(c.n_layer):
        b, p = params[f"block_{i}"], f"model.layers.{i}."
        w |= llama.attention_weights(c, b["attn"], p) | llama.dense_mlp_weights(c, b, p)
        for name in ("q_norm", "k_norm"):
            w[p + f"self_attn.{name}.weight"] = w[p + f"self_attn.{name}.weight"] - 1.0
        w |= {p + theirs + ".weight": b[ours]["scale"] - 1.0 for theirs, ours in NORMS.items()}
    return w


def to_hf_config(c: ModelConfig) -> dict:
    """config.json of Gemma3ForCausalLM, as transformers 5 writes it (layer_types and
    rope_parameters per layer type)."""
    types = [WINDOWED if c.is_windowed_layer(i) else GLOBAL for i in range(c.n_layer)]
    global_rope = llama.rope_parameters(c)
    local_rope = (
        {"rope_type": "default", "rope_theta": c.rope_local_theta or c.rope_theta} if c.global_every else global_rope
    )
    return written_sizes(c, SIZES) | {
        "intermediate_size": c.mlp_hidden,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": c.norm_eps,
        "query_pre_attn_scalar": c.attention_scale_dim or c.head_dim,
        "sliding_window": c.attention_window or None,
        "layer_types": types,
        "rope_parameters": {GLOBAL: global_rope, WINDOWED: local_rope},
        "attention_bias": False,
        "tie_word_embeddings": c.tie_embeddings,
        "final_logit_softcapping": c.logit_softcap or None,
        "attn_logit_softcapping": None,
    }


def check_exportable(c: ModelConfig) -> None:
    """One line for a Gemma-recipe model (sandwich norms, GeGLU) Gemma3ForCausalLM cannot hold."""
    if not (c.qk_norm and c.scale_embeddings and c.position == "rope" and c.norm == "rmsnorm"):
        raise UserError(
            "a model with sandwich norms and GeGLU exports as Gemma 3, which also has qk_norm, scale_embeddings, "
            "RoPE and RMSNorm; turn those on, or choose another recipe"
        )
    if c.bias or c.qkv_bias:
        raise UserError("Gemma 3's projections have no biases; export a model with bias=False and qkv_bias=False")
    if c.global_every and c.rope_scaling is not None and c.rope_scaling.kind not in ("linear", "llama3", "longrope"):
        raise UserError(
            f"model.rope_scaling.kind={c.rope_scaling.kind!r} has no Hugging Face counterpart jaxgpt writes"
        )


# the multimodal checkpoints' text model, under the names of the task model jaxgpt reads
MULTIMODAL_NAMES = (
    (r"^model\.language_model\.", "model."),  # as transformers 5 saves Gemma3ForConditionalGeneration
    (r"^language_model\.model\.", "model."),  # as the Hub's 4B, 12B and 27B files store it
    (r"^language_model\.lm_head\.", "lm_head."),
)
NOT_TEXT = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector.")


def text_model_name(name: str) -> str:
    for pattern, replacement in MULTIMODAL_NAMES:
        name = re.sub(pattern, replacement, name)
    return name


TEXT_MODEL = BaseModel("Gemma3TextModel", "model.", ("lm_head.",), "language-model head", untied_head)
GEMMA3 = Family("Gemma3ForCausalLM", read_config, to_params, to_weights, to_hf_config, TEXT_MODEL)
GEMMA3_MULTIMODAL = Family(
    "Gemma3ForConditionalGeneration", read_multimodal_config, to_params, to_weights, to_hf_config,
    TEXT_MODEL._replace(renamed=text_model_name, not_loaded=NOT_TEXT),
)  # fmt: skip
