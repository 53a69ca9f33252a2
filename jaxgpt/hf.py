"""Hugging Face checkpoints <-> jaxgpt: GPT2LMHeadModel, LlamaForCausalLM (Llama 3.1 and LongRoPE
scaling included), MistralForCausalLM (Llama with a sliding window), Qwen2ForCausalLM (Llama with
biases on the query, key and value projections), MixtralForCausalLM (Mistral with a mixture of
experts in every block: dropless top-k routing, renormalised, jaxgpt/moe.py), the encoder
BertForMaskedLM (model.objective=masked) and the encoder–decoder BartForConditionalGeneration
(model.encoder_layers: BART's post-norm blocks, learned positions read from row 2 of its tables,
embedding LayerNorms and final_logits_bias are all switches of jaxgpt's own model).

    config, params = load_pretrained("path/to/dir")     # or a Hub name such as "gpt2", online
    save_pretrained(config, params, "out/dir")          # safetensors + config.json for transformers

Weights are read and written with safetensors' numpy API, so converting needs neither torch nor
transformers (the parity tests use them as the reference). Two layout facts matter:
  - GPT-2's `Conv1D` stores kernels as (in, out), already the orientation of a flax kernel;
    torch `nn.Linear` (Llama) stores (out, in) and is transposed.
  - Mixtral's experts are read in either layout: the Hub's (block_sparse_moe.experts.E.w1/w3/w2,
    one module per expert) or transformers 5's (mlp.experts.gate_up_proj, gate and up stacked);
    they are written in the Hub's, which both versions of transformers load.
  - Llama's q/k projections are laid out for the "rotate half" RoPE (pairs i and i + head_dim/2),
    which is jaxgpt's layout too, so they load without permutation; query head h reads key/value
    head h // group in both.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

from jaxgpt.config import MixtureOfExperts, ModelConfig, RopeScaling
from jaxgpt.errors import UserError
from jaxgpt.model import init_params

# ----------------------------------------------------------------------------- GPT-2


def _gpt2_config(hf: dict) -> ModelConfig:
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise UserError(f"GPT-2 activation {hf['activation_function']!r} is not supported (jaxgpt's GELU is tanh)")
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf["n_positions"],
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        d_model=hf["n_embd"],
        mlp_hidden=hf.get("n_inner") or 4 * hf["n_embd"],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="learned",
        tie_embeddings=hf.get("tie_word_embeddings", True),
    )


def _gpt2_params(c: ModelConfig, w: dict) -> dict:
    H, hd, D = c.n_head, c.head_dim, c.d_model

    def layer(i):
        p = f"transformer.h.{i}."
        qkv = w[p + "attn.c_attn.weight"].reshape(D, 3, H, hd).transpose(0, 2, 1, 3)  # (D, H, q/k/v, hd)
        return {
            "attn": {
                "qkv": {"kernel": qkv, "bias": w[p + "attn.c_attn.bias"].reshape(3, H, hd).transpose(1, 0, 2)},
                "out": {"kernel": w[p + "attn.c_proj.weight"].reshape(H, 1, hd, D), "bias": w[p + "attn.c_proj.bias"]},
            },
            "mlp": {
                "up": {"kernel": w[p + "mlp.c_fc.weight"], "bias": w[p + "mlp.c_fc.bias"]},
                "down": {"kernel": w[p + "mlp.c_proj.weight"], "bias": w[p + "mlp.c_proj.bias"]},
            },
            "norm_1": {"scale": w[p + "ln_1.weight"], "bias": w[p + "ln_1.bias"]},
            "norm_2": {"scale": w[p + "ln_2.weight"], "bias": w[p + "ln_2.bias"]},
        }

    params = {f"block_{i}": layer(i) for i in range(c.n_layer)}
    params["wte"] = {"embedding": w["transformer.wte.weight"]}
    params["wpe"] = {"embedding": w["transformer.wpe.weight"]}
    params["norm_f"] = {"scale": w["transformer.ln_f.weight"], "bias": w["transformer.ln_f.bias"]}
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": w["lm_head.weight"].T}
    return params


def _gpt2_weights(c: ModelConfig, params: dict) -> dict:
    D = c.d_model
    w = {
        "transformer.wte.weight": params["wte"]["embedding"],
        "transformer.wpe.weight": params["wpe"]["embedding"],
        "transformer.ln_f.weight": params["norm_f"]["scale"],
        "transformer.ln_f.bias": params["norm_f"]["bias"],
    }
    if not c.tie_embeddings:
        w["lm_head.weight"] = params["lm_head"]["kernel"].T
    for i in range(c.n_layer):
        b, p = params[f"block_{i}"], f"transformer.h.{i}."
        w[p + "attn.c_attn.weight"] = b["attn"]["qkv"]["kernel"].transpose(0, 2, 1, 3).reshape(D, 3 * D)
        w[p + "attn.c_attn.bias"] = b["attn"]["qkv"]["bias"].transpose(1, 0, 2).reshape(3 * D)
        w[p + "attn.c_proj.weight"] = b["attn"]["out"]["kernel"].reshape(D, D)
        w[p + "attn.c_proj.bias"] = b["attn"]["out"]["bias"]
        w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = b["mlp"]["up"]["kernel"], b["mlp"]["up"]["bias"]
        w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = b["mlp"]["down"]["kernel"], b["mlp"]["down"]["bias"]
        for ours, theirs in (("norm_1", "ln_1"), ("norm_2", "ln_2")):
            w[p + theirs + ".weight"], w[p + theirs + ".bias"] = b[ours]["scale"], b[ours]["bias"]
    return w


def _gpt2_hf_config(c: ModelConfig) -> dict:
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_embd": c.d_model,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": c.mlp_hidden,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": c.norm_eps,
        "tie_word_embeddings": c.tie_embeddings,
    }


# ----------------------------------------------------------------------------- Llama


def _rope(hf: dict) -> tuple[float, RopeScaling | None]:
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
        return rope["rope_theta"], _longrope(hf, rope)
    raise UserError(
        f"config.json {field}.rope_type={kind!r} is not supported; jaxgpt converts 'default', 'linear', 'llama3' "
        "and 'longrope'"
    )


def _longrope(hf: dict, rope: dict) -> RopeScaling:
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


def _llama_config(hf: dict) -> ModelConfig:
    """Llama, and Mistral (Llama's recipe with a sliding attention window)."""
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"config.json hidden_act={hf['hidden_act']!r}: jaxgpt's Llama recipe is SwiGLU ('silu')")
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        raise UserError("config.json attention_bias and mlp_bias differ: jaxgpt's `bias` covers both or neither")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
        raise UserError(
            f"config.json head_dim={head_dim} x num_attention_heads={hf['num_attention_heads']} is not "
            f"hidden_size={hf['hidden_size']}: jaxgpt's heads split the residual width exactly"
        )
    rope_theta, rope_scaling = _rope(hf)
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf["max_position_embeddings"],
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        d_model=hf["hidden_size"],
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


