"""BartForConditionalGeneration (Lewis et al. 2020): the encoder–decoder (model.encoder_layers).
BART's post-norm blocks, learned positions read from row 2 of its tables, embedding LayerNorms
and final_logits_bias are all switches of jaxgpt's own model."""

from __future__ import annotations

import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.hf import layers
from jaxgpt.hf.family import BaseModel, Family, read_sizes, switched_on, written_sizes
from jaxgpt.model.sampling import Answering

BART_POSITION_OFFSET = 2  # BartLearnedPositionalEmbedding reads row position + 2 of its table
SIZES = {
    "vocab_size": "vocab_size",
    "block_size": "max_position_embeddings",
    "n_layer": "decoder_layers",
    "encoder_layers": "encoder_layers",
    "n_head": "decoder_attention_heads",
    "d_model": "d_model",
    "mlp_hidden": "decoder_ffn_dim",
}  # the encoder's heads and MLP width are the decoder's: read_config checks they match
BART_HAS = ("embedding_norm", "head_transform", "scale_embeddings")  # of the workbench's switches
BART_EMBEDDINGS = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def read_config(hf: dict) -> ModelConfig:
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
    if hf.get("activation_function", "gelu") not in layers.ACTIVATIONS:
        raise UserError(
            f"config.json activation_function={hf['activation_function']!r}: jaxgpt converts "
            f"{', '.join(layers.ACTIVATIONS)}"
        )
    if not hf.get("tie_word_embeddings", True):
        raise UserError(
            "config.json tie_word_embeddings=false: jaxgpt's encoder–decoder has one token embedding for its encoder, "
            "decoder and head, as BART's own checkpoints do"
        )
    return ModelConfig(
        **read_sizes(hf, SIZES),
        activation=layers.ACTIVATIONS[hf.get("activation_function", "gelu")],
        norm_position="post",
        position="learned",
        scale_embeddings=hf.get("scale_embedding", False),
        embedding_norm=True,
        logits_bias=True,
    )


def to_params(c: ModelConfig, w: dict) -> dict:
    D, H, hd = c.d_model, c.n_head, c.head_dim

    def block(side: str, i: int) -> dict:
        p = f"model.{side}.layers.{i}."
        b = {
            "attn": layers.multi_head(c, w, *(f"{p}self_attn.{n}_proj" for n in "qkv"), p + "self_attn.out_proj"),
            "mlp": {"up": layers.dense(w, p + "fc1"), "down": layers.dense(w, p + "fc2")},
            "norm_1": layers.layer_norm(w, p + "self_attn_layer_norm"),
            "norm_2": layers.layer_norm(w, p + "final_layer_norm"),
        }
        if side == "decoder":  # cross-attention: queries from the decoder, keys and values from the encoder
            q, k, v = (layers.dense(w, f"{p}encoder_attn.{n}_proj", (D, H, 1, hd)) for n in "qkv")
            kv = {name: np.concatenate([k[name], v[name]], axis=-2) for name in ("kernel", "bias")}
            b["cross"] = {"q": q, "kv": kv, "out": layers.output(c, w, p + "encoder_attn.out_proj")}
            b["norm_cross"] = layers.layer_norm(w, p + "encoder_attn_layer_norm")
        return b

    def embeddings(side: str) -> dict:
        table = w[f"model.{side}.embed_positions.weight"][BART_POSITION_OFFSET:]
        norm = layers.layer_norm(w, f"model.{side}.layernorm_embedding")
        return {"wpe": {"embedding": table}, "norm_embeddings": norm}

    encoder = {f"block_{i}": block("encoder", i) for i in range(c.encoder_layers)} | embeddings("encoder")
    params = {f"block_{i}": block("decoder", i) for i in range(c.n_layer)} | embeddings("decoder")
    shared = next((name for name in BART_EMBEDDINGS if name in w), BART_EMBEDDINGS[0])
    return params | {
        "encoder": encoder,
        "wte": {"embedding": w[shared]},
        "head_bias": (
            w["final_logits_bias"].reshape(-1) if "final_logits_bias" in w else np.zeros(c.vocab_size, np.float32)
        ),
    }


