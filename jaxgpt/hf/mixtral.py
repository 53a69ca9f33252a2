"""MixtralForCausalLM: Mistral with a mixture of experts in every block (dropless top-k
routing, renormalised: jaxgpt/model/moe.py). Its experts are read in either layout, the Hub's
(block_sparse_moe.experts.E.w1/w3/w2, one module per expert) or transformers 5's
(mlp.experts.gate_up_proj, gate and up stacked), and written in the Hub's, which both versions
of transformers load."""

from __future__ import annotations

from functools import partial

import numpy as np

from jaxgpt.config import MixtureOfExperts, ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.hf import llama
from jaxgpt.hf.family import Family


def experts(c: ModelConfig, w: dict, p: str) -> dict:
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


def read_config(hf: dict) -> ModelConfig:
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
    return llama.read_config(hf).replace(moe=moe)


def expert_weights(c: ModelConfig, b: dict, p: str) -> dict:
    """A block's router and experts in the Hub's layout."""
    moe, q = b["moe"], p + "block_sparse_moe."
    w = {q + "gate.weight": moe["router"]["kernel"].T}
    for e in range(c.moe.experts):
        w[f"{q}experts.{e}.w1.weight"] = moe["experts_up"][e, :, 0].T
        w[f"{q}experts.{e}.w3.weight"] = moe["experts_up"][e, :, 1].T
        w[f"{q}experts.{e}.w2.weight"] = moe["experts_down"][e].T
    return w


def to_hf_config(c: ModelConfig) -> dict:
    return llama.to_hf_config(c, family="mixtral") | {
        "num_local_experts": c.moe.experts,
        "num_experts_per_tok": c.moe.top_k,
        "router_aux_loss_coef": c.moe.aux_loss,
        "router_jitter_noise": 0.0,
    }


def check_exportable(c: ModelConfig) -> None:
    """Nothing for a mixture of experts Mixtral's config can describe; else one line naming the
    setting it has no counterpart for. (The rest is checked as for Llama and Mistral.)"""
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


FAMILY = Family(
    "MixtralForCausalLM",
    read_config,
    partial(llama.to_params, feed_forward=experts),
    partial(llama.to_weights, feed_forward_weights=expert_weights),
    to_hf_config,
    llama.base_model("MixtralModel"),
)