def _llama_params(c: ModelConfig, w: dict) -> dict:
    K, G, hd, D = c.n_kv_head, c.group_size, c.head_dim, c.d_model

    def layer(i):
        p = f"model.layers.{i}."
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
        feed_forward = _mixtral_experts(c, w, p) if c.moe else _llama_mlp(w, p)
        return feed_forward | {
            "attn": {"qkv": qkv, "out": {"kernel": w[p + "self_attn.o_proj.weight"].T.reshape(K, G, hd, D)}},
            "norm_1": {"scale": w[p + "input_layernorm.weight"]},
            "norm_2": {"scale": w[p + "post_attention_layernorm.weight"]},
        }

    params = {f"block_{i}": layer(i) for i in range(c.n_layer)}
    params["wte"] = {"embedding": w["model.embed_tokens.weight"]}
    params["norm_f"] = {"scale": w["model.norm.weight"]}
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": w["lm_head.weight"].T}
    return params


def _llama_mlp(w: dict, p: str) -> dict:
    gate, up = w[p + "mlp.gate_proj.weight"].T, w[p + "mlp.up_proj.weight"].T
    return {
        "mlp": {"up": {"kernel": np.stack([gate, up], axis=1)}, "down": {"kernel": w[p + "mlp.down_proj.weight"].T}}
    }


def _mixtral_experts(c: ModelConfig, w: dict, p: str) -> dict:
    """A Mixtral block's router and experts as jaxgpt's MoE layer: experts_up (experts, d, 2,
    hidden) holds each expert's gate (w1) and up (w3) projections, experts_down its w2."""
    if p + "mlp.experts.gate_up_proj" in w:  # transformers 5: (experts, 2 hidden, d), gate first
        gate_up, hidden = w[p + "mlp.experts.gate_up_proj"], c.expert_hidden
        gate, up, down = gate_up[:, :hidden], gate_up[:, hidden:], w[p + "mlp.experts.down_proj"]
        router = w[p + "mlp.gate.weight"]
    else:  # the Hub's layout: one module per expert
        q = p + "block_sparse_moe."
        gate, up, down = (
            np.stack([w[f"{q}experts.{e}.{name}.weight"] for e in range(c.moe.experts)]) for name in ("w1", "w3", "w2")
        )
        router = w[q + "gate.weight"]
    return {
        "moe": {
            "router": {"kernel": router.T},  # (d, experts)
            "experts_up": np.stack([gate.transpose(0, 2, 1), up.transpose(0, 2, 1)], axis=2),
            "experts_down": down.transpose(0, 2, 1),  # (experts, hidden, d)
        }
    }


def _qwen2_config(hf: dict) -> ModelConfig:
    """Qwen2: Llama's recipe with biases on the query, key and value projections. Its
    config.json names a sliding window that applies only where use_sliding_window is set."""
    if hf.get("use_sliding_window"):
        raise UserError(
            "config.json use_sliding_window=true: Qwen2's window covers only the layers past max_window_layers, "
            "and jaxgpt's attention_window is the same in every layer; convert a model with it off"
        )
    return _llama_config(hf | {"sliding_window": None}).replace(qkv_bias=True)


def _mixtral_config(hf: dict) -> ModelConfig:
    """Mistral's attention with a dropless top-k mixture of experts in every block."""
    if hf.get("router_jitter_noise"):
        raise UserError(
            f"config.json router_jitter_noise={hf['router_jitter_noise']!r}: jaxgpt's router adds no noise; "
            "set it to 0 to convert"
        )
    moe = MixtureOfExperts(
        experts=hf["num_local_experts"],
        top_k=hf["num_experts_per_tok"],
        expert_hidden=hf["intermediate_size"],
        capacity_factor=0.0,  # Mixtral drops no token
        aux_loss=hf.get("router_aux_loss_coef", 0.02),
        z_loss=0.0,
    )
    return _llama_config(hf).replace(moe=moe)


