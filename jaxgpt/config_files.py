"""Config files and the command line -> a validated RunConfig.

A config file (`configs/*.py`) defines `get_config()` returning `base_config()` with some
values changed: an `ml_collections.ConfigDict` with sections `model`, `data`, `train` and
`mesh` whose keys are exactly the fields of the dataclasses in jaxgpt/config/, so
command-line overrides like `--config.train.lr=1e-3` are type-checked against the defaults.
`resolve` turns such a dict into a `RunConfig`.
"""

from __future__ import annotations

import dataclasses
import difflib

import ml_collections

from jaxgpt.config import (
    ConfigError,
    DataConfig,
    MeshConfig,
    MixtureOfExperts,
    ModelConfig,
    Reinforcement,
    RopeScaling,
    RunConfig,
    TrainConfig,
)

SECTIONS = ("model", "data", "train", "mesh")

# model.vocab_size until the tokenizer is known (training resolves the config before preparing
# its data, to refuse a bad one before the slow work): any size validates the rest of the model,
# and one token is a size no config asks for (resolve refuses it).
VOCAB_FROM_TOKENIZER = 1

# Set by the run, not by the config: compute dtype comes from train.dtype, and parameters are
# always stored in float32 for training (mixed precision).
_RUN_OWNED_MODEL_FIELDS = ("dtype", "param_dtype")


def base_config() -> ml_collections.ConfigDict:
    """Every key a config file may set, with its default; config files change some of them."""

    def section(cls, skip=()):
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            default = f.default
            if default is None:  # typed placeholders keep CLI overrides typed
                default = ml_collections.config_dict.placeholder(int)
            out[f.name] = default
        return ml_collections.ConfigDict(out)

    config = ml_collections.ConfigDict()
    config.model = section(ModelConfig, _RUN_OWNED_MODEL_FIELDS + ("rope_scaling", "moe"))
    config.model.vocab_size = ml_collections.config_dict.placeholder(int)  # from the tokenizer
    # A section rather than None, so `--config.model.rope_scaling.kind=yarn` can switch it on;
    # kind "" means no scaling.
    config.model.rope_scaling = ml_collections.ConfigDict(
        {
            f.name: ml_collections.config_dict.placeholder(tuple if f.type.startswith("tuple") else int)
            if f.default is None
            else f.default
            for f in dataclasses.fields(RopeScaling)
        }
        | {"kind": "", "factor": 1.0}
    )
    # Likewise `--config.model.moe.experts=8` switches experts on; experts 0 means dense MLPs.
    config.model.moe = ml_collections.ConfigDict(
        {
            f.name: ml_collections.config_dict.placeholder(int) if f.default is None else f.default
            for f in dataclasses.fields(MixtureOfExperts)
            if f.name != "experts"
        }
        | {"experts": 0}
    )
    config.data = section(DataConfig)
    config.train = section(TrainConfig, ("rl",))
    # Likewise `--config.train.rl.samples=8` switches learning from rewards on; samples 0 means off.
    config.train.rl = ml_collections.ConfigDict(
        {f.name: f.default for f in dataclasses.fields(Reinforcement) if f.name != "samples"} | {"samples": 0}
    )
    config.mesh = section(MeshConfig)
    return config


def _checked_section(values: dict, cls, section: str, skip=()) -> dict:
    allowed = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    for key in values:
        if key not in allowed:
            guess = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {section}.{guess[0]}?" if guess else f"known keys: {', '.join(allowed)}"
            raise ConfigError(f"unknown config key {section}.{key}; {hint}")
    return values


def _with_rollouts(train: dict, notes: list[str]) -> dict:
    """train.rl as a Reinforcement (None where the config file's section leaves samples 0), and
    train.batch_size its prompts x samples: a step's batch is its answers."""
    rl = train.get("rl")
    if not isinstance(rl, dict):
        return train
    if not rl.get("samples"):
        return train | {"rl": None}
    rl = Reinforcement(**_checked_section(dict(rl), Reinforcement, "train.rl"))
    rows = rl.prompts * rl.samples
    if train.get("batch_size", rows) != rows:
        notes.append(f"train.batch_size={rows}: train.rl's {rl.prompts} prompts x {rl.samples} answers a step")
    return train | {"rl": rl, "batch_size": rows}


