"""BertForMaskedLM: an encoder (model.objective=masked) of post-norm blocks without the causal
mask, learned positions, a LayerNorm over the embeddings and BERT's prediction head."""

from __future__ import annotations

import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.hf import layers
from jaxgpt.hf.family import BaseModel, Family, read_sizes, written_sizes

SIZES = {
    "vocab_size": "vocab_size", "block_size": "max_position_embeddings", "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads", "d_model": "hidden_size", "mlp_hidden": "intermediate_size",
}  # fmt: skip


def read_config(hf: dict) -> ModelConfig:
    """BertForMaskedLM: post-norm blocks without the causal mask, learned positions, a LayerNorm
    over the embeddings, and the prediction head's dense layer, activation, LayerNorm and bias.
    Its segment (token type) embeddings are folded into the position table: every token is
    segment 0, as in one-sentence masked-token prediction."""
    if hf.get("hidden_act", "gelu") not in layers.ACTIVATIONS:
        raise UserError(f"config.json hidden_act={hf['hidden_act']!r}: jaxgpt converts {', '.join(layers.ACTIVATIONS)}")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(
            f"config.json position_embedding_type={hf['position_embedding_type']!r}: jaxgpt converts BERT's "
            "'absolute' (learned) positions only"
        )
    return ModelConfig(
        **read_sizes(hf, SIZES),
        activation=layers.ACTIVATIONS[hf.get("hidden_act", "gelu")],
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


def to_params(c: ModelConfig, w: dict) -> dict:
    def layer(i):
        p = f"bert.encoder.layer.{i}."
        self_attention = (f"{p}attention.self.{n}" for n in ("query", "key", "value"))
        return {
            "attn": layers.multi_head(c, w, *self_attention, p + "attention.output.dense"),
            "mlp": {"up": layers.dense(w, p + "intermediate.dense"), "down": layers.dense(w, p + "output.dense")},
            "norm_1": layers.layer_norm(w, p + "attention.output.LayerNorm"),
            "norm_2": layers.layer_norm(w, p + "output.LayerNorm"),
        }

    segment_0 = w["bert.embeddings.token_type_embeddings.weight"][0]
    params = {f"block_{i}": layer(i) for i in range(c.n_layer)}
    params["wte"] = {"embedding": w["bert.embeddings.word_embeddings.weight"]}
    params["wpe"] = {"embedding": w["bert.embeddings.position_embeddings.weight"] + segment_0}
    params["norm_embeddings"] = layers.layer_norm(w, "bert.embeddings.LayerNorm")
    params["head_dense"] = layers.dense(w, "cls.predictions.transform.dense")
    params["head_norm"] = layers.layer_norm(w, "cls.predictions.transform.LayerNorm")
    bias = "cls.predictions.bias" if "cls.predictions.bias" in w else "cls.predictions.decoder.bias"
    params["head_bias"] = w[bias]
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": w["cls.predictions.decoder.weight"].T}
    return params


def to_weights(c: ModelConfig, params: dict) -> dict:
    w = {
        "bert.embeddings.word_embeddings.weight": params["wte"]["embedding"],
        "bert.embeddings.position_embeddings.weight": params["wpe"]["embedding"],
        "bert.embeddings.token_type_embeddings.weight": np.zeros((2, c.d_model), np.float32),  # 0 is in the table
        "cls.predictions.bias": params["head_bias"],
    }
    w |= layers.layer_norm_weights(params["norm_embeddings"], "bert.embeddings.LayerNorm")
    w |= layers.linear(params["head_dense"], "cls.predictions.transform.dense")
    w |= layers.layer_norm_weights(params["head_norm"], "cls.predictions.transform.LayerNorm")
    if not c.tie_embeddings:
        w["cls.predictions.decoder.weight"] = params["lm_head"]["kernel"].T
    for i in range(c.n_layer):
        b, p = params[f"block_{i}"], f"bert.encoder.layer.{i}."
        self_attention = (f"{p}attention.self.{n}" for n in ("query", "key", "value"))
        w |= layers.multi_head_weights(c, b["attn"], *self_attention, p + "attention.output.dense")
        w |= layers.linear(b["mlp"]["up"], p + "intermediate.dense")
        w |= layers.linear(b["mlp"]["down"], p + "output.dense")
        w |= layers.layer_norm_weights(b["norm_1"], p + "attention.output.LayerNorm")
        w |= layers.layer_norm_weights(b["norm_2"], p + "output.LayerNorm")
    return w


def to_hf_config(c: ModelConfig) -> dict:
    return written_sizes(c, SIZES) | {
        "hidden_act": layers.ACTIVATION_NAMES[c.activation],
        "type_vocab_size": 2,
        "layer_norm_eps": c.norm_eps,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": c.tie_embeddings,
        "pad_token_id": 0,
    }


def check_exportable(c: ModelConfig) -> None:
    """Nothing for an encoder BertForMaskedLM can describe; else one line naming what it lacks."""
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


def masked_token_head(c: ModelConfig) -> tuple[str, ...]:
    untied = () if c.tie_embeddings else ("cls.predictions.decoder.weight",)
    return ("cls.predictions.transform.dense.weight", *untied)


BASE = BaseModel("BertModel", "bert.", ("cls.",), "masked-token head", masked_token_head)
FAMILY = Family("BertForMaskedLM", read_config, to_params, to_weights, to_hf_config, BASE)
