"""A run's own configuration as a config file: what lets `python train.py --workdir runs/X`
resume (and `--config.train.steps=N` extend) a run without its original command line.

train.py passes `--config=jaxgpt/commands/saved_config.py:<workdir or config.json>`; ml_collections
calls `get_config` with the part after the colon, and command-line overrides then apply to
the run's saved values exactly as they would to a config file's.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_collections

from jaxgpt.config_files import base_config
from jaxgpt.errors import UserError
from jaxgpt.job.checkpoint import recorded_config


def get_config(where: str) -> ml_collections.ConfigDict:
    path = Path(where)
    if path.is_dir() and not (path / "config.json").exists():
        return config_of(recorded_config(path))
    path = path / "config.json" if path.is_dir() else path
    try:
        saved = json.loads(path.read_text())
        sections = {section: dict(values) for section, values in saved.items()}
    except (OSError, ValueError, AttributeError, TypeError) as error:
        raise UserError(
            f"{path} cannot be read ({type(error).__name__}: {str(error)[:80]}); resume by naming the run's config "
            "file again (python train.py --config FILE --workdir DIR, with the run's overrides: its checkpoints' own "
            "record is checked against them), which writes config.json anew"
        ) from None
    return config_of(sections)


def config_of(sections: dict) -> ml_collections.ConfigDict:
    """base_config() with a saved run's values (config.json's sections) written over it."""
    config = base_config()
    for section, values in sections.items():
        for key, value in values.items():
            if key not in config[section]:  # the run-owned model.dtype/param_dtype are not config keys
                continue
            if isinstance(value, dict):  # rope_scaling: a section, updated in place
                config[section][key].update(value)
            elif value is not None or not isinstance(config[section][key], ml_collections.ConfigDict):
                config[section][key] = value
    return config
