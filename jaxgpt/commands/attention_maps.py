"""Draw what every attention head looks at: python -m jaxgpt attention-maps --workdir DIR --prompt TEXT

Examples:
  python -m jaxgpt attention-maps --workdir runs/tiny --prompt "if x is None: x = x + 1" --out docs/images/attention.png
  python -m jaxgpt attention-maps --workdir runs/tiny --prompt "if x is None: x = x + 1" --layer 0 --init
  python -m jaxgpt attention-maps --init_from gpt2 --prompt "The cat sat on the mat. The cat"

One panel per head (a row per layer, or only layer L): query position down, key position
across, brightness the attention weight (or, with --scores, the pre-softmax score, the masked
future left blank). The causal triangle shows as the dark upper right. The weights come from
the run's newest checkpoint, a kept one (--step), the run's initialisation (--init: the
parameters its seed gives at step 0), or Hugging Face weights (--init_from).
Patterns worth looking for: a bright first column (an attention sink), a bright diagonal
just below the main one (a previous-token head), and stripes that jump to the token after an
earlier copy of the current one (an induction head; try a prompt that repeats itself).
On an encoder–decoder saved by `python -m jaxgpt seq2seq --workdir DIR`, the prompt is a source
of digits: the model answers it, and its cross-attention is drawn, answer positions down and
source digits across.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from absl import flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxgpt.capture import capture  # noqa: E402
from jaxgpt.commands import cli, inspected  # noqa: E402
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


def draw(
    maps: np.ndarray,
    labels: list[str] | None,
    first_layer: int,
    out: Path,
    scores: bool = False,
    key_labels: list[str] | None = None,
    kind: str = "",
) -> Path:
    """A panel per layer and head of maps (layers, heads, queries, keys), queries down and keys
    across, labelled by `labels` (and `key_labels` where the keys are another sequence, as in
    cross-attention; titles then start with `kind`)."""
    layers, heads, t, s = maps.shape
    key_labels = labels if key_labels is None else key_labels
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
            axes.set_title(f"{kind}layer {first_layer + layer} head {head} {what}", fontsize=7)
            if labels is not None:
                axes.set_xticks(range(s), key_labels, rotation=90, fontsize=5)
                axes.set_yticks(range(t), labels, fontsize=5)
            else:
                axes.tick_params(labelsize=5)
    return save_png(figure, out)


def draw_cross_attention(config: ModelConfig, params, source: np.ndarray, answer: np.ndarray, out: Path) -> Path:
    """An encoder–decoder's cross-attention (jaxgpt/encoder_decoder.py) on one source (s,) and
    the answer (t,) it is read with: rows are the decoder's positions (BOS, then the answer
    but its last token), columns the source's."""
    from jaxgpt.seq2seq_tasks import cross_attention_weights

    weights = cross_attention_weights(config, params, np.asarray(source)[None], np.asarray(answer)[None])[:, 0]
    rows = ["BOS", *map(str, np.asarray(answer)[:-1])]
    return draw(weights, rows, 0, out, key_labels=list(map(str, np.asarray(source))), kind="cross ")


def _draw_seq2seq(f: flags.FlagValues) -> None:
    """attention-maps on a `seq2seq --workdir` model: the prompt is a source of digits, answered
    greedily, and the cross-attention is drawn."""
    import jax.numpy as jnp

    from jaxgpt import seq2seq_tasks as tasks

    workdir = Path(f.workdir)
    config, task, params = tasks.load(workdir)
    length = config.block_size
    if not (f.prompt or "").isdigit() or len(f.prompt) != length:
        example = "31415926535897932384"[:length]
        raise UserError(f"--prompt {f.prompt!r}: this {task} model reads exactly {length} digits, e.g. {example}")
    source = np.array([int(c) for c in f.prompt], np.int32)
    answer = np.asarray(tasks.greedy_decode(config, params, jnp.asarray(source)[None], length))[0]
    out = draw_cross_attention(config, params, source, answer, Path(f.out) if f.out else workdir / "attention.png")
    print(f"{task}: {f.prompt} -> {''.join(map(str, answer))}")
    print(f"wrote {out} (cross-attention: {config.n_layer} decoder layer(s) x {config.n_head} heads)")


def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    cli.run(lambda: _draw_maps(argv))


def _draw_maps(argv: list[str] | None) -> None:
    argv, f = cli.command_flags(argv)
    inspected.define_flags(f)
    flags.DEFINE_integer("layer", None, "Draw only this layer (0-based).", flag_values=f)
    flags.DEFINE_bool("scores", False, "Draw the pre-softmax scores instead of the weights.", flag_values=f)
    flags.DEFINE_string("out", None, "PNG to write (default: <workdir>/attention.png).", flag_values=f)
    cli.parse_flags(argv, __doc__, f)
    from jaxgpt.seq2seq_tasks import is_saved

    if f.workdir and is_saved(Path(f.workdir)):  # an encoder-decoder saved by seq2seq --workdir
        return _draw_seq2seq(f)
    config, params, tokenizer, source = inspected.load_model(f)
    if f.layer is not None and not 0 <= f.layer < config.n_layer:
        raise UserError(f"--layer {f.layer} is out of range; the model has layers 0 to {config.n_layer - 1}")
    ids = inspected.prompt_ids(tokenizer, f.prompt, config)
    maps = attention_maps(config, params, ids, scores=f.scores)
    first = f.layer or 0
    if f.layer is not None:
        maps = maps[f.layer : f.layer + 1]
    labels = [repr(tokenizer.decode([int(i)]))[1:-1] for i in ids] if len(ids) <= LABELLED_TOKENS else None
    out = Path(f.out) if f.out else Path(f.workdir or ".") / "attention.png"
    out = draw(maps, labels, first, out, scores=f.scores)
    print(f"wrote {out} ({source}, {len(ids)} tokens, {maps.shape[0]} layer(s) x {maps.shape[1]} heads)")


if __name__ == "__main__":
    main()