def _llama_weights(c: ModelConfig, params: dict) -> dict:
    K, G, hd, D = c.n_kv_head, c.group_size, c.head_dim, c.d_model
    w = {"model.embed_tokens.weight": params["wte"]["embedding"], "model.norm.weight": params["norm_f"]["scale"]}
    if not c.tie_embeddings:
        w["lm_head.weight"] = params["lm_head"]["kernel"].T
    for i in range(c.n_layer):
        b, p = params[f"block_{i}"], f"model.layers.{i}."
        qkv = b["attn"]["qkv"]["kernel"]  # (D, K, G + 2, hd)
        w[p + "self_attn.q_proj.weight"] = qkv[:, :, :G].reshape(D, K * G * hd).T
        w[p + "self_attn.k_proj.weight"] = qkv[:, :, G].reshape(D, K * hd).T
        w[p + "self_attn.v_proj.weight"] = qkv[:, :, G + 1].reshape(D, K * hd).T
        w[p + "self_attn.o_proj.weight"] = b["attn"]["out"]["kernel"].reshape(K * G * hd, D).T
        if c.qkv_bias:
            bias = b["attn"]["qkv"]["bias"]  # (K, G + 2, hd)
            w[p + "self_attn.q_proj.bias"] = bias[:, :G].reshape(K * G * hd)
            w[p + "self_attn.k_proj.bias"] = bias[:, G].reshape(K * hd)
            w[p + "self_attn.v_proj.bias"] = bias[:, G + 1].reshape(K * hd)
        if c.moe:  # the Hub's Mixtral layout
            moe, q = b["moe"], p + "block_sparse_moe."
            w[q + "gate.weight"] = moe["router"]["kernel"].T
            for e in range(c.moe.experts):
                w[f"{q}experts.{e}.w1.weight"] = moe["experts_up"][e, :, 0].T
                w[f"{q}experts.{e}.w3.weight"] = moe["experts_up"][e, :, 1].T
                w[f"{q}experts.{e}.w2.weight"] = moe["experts_down"][e].T
        else:
            w[p + "mlp.gate_proj.weight"] = b["mlp"]["up"]["kernel"][:, 0].T
            w[p + "mlp.up_proj.weight"] = b["mlp"]["up"]["kernel"][:, 1].T
            w[p + "mlp.down_proj.weight"] = b["mlp"]["down"]["kernel"].T
        w[p + "input_layernorm.weight"] = b["norm_1"]["scale"]
        w[p + "post_attention_layernorm.weight"] = b["norm_2"]["scale"]
    return w


def _llama_hf_config(c: ModelConfig) -> dict:
    """config.json of the Llama-family model `c` is: Llama, Mistral (a sliding window), Qwen2
    (query, key and value biases) or Mixtral (experts)."""
    family = _family_of(c)
    config = {
        "model_type": family,
        "architectures": [ARCHITECTURES[family]],
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.expert_hidden,  # the MLP's width, or each expert's
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.block_size,
        "hidden_act": "silu",
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "rope_parameters": _rope_parameters(c),
        "attention_bias": c.bias,
        "mlp_bias": c.bias,
        "tie_word_embeddings": c.tie_embeddings,
    }
    if family in ("mistral", "mixtral"):
        config["sliding_window"] = c.attention_window or None
    if family == "qwen2":
        config |= {"use_sliding_window": False, "sliding_window": None}
    if c.moe:
        config |= {
            "num_local_experts": c.moe.experts,
            "num_experts_per_tok": c.moe.top_k,
            "router_aux_loss_coef": c.moe.aux_loss,
            "router_jitter_noise": 0.0,
        }
    return config


def _rope_parameters(c: ModelConfig) -> dict:
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


# ----------------------------------------------------------------------------- BERT

BERT_ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
HF_ACTIVATION_NAMES = {ours: theirs for theirs, ours in BERT_ACTIVATIONS.items() if theirs != "gelu_pytorch_tanh"}


def _bert_config(hf: dict) -> ModelConfig:
    """BertForMaskedLM: post-norm blocks without the causal mask, learned positions, a LayerNorm
    over the embeddings, and the prediction head's dense layer, activation, LayerNorm and bias.
    Its segment (token type) embeddings are folded into the position table: every token is
    segment 0, as in one-sentence masked-token prediction."""
    if hf.get("hidden_act", "gelu") not in BERT_ACTIVATIONS:
        raise UserError(f"config.json hidden_act={hf['hidden_act']!r}: jaxgpt converts {', '.join(BERT_ACTIVATIONS)}")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(
            f"config.json position_embedding_type={hf['position_embedding_type']!r}: jaxgpt converts BERT's "
            "'absolute' (learned) positions only"
        )
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf["max_position_embeddings"],
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        d_model=hf["hidden_size"],
        mlp_hidden=hf["intermediate_size"],
        activation=BERT_ACTIVATIONS[hf.get("hidden_act", "gelu")],
        norm_position="post",
        norm_eps=hf.get("layer_norm_eps", 1e-12),
        position="learned",
        tie_embeddings=hf.get("tie_word_embeddings", True),
        causal=False,
        objective="masked",
        embedding_norm=True,
        head_transform=True,
        mask_token=hf.get("_mask_token_id"),
    )


def _layer_norm(w: dict, name: str) -> dict:
    """A LayerNorm's two weights, under today's names or the original BERT's gamma and beta."""
    scale = w[f"{name}.weight"] if f"{name}.weight" in w else w[f"{name}.gamma"]
    return {"scale": scale, "bias": w[f"{name}.bias"] if f"{name}.bias" in w else w[f"{name}.beta"]}


def _dense(w: dict, name: str, shape: tuple[int, ...] | None = None) -> dict:
    """A torch Linear as a flax kernel (in, out), reshaped to `shape` with its bias to match."""
    kernel, bias = w[f"{name}.weight"].T, w[f"{name}.bias"]
    if shape is None:
        return {"kernel": kernel, "bias": bias}
    return {"kernel": kernel.reshape(shape), "bias": bias.reshape(shape[1:])}


