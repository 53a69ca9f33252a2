"""Layers as Hugging Face checkpoints store them and as jaxgpt does, both ways: a torch
`nn.Linear` is (out, in) where a flax kernel is (in, out), with multi-head projections split by
head; LayerNorm's two weights; the activation names of config.json files."""

from __future__ import annotations

import numpy as np

from jaxgpt.config import ModelConfig

# config.json's hidden_act / activation_function -> jaxgpt's activation, and back
ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
ACTIVATION_NAMES = {ours: theirs for theirs, ours in ACTIVATIONS.items() if theirs != "gelu_pytorch_tanh"}


def layer_norm(w: dict, name: str) -> dict:
    """A LayerNorm's two weights (the original BERT's gamma and beta are renamed before: convert.py)."""
    return {"scale": w[f"{name}.weight"], "bias": w[f"{name}.bias"]}


def dense(w: dict, name: str, shape: tuple[int, ...] | None = None) -> dict:
    """A torch Linear as a flax kernel (in, out), reshaped to `shape` with its bias to match."""
    kernel, bias = w[f"{name}.weight"].T, w[f"{name}.bias"]
    if shape is None:
        return {"kernel": kernel, "bias": bias}
    return {"kernel": kernel.reshape(shape), "bias": bias.reshape(shape[1:])}


def multi_head(c: ModelConfig, w: dict, query: str, key: str, value: str, out: str) -> dict:
    """Separate torch query, key and value Linears (multi-head, with biases) and the output
    Linear, as a jaxgpt self-attention layer's qkv and out."""
    H, hd, D = c.n_head, c.head_dim, c.d_model
    q, k, v = (dense(w, name, (D, H, 1, hd)) for name in (query, key, value))
    return {
        "qkv": {name: np.concatenate([q[name], k[name], v[name]], axis=-2) for name in ("kernel", "bias")},
        "out": output(c, w, out),
    }


def output(c: ModelConfig, w: dict, name: str) -> dict:
    """An attention layer's output Linear as jaxgpt's out (heads, 1, head_dim, d_model)."""
    out = dense(w, name)
    return {"kernel": out["kernel"].reshape(c.n_head, 1, c.head_dim, c.d_model), "bias": out["bias"]}


def linear(p: dict, name: str, d_in: int | None = None) -> dict:
    """A flax kernel and its bias as a torch Linear's weight (out, in) and bias: a kernel of
    (in..., out), or given `d_in` one of (d_in, out...)."""
    kernel = p["kernel"].reshape(d_in, -1) if d_in else p["kernel"].reshape(-1, p["kernel"].shape[-1])
    return {f"{name}.weight": kernel.T, f"{name}.bias": p["bias"].reshape(-1)}


def layer_norm_weights(p: dict, name: str) -> dict:
    return {f"{name}.weight": p["scale"], f"{name}.bias": p["bias"]}


def multi_head_weights(c: ModelConfig, attn: dict, query: str, key: str, value: str, out: str) -> dict:
    """The inverse of `multi_head`: a jaxgpt self-attention layer as torch Linears."""
    D, qkv = c.d_model, attn["qkv"]  # kernel (D, H, 3, hd), bias (H, 3, hd)
    w = {}
    for j, name in enumerate((query, key, value)):
        w[f"{name}.weight"] = qkv["kernel"][:, :, j].reshape(D, D).T
        w[f"{name}.bias"] = qkv["bias"][:, j].reshape(D)
    return w | linear(attn["out"], out)
