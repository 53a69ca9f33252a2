"""Converting between a Hugging Face folder and jaxgpt: which family a folder's config.json
names (or a jaxgpt model exports as), its weights read into jaxgpt's params and written back,
every weight accounted for and every shape checked against the config.

A folder's weights are read under the names its family's task model gives them, whichever
transformers class saved them: the task model's own (GPT2LMHeadModel's `transformer.h.0...`,
as save_pretrained writes them) or its base model's (GPT2Model's `h.0...`, as the Hub stores
GPT-2; BertModel, LlamaModel and the others alike), older names as today's (the original BERT's
LayerNorm gamma and beta), a tied head absent. A head the model needs and the folder lacks (a
BertModel has no masked-token head) is one line naming the class that has it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError, warn_once
from jaxgpt.hf import bart, bert, gemma, gpt2, llama, mixtral
from jaxgpt.hf.family import BaseModel, Family, switched_on
from jaxgpt.hf.files import (
    ReadWeights,
    local_directory,
    read_json,
    read_safetensors,
    read_weights,
    token_id,
    weight_files,
)
from jaxgpt.model.transformer import init_params, unstack_blocks
from jaxgpt.training.objectives import objective_of

FAMILIES: dict[str, Family] = {  # config.json's model_type -> the family
    "gpt2": gpt2.FAMILY,
    "llama": llama.LLAMA,
    "mistral": llama.MISTRAL,  # Llama with a sliding window
    "qwen2": llama.QWEN2,  # Llama with query, key and value biases
    "qwen3": llama.QWEN3,  # Llama with each head's queries and keys normed, heads of their own width
    "mixtral": mixtral.FAMILY,  # Mistral with experts
    "bert": bert.FAMILY,  # an encoder
    "bart": bart.FAMILY,  # an encoder–decoder
    "gemma3_text": gemma.GEMMA3,  # sandwich norms, GeGLU, windowed layers and global ones
    "gemma3": gemma.GEMMA3_MULTIMODAL,  # its text model, read from beside a vision tower
}


# The workbench switches Gemma 3 has (its text model)
GEMMA_SWITCHES = (
    "qk_norm",
    "scale_embeddings",
    "attention_window",
    "global_every",
    "rope_local_theta",
    "logit_softcap",
)


def family_of(c: ModelConfig) -> str:
    """Which Hugging Face family a jaxgpt model exports as; else one line naming the setting
    none of them has."""
    objective = objective_of(c)
    if "export" not in objective.commands:
        raise UserError(f"the model is {objective.described}; no Hugging Face family jaxgpt writes holds its head")
    gemma_recipe = (c.norm_position, c.activation) == ("sandwich", "geglu") and c.moe is None and not c.encoder_layers
    if c.attention_scale_dim not in (None, c.head_dim) and not gemma_recipe:
        raise UserError(
            f"model.attention_scale_dim={c.attention_scale_dim} scales the scores as only Gemma 3 does; export a "
            "model with it unset, or Gemma's recipe (norm_position=sandwich, activation=geglu)"
        )
    if gemma_recipe:
        gemma.check_exportable(c)
        if switched := switched_on(c, besides=GEMMA_SWITCHES):
            raise UserError(
                f"model.{switched[0]}={getattr(c, switched[0])!r} has no counterpart in Hugging Face's Gemma 3; "
                "only a model with the other workbench switches off can be exported"
            )
        return "gemma3_text"
    if c.encoder_layers:
        bart.check_exportable(c)
        return "bart"
    if objective.exports_as == "bert":  # an encoder trained on blanks
        bert.check_exportable(c)
        return "bert"
    if c.moe is not None:
        mixtral.check_exportable(c)
        family_of(c.replace(moe=None))  # the rest as for Llama/Mistral: a workbench switch or rope scaling
        return "mixtral"
    switched = switched_on(c)
    llama_recipe = (c.position, c.norm, c.activation, c.norm_position) == ("rope", "rmsnorm", "swiglu", "pre")
    if llama_recipe and switched == ["attention_window"] and not c.qkv_bias:
        switched = []  # Mistral: Llama with a sliding window
    if llama_recipe and switched == ["qk_norm"] and not c.qkv_bias:
        switched = []  # Qwen3: Llama with its queries and keys normed per head
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
        return "qwen3" if c.qk_norm else "mistral" if c.attention_window else "llama"
    raise UserError(
        "this model is neither GPT-2 (learned positions, LayerNorm, GELU, biases, multi-head) nor Llama (RoPE, "
        "RMSNorm, SwiGLU): Hugging Face has no matching architecture to export it to"
    )


def check_folder(path_or_name: str) -> None:
    """A local Hugging Face folder checked before any work is done with it (a workdir made, a
    model compiled): its config.json describes a model jaxgpt converts, its weight files'
    headers read, and its weights' names hold the head the model needs. The weights themselves
    are read, and checked against the config, when loaded."""
    directory = Path(path_or_name).expanduser()
    if not directory.is_dir():
        return  # a Hub name: fetched (or refused, offline) when loaded
    config, family = pretrained_config(directory / "config.json")
    files = weight_files(directory)
    names = [name for path in files for name in read_safetensors(path, header_only=True)]
    if files:  # pytorch_model.bin has no header to read: its names are checked when it is loaded
        _check_head(config, FAMILIES[family], directory, names)


def task_model_names(names, base: BaseModel) -> dict[str, str]:
    """Each stored name -> the name the family's task model gives it: a base model's weights
    alone (no name under the base's prefix: GPT2Model's `h.0.attn.c_attn.weight`) get the prefix
    (`transformer.h.0.attn.c_attn.weight`), a task model's keep theirs (so another task's head,
    a classifier, shows as itself), and the original BERT's LayerNorm gamma and beta become
    weight and bias."""
    if base.renamed is not None:  # a larger model's part (Gemma 3's text model)
        return {name: base.renamed(name) for name in names}
    prefix = "" if _is_task_model(names, base) else base.prefix
    return {name: re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", prefix + name)) for name in names}


def _is_task_model(names, base: BaseModel) -> bool:
    return any(name.startswith(base.prefix) for name in names)


def stored_architecture(directory: Path, family: Family, names) -> str:
    """The transformers class a folder's weights are of: config.json's `architectures`, else the
    base model's where no name has the task model's prefix, or the task model's."""
    named = read_json(directory / "config.json", "").get("architectures")
    if isinstance(named, list) and named and isinstance(named[0], str):
        return named[0]
    return family.architecture if _is_task_model(names, family.base) else family.base.architecture