def _multi_head(c: ModelConfig, w: dict, query: str, key: str, value: str, out: str) -> dict:
    """Separate torch query, key and value Linears (multi-head, with biases) and the output
    Linear, as a jaxgpt self-attention layer's qkv and out."""
    H, hd, D = c.n_head, c.head_dim, c.d_model
    q, k, v = (_dense(w, name, (D, H, 1, hd)) for name in (query, key, value))
    return {
        "qkv": {name: np.concatenate([q[name], k[name], v[name]], axis=-2) for name in ("kernel", "bias")},
        "out": _output(c, w, out),
    }


def _output(c: ModelConfig, w: dict, name: str) -> dict:
    """An attention layer's output Linear as jaxgpt's out (heads, 1, head_dim, d_model)."""
    out = _dense(w, name)
    return {"kernel": out["kernel"].reshape(c.n_head, 1, c.head_dim, c.d_model), "bias": out["bias"]}


def _linear(p: dict, name: str, d_in: int | None = None) -> dict:
    """A flax kernel and its bias as a torch Linear's weight (out, in) and bias: a kernel of
    (in..., out), or given `d_in` one of (d_in, out...)."""
    kernel = p["kernel"].reshape(d_in, -1) if d_in else p["kernel"].reshape(-1, p["kernel"].shape[-1])
    return {f"{name}.weight": kernel.T, f"{name}.bias": p["bias"].reshape(-1)}


def _layer_norm_weights(p: dict, name: str) -> dict:
    return {f"{name}.weight": p["scale"], f"{name}.bias": p["bias"]}


def _multi_head_weights(c: ModelConfig, attn: dict, query: str, key: str, value: str, out: str) -> dict:
    """The inverse of `_multi_head`: a jaxgpt self-attention layer as torch Linears."""
    D, qkv = c.d_model, attn["qkv"]  # kernel (D, H, 3, hd), bias (H, 3, hd)
    w = {}
    for j, name in enumerate((query, key, value)):
        w[f"{name}.weight"] = qkv["kernel"][:, :, j].reshape(D, D).T
        w[f"{name}.bias"] = qkv["bias"][:, j].reshape(D)
    return w | _linear(attn["out"], out)


def _bert_params(c: ModelConfig, w: dict) -> dict:
    def layer(i):
        p = f"bert.encoder.layer.{i}."
        self_attention = (f"{p}attention.self.{n}" for n in ("query", "key", "value"))
        return {
            "attn": _multi_head(c, w, *self_attention, p + "attention.output.dense"),
            "mlp": {"up": _dense(w, p + "intermediate.dense"), "down": _dense(w, p + "output.dense")},
            "norm_1": _layer_norm(w, p + "attention.output.LayerNorm"),
            "norm_2": _layer_norm(w, p + "output.LayerNorm"),
        }

    segment_0 = w["bert.embeddings.token_type_embeddings.weight"][0]
    params = {f"block_{i}": layer(i) for i in range(c.n_layer)}
    params["wte"] = {"embedding": w["bert.embeddings.word_embeddings.weight"]}
    params["wpe"] = {"embedding": w["bert.embeddings.position_embeddings.weight"] + segment_0}
    params["norm_embeddings"] = _layer_norm(w, "bert.embeddings.LayerNorm")
    params["head_dense"] = _dense(w, "cls.predictions.transform.dense")
    params["head_norm"] = _layer_norm(w, "cls.predictions.transform.LayerNorm")
    bias = "cls.predictions.bias" if "cls.predictions.bias" in w else "cls.predictions.decoder.bias"
    params["head_bias"] = w[bias]
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": w["cls.predictions.decoder.weight"].T}
    return params


def _bert_weights(c: ModelConfig, params: dict) -> dict:
    w = {
        "bert.embeddings.word_embeddings.weight": params["wte"]["embedding"],
        "bert.embeddings.position_embeddings.weight": params["wpe"]["embedding"],
        "bert.embeddings.token_type_embeddings.weight": np.zeros((2, c.d_model), np.float32),  # 0 is in the table
        "cls.predictions.bias": params["head_bias"],
    }
    w |= _layer_norm_weights(params["norm_embeddings"], "bert.embeddings.LayerNorm")
    w |= _linear(params["head_dense"], "cls.predictions.transform.dense")
    w |= _layer_norm_weights(params["head_norm"], "cls.predictions.transform.LayerNorm")
    if not c.tie_embeddings:
        w["cls.predictions.decoder.weight"] = params["lm_head"]["kernel"].T
    for i in range(c.n_layer):
        b, p = params[f"block_{i}"], f"bert.encoder.layer.{i}."
        self_attention = (f"{p}attention.self.{n}" for n in ("query", "key", "value"))
        w |= _multi_head_weights(c, b["attn"], *self_attention, p + "attention.output.dense")
        w |= _linear(b["mlp"]["up"], p + "intermediate.dense") | _linear(b["mlp"]["down"], p + "output.dense")
        w |= _layer_norm_weights(b["norm_1"], p + "attention.output.LayerNorm")
        w |= _layer_norm_weights(b["norm_2"], p + "output.LayerNorm")
    return w


def _bert_hf_config(c: ModelConfig) -> dict:
    return {
        "model_type": "bert",
        "architectures": ["BertForMaskedLM"],
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "intermediate_size": c.mlp_hidden,
        "hidden_act": HF_ACTIVATION_NAMES[c.activation],
        "max_position_embeddings": c.block_size,
        "type_vocab_size": 2,
        "layer_norm_eps": c.norm_eps,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": c.tie_embeddings,
        "pad_token_id": 0,
    }


