"""The model an inspecting command looks at (attention_maps, logit_lens, fill, hellaswag): a run's newest
checkpoint, a kept one (--step), its initialisation (--init), or Hugging Face weights
(--init_from); and the prompt it reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from absl import flags

from jaxgpt.commands import cli
from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError


def define_flags(f: flags.FlagValues, prompt: bool = True) -> None:
    """--workdir or --init_from, --step or --init, and (unless prompt=False) --prompt."""
    flags.DEFINE_string("workdir", None, "A train.py run.", flag_values=f)
    flags.DEFINE_string(
        "init_from", None, "Hugging Face weights: a local directory, or a Hub name such as gpt2.", flag_values=f
    )
    if prompt:
        flags.DEFINE_string("prompt", None, "Text to run the model on.", flag_values=f)
    flags.DEFINE_integer("step", None, "A kept checkpoint's step (default: the newest).", flag_values=f)
    flags.DEFINE_bool("init", False, "The run's parameters at initialisation (step 0).", flag_values=f)


def parse_flags(
    argv: list[str] | None, usage: str, define: Callable[[flags.FlagValues], None], prompt: bool = True
) -> flags.FlagValues:
    """An inspecting command's flags: the ones above, the command's own (`define`), parsed."""
    argv, f = cli.command_flags(argv)
    define_flags(f, prompt)
    define(f)
    cli.parse_flags(argv, usage, f)
    return f


def load_model(f: flags.FlagValues, reads_a_prompt: bool = True) -> tuple[ModelConfig, dict, object, str]:
    """(model config, params, tokenizer, where the weights came from) for the flags above;
    one line for a combination that names no model, or two (and, where the command reads a
    prompt, none)."""
    cli.require(f, "workdir", "init_from", what="the model to look at: a train.py run, or Hugging Face weights")
    if "prompt" in f and reads_a_prompt:
        cli.require(f, "prompt", what="the text to run the model on")
    if f.init and f.step is not None:
        raise UserError("--step and --init both choose the checkpoint; pass one")
    return load(Path(f.workdir) if f.workdir else None, f.init_from, f.step, f.init)


def load(workdir: Path | None, init_from: str | None = None, step: int | None = None, init: bool = False):
    """load_model's answer for the model named: `init_from`'s weights, or `workdir`'s
    checkpoint of `step` (the newest if None), or its initialisation."""
    if init_from:
        from jaxgpt.hf import load_pretrained, pretrained_tokenizer

        if init or step is not None:
            raise UserError(
                "--step and --init choose a checkpoint of a --workdir run; --init_from weights have neither"
            )
        config, params, family = load_pretrained(init_from)
        return config, params, pretrained_tokenizer(init_from, family), init_from
    if init:
        import jax

        from jaxgpt.config import run_config_from_dict
        from jaxgpt.model.transformer import init_params
        from jaxgpt.tokenizers import load_tokenizer
        from jaxgpt.training.train_step import run_keys

        saved = workdir / "config.json"
        if not saved.is_file():
            raise UserError(f"no config.json in {workdir}; --init needs a workdir train.py has started")
        run = run_config_from_dict(json.loads(saved.read_text()))
        params = jax.jit(init_params, static_argnums=0)(run.model, run_keys(run.train.seed)[0])
        return run.model, params, load_tokenizer(workdir / "tokenizer.json"), "initialisation (step 0)"
    from jaxgpt.job.checkpoint import load_latest

    run, params, tokenizer, step = load_latest(workdir, step=step)
    return run.model, params, tokenizer, f"step {step}"


def answering(tokenizer, init_from: str | None = None):
    """How the commands ask an encoder–decoder a source: as a run trained on pairs here was
    taught (its separator), or as BART's folder says (its config.json's tokens)."""
    if init_from:
        from jaxgpt.hf.bart import answering as asking_bart
        from jaxgpt.hf.files import local_directory, read_json

        return asking_bart(read_json(local_directory(init_from) / "config.json", ""), tokenizer)
    from jaxgpt.data.pairs import answering as asking_a_run

    return asking_a_run(tokenizer)


def prompt_ids(tokenizer, prompt: str, config: ModelConfig) -> np.ndarray:
    """The prompt's token ids, refused unless 1 to block_size of them (and for a model that
    reads images, which no prompt is)."""
    if config.patch_size:
        raise UserError(
            "this model reads images (model.patch_size), not a prompt: python -m jaxgpt attention-maps --workdir ... "
            "--image N draws one of its held-out images"
        )
    ids = np.asarray(tokenizer.encode(prompt))
    if not 0 < len(ids) <= config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens; give 1 to {config.block_size} (the model's block_size)")
    return ids
