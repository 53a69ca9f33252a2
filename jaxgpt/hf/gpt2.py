"""GPT2LMHeadModel. Its `Conv1D` stores kernels as (in, out), already the orientation of a
flax kernel; the query, key and value projections are one matrix, [q | k | v] each of all heads."""

from __future__ import annotations

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.hf import layers
from jaxgpt.hf.family import BaseModel, Family, read_sizes, untied_head, written_sizes

SIZES = {
    "vocab_size": "vocab_size",
    "block_size": "n_positions",
    "n_layer": "n_layer",
    "n_head": "n_head",
    "d_model": "n_embd",
}


def read_config(hf: dict) -> ModelConfig:
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise UserError(f"GPT-2 activation {hf['activation_function']!r} is not supported (jaxgpt's GELU is tanh)")
    return ModelConfig(
        **read_sizes(hf, SIZES),
        mlp_hidden=hf.get("n_inner") or 4 * hf["n_embd"],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="learned",
        tie_embeddings=hf.get("tie_word_embeddings", True),
    )


def to_params(c: ModelConfig, w: dict) -> dict:
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
            "norm_1": layers.layer_norm(w, p + "ln_1"),
            "norm_2": layers.layer_norm(w, p + "ln_2"),
        }

    params = {f"block_{i}": layer(i) for i in range(c.n_layer)}
    params["wte"] = {"embedding": w["transformer.wte.weight"]}
    params["wpe"] = {"embedding": w["transformer.wpe.weight"]}
    params["norm_f"] = layers.layer_norm(w, "transformer.ln_f")
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": w["lm_head.weight"].T}
    return params


def to_weights(c: ModelConfig, params: dict) -> dict:
    D = c.d_model
    w = {
        "transformer.wte.weight": params["wte"]["embedding"],
        "transformer.wpe.weight": params["wpe"]["embedding"],
    } | layers.layer_norm_weights(params["norm_f"], "transformer.ln_f")
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
        w |= layers.layer_norm_weights(b["norm_1"], p + "ln_1") | layers.layer_norm_weights(b["norm_2"], p + "ln_2")
    return w


def to_hf_config(c: ModelConfig) -> dict:
    return written_sizes(c, SIZES) | {
        "n_inner": c.mlp_hidden,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": c.norm_eps,
        "tie_word_embeddings": c.tie_embeddings,
    }


BASE = BaseModel("GPT2Model", "transformer.", ("lm_head.",), "language-model head", untied_head)
FAMILY = Family("GPT2LMHeadModel", read_config, to_params, to_weights, to_hf_config, BASE)