def _bert_family(c: ModelConfig) -> str:
    """ "bert" for an encoder BertForMaskedLM can describe; else one line naming what it lacks."""
    recipe = dict(
        position="learned", norm="layernorm", norm_position="post", bias=True, causal=False, embedding_norm=True,
        head_transform=True, qkv_projections=True, scale_attention=True, residual=True, mlp=True,
    )  # fmt: skip
    differences = [f"{field}={getattr(c, field)!r}" for field, want in recipe.items() if getattr(c, field) != want]
    if c.activation not in ("gelu", "gelu_exact", "relu"):
        differences.append(f"activation={c.activation!r}")
    if c.n_kv_head != c.n_head:
        differences.append(f"n_kv_head={c.n_kv_head!r}")
    if differences:
        raise UserError(
            f"model.{differences[0]}: a masked-token encoder exports as BertForMaskedLM (learned positions, post-norm "
            "LayerNorm blocks with biases, a norm over the embeddings, head_transform, multi-head attention)"
        )
    return "bert"


# ----------------------------------------------------------------------------- BART

BART_POSITION_OFFSET = 2  # BartLearnedPositionalEmbedding reads row position + 2 of its table
BART_EMBEDDINGS = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def _bart_config(hf: dict) -> ModelConfig:
    """BartForConditionalGeneration (Lewis et al. 2020): an encoder–decoder of post-norm LayerNorm
    blocks with biases, learned positions (a table for each side), a LayerNorm over each side's
    embeddings, one token embedding for the encoder, the decoder and the head, and a bias per
    token on the logits (final_logits_bias). Dropout is the run's to choose, as for every family."""
    for encoder_side, decoder_side in (("encoder_attention_heads", "decoder_attention_heads"),
                                       ("encoder_ffn_dim", "decoder_ffn_dim")):  # fmt: skip
        if hf[encoder_side] != hf[decoder_side]:
            raise UserError(
                f"config.json {encoder_side}={hf[encoder_side]} but {decoder_side}={hf[decoder_side]}: jaxgpt's "
                "encoder and decoder blocks have the same heads and MLP width"
            )
    if hf.get("activation_function", "gelu") not in BERT_ACTIVATIONS:
        raise UserError(
            f"config.json activation_function={hf['activation_function']!r}: jaxgpt converts "
            f"{', '.join(BERT_ACTIVATIONS)}"
        )
    if not hf.get("tie_word_embeddings", True):
        raise UserError(
            "config.json tie_word_embeddings=false: jaxgpt's encoder–decoder has one token embedding for its encoder, "
            "decoder and head, as BART's own checkpoints do"
        )
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf["max_position_embeddings"],
        n_layer=hf["decoder_layers"],
        encoder_layers=hf["encoder_layers"],
        n_head=hf["decoder_attention_heads"],
        d_model=hf["d_model"],
        mlp_hidden=hf["decoder_ffn_dim"],
        activation=BERT_ACTIVATIONS[hf.get("activation_function", "gelu")],
        norm_position="post",
        position="learned",
        scale_embeddings=hf.get("scale_embedding", False),
        embedding_norm=True,
        logits_bias=True,
    )


def _bart_params(c: ModelConfig, w: dict) -> dict:
    D, H, hd = c.d_model, c.n_head, c.head_dim

    def block(side: str, i: int) -> dict:
        p = f"model.{side}.layers.{i}."
        b = {
            "attn": _multi_head(c, w, *(f"{p}self_attn.{n}_proj" for n in "qkv"), p + "self_attn.out_proj"),
            "mlp": {"up": _dense(w, p + "fc1"), "down": _dense(w, p + "fc2")},
            "norm_1": _layer_norm(w, p + "self_attn_layer_norm"),
            "norm_2": _layer_norm(w, p + "final_layer_norm"),
        }
        if side == "decoder":  # cross-attention: queries from the decoder, keys and values from the encoder
            q, k, v = (_dense(w, f"{p}encoder_attn.{n}_proj", (D, H, 1, hd)) for n in "qkv")
            kv = {name: np.concatenate([k[name], v[name]], axis=-2) for name in ("kernel", "bias")}
            b["cross"] = {"q": q, "kv": kv, "out": _output(c, w, p + "encoder_attn.out_proj")}
            b["norm_cross"] = _layer_norm(w, p + "encoder_attn_layer_norm")
        return b

    def embeddings(side: str) -> dict:
        table = w[f"model.{side}.embed_positions.weight"][BART_POSITION_OFFSET:]
        return {"wpe": {"embedding": table}, "norm_embeddings": _layer_norm(w, f"model.{side}.layernorm_embedding")}

    encoder = {f"block_{i}": block("encoder", i) for i in range(c.encoder_layers)} | embeddings("encoder")
    params = {f"block_{i}": block("decoder", i) for i in range(c.n_layer)} | embeddings("decoder")
    shared = next((name for name in BART_EMBEDDINGS if name in w), BART_EMBEDDINGS[0])
    return params | {
        "encoder": encoder,
        "wte": {"embedding": w[shared]},
        "head_bias": w["final_logits_bias"].reshape(-1),
    }


