"""jaxgpt: transformers in JAX/Flax, built to be read: decoders (GPT- and Llama-style, dense or
mixture of experts), encoders trained by masked-token prediction, and the encoder–decoder.

The model names below load on first use, so `import jaxgpt` (and the scripts' flag parsing,
`--help` and bad-flag errors) never waits for JAX and Flax to import.
"""

import importlib

_EXPORTS = {
    "ConfigError": "jaxgpt.config",
    "ModelConfig": "jaxgpt.config",
    "RopeScaling": "jaxgpt.config",
    "GPT": "jaxgpt.model.transformer",
    "count_params": "jaxgpt.model.transformer",
    "flops_per_token": "jaxgpt.model.transformer",
    "init_cache": "jaxgpt.model.transformer",
    "init_params": "jaxgpt.model.transformer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'jaxgpt' has no attribute {name!r}")
