"""The model an inspecting command looks at (attention_maps, logit_lens, hellaswag): a run's newest
checkpoint, a kept one (--step), its initialisation (--init), or Hugging Face weights
(--init_from); and the prompt it reads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError


def add_flags(parser: argparse.ArgumentParser, prompt: bool = True) -> None:
    """--workdir or --init_from, --step or --init, and (unless prompt=False) --prompt."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", type=Path, help="a train.py run")
    source.add_argument("--init_from", help="Hugging Face weights: a local directory, or a Hub name such as gpt2")
    if prompt:
        parser.add_argument("--prompt", required=True, help="text to run the model on")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--step", type=int, default=None, help="a kept checkpoint's step (default: the newest)")
    when.add_argument("--init", action="store_true", help="the run's parameters at initialisation (step 0)")


def load_model(args) -> tuple[ModelConfig, dict, object, str]:
    """(model config, params, tokenizer, where the weights came from) for the flags above."""
    if args.init_from:
        from jaxgpt.hf import load_pretrained, pretrained_tokenizer

        if args.init or args.step is not None:
            raise UserError(
                "--step and --init choose a checkpoint of a --workdir run; --init_from weights have neither"
            )
        config, params, family = load_pretrained(args.init_from)
        return config, params, pretrained_tokenizer(args.init_from, family), args.init_from
    if args.init:
        import jax

        from jaxgpt.config import run_config_from_dict
        from jaxgpt.model import init_params
        from jaxgpt.tokenizers import load_tokenizer
        from jaxgpt.train_step import run_keys

        saved = args.workdir / "config.json"
        if not saved.is_file():
            raise UserError(f"no config.json in {args.workdir}; --init needs a workdir train.py has started")
        run = run_config_from_dict(json.loads(saved.read_text()))
        params = jax.jit(init_params, static_argnums=0)(run.model, run_keys(run.train.seed)[0])
        return run.model, params, load_tokenizer(args.workdir / "tokenizer.json"), "initialisation (step 0)"
    from jaxgpt.job.checkpoint import load_latest

    run, params, tokenizer, step = load_latest(args.workdir, step=args.step)
    return run.model, params, tokenizer, f"step {step}"


def prompt_ids(tokenizer, prompt: str, config: ModelConfig) -> np.ndarray:
    """The prompt's token ids, refused unless 1 to block_size of them."""
    ids = np.asarray(tokenizer.encode(prompt))
    if not 0 < len(ids) <= config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens; give 1 to {config.block_size} (the model's block_size)")
    return ids
