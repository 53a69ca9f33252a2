"""Draw what every attention head looks at:
python -m jaxgpt.attention_maps --workdir DIR --prompt TEXT [--step N | --init] [--layer L] [--scores] [--out maps.png]
python -m jaxgpt.attention_maps --init_from gpt2 --prompt TEXT ...

One panel per head (a row per layer, or only layer L): query position down, key position
across, brightness the attention weight (or, with --scores, the pre-softmax score, the masked
future left blank). The causal triangle shows as the dark upper right. The weights come from
the run's newest checkpoint, a kept one (--step), the run's initialisation (--init: the
parameters its seed gives at step 0), or Hugging Face weights (--init_from).
Patterns worth looking for: a bright first column (an attention sink), a bright diagonal
just below the main one (a previous-token head), and stripes that jump to the token after an
earlier copy of the current one (an induction head; try a prompt that repeats itself).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxgpt.capture import capture  # noqa: E402
from jaxgpt.commands import cli  # noqa: E402
from jaxgpt.commands.plot import save_png  # noqa: E402
from jaxgpt.config import ModelConfig  # noqa: E402
from jaxgpt.errors import UserError  # noqa: E402

LABELLED_TOKENS = 32  # longer prompts get numbered axes instead of token ticks
PANEL_INCHES, DPI = 2.0, 100


def attention_maps(config: ModelConfig, params, tokens: np.ndarray, scores: bool = False) -> np.ndarray:
    """(n_layer, n_head, t, t) float32 attention weights (or pre-softmax scores, -inf where
    masked) of one sequence `tokens` (t,), from one captured forward pass."""
    captured = capture(config, params, np.asarray(tokens)[None])
    return (captured.scores if scores else captured.weights)[:, 0]


def load_model(args) -> tuple[ModelConfig, dict, object, str]:
    """(model config, params, tokenizer, where the weights came from) for the command's flags."""
    if args.init_from:
        from jaxgpt.hf import load_pretrained, pretrained_tokenizer

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


def draw(maps: np.ndarray, labels: list[str] | None, first_layer: int, out: Path, scores: bool = False) -> Path:
    layers, heads, t, _ = maps.shape
    figure, grid = plt.subplots(
        layers, heads, figsize=(PANEL_INCHES * heads, PANEL_INCHES * layers), dpi=DPI, squeeze=False
    )
    # Weights lie in [0, 1]; scores on one symmetric scale for all panels, the masked ones blank.
    shown = np.ma.masked_invalid(maps)
    limit = float(np.abs(shown).max()) if scores else 1.0
    colours = dict(cmap="RdBu_r", vmin=-limit, vmax=limit) if scores else dict(cmap="viridis", vmin=0.0, vmax=1.0)
    for layer in range(layers):
        for head in range(heads):
            axes = grid[layer, head]
            axes.imshow(shown[layer, head], interpolation="nearest", **colours)
            what = "scores" if scores else "weights"
            axes.set_title(f"layer {first_layer + layer} head {head} {what}", fontsize=7)
            if labels is not None:
                axes.set_xticks(range(t), labels, rotation=90, fontsize=5)
                axes.set_yticks(range(t), labels, fontsize=5)
            else:
                axes.tick_params(labelsize=5)
    return save_png(figure, out)


def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    cli.run(lambda: _draw_maps(argv))


def _draw_maps(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jaxgpt.attention_maps", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", type=Path, help="a train.py run")
    source.add_argument("--init_from", help="Hugging Face weights: a local directory, or a Hub name such as gpt2")
    parser.add_argument("--prompt", required=True, help="text to run the model on")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--step", type=int, default=None, help="a kept checkpoint's step (default: the newest)")
    when.add_argument("--init", action="store_true", help="the run's parameters at initialisation (step 0)")
    parser.add_argument("--layer", type=int, default=None, help="draw only this layer (0-based)")
    parser.add_argument("--scores", action="store_true", help="draw the pre-softmax scores instead of the weights")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: <workdir>/attention.png)")
    args = parser.parse_args(argv)
    if args.init_from and (args.init or args.step is not None):
        raise UserError("--step and --init choose a checkpoint of a --workdir run; --init_from weights have neither")
    config, params, tokenizer, source = load_model(args)
    if args.layer is not None and not 0 <= args.layer < config.n_layer:
        raise UserError(f"--layer {args.layer} is out of range; the model has layers 0 to {config.n_layer - 1}")
    ids = tokenizer.encode(args.prompt)
    if not 0 < len(ids) <= config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens; give 1 to {config.block_size} (the model's block_size)")
    maps = attention_maps(config, params, np.asarray(ids), scores=args.scores)
    first = args.layer or 0
    if args.layer is not None:
        maps = maps[args.layer : args.layer + 1]
    labels = [repr(tokenizer.decode([i]))[1:-1] for i in ids] if len(ids) <= LABELLED_TOKENS else None
    out = draw(maps, labels, first, args.out or (args.workdir or Path(".")) / "attention.png", scores=args.scores)
    print(f"wrote {out} ({source}, {len(ids)} tokens, {maps.shape[0]} layer(s) x {maps.shape[1]} heads)")


if __name__ == "__main__":
    main()
