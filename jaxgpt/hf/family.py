"""What a Hugging Face family is to jaxgpt: four functions between its files and a jaxgpt model
(`Family`), and the workbench switches no family's checkpoint has."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from jaxgpt.config import ModelConfig


class Family(NamedTuple):
    architecture: str  # the transformers class its config.json names, e.g. "GPT2LMHeadModel"
    config: Callable[[dict], ModelConfig]  # config.json -> the jaxgpt model it describes
    params: Callable[[ModelConfig, dict], dict]  # its weights by name -> jaxgpt's params tree
    weights: Callable[[ModelConfig, dict], dict]  # jaxgpt's params tree -> its weights by name
    hf_config: Callable[[ModelConfig], dict]  # the jaxgpt model -> config.json (model_type is added)


# Switches and ablations GPT-2 and Llama checkpoints do not have (zero_init_residual is only an init).
WORKBENCH_FIELDS = (
    "qk_norm", "logit_softcap", "attention_window", "scale_attention", "causal", "residual", "rope_pairing",
    "mlp", "uniform_attention", "qkv_projections", "scale_embeddings", "embedding_norm", "head_transform",
)  # fmt: skip


def switched_on(c: ModelConfig, besides: tuple[str, ...] = ()) -> list[str]:
    """The workbench fields `c` sets away from their defaults, other than `besides` (those a
    family has)."""
    return [f for f in WORKBENCH_FIELDS if f not in besides and getattr(c, f) != getattr(ModelConfig, f)]