def _bart_weights(c: ModelConfig, params: dict) -> dict:
    def block(b: dict, p: str) -> dict:
        w = _multi_head_weights(c, b["attn"], *(f"{p}self_attn.{n}_proj" for n in "qkv"), p + "self_attn.out_proj")
        w |= _linear(b["mlp"]["up"], p + "fc1") | _linear(b["mlp"]["down"], p + "fc2")
        w |= _layer_norm_weights(b["norm_1"], p + "self_attn_layer_norm")
        w |= _layer_norm_weights(b["norm_2"], p + "final_layer_norm")
        if "cross" in b:
            kv, D = b["cross"]["kv"], c.d_model  # kernel (D, H, 2, hd), bias (H, 2, hd)
            for j, n in enumerate("kv"):
                one = {"kernel": kv["kernel"][:, :, j], "bias": kv["bias"][:, j]}
                w |= _linear(one, f"{p}encoder_attn.{n}_proj", d_in=D)
            w |= _linear(b["cross"]["q"], p + "encoder_attn.q_proj", d_in=D)
            w |= _linear(b["cross"]["out"], p + "encoder_attn.out_proj")
            w |= _layer_norm_weights(b["norm_cross"], p + "encoder_attn_layer_norm")
        return w

    unused_rows = np.zeros((BART_POSITION_OFFSET, c.d_model), np.float32)
    bias = params["head_bias"] if c.logits_bias else np.zeros(c.vocab_size, np.float32)
    w = {"model.shared.weight": params["wte"]["embedding"], "final_logits_bias": bias.reshape(1, -1)}
    for side, tree, count in (("encoder", params["encoder"], c.encoder_layers), ("decoder", params, c.n_layer)):
        w[f"model.{side}.embed_positions.weight"] = np.concatenate([unused_rows, tree["wpe"]["embedding"]])
        w |= _layer_norm_weights(tree["norm_embeddings"], f"model.{side}.layernorm_embedding")
        for i in range(count):
            w |= block(tree[f"block_{i}"], f"model.{side}.layers.{i}.")
    return w


def _bart_hf_config(c: ModelConfig) -> dict:
    # Not BART's default forced_eos_token_id=2, which forces token 2 last into every generation:
    # the end of a jaxgpt model's answers is its own (save_pretrained's special_tokens).
    return {
        "model_type": "bart",
        "architectures": ["BartForConditionalGeneration"],
        "is_encoder_decoder": True,
        "vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.encoder_layers,
        "decoder_layers": c.n_layer,
        "encoder_attention_heads": c.n_head,
        "decoder_attention_heads": c.n_head,
        "encoder_ffn_dim": c.mlp_hidden,
        "decoder_ffn_dim": c.mlp_hidden,
        "activation_function": HF_ACTIVATION_NAMES[c.activation],
        "max_position_embeddings": c.block_size,
        "scale_embedding": c.scale_embeddings,
        "tie_word_embeddings": True,
        "dropout": c.dropout,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "forced_eos_token_id": None,
    }


def _bart_family(c: ModelConfig) -> str:
    """ "bart" for an encoder–decoder BartForConditionalGeneration can describe; else one line
    naming what it lacks."""
    recipe = dict(
        position="learned", norm="layernorm", norm_position="post", bias=True, embedding_norm=True,
        head_transform=False, tie_embeddings=True, moe=None, n_kv_head=c.n_head,
    )  # fmt: skip
    differences = [f"{field}={getattr(c, field)!r}" for field, want in recipe.items() if getattr(c, field) != want]
    if c.activation not in HF_ACTIVATION_NAMES:
        differences.append(f"activation={c.activation!r}")
    bart_has = ("embedding_norm", "head_transform", "scale_embeddings")
    switched = [f for f in WORKBENCH_FIELDS if f not in bart_has and getattr(c, f) != getattr(ModelConfig, f)]
    differences += [f"{f}={getattr(c, f)!r}" for f in switched]
    if differences:
        raise UserError(
            f"model.{differences[0]}: an encoder–decoder exports as BartForConditionalGeneration (learned positions, "
            "post-norm LayerNorm blocks with biases, a norm over the embeddings, one tied embedding, multi-head "
            "attention, dense MLPs)"
        )
    return "bart"


# ----------------------------------------------------------------------------- families

FAMILIES = {
    "gpt2": (_gpt2_config, _gpt2_params, _gpt2_weights, _gpt2_hf_config),
    "llama": (_llama_config, _llama_params, _llama_weights, _llama_hf_config),
    "mistral": (_llama_config, _llama_params, _llama_weights, _llama_hf_config),  # same weights as Llama
    "qwen2": (_qwen2_config, _llama_params, _llama_weights, _llama_hf_config),  # Llama with q, k, v biases
    "mixtral": (_mixtral_config, _llama_params, _llama_weights, _llama_hf_config),  # Mistral with experts
    "bert": (_bert_config, _bert_params, _bert_weights, _bert_hf_config),  # an encoder
    "bart": (_bart_config, _bart_params, _bart_weights, _bart_hf_config),  # an encoder–decoder
}
ARCHITECTURES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "bert": "BertForMaskedLM",
    "bart": "BartForConditionalGeneration",
}


# Switches and ablations GPT-2 and Llama checkpoints do not have (zero_init_residual is only an init).
WORKBENCH_FIELDS = (
    "qk_norm", "logit_softcap", "attention_window", "scale_attention", "causal", "residual", "rope_pairing",
    "mlp", "uniform_attention", "qkv_projections", "scale_embeddings", "embedding_norm", "head_transform",
)  # fmt: skip