def _check_head(config: ModelConfig, family: Family, directory: Path, stored_names) -> None:
    """One line where the folder lacks a head the model reads: a BertModel has no masked-token
    head, a LlamaModel with tie_word_embeddings=false no lm_head."""
    held = set(task_model_names(stored_names, family.base).values())
    missing = [name for name in family.base.needs_head(config) if name not in held]
    if not missing:
        return
    untied = "lm_head.weight" in missing
    raise UserError(
        f"{directory} holds a {stored_architecture(directory, family, stored_names)}, which has no "
        f"{family.base.head_name} ({missing[0]})"
        + (", and config.json's tie_word_embeddings=false says the head is not the token embedding" if untied else "")
        + f"; jaxgpt needs a {family.architecture}'s weights, its head included"
    )


def pretrained_tokenizer(path_or_name: str, family: str):
    """The tokenizer that goes with a checkpoint: the run's own where `jaxgpt export` wrote the
    folder (its jaxgpt_tokenizer.json: a char vocabulary stays one, whatever the family), else
    tiktoken's GPT-2 BPE for GPT-2 models, the directory's tokenizer.json (Hugging Face
    `tokenizers`) otherwise."""
    from jaxgpt.tokenizers import HuggingFaceTokenizer, load_tokenizer, make_tokenizer

    exported = Path(path_or_name) / "jaxgpt_tokenizer.json"  # commands/export.py's TOKENIZER_FILE
    if exported.is_file():
        return load_tokenizer(exported)
    if family == "gpt2":
        return make_tokenizer("gpt2")
    return HuggingFaceTokenizer(local_directory(path_or_name))


def pretrained_config(config_json: str | Path) -> tuple[ModelConfig, str]:
    """(config, family) that a Hugging Face config.json describes, without its weights: how to
    read a real model's config, and count its parameters with `jax.eval_shape`."""
    config_json = Path(config_json)
    hf = read_json(config_json, "a Hugging Face model folder holds config.json beside its weights")
    family = hf.get("model_type")
    if family == "bert":
        hf["_mask_token_id"] = token_id(config_json.parent, "[MASK]")
    if family not in FAMILIES:
        raise UserError(
            f"{config_json}: model_type {family!r} is not supported; jaxgpt converts gpt2, llama, mistral, qwen2, "
            "qwen3, mixtral, gemma3_text, gemma3 (its text model), bert and bart"
        )
    try:
        return FAMILIES[family].config(hf), family
    except UserError:
        raise
    except KeyError as missing:
        raise UserError(
            f"{config_json} has no {missing.args[0]!r}, which a {family} config.json has; the file is cut short or "
            "from another model: download it again"
        ) from None
    except (TypeError, ValueError) as error:
        raise UserError(f"{config_json}: a value of the wrong type for a {family} model ({error})") from None


