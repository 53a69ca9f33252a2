"""LlamaForCausalLM (Llama 3.1's and LongRoPE's scaling included), MistralForCausalLM (Llama
with a sliding window), Qwen2ForCausalLM (Llama with biases on the query, key and value
projections) and Qwen3ForCausalLM (Llama with an RMSNorm over each head's queries and keys, and
heads of their own width). torch `nn.Linear` stores (out, in) and is transposed. Llama's q/k projections are
laid out for the "rotate half" RoPE (pairs i and i + head_dim/2), which is jaxgpt's layout too,
so they load without permutation; query head h reads key/value head h // group in both."""

from __future__ import annotations

from functools import partial

import numpy as np

from jaxgpt.config import ModelConfig, RopeScaling
from jaxgpt.errors import UserError
from jaxgpt.hf.family import BaseModel, Family, read_sizes, untied_head, written_sizes

SIZES = {
    "vocab_size": "vocab_size", "block_size": "max_position_embeddings", "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads", "d_model": "hidden_size",
}  # fmt: skip


def read_rope(hf: dict) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) from a Llama-family config.json: transformers 5 writes
    `rope_parameters`; older files (Llama 3.1's on the Hub) keep `rope_theta` beside a
    `rope_scaling` section, whose type is under "rope_type" or "type"."""
    field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    rope = {"rope_theta": hf.get("rope_theta", 10000.0)} | (hf.get(field) or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return rope["rope_theta"], None
    if kind == "linear":
        return rope["rope_theta"], RopeScaling("linear", rope["factor"])
    if kind == "llama3":
        return rope["rope_theta"], RopeScaling(
            "llama3",
            rope["factor"],
            original_block_size=rope["original_max_position_embeddings"],
            low_freq_factor=rope["low_freq_factor"],
            high_freq_factor=rope["high_freq_factor"],
        )
    if kind == "longrope":
        return rope["rope_theta"], read_longrope(hf, rope)
    raise UserError(
        f"config.json {field}.rope_type={kind!r} is not supported; jaxgpt converts 'default', 'linear', 'llama3' "
        "and 'longrope'"
    )


def read_longrope(hf: dict, rope: dict) -> RopeScaling:
    """LongRoPE as Phi-3 writes it: the original window beside the section or in it, and the
    stretch `factor` left out when it is max_position_embeddings / original window."""
    original = rope.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
    if not original:
        raise UserError("config.json longrope scaling has no original_max_position_embeddings; add the trained window")
    if rope.get("attention_factor") is not None:
        raise UserError(
            f"config.json longrope attention_factor={rope['attention_factor']!r}: jaxgpt derives it from the stretch "
            "(sqrt(1 + ln factor / ln original window)); remove it to convert"
        )
    return RopeScaling(
        "longrope",
        rope.get("factor") or hf["max_position_embeddings"] / original,
        original_block_size=original,
        long_factor=tuple(rope["long_factor"]),
        short_factor=tuple(rope["short_factor"]),
    )


def read_config(hf: dict) -> ModelConfig:
    """Llama, and Mistral (Llama's recipe with a sliding attention window)."""
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"config.json hidden_act={hf['hidden_act']!r}: jaxgpt's Llama recipe is SwiGLU ('silu')")
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        raise UserError("config.json attention_bias and mlp_bias differ: jaxgpt's `bias` covers both or neither")
    rope_theta, rope_scaling = read_rope(hf)
    return ModelConfig(
        **read_sizes(hf, SIZES),
        n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        mlp_hidden=hf["intermediate_size"],
        activation="swiglu",
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        position="rope",
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        attention_window=hf.get("sliding_window") or 0,  # Mistral: the query and window - 1 before it
        bias=hf.get("attention_bias", False),
        tie_embeddings=hf.get("tie_word_embeddings", False),
    )


def to_params(c: ModelConfig, w: dict, feed_forward=None) -> dict:
    """`feed_forward(c, w, prefix)`: a block's MLP (`dense_mlp`), or Mixtral's experts."""
    feed_forward = feed_forward or dense_mlp

    def layer(i):
        p = f"model.layers.{i}."
        return feed_forward(c, w, p) | {
            "attn": attention(c, w, p),
            "norm_1": {"scale": w[p + "input_layernorm.weight"]},
            "norm_2": {"scale": w[p + "post_attention_layernorm.weight"]},
        }

    return {f"block_{i}": layer(i) for i in range(c.n_layer)} | embedding_and_head(c, w)


def attention(c: ModelConfig, w: dict, p: str) -> dict:
    """The self-attention of the layer whose weights' names start with `p` (Gemma's too)."""
    K, G, hd, D = c.n_kv_head, c.group_size, c.head_dim, c.d_model
    q = w[p + "self_attn.q_proj.weight"].T.reshape(D, K, G, hd)  # query head h = k * G + g
    k = w[p + "self_attn.k_proj.weight"].T.reshape(D, K, 1, hd)
    v = w[p + "self_attn.v_proj.weight"].T.reshape(D, K, 1, hd)
    qkv = {"kernel": np.concatenate([q, k, v], axis=2)}
    if c.qkv_bias:  # Qwen2
        qkv["bias"] = np.concatenate(
            [
                w[p + "self_attn.q_proj.bias"].reshape(K, G, hd),
                w[p + "self_attn.k_proj.bias"].reshape(K, 1, hd),
                w[p + "self_attn.v_proj.bias"].reshape(K, 1, hd),
            ],
            axis=1,
        )
    attn = {"qkv": qkv, "out": {"kernel": w[p + "self_attn.o_proj.weight"].T.reshape(K, G, hd, D)}}
    if c.qk_norm:  # Qwen3, Gemma 3: an RMSNorm over each head's queries and keys
        attn |= {name: {"scale": w[p + f"self_attn.{name}.weight"]} for name in ("q_norm", "k_norm")}
    return attn


def embedding_and_head(c: ModelConfig, w: dict) -> dict:
    """The token embedding, the final norm and an untied head."""
    params = {"wte": {"embedding": w["model.embed_tokens.weight"]}, "norm_f": {"scale": w["model.norm.weight"]}}
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": w["lm_head.weight"].T}
    return params


def dense_mlp(c: ModelConfig, w: dict, p: str) -> dict:
    gate, up = w[p + "mlp.gate_proj.weight"].T, w[p + "mlp.up_proj.weight"].T
    return {
        "mlp": {"up": {"kernel": np.stack([gate, up], axis=1)}, "down": {"kernel": w[p + "mlp.down_proj.weight"].T}}
    }


def read_qwen2_config(hf: dict) -> ModelConfig:
    """Qwen2: Llama's recipe with biases on the query, key and value projections. Its
    config.json names a sliding window that applies only where use_sliding_window is set."""
    if hf.get("use_sliding_window"):
        raise UserError(
            "config.json use_sliding_window=true: Qwen2's window covers only the layers past max_window_layers, "
            "and jaxgpt's attention_window is the same in every layer; convert a model with it off"
        )
    return read_config(hf | {"sliding_window": None}).replace(qkv_bias=True)


def read_qwen3_config(hf: dict) -> ModelConfig:
    """Qwen3: Llama's recipe with an RMSNorm over each head's queries and keys before RoPE
    (jaxgpt's qk_norm), heads of their own width (head_dim), no biases; its sliding window, as
    Qwen2's, applies only where use_sliding_window is set."""
    return read_qwen2_config(hf).replace(qkv_bias=hf.get("attention_bias", False), qk_norm=True)


def to_weights(c: ModelConfig, params: dict, feed_forward_weights=None) -> dict:
    """`feed_forward_weights(c, block, prefix)`: a block's MLP (`dense_mlp_weights`), or Mixtral's experts."""
    feed_forward_weights = feed_forward_weights or dense_mlp_weights
    w = embedding_and_head_weights(c, params)
    for i in range(c.n_layer):
        b, p = params[f"block_{i}"], f"model.layers.{i}."
        w |= attention_weights(c, b["attn"], p) | feed_forward_weights(c, b, p)
        w[p + "input_layernorm.weight"] = b["norm_1"]["scale"]
        w[p + "post_attention_layernorm.weight"] = b["norm_2"]["scale"]
    return w


def attention_weights(c: ModelConfig, attn: dict, p: str) -> dict:
    """The inverse of `attention`."""
    K, G, hd, D = c.n_kv_head, c.group_size, c.head_dim, c.d_model
    qkv = attn["qkv"]["kernel"]  # (D, K, G + 2, hd)
    w = {
        p + "self_attn.q_proj.weight": qkv[:, :, :G].reshape(D, K * G * hd).T,
        p + "self_attn.k_proj.weight": qkv[:, :, G].reshape(D, K * hd).T,
        p + "self_attn.v_proj.weight": qkv[:, :, G + 1].reshape(D, K * hd).T,
        p + "self_attn.o_proj.weight": attn["out"]["kernel"].reshape(K * G * hd, D).T,
    }
    if c.qk_norm:
        for name in ("q_norm", "k_norm"):
            w[p + f"self_attn.{name}.weight"] = attn[name]["scale"]
    if c.qkv_bias:
        bias = attn["qkv"]["bias"]  # (K, G + 2, hd)
        w[p + "self_attn.q_proj.bias"] = bias[:, :G].reshape(K * G * hd)
        w[p + "self_attn.k_proj.bias"] = bias[:, G].reshape(K * hd)
        w[p + "self_attn.v_proj.bias"] = bias[:, G + 1].reshape(K * hd)
    return w


def embedding_and_head_weights(c: ModelConfig, params: dict) -> dict:
    """The inverse of `embedding_and_head`."""
    w = {"model.embed_tokens.weight": params["wte"]["embedding"], "model.norm.weight": params["norm_f"]["scale"]}
    if not c.tie_embeddings:
        w["lm_head.weight"] = params["lm_head"]["kernel"].T
    return w


def dense_mlp_weights(c: ModelConfig, b: dict, p: str) -> dict:
    return {
        p + "mlp.gate_proj.weight": b["mlp"]["up"]["kernel"][:, 0].T,
        p + "mlp.up_proj.weight": b["mlp"]["up"]["kernel"][:, 1].T,
        p + "mlp.down_proj.weight": b["mlp"]["down"]["kernel"].T,
    }


def to_hf_config(c: ModelConfig, family: str = "llama") -> dict:
    """config.json of the Llama-family model `c` is, as `family`: llama, mistral (a sliding
    window), qwen2 (query, key and value biases), qwen3 (each head's queries and keys normed) or
    mixtral (experts: jaxgpt/hf/mixtral.py)."""
    config = written_sizes(c, SIZES) | {
        "intermediate_size": c.expert_hidden,  # the MLP's width, or each expert's
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "rope_parameters": rope_parameters(c),
        "attention_bias": c.bias,
        "mlp_bias": c.bias,
        "tie_word_embeddings": c.tie_embeddings,
    }
    if family in ("mistral", "mixtral"):
        config["sliding_window"] = c.attention_window or None
    if family in ("qwen2", "qwen3"):
        config |= {"use_sliding_window": False, "sliding_window": None}
    return config


def rope_parameters(c: ModelConfig) -> dict:
    rope = {"rope_theta": c.rope_theta, "rope_type": "default"}
    if c.rope_scaling is not None:
        s = c.rope_scaling
        rope |= {"rope_type": s.kind, "factor": s.factor}
        if s.kind == "llama3":
            rope |= {
                "original_max_position_embeddings": s.original_block_size,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
            }
        if s.kind == "longrope":
            rope |= {
                "original_max_position_embeddings": s.original_block_size,
                "long_factor": list(s.long_factor),
                "short_factor": list(s.short_factor),
            }
    return rope


def base_model(name: str) -> BaseModel:
    """LlamaModel and its kin: `model.` in the task model, beside lm_head unless tied."""
    return BaseModel(name, "model.", ("lm_head.",), "language-model head", untied_head)


LLAMA = Family("LlamaForCausalLM", read_config, to_params, to_weights, to_hf_config, base_model("LlamaModel"))
MISTRAL = Family(
    "MistralForCausalLM", read_config, to_params, to_weights, partial(to_hf_config, family="mistral"),
    base_model("MistralModel"),
)  # fmt: skip
QWEN2 = Family(
    "Qwen2ForCausalLM", read_qwen2_config, to_params, to_weights, partial(to_hf_config, family="qwen2"),
    base_model("Qwen2Model"),
)  # fmt: skip
QWEN3 = Family(
    "Qwen3ForCausalLM", read_qwen3_config, to_params, to_weights, partial(to_hf_config, family="qwen3"),
    base_model("Qwen3Model"),
)  # fmt: skip
