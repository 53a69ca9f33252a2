"""A run that starts from trained weights (train.init_from): a jaxgpt run's workdir (its newest
checkpoint, or the kept one of train.init_step), or a Hugging Face folder (or a Hub name,
online); and what a resumed run keeps of its own when its sources have moved on (its model, its
tokenizer).

The model is the weights' model. Every field that says what the weights compute — sizes,
positions and their base and scaling, norms and their epsilon, activation, tying, biases, the
vocabulary — is read from the source, whatever the config file says (configs/llama_tiny.py's
own rope_theta included), and a note lists what it replaced. The config keeps what a run
chooses for itself (RUN_CHOICES: dropout, arithmetic, layout, adapters, a mixture's capacity
and loss weights), and a shorter block_size where no parameter has its length. Only an explicit
override (the command line's --config.model.X) of what a context extension changes on purpose
(block_size, rope_theta, rope_scaling: tests/test_context_extension.py) moves the source's,
said in one line; any other override that differs is refused in one line, before any data is
prepared or any workdir made.

  kept_tokenizer            a resumed run's own tokenizer, where the folder it was read from changed
  with_source_architecture  the run's model made the source's, before the data is prepared
  check_init_from_run       a run's weights fit, a folder's files read, before the data is prepared
  refuse_another_tokenizer  the weights' tokenizer is the run's (jaxgpt/job/setup.py's
                            with_source_vocabulary, once the tokenizer is known: the weights' rows
                            it must fill)
  start_from_pretrained     the state's random parameters replaced by the source's, at step 0
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from types import MappingProxyType

import jax

from jaxgpt.config import ModelConfig, RunConfig, run_config_from_dict
from jaxgpt.config.model import fields_of_kind
from jaxgpt.errors import UserError
from jaxgpt.job.checkpoint import load_latest, recorded_config, saved_steps
from jaxgpt.tokenizers import (
    TOKENIZERS,
    base_tokenizer,
    load_tokenizer,
    make_tokenizer,
    same_tokenizer,
    using_the_runs_copy,
)
from jaxgpt.training.objectives import objective_of

# The fields that decide what the weights compute (not dropout, dtypes or layout): what two sets
# of weights must agree on for one to continue the other
ARCHITECTURE_FIELDS = fields_of_kind("architecture") + fields_of_kind("workbench")

# How positions are read rather than what is stored: a context is extended by changing them
EXTENSIBLE_FIELDS = ("rope_theta", "rope_scaling")

# What a run starting from weights chooses for itself (config/model.py's FIELD_KINDS): every
# other model field is the source's
RUN_CHOICES = fields_of_kind("run")
MOE_RUN_CHOICES = ("capacity_factor", "aux_loss", "z_loss")  # how the experts train, not what they are


def is_run(source: str) -> bool:
    """Whether train.init_from names a jaxgpt run (a workdir with checkpoints) rather than
    Hugging Face weights."""
    return (Path(source) / "checkpoints").is_dir()


def source_model(source: str) -> ModelConfig:
    """The model the weights `source` names, read without the weights: a run's saved config
    (or its newest checkpoint's record), or a Hugging Face folder's config.json with its weight
    files' headers checked (a Hub name is fetched, online)."""
    if is_run(source):
        saved = Path(source) / "config.json"
        if saved.is_file():
            return run_config_from_dict(json.loads(saved.read_text())).model
        return run_config_from_dict(recorded_config(Path(source))).model
    from jaxgpt.hf import check_folder, pretrained_config
    from jaxgpt.hf.files import local_directory

    check_folder(source)
    return pretrained_config(local_directory(source) / "config.json")[0]


def resumed_model(workdir: Path, source: str) -> ModelConfig | None:
    """The model of the run `workdir` holds, where it started from the same weights and has a
    checkpoint to continue from: a resume keeps its own architecture (the source's when it
    started, extended as it was then), and needs the source no more."""
    saved = workdir / "config.json"
    if not source or not saved.is_file() or not saved_steps(workdir):
        return None
    try:
        run = run_config_from_dict(json.loads(saved.read_text()))
    except (ValueError, TypeError, KeyError):  # a damaged config.json: the resume itself says so
        return None
    return run.model if run.train.init_from == source else None


def kept_tokenizer(workdir: Path, run: RunConfig):
    """For a resume: the tokenizer the run was trained with, from its own tokenizer.json, where
    the folder data.tokenizer names has changed since or is gone (a BPE trained again in place,
    a Hugging Face folder overwritten or moved), said in one line; None where that folder still
    gives the same tokenizer (or the tokenizer is named, not a folder), and the corpus is
    prepared as before. So a resume never tokenizes with another vocabulary."""
    saved, kept = workdir / "config.json", workdir / "tokenizer.json"
    if run.data.tokenizer in TOKENIZERS or not (saved.is_file() and kept.is_file()):
        return None
    try:
        trained_with = json.loads(saved.read_text())["data"]["tokenizer"]
    except (ValueError, KeyError, TypeError):  # a damaged config.json: the resume itself says so
        return None
    if trained_with != run.data.tokenizer or not saved_steps(workdir):
        return None
    theirs = base_tokenizer(load_tokenizer(kept))
    source = Path(run.data.tokenizer) / "tokenizer.json"
    try:
        today = make_tokenizer(run.data.tokenizer)
    except UserError:  # the folder is gone, or no longer holds a tokenizer
        today = None
    if today is not None and same_tokenizer(theirs.to_dict(), today.to_dict()):
        return None
    using_the_runs_copy(source, changed=today is not None)
    return theirs


def values_set(config, keys: Collection[str]) -> dict[str, object]:
    """The values a config (a ConfigDict, or a nested dict) holds at `keys` ("model.rope_theta"),
    those it has."""
    values = {}
    for key in keys:
        value = config
        for part in key.split("."):
            value = value.get(part) if hasattr(value, "get") else None
        if value is not None:
            values[key] = value
    return values


def with_source_architecture(
    run: RunConfig,
    overrides: Mapping[str, object] = MappingProxyType({}),
    notes: list[str] | None = None,
    resumed: ModelConfig | None = None,
) -> RunConfig:
    """`run` with its model the train.init_from weights' (the module's docstring says which
    fields, and which `overrides`, the config values set on purpose by key, may move), or
    `resumed`, the model of the run it continues. `notes` gets the fields the config said
    otherwise, and any context extension."""
    source = run.train.init_from
    if not source:
        return run
    theirs, ours = resumed or source_model(source), run.model
    model = theirs.replace(**{f: getattr(ours, f) for f in RUN_CHOICES}, moe=_moe(theirs, ours))
    model = model.replace(**{f: getattr(ours, f) for f in objective_of(ours).own_fields})  # a head of its own
    if ours.block_size < theirs.block_size and theirs.position != "learned":
        model = model.replace(block_size=ours.block_size)  # shorter windows: the positions read as before
    explicit = {key.split(".")[1] for key in overrides if key.startswith("model.")}
    extended = []
    for field in sorted(explicit - set(RUN_CHOICES) - {"moe"}):
        wanted = _wanted(field, ours, theirs, overrides)
        if wanted == getattr(model, field):
            continue
        if field in EXTENSIBLE_FIELDS or (field == "block_size" and theirs.position != "learned"):
            extended.append(f"{field} {_shown(getattr(model, field))} -> {_shown(wanted)}")
            model = model.replace(**{field: wanted})
            continue
        why = " (learned positions have a row per position)" if field == "block_size" else ""
        raise UserError(
            f"--config.model.{field}={_shown(wanted)}, but train.init_from={source}'s weights have "
            f"{field}={_shown(getattr(theirs, field))}{why}: fine-tuning takes the architecture from the weights; drop "
            "the override (only block_size, rope_theta and rope_scaling may move, to extend the context)"
        )
    _refuse_moe_overrides(source, ours, theirs, overrides)
    if notes is not None:
        notes.extend(_said(source, ours, model, explicit, extended))
    return dataclasses.replace(run, model=model)


def _moe(theirs: ModelConfig, ours: ModelConfig):
    """The source's experts, trained with the run's capacity and loss weights where it sets them."""
    if theirs.moe is None or ours.moe is None:
        return theirs.moe
    return dataclasses.replace(theirs.moe, **{f: getattr(ours.moe, f) for f in MOE_RUN_CHOICES})


def _wanted(field: str, ours: ModelConfig, theirs: ModelConfig, overrides: Mapping[str, object]):
    """The value an override asks `field` to take: the config's, or for rope_scaling, the
    source's scaling with the overridden parts of it changed (--config.model.rope_scaling.factor
    alone stretches the source's llama3 scaling further; its kind "" drops it)."""
    parts = {key.split(".")[2]: value for key, value in overrides.items() if key.startswith("model.rope_scaling.")}
    if field != "rope_scaling" or theirs.rope_scaling is None or "kind" in parts:
        return getattr(ours, field)
    return dataclasses.replace(theirs.rope_scaling, **parts)


def _refuse_moe_overrides(source: str, ours: ModelConfig, theirs: ModelConfig, overrides: Mapping[str, object]) -> None:
    for key in overrides:
        part = key.removeprefix("model.moe.")
        if part == key or part in MOE_RUN_CHOICES:
            continue
        wanted = getattr(ours.moe, part, None) if ours.moe else None
        if wanted != (getattr(theirs.moe, part, None) if theirs.moe else None):
            raise UserError(
                f"--config.{key}={wanted!r}, but train.init_from={source}'s weights have "
                f"{'no experts' if theirs.moe is None else f'moe.{part}={getattr(theirs.moe, part)!r}'}: fine-tuning "
                "takes the architecture from the weights; drop the override"
            )


def _said(source: str, ours: ModelConfig, model: ModelConfig, explicit: set[str], extended: list[str]) -> list[str]:
    """The lines a run starting from weights prints: the config's values the weights' replaced,
    and a context extension."""
    lines = []
    replaced = [
        f"{f} {_shown(getattr(ours, f))} -> {_shown(getattr(model, f))}"
        for f in (field.name for field in dataclasses.fields(ModelConfig))
        if f not in explicit and f != "vocab_size" and getattr(ours, f) != getattr(model, f)
    ]
    if replaced:
        shown = ", ".join(replaced[:6]) + (f" and {len(replaced) - 6} more" if len(replaced) > 6 else "")
        lines.append(f"the model is train.init_from={source}'s; it replaces the config's {shown}")
    if extended:
        lines.append(f"extending context: {'; '.join(extended)}")
    return lines


def _shown(value) -> str:
    """A config value as a line shows it: a RoPE scaling by its kind and factor."""
    if hasattr(value, "kind") and hasattr(value, "factor"):
        return f"{value.kind} x{value.factor:g}"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def architecture_mismatches(ours: ModelConfig, theirs: ModelConfig, grows: bool = False) -> list[str]:
    """The fields in which `theirs`' weights do not describe `ours`' model. block_size may
    differ wherever no parameter has its length (every position kind but learned), and RoPE's
    base and scaling may change: together, that is how a trained context is extended. With
    `grows`, ours may have more tokens: special tokens a fine-tuning adds (`grow_vocabulary`)."""
    fields = [
        f
        for f in ARCHITECTURE_FIELDS
        if f not in EXTENSIBLE_FIELDS
        and f not in objective_of(ours).own_fields
        and not (f == "block_size" and ours.position != "learned")
        and not (f == "vocab_size" and grows and ours.vocab_size > theirs.vocab_size)
    ]
    return [
        f"model.{f}={_architecture(ours, f)!r} but the weights have {_architecture(theirs, f)!r}"
        + (" (learned positions have a row per position)" if f == "block_size" else "")
        for f in fields
        if _architecture(ours, f) != _architecture(theirs, f)
    ]


def _architecture(config: ModelConfig, field: str):
    """The value of `field` that the weights depend on: for model.moe, what makes the experts
    (how many, how many a token uses, shared ones, their width, which blocks hold them)."""
    if field != "moe" or config.moe is None:
        return getattr(config, field)
    m = config.moe
    return {k: getattr(m, k) for k in ("experts", "top_k", "shared_experts", "expert_hidden", "every")}


def refuse_unless_fits(source: str, ours: ModelConfig, theirs: ModelConfig, grows: bool = False) -> None:
    if differ := architecture_mismatches(ours, theirs, grows):
        raise UserError(f"train.init_from={source!r} does not fit this config: {'; '.join(differ)}")


def check_init_from_run(run: RunConfig) -> None:
    """Before any slow work (a compile, a workdir): refuse a jaxgpt run's weights that cannot fit
    this model, read from what is saved beside them (its tokenizer was compared by
    with_source_vocabulary). A Hugging Face folder's files were read by with_source_architecture;
    its weights' values are checked when they are loaded."""
    source, step = run.train.init_from, run.train.init_step
    if source and is_run(source):
        refuse_unless_fits(source, run.model, source_model(source), grows=run.data.chat)
        kept = saved_steps(Path(source))
        if step and step not in kept:
            raise UserError(
                f"train.init_step={step}: {source} keeps no checkpoint of step {step}; it keeps "
                f"{', '.join(map(str, kept)) or 'none'} (or 0 for its newest)"
            )
    elif source and step:
        raise UserError(
            f"train.init_step={step} chooses a checkpoint of a jaxgpt run, and train.init_from={source!r} is not "
            "one; leave init_step at 0"
        )


def refuse_another_tokenizer(source: str, theirs, ours) -> None:
    """One line where two tokenizers give text other ids (special tokens added after either aside)."""
    if not same_tokenizer(base_tokenizer(theirs).to_dict(), base_tokenizer(ours).to_dict()):
        raise UserError(
            f"train.init_from={source!r}: that run's tokenizer is not this one's, so its embeddings mean other "
            f"tokens; use its tokenizer, data.tokenizer={source}"
        )


def start_from_pretrained(state, config: RunConfig, source: str, tokenizer=None):
    """`state` with its random parameters replaced by the weights `source` names: a workdir
    of a jaxgpt run (its newest checkpoint, or train.init_step's), or Hugging Face weights. The
    optimizer's zero moments do not depend on the parameters' values. Returns (state, where the
    weights came from)."""
    from jaxgpt.model.transformer import grow_vocabulary, stack_blocks, unstack_blocks

    if is_run(source):
        run, params, their_tokenizer, step = load_latest(Path(source), step=config.train.init_step or None)
        pretrained, origin = run.model, f"{source} (step {step})"
    else:
        from jaxgpt.hf import load_pretrained

        pretrained, params, _ = load_pretrained(source)
        origin, their_tokenizer = source, None
    ours = config.model
    grows = config.data.chat  # the chat template's tokens, added after the weights' vocabulary
    refuse_unless_fits(source, ours, pretrained, grows)
    if their_tokenizer is not None and tokenizer is not None:
        refuse_another_tokenizer(source, their_tokenizer, tokenizer)
    if ours.vocab_size > pretrained.vocab_size:
        params = grow_vocabulary(pretrained, params, ours.vocab_size)
        origin += f", {ours.vocab_size - pretrained.vocab_size} token rows added"
    if pretrained.scan_layers and not ours.scan_layers:
        params = unstack_blocks(params)
    elif ours.scan_layers and not pretrained.scan_layers:
        params = stack_blocks(params, ours.n_layer)
    if objective_of(ours).own_fields:  # the body's weights, and a head of its own as initialised
        params = {name: params.get(name, fresh) for name, fresh in state.params.items()}
        origin += f", its head replaced by a fresh {objective_of(ours).name} head"
    if ours.lora_rank and not pretrained.lora_rank:  # the base's weights, and the adapters as initialised
        from jaxgpt.model.lora import with_fresh_adapters

        params = with_fresh_adapters(params, state.params)
        origin += f", low-rank adapters of rank {ours.lora_rank} beside {', '.join(ours.adapted)}"
    shardings = jax.tree.map(lambda a: a.sharding, state.params)
    return state.replace(params=jax.device_put(params, shardings)), origin
