"""Draw what every attention head looks at:
python -m jaxgpt.attention_maps --workdir DIR --prompt TEXT [--layer L] [--out maps.png]

One panel per head (a row per layer, or only layer L): query position down, key position
across, brightness the attention weight. The causal triangle shows as the dark upper right.
Patterns worth looking for: a bright first column (an attention sink), a bright diagonal
just below the main one (a previous-token head), and stripes that jump to the token after an
earlier copy of the current one (an induction head; try a prompt that repeats itself).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxgpt.commands import cli  # noqa: E402
from jaxgpt.commands.plot import save_png  # noqa: E402
from jaxgpt.config import ModelConfig  # noqa: E402
from jaxgpt.errors import UserError  # noqa: E402
from jaxgpt.job.checkpoint import load_latest  # noqa: E402
from jaxgpt.model import GPT, unstack_blocks  # noqa: E402

LABELLED_TOKENS = 32  # longer prompts get numbered axes instead of token ticks
PANEL_INCHES, DPI = 2.0, 100


def attention_maps(config: ModelConfig, params, tokens: np.ndarray) -> np.ndarray:
    """(n_layer, n_head, t, t) float32 attention weights of one sequence `tokens` (t,).

    Runs the model unscanned in float32 with the "intermediates" collection mutable, which
    makes each attention layer sow its softmax weights (jaxgpt/attention.py)."""
    if config.scan_layers:
        params = unstack_blocks(params)
    config = config.replace(scan_layers=False, dtype="float32", remat="none")

    @jax.jit
    def weights(params, tokens):
        _, state = GPT(config).apply({"params": params}, tokens[None], mutable=["intermediates"])
        layers = [state["intermediates"][f"block_{i}"]["attn"]["attention_weights"][0] for i in range(config.n_layer)]
        # each (1, kv_heads, group, t, t): query head h = kv_head * group + g, as in the model
        return jnp.stack([w.reshape(config.n_head, *w.shape[-2:]) for w in layers])

    return np.asarray(weights(params, jnp.asarray(tokens, jnp.int32)))


def draw(maps: np.ndarray, labels: list[str] | None, first_layer: int, out: Path) -> Path:
    layers, heads, t, _ = maps.shape
    figure, grid = plt.subplots(
        layers, heads, figsize=(PANEL_INCHES * heads, PANEL_INCHES * layers), dpi=DPI, squeeze=False
    )
    for layer in range(layers):
        for head in range(heads):
            axes = grid[layer, head]
            axes.imshow(maps[layer, head], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            axes.set_title(f"layer {first_layer + layer} head {head}", fontsize=7)
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
    parser.add_argument("--workdir", type=Path, required=True, help="a train.py run with a checkpoint")
    parser.add_argument("--prompt", required=True, help="text to run the model on")
    parser.add_argument("--layer", type=int, default=None, help="draw only this layer (0-based)")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: <workdir>/attention.png)")
    args = parser.parse_args(argv)
    run, params, tokenizer, step = load_latest(args.workdir)
    config = run.model
    if args.layer is not None and not 0 <= args.layer < config.n_layer:
        raise UserError(f"--layer {args.layer} is out of range; the model has layers 0 to {config.n_layer - 1}")
    ids = tokenizer.encode(args.prompt)
    if not 0 < len(ids) <= config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens; give 1 to {config.block_size} (the model's block_size)")
    maps = attention_maps(config, params, np.asarray(ids))
    first = args.layer or 0
    if args.layer is not None:
        maps = maps[args.layer : args.layer + 1]
    labels = [repr(tokenizer.decode([i]))[1:-1] for i in ids] if len(ids) <= LABELLED_TOKENS else None
    out = draw(maps, labels, first, args.out or args.workdir / "attention.png")
    print(f"wrote {out} (step {step}, {len(ids)} tokens, {maps.shape[0]} layer(s) x {maps.shape[1]} heads)")


if __name__ == "__main__":
    main()