def to_weights(c: ModelConfig, params: dict) -> dict:
    def block(b: dict, p: str) -> dict:
        self_attention = (f"{p}self_attn.{n}_proj" for n in "qkv")
        w = layers.multi_head_weights(c, b["attn"], *self_attention, p + "self_attn.out_proj")
        w |= layers.linear(b["mlp"]["up"], p + "fc1") | layers.linear(b["mlp"]["down"], p + "fc2")
        w |= layers.layer_norm_weights(b["norm_1"], p + "self_attn_layer_norm")
        w |= layers.layer_norm_weights(b["norm_2"], p + "final_layer_norm")
        if "cross" in b:
            kv, D = b["cross"]["kv"], c.d_model  # kernel (D, H, 2, hd), bias (H, 2, hd)
            for j, n in enumerate("kv"):
                one = {"kernel": kv["kernel"][:, :, j], "bias": kv["bias"][:, j]}
                w |= layers.linear(one, f"{p}encoder_attn.{n}_proj", d_in=D)
            w |= layers.linear(b["cross"]["q"], p + "encoder_attn.q_proj", d_in=D)
            w |= layers.linear(b["cross"]["out"], p + "encoder_attn.out_proj")
            w |= layers.layer_norm_weights(b["norm_cross"], p + "encoder_attn_layer_norm")
        return w

    unused_rows = np.zeros((BART_POSITION_OFFSET, c.d_model), np.float32)
    bias = params["head_bias"] if c.logits_bias else np.zeros(c.vocab_size, np.float32)
    w = {"model.shared.weight": params["wte"]["embedding"], "final_logits_bias": bias.reshape(1, -1)}
    for side, tree, count in (("encoder", params["encoder"], c.encoder_layers), ("decoder", params, c.n_layer)):
        w[f"model.{side}.embed_positions.weight"] = np.concatenate([unused_rows, tree["wpe"]["embedding"]])
        w |= layers.layer_norm_weights(tree["norm_embeddings"], f"model.{side}.layernorm_embedding")
        for i in range(count):
            w |= block(tree[f"block_{i}"], f"model.{side}.layers.{i}.")
    return w


def to_hf_config(c: ModelConfig) -> dict:
    # Not BART's default forced_eos_token_id=2, which forces token 2 last into every generation:
    # the end of a jaxgpt model's answers is its own (save_pretrained's special_tokens).
    return written_sizes(c, SIZES) | {
        "is_encoder_decoder": True,
        "encoder_attention_heads": c.n_head,
        "encoder_ffn_dim": c.mlp_hidden,
        "activation_function": layers.ACTIVATION_NAMES[c.activation],
        "scale_embedding": c.scale_embeddings,
        "tie_word_embeddings": True,
        "dropout": c.dropout,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "forced_eos_token_id": None,
    }


def answering(hf: dict, tokenizer) -> Answering:
    """How BART is asked, as transformers' BartTokenizer and generate do it: the source between
    <s> and </s> (config.json's bos_token_id and eos_token_id), the decoder started from
    decoder_start_token_id (and forced_bos_token_id, where set, as bart-large's first token),
    the answer ended by eos_token_id."""
    bos, eos, start = hf.get("bos_token_id"), hf.get("eos_token_id"), hf.get("decoder_start_token_id")
    if not isinstance(eos, int) or not isinstance(start, int):
        raise UserError(
            "config.json names no eos_token_id or decoder_start_token_id: the commands cannot tell where BART's "
            "answers start and end; add them (BART's own: 2 and 2)"
        )
    forced = hf.get("forced_bos_token_id")
    framed = ([bos] if isinstance(bos, int) else [], [eos])

    def source(text: str) -> list[int]:
        return [*framed[0], *tokenizer.encode(text.strip()), *framed[1]]

    return Answering(source, (start, *([forced] if isinstance(forced, int) else [])), eos)


def check_exportable(c: ModelConfig) -> None:
    """Nothing for an encoder–decoder BartForConditionalGeneration can describe; else one line
    naming what it lacks."""
    recipe = dict(
        position="learned", norm="layernorm", norm_position="post", bias=True, embedding_norm=True,
        head_transform=False, tie_embeddings=True, moe=None, n_kv_head=c.n_head,
    )  # fmt: skip
    differences = [f"{field}={getattr(c, field)!r}" for field, want in recipe.items() if getattr(c, field) != want]
    if c.activation not in layers.ACTIVATION_NAMES:
        differences.append(f"activation={c.activation!r}")
    differences += [f"{f}={getattr(c, f)!r}" for f in switched_on(c, besides=BART_HAS)]
    if differences:
        raise UserError(
            f"model.{differences[0]}: an encoder–decoder exports as BartForConditionalGeneration (learned positions, "
            "post-norm LayerNorm blocks with biases, a norm over the embeddings, one tied embedding, multi-head "
            "attention, dense MLPs)"
        )


# BartModel's head is the shared embedding; the task model adds only final_logits_bias, which
# BartForConditionalGeneration starts at zero where a folder lacks it, as to_params does
BASE = BaseModel("BartModel", "model.", ("final_logits_bias", "lm_head."), "head", lambda c: ())
FAMILY = Family("BartForConditionalGeneration", read_config, to_params, to_weights, to_hf_config, BASE)
