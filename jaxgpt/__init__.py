"""jaxgpt: transformers in JAX/Flax, built to be read: decoders (GPT- and Llama-style, dense or
mixture of experts), encoders trained by masked-token prediction, and the encoder–decoder.

The model names below load on first use, so `import jaxgpt` (and the scripts' flag parsing,
`--help` and bad-flag errors) never waits for JAX and Flax to import.
"""

import importlib
import sys
from pathlib import Path

_EXPORTS = {
    "ConfigError": "jaxgpt.config",
    "ModelConfig": "jaxgpt.config",
    "RopeScaling": "jaxgpt.config",
    "GPT": "jaxgpt.model",
    "count_params": "jaxgpt.model",
    "flops_per_token": "jaxgpt.model",
    "init_cache": "jaxgpt.model",
    "init_params": "jaxgpt.model",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'jaxgpt' has no attribute {name!r}")


class _EarlierCommandNames:
    """A sys.meta_path finder: `python -m jaxgpt.evaluate` (and .check, .plot, ...), as the
    commands were started before `jaxgpt COMMAND`, still runs the command. The name finds
    jaxgpt/commands/NAME.py, so the package's top holds only the library, without a file per
    old name, and nothing here imports the commands. (find_spec is all a finder needs;
    importlib.abc would cost `import jaxgpt` 14 ms.)"""

    NAMES = (
        "attention_maps", "check", "compare", "evaluate", "fill", "hellaswag", "logit_lens", "plot", "prepare",
        "seq2seq",
    )  # fmt: skip

    def find_spec(self, fullname, path, target=None):
        package, _, name = fullname.partition(".")
        if package != "jaxgpt" or name not in self.NAMES:
            return None
        import importlib.util

        return importlib.util.spec_from_file_location(fullname, Path(__file__).parent / "commands" / f"{name}.py")


if not any(isinstance(finder, _EarlierCommandNames) for finder in sys.meta_path):
    sys.meta_path.append(_EarlierCommandNames())