def _family_of(c: ModelConfig) -> str:
    """Which Hugging Face architecture a jaxgpt config is, if any."""
    if c.encoder_layers:
        return _bart_family(c)
    if c.objective == "masked":
        return _bert_family(c)
    if c.moe is not None:
        return _mixtral_family(c)
    switched = [f for f in WORKBENCH_FIELDS if getattr(c, f) != getattr(ModelConfig, f)]
    llama_recipe = (c.position, c.norm, c.activation, c.norm_position) == ("rope", "rmsnorm", "swiglu", "pre")
    if llama_recipe and switched == ["attention_window"] and not c.qkv_bias:
        switched = []  # Mistral: Llama with a sliding window
    if switched:
        raise UserError(
            f"model.{switched[0]}={getattr(c, switched[0])!r} has no counterpart in Hugging Face's GPT-2, Llama or "
            "Mistral; only a model with the workbench switches off can be exported"
        )
    if (c.position, c.norm, c.activation, c.norm_position, c.bias) == ("learned", "layernorm", "gelu", "pre", True):
        if c.n_kv_head == c.n_head:
            return "gpt2"
    if llama_recipe and not (c.rope_scaling is None or c.rope_scaling.kind in ("linear", "llama3", "longrope")):
        raise UserError(
            f"model.rope_scaling.kind={c.rope_scaling.kind!r} has no Hugging Face counterpart jaxgpt writes; "
            "export a model with rope_scaling 'linear', 'llama3', 'longrope' or none"
        )
    if llama_recipe and c.qkv_bias and not c.bias:
        return "qwen2"
    if llama_recipe and not c.qkv_bias:
        return "mistral" if c.attention_window else "llama"
    raise UserError(
        "this model is neither GPT-2 (learned positions, LayerNorm, GELU, biases, multi-head) nor Llama (RoPE, "
        "RMSNorm, SwiGLU): Hugging Face has no matching architecture to export it to"
    )


def _mixtral_family(c: ModelConfig) -> str:
    """ "mixtral" for a mixture of experts Mixtral's config can describe; else one line naming
    the setting it has no counterpart for."""
    m = c.moe
    differences = [
        ("capacity_factor", m.capacity_factor, 0.0, "Mixtral routes every token (dropless)"),
        ("every", m.every, 1, "Mixtral has experts in every block"),
        ("shared_experts", m.shared_experts, 0, "Mixtral has no shared expert"),
        ("renormalize", m.renormalize, True, "Mixtral renormalises the chosen experts' weights"),
    ]
    for field, value, wanted, why in differences:
        if value != wanted:
            raise UserError(f"model.moe.{field}={value!r} has no counterpart in Hugging Face's Mixtral ({why})")
    if (c.position, c.norm, c.activation, c.norm_position, c.bias, c.qkv_bias) != (
        "rope", "rmsnorm", "swiglu", "pre", False, False
    ):  # fmt: skip
        raise UserError(
            "a mixture of experts exports as Mixtral, which is the Llama recipe (RoPE, RMSNorm, SwiGLU experts, no "
            "biases); this model is not"
        )
    _family_of(c.replace(moe=None))  # the rest as for Llama/Mistral: refuses a workbench switch or rope scaling
    return "mixtral"


# ----------------------------------------------------------------------------- files


def _read_json(path: Path, missing: str) -> dict:
    """A JSON object of a Hugging Face folder; one line, naming the file, if it is absent (then
    `missing` says what to do), not JSON, or not an object."""
    if not path.is_file():
        raise UserError(f"{path.parent} has no {path.name}; {missing}")
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not JSON ({error}); the file is damaged or cut short: download it again") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} holds a JSON {type(value).__name__}, not an object; download it again")
    return value


def _weight_files(directory: Path) -> list[Path]:
    """The safetensors files holding a folder's weights (one, or the shards its index names,
    each checked to be there); [] when it has none."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if not index.exists():
        return []
    weight_map = _read_json(index, "").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{index} has no weight_map naming the shards; download it again")
    shards = [directory / name for name in sorted(set(weight_map.values()))]
    if absent := [shard.name for shard in shards if not shard.is_file()]:
        raise UserError(f"{index} names {', '.join(absent)}, which {directory} lacks; download the missing shards")
    return shards


def _safetensors(path: Path, *, header_only: bool = False):
    """A safetensors file's arrays by name (with header_only, its names alone, reading only the
    header); one line for a damaged or cut-short file."""
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    try:
        if header_only:
            with safe_open(path, "np") as opened:
                return list(opened.keys())
        return load_file(path)
    except (SafetensorError, OSError) as error:
        raise UserError(
            f"{path} cannot be read as safetensors ({error}); the file is damaged or cut short: download it again"
        ) from None


def check_folder(path_or_name: str) -> None:
    """A local Hugging Face folder checked before any work is done with it (a workdir made, a
    model compiled): its config.json describes a model jaxgpt converts, and its weight files'
    headers read. The weights themselves are read, and checked against the config, when loaded."""
    directory = Path(path_or_name).expanduser()
    if not directory.is_dir():
        return  # a Hub name: fetched (or refused, offline) when loaded
    pretrained_config(directory / "config.json")
    for path in _weight_files(directory):
        _safetensors(path, header_only=True)


def _read_weights(directory: Path) -> dict[str, np.ndarray]:
    if files := _weight_files(directory):
        weights = {}
        for path in files:
            weights |= _safetensors(path)
        return weights
    if (directory / "pytorch_model.bin").exists():
        try:
            import torch
        except ImportError:
            raise UserError(
                f"{directory} holds PyTorch weights: pip install -r requirements-hf.txt to read them"
            ) from None
        state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise UserError(f"{directory} has no model.safetensors, sharded safetensors or pytorch_model.bin")


def _local_directory(path_or_name: str) -> Path:
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors"]
        return Path(snapshot_download(path_or_name, allow_patterns=patterns))
    except Exception as error:  # offline, unknown name, gated repo
        raise UserError(
            f"{path_or_name!r} is not a local directory and could not be fetched from the Hub "
            f"({type(error).__name__}); download it where you have a network and pass its directory"
        ) from None


def pretrained_tokenizer(path_or_name: str, family: str):
    """The tokenizer that goes with a checkpoint: tiktoken's GPT-2 BPE for GPT-2 models, the
    directory's tokenizer.json (Hugging Face `tokenizers`) otherwise."""
    from jaxgpt.tokenizers import HuggingFaceTokenizer, make_tokenizer

    if family == "gpt2":
        return make_tokenizer("gpt2")
    return HuggingFaceTokenizer(_local_directory(path_or_name))