def resolve(config, vocab_size: int | None = None, notes: list[str] | None = None) -> RunConfig:
    """A ConfigDict (or plain nested dict) -> validated RunConfig.

    model.vocab_size is taken from `vocab_size` (the tokenizer's; with_tokenizer_vocab when
    it is known only later) when the config leaves it unset. A warmup as
    long as the run (a shipped config shortened with --config.train.steps) is clipped to a
    tenth of the run, a cooldown longer than the rest of it to the rest, and `notes` gets a line
    saying so; a model without the causal mask gets a line saying how it is scored.
    """
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    for section in raw:
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section {section!r}; a config has model, data, train and mesh")
    model = dict(_checked_section(dict(raw.get("model", {})), ModelConfig, "model", _RUN_OWNED_MODEL_FIELDS))
    if isinstance(model.get("rope_scaling"), dict) and not model["rope_scaling"].get("kind"):
        model["rope_scaling"] = None  # the base config's section left off
    if isinstance(model.get("moe"), dict) and not model["moe"].get("experts"):
        model["moe"] = None  # likewise: dense MLPs
    data = DataConfig(**_checked_section(dict(raw.get("data", {})), DataConfig, "data"))
    train_values = _checked_section(dict(raw.get("train", {})), TrainConfig, "train")
    train_values = _with_rollouts(train_values, notes if notes is not None else [])
    train_values = _fit_schedule_to_the_run(train_values, notes if notes is not None else [])
    train = TrainConfig(**train_values)
    if model.get("vocab_size") == VOCAB_FROM_TOKENIZER:
        raise ConfigError("model.vocab_size=1 leaves no choice of token to predict; leave it unset or raise it")
    model["vocab_size"] = model.get("vocab_size") or VOCAB_FROM_TOKENIZER
    mesh = MeshConfig(**_checked_section(dict(raw.get("mesh", {})), MeshConfig, "mesh"))
    model = ModelConfig(**model, dtype=train.dtype, param_dtype="float32")
    if notes is not None:
        notes.extend(model.notes())
    run = RunConfig(model, data, train, mesh)
    return with_tokenizer_vocab(run, vocab_size) if vocab_size else run


def tokens_needed(model: ModelConfig, vocab_size: int) -> int:
    """The token rows `model` needs for a tokenizer of `vocab_size` ids: one more for the masked
    objective's own mask token, the last id, where the model names none (jaxgpt/training/masked.py;
    BERT's [MASK] is one of its tokenizer's ids)."""
    return vocab_size + model.adds_a_mask_token


def with_tokenizer_vocab(run: RunConfig, vocab_size: int) -> RunConfig:
    """`run` with the tokenizer's `vocab_size` where its config left model.vocab_size unset (and
    the masked objective's own mask token: tokens_needed); a configured size smaller than that
    is an error."""
    needed = tokens_needed(run.model, vocab_size)
    if run.model.vocab_size == VOCAB_FROM_TOKENIZER:
        return dataclasses.replace(run, model=run.model.replace(vocab_size=needed))
    if run.model.vocab_size < needed:
        extra = " and the mask token" if needed > vocab_size else ""
        raise ConfigError(
            f"model.vocab_size={run.model.vocab_size} is smaller than the tokenizer's {vocab_size} tokens{extra}; "
            "leave it unset or raise it"
        )
    return run


def _fit_schedule_to_the_run(train: dict, notes: list[str]) -> dict:
    """`train` with a warmup as long as the run clipped to a tenth of it, and a cooldown longer
    than the steps after the warmup clipped to those steps (the rate then falls from the warmup's
    end), each with a note: a shipped config shortened with --config.train.steps still runs."""
    defaults = TrainConfig.__dataclass_fields__
    names = ("steps", "warmup_steps", "decay_steps", "cooldown_steps")
    steps, warmup, decay_steps, cooldown = (train.get(name, defaults[name].default) for name in names)
    if not all(isinstance(value, int) for value in (steps, warmup, decay_steps, cooldown)) or steps <= 0:
        return train  # a wrong type or count is TrainConfig's to report
    if warmup >= steps:
        notes.append(
            f"train.warmup_steps={warmup} is not shorter than train.steps={steps}; warming up for {steps // 10}"
        )
        warmup = steps // 10
        train = train | {"warmup_steps": warmup}
    room = (decay_steps or steps) - warmup
    if cooldown > room > 0:
        train = train | {"cooldown_steps": room}
        notes.append(
            f"train.cooldown_steps={cooldown} is longer than the {room} steps after the warmup; "
            f"cooling down over all {room}"
        )
    return train
