"""Pruning that saves: attention heads taken out of the weights, not only masked.

`evaluate --prune F` masks heads to score the model without them; with `--out DIR` the heads
are cut out: every layer loses the same number, round(F x n_head), so the smaller model is
still one regular transformer (n_head fewer, head_dim kept) that every part of the engine
reads as it reads any other. Which heads go is chosen greedily over the whole model, each time
the head whose removal raises the loss least, among the layers that have not yet given their
share (Michel et al. 2019 prune globally and let layers differ; a regular shape is what keeps
the smaller model's step faster on any mesh and its export possible).

A head's parameters are its slices of the query/key/value projection, of the output
projection and, with model.attention_gate, of the gate: removing them computes exactly what
zeroing the head's output computes (the output projection's bias stays), so the pruned model's
loss is the masked model's to float rounding, which the command checks and prints.

DIR is a run folder holding weights alone (no optimizer state): `train.py
--config.train.init_from=DIR` fine-tunes it, sample/evaluate/the lab read it, and a resume of it
is refused in one line (jaxgpt/job/resume.py). This module cuts; the command writes the folder
(jaxgpt/commands/evaluate.py, `write_pruned_run`).
"""

from __future__ import annotations

import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError

# (module, parameter) of a layer's attention -> the axis its heads lie on (before a scanned
# layout's leading layer axis); with n_kv_head = n_head each head is its own key/value head
HEAD_AXES = {("qkv", "kernel"): 1, ("qkv", "bias"): 0, ("out", "kernel"): 0, ("gate", "kernel"): 1, ("gate", "bias"): 0}
SHARED = {"q_norm", "k_norm", "value_mix", "out"}  # parameters every head shares (the output's bias)


def refusal(model: ModelConfig) -> str | None:
    """Why heads cannot be cut out of `model`'s weights, or None."""
    if model.n_kv_head != model.n_head:
        return (
            f"its {model.n_head} query heads share {model.n_kv_head} key/value heads, so a query head cannot "
            "leave alone; --out prunes multi-head attention (n_kv_head = n_head)"
        )
    if model.position == "alibi":
        return "ALiBi's slopes are a function of the number of heads, so fewer heads would attend otherwise"
    if model.lora_rank:
        return "its low-rank adapters are not cut; merge them first (python -m jaxgpt export) and prune the merged run"
    if model.value_embeddings:
        return "its value embeddings are as wide as its heads and are not cut; prune a run without them"
    if model.encoder_layers:
        return "an encoder–decoder's cross-attention heads are not cut; prune a decoder"
    return None


def per_layer_share(model: ModelConfig, fraction: float) -> int:
    """How many heads each layer gives up for `fraction` of the model's heads, or one line why
    none can be."""
    share = round(fraction * model.n_head)
    if share < 1 or share >= model.n_head:
        raise UserError(
            f"--prune {fraction} of {model.n_head} heads a layer removes {share}; --out cuts the same number from "
            f"every layer, at least 1 and fewer than {model.n_head}: give a share between "
            f"{0.5 / model.n_head:.3g} and {(model.n_head - 0.5) / model.n_head:.3g}"
        )
    return share


def kept_heads(model: ModelConfig, removed: list[tuple[int, int]]) -> list[list[int]]:
    """Each layer's heads left after `removed` ((layer, head) pairs), in order; every layer must
    lose as many as the others."""
    gone = [{head for layer, head in removed if layer == i} for i in range(model.n_layer)]
    assert len({len(g) for g in gone}) == 1, "every layer loses the same number of heads"
    return [[h for h in range(model.n_head) if h not in g] for g in gone]


def pruned_model(model: ModelConfig, heads_left: int) -> ModelConfig:
    """The same model with `heads_left` heads a layer, each as wide as before."""
    return model.replace(n_head=heads_left, n_kv_head=heads_left, head_dim=model.head_dim)


def _cut_attention(attn: dict, keep: list[list[int]], layer_axis: bool) -> dict:
    """One attention's parameters with only the heads `keep` names (one list, or one a layer
    along a scanned layout's leading axis)."""
    out = {}
    for module, leaves in attn.items():
        out[module] = {}
        for name, value in leaves.items():
            value = np.asarray(value)
            axis = HEAD_AXES.get((module, name))
            if axis is None:
                if module not in SHARED:
                    raise AssertionError(f"attention parameter {module}/{name}: which heads' is it? (HEAD_AXES)")
                out[module][name] = value
            elif layer_axis:
                out[module][name] = np.stack([np.take(v, k, axis=axis) for v, k in zip(value, keep, strict=True)])
            else:
                out[module][name] = np.take(value, keep[0], axis=axis)
    return out


def pruned_params(model: ModelConfig, params: dict, removed: list[tuple[int, int]]) -> tuple[ModelConfig, dict]:
    """(the smaller model, its parameters): `params` with the heads `removed` cut out of every
    layer's attention (unscanned block_i or scanned blocks alike); everything else as it was."""
    keep = kept_heads(model, removed)
    out = {name: value for name, value in params.items()}
    if "blocks" in params:
        blocks = dict(params["blocks"])
        blocks["attn"] = _cut_attention(blocks["attn"], keep, layer_axis=True)
        out["blocks"] = blocks
    else:
        for i in range(model.n_layer):
            block = dict(params[f"block_{i}"])
            block["attn"] = _cut_attention(block["attn"], [keep[i]], layer_axis=False)
            out[f"block_{i}"] = block
    return pruned_model(model, len(keep[0])), out
