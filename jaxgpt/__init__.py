"""jaxgpt: decoder-only transformers (GPT- and Llama-style) in JAX/Flax, built to be read."""

from jaxgpt.config import ConfigError, ModelConfig, RopeScaling
from jaxgpt.model import GPT, count_params, flops_per_token, init_cache, init_params

__all__ = [
    "GPT",
    "ConfigError",
    "ModelConfig",
    "RopeScaling",
    "count_params",
    "flops_per_token",
    "init_cache",
    "init_params",
]