def load_pretrained(path_or_name: str) -> tuple[ModelConfig, dict, str]:
    """(config, params, family) from a Hugging Face directory (or Hub name, online)."""
    directory = local_directory(path_or_name)
    config, family = pretrained_config(directory / "config.json")
    stored, of = read_weights(directory), FAMILIES[family]
    _check_head(config, of, directory, stored)
    names = task_model_names(stored, of.base)
    if not_loaded := [name for name in names.values() if name.startswith(of.base.not_loaded)]:
        parts = sorted({name.removeprefix("model.").split(".")[0] for name in not_loaded})  # vision_tower, ...
        warn_once(
            f"{directory} holds a {stored_architecture(directory, of, stored)}: its {of.base.architecture} is read, "
            f"and the {len(not_loaded)} weights of the rest ({', '.join(parts)}) are not loaded"
        )
    weights = ReadWeights({names[k]: np.asarray(v, np.float32) for k, v in stored.items()})
    try:
        params = of.params(config, weights)
    except KeyError as missing:
        raise UserError(
            f"{directory}: weight {missing.args[0]} is missing for a {family} model (its weights read as a "
            f"{stored_architecture(directory, of, stored)}'s)"
        ) from None
    except ValueError as error:  # a reshape that does not fit
        raise UserError(f"{directory}: weights do not fit config.json ({error})") from None
    left = of.base.not_loaded
    if unread := sorted(
        n for n in set(weights) - weights.read if not (_left_by_design(n, config) or n.startswith(left))
    ):
        shown = ", ".join(unread[:4]) + (f" and {len(unread) - 4} more" if len(unread) > 4 else "")
        raise UserError(
            f"{directory}: {len(unread)} weights have no place in the {family} model its config.json describes "
            f"({config.n_layer} layers): {shown}; the config and the weights are of different models"
        )
    _check_shapes(config, params, directory)
    return config, params, family


# Weights checkpoints carry that no jaxgpt model holds: GPT-2's causal-mask buffers (older
# checkpoints), RoPE's frequency table, position-id buffers, BERT's pooler and next-sentence head
LEFT_BY_DESIGN = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq", "position_ids")
LEFT_BY_DESIGN_PREFIXES = ("bert.pooler.", "cls.seq_relationship.")


def _left_by_design(name: str, config: ModelConfig) -> bool:
    """Whether a weight no conversion reads is one jaxgpt leaves out on purpose (a buffer, BERT's
    heads for other tasks, a tied head's copy of the embedding), rather than one of a layer the
    config lacks."""
    tied_copies = ("lm_head.weight", "cls.predictions.decoder.weight", *bart.BART_EMBEDDINGS)
    tied_copy = config.tie_embeddings and name in tied_copies
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
    """Write a directory transformers loads: config.json and model.safetensors (float32, the
    blocks of scanned layers one a layer). `special_tokens`
    join config.json: an encoder–decoder trained on pairs starts and ends its answers at the
    pair separator, {"decoder_start_token_id": sep, "eos_token_id": sep}, for
    transformers' generate to do the same."""
    from safetensors.numpy import save_file

    family = family_of(config)
    to_weights, to_hf_config = FAMILIES[family].weights, FAMILIES[family].hf_config
    if config.scan_layers:  # a layout of the computation, not of the model: a block a layer, as transformers
        params = unstack_blocks(params) | (
            {"encoder": unstack_blocks(params["encoder"])} if config.encoder_layers else {}
        )
        config = config.replace(scan_layers=False)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    numpy_params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    weights = {k: np.ascontiguousarray(v) for k, v in to_weights(config, numpy_params).items()}
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    hf_config = {"model_type": family, "architectures": [FAMILIES[family].architecture]} | to_hf_config(config)
    (directory / "config.json").write_text(json.dumps(hf_config | (special_tokens or {}), indent=2))
    return directory