def pretrained_config(config_json: str | Path) -> tuple[ModelConfig, str]:
    """(config, family) that a Hugging Face config.json describes, without its weights: how to
    read a real model's config, and count its parameters with `jax.eval_shape`."""
    config_json = Path(config_json)
    hf = _read_json(config_json, "a Hugging Face model folder holds config.json beside its weights")
    family = hf.get("model_type")
    if family == "bert":
        hf["_mask_token_id"] = _token_id(config_json.parent, "[MASK]")
    if family not in FAMILIES:
        raise UserError(
            f"{config_json}: model_type {family!r} is not supported; jaxgpt converts gpt2, llama, mistral, qwen2, "
            "mixtral, bert and bart"
        )
    try:
        return FAMILIES[family][0](hf), family
    except UserError:
        raise
    except KeyError as missing:
        raise UserError(
            f"{config_json} has no {missing.args[0]!r}, which a {family} config.json has; the file is cut short or "
            "from another model: download it again"
        ) from None
    except (TypeError, ValueError) as error:
        raise UserError(f"{config_json}: a value of the wrong type for a {family} model ({error})") from None


def _token_id(directory: Path, token: str) -> int | None:
    """The id of a special token in the directory's tokenizer.json or vocab.txt, if either says."""
    if (directory / "tokenizer.json").exists():
        added = json.loads((directory / "tokenizer.json").read_text()).get("added_tokens", [])
        if found := [t["id"] for t in added if t.get("content") == token]:
            return found[0]
    if (directory / "vocab.txt").exists():
        lines = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
        if token in lines:
            return lines.index(token)
    return None


def load_pretrained(path_or_name: str) -> tuple[ModelConfig, dict, str]:
    """(config, params, family) from a Hugging Face directory (or Hub name, online)."""
    directory = _local_directory(path_or_name)
    config, family = pretrained_config(directory / "config.json")
    to_params = FAMILIES[family][1]
    weights = _ReadWeights({k: np.asarray(v, np.float32) for k, v in _read_weights(directory).items()})
    try:
        params = to_params(config, weights)
    except KeyError as missing:
        raise UserError(f"{directory}: weight {missing.args[0]} is missing for a {family} model") from None
    except ValueError as error:  # a reshape that does not fit
        raise UserError(f"{directory}: weights do not fit config.json ({error})") from None
    if unread := sorted(name for name in set(weights) - weights.read if not _left_by_design(name, config)):
        shown = ", ".join(unread[:4]) + (f" and {len(unread) - 4} more" if len(unread) > 4 else "")
        raise UserError(
            f"{directory}: {len(unread)} weights have no place in the {family} model its config.json describes "
            f"({config.n_layer} layers): {shown}; the config and the weights are of different models"
        )
    _check_shapes(config, params, directory)
    return config, params, family


class _ReadWeights(dict):
    """A folder's weights by name, remembering which names the conversion read."""

    def __init__(self, weights: dict):
        super().__init__(weights)
        self.read: set[str] = set()

    def __getitem__(self, name: str):
        self.read.add(name)
        return super().__getitem__(name)


# Weights checkpoints carry that no jaxgpt model holds: GPT-2's causal-mask buffers (older
# checkpoints), RoPE's frequency table, position-id buffers, BERT's pooler and next-sentence head
LEFT_BY_DESIGN = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq", "position_ids")
LEFT_BY_DESIGN_PREFIXES = ("bert.pooler.", "cls.seq_relationship.")


def _left_by_design(name: str, config: ModelConfig) -> bool:
    """Whether a weight no conversion reads is one jaxgpt leaves out on purpose (a buffer, BERT's
    heads for other tasks, a tied head's copy of the embedding), rather than one of a layer the
    config lacks."""
    tied_copy = config.tie_embeddings and name in ("lm_head.weight", "cls.predictions.decoder.weight", *BART_EMBEDDINGS)
    return tied_copy or name.endswith(LEFT_BY_DESIGN) or name.startswith(LEFT_BY_DESIGN_PREFIXES)


def _check_shapes(config: ModelConfig, params: dict, source) -> None:
    expected = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    got = jax.tree_util.tree_flatten_with_path(params)[0]
    want = dict(jax.tree_util.tree_flatten_with_path(expected)[0])
    if len(got) != len(want):
        raise UserError(f"{source}: {len(got)} weights for a model of {len(want)} parameters")
    for path, array in got:
        if path not in want or tuple(want[path].shape) != array.shape:
            name = "/".join(k.key for k in path)
            shape = tuple(want[path].shape) if path in want else None
            raise UserError(f"{source}: weight {name} has shape {array.shape}, but config.json implies {shape}")


def save_pretrained(
    config: ModelConfig, params: dict, directory: str | Path, special_tokens: dict | None = None
) -> Path:
    """Write a directory transformers loads: config.json and model.safetensors. `special_tokens`
    join config.json: an encoder–decoder trained on pairs starts and ends its answers at the
    pair separator, {"decoder_start_token_id": sep, "eos_token_id": sep}, for
    transformers' generate to do the same."""
    from safetensors.numpy import save_file

    family = _family_of(config)
    _, _, to_weights, to_hf_config = FAMILIES[family]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    numpy_params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    weights = {k: np.ascontiguousarray(v) for k, v in to_weights(config, numpy_params).items()}
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(to_hf_config(config) | (special_tokens or {}), indent=2))
    return directory
