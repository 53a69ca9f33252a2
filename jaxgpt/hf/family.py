"""What a Hugging Face family is to jaxgpt: four functions between its files and a jaxgpt model
and the base model inside its task model (`Family`), and the workbench switches no family's
checkpoint has."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from jaxgpt.config import ModelConfig
from jaxgpt.config.model import fields_of_kind


class BaseModel(NamedTuple):
    """The model inside a family's task model, which the Hub often stores alone: openai-community/
    gpt2's file holds GPT2Model's weights (`h.0.attn.c_attn.weight`), where GPT2LMHeadModel holds
    the same under `transformer.`, beside a head of its own that a tied model leaves out."""

    architecture: str  # e.g. "GPT2Model"
    prefix: str  # its weights' names inside the task model start so: "transformer."
    head: tuple[str, ...]  # how the task model's own weights (its head's) start: ("lm_head.",)
    head_name: str  # what that head is, for the line saying it is missing: "language-model head"
    needs_head: Callable[[ModelConfig], tuple[str, ...]]  # the head's weights a model reads, by name
    # where a checkpoint holds the model inside a larger one (Gemma 3's text model beside a vision
    # tower): each stored name -> the task model's, and how the names of the parts not read start
    renamed: Callable[[str], str] | None = None
    not_loaded: tuple[str, ...] = ()


class Family(NamedTuple):
    architecture: str  # the transformers class its config.json names, e.g. "GPT2LMHeadModel"
    config: Callable[[dict], ModelConfig]  # config.json -> the jaxgpt model it describes
    params: Callable[[ModelConfig, dict], dict]  # its weights by name -> jaxgpt's params tree
    weights: Callable[[ModelConfig, dict], dict]  # jaxgpt's params tree -> its weights by name
    hf_config: Callable[[ModelConfig], dict]  # the jaxgpt model -> config.json (model_type is added)
    base: BaseModel


def untied_head(c: ModelConfig) -> tuple[str, ...]:
    """A decoder's head weights: its own lm_head, unless it reads out through the embedding."""
    return () if c.tie_embeddings else ("lm_head.weight",)


# Switches and ablations GPT-2 and Llama checkpoints do not have (zero_init_residual is only an init)
WORKBENCH_FIELDS = fields_of_kind("workbench")


def switched_on(c: ModelConfig, besides: tuple[str, ...] = ()) -> list[str]:
    """The workbench fields `c` sets away from their defaults, other than `besides` (those a
    family has)."""
    return [f for f in WORKBENCH_FIELDS if f not in besides and getattr(c, f) != getattr(ModelConfig, f)]


def read_sizes(hf: dict, names: dict[str, str]) -> dict:
    """A config.json's sizes as ModelConfig fields: `names` maps each field to the family's own
    name for it (GPT-2's n_embd, BERT's hidden_size, BART's d_model)."""
    return {ours: hf[theirs] for ours, theirs in names.items()}


def written_sizes(c: ModelConfig, names: dict[str, str]) -> dict:
    """The inverse of `read_sizes`: the model's sizes under the family's names."""
    return {theirs: getattr(c, ours) for ours, theirs in names.items()}
