"""Draw what every attention head looks at: python -m jaxgpt attention-maps --workdir DIR --prompt TEXT

Examples:
  python -m jaxgpt attention-maps --workdir runs/tiny --prompt "if x is None: x = x + 1" --out docs/images/attention.png
  python -m jaxgpt attention-maps --workdir runs/tiny --prompt "if x is None: x = x + 1" --layer 0 --init
  python -m jaxgpt attention-maps --init_from gpt2 --prompt "The cat sat on the mat. The cat"
  python -m jaxgpt attention-maps --workdir runs/seq2seq_reverse --prompt 31415926
  python -m jaxgpt attention-maps --workdir runs/tiny --prompt "if x is None: x = x + 1" --html attention.html
  python -m jaxgpt attention-maps --workdir runs/vit_digits --image 3

One panel per head (a row per layer, or only layer L): query position down, key position
across, brightness the attention weight (or, with --scores, the pre-softmax score, the masked
future left blank). The causal triangle shows as the dark upper right. The weights come from
the run's newest checkpoint, a kept one (--step), the run's initialisation (--init: the
parameters its seed gives at step 0), or Hugging Face weights (--init_from).
It also prints the share of attention the later queries pay the first token, layer by layer
(the attention sink; model.attention_gate is said to drain it).
Patterns worth looking for: a bright first column (an attention sink), a bright diagonal
just below the main one (a previous-token head), and stripes that jump to the token after an
earlier copy of the current one (an induction head; try a prompt that repeats itself).
On an encoder–decoder run (model.encoder_layers, e.g. configs/seq2seq_reverse.py) the prompt is
a source: the model answers it greedily, and its cross-attention is drawn, answer positions down
and source tokens across, with the encoder's and the decoder's self-attention in two more files
beside it (<out>_encoder.png, <out>_decoder.png).
On a Vision Transformer's run (model.patch_size, e.g. configs/vit_digits.py) --image N takes the
run's held-out image N instead of a prompt, and draws where its class token looks: the image,
then a panel per layer and head with the class token's weights on each patch laid over the
patch's pixels, titled with the weight it keeps on itself; the line printed names the true and
the predicted class.
--html PAGE also writes the weights as a page to touch (jaxgpt/lab/views.py): pick a layer and a
head, hover a query token, and the keys it reads are shaded by their weights, listed to three
decimals; one self-contained file, nothing fetched (an encoder–decoder's three beside each other).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
from absl import flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxgpt.commands import cli, inspected  # noqa: E402
from jaxgpt.commands.plot import save_png  # noqa: E402
from jaxgpt.config import ModelConfig  # noqa: E402
from jaxgpt.errors import UserError  # noqa: E402
from jaxgpt.lab.capture import capture, sink_line  # noqa: E402
from jaxgpt.lab.views import attention_view  # noqa: E402

LABELLED_TOKENS = 32  # longer prompts get numbered axes instead of token ticks
PANEL_INCHES, DPI = 2.0, 100  # a panel's side; longer labelled prompts get larger panels
LABEL_INCHES = 0.1  # a token's tick label at 6 points, with its spacing
COLOUR_BAR_INCHES = 0.7  # the figure's one colour bar, to the right of the panels


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
    across (each axis named on the outer panels), labelled by `labels` (and `key_labels` where
    the keys are another sequence, as in cross-attention; titles then start with `kind`), one
    colour bar for all of them."""
    layers, heads, t, s = maps.shape
    key_labels = labels if key_labels is None else key_labels
    side = max(PANEL_INCHES, LABEL_INCHES * max(t, s) + 0.8) if labels is not None else PANEL_INCHES
    figure, grid = plt.subplots(
        layers,
        heads,
        figsize=(side * heads + COLOUR_BAR_INCHES, side * layers),
        dpi=DPI,
        squeeze=False,
        layout="constrained",  # room for the colour bar and the axis names without overlap
    )
    # Weights lie in [0, 1]; scores on one symmetric scale for all panels, the masked ones blank.
    shown = np.ma.masked_invalid(maps)
    limit = float(np.abs(shown).max()) if scores else 1.0
    colours = dict(cmap="RdBu_r", vmin=-limit, vmax=limit) if scores else dict(cmap="viridis", vmin=0.0, vmax=1.0)
    for layer in range(layers):
        for head in range(heads):
            axes = grid[layer, head]
            image = axes.imshow(shown[layer, head], interpolation="nearest", **colours)
            what = "scores" if scores else "weights"
            axes.set_title(f"{kind}layer {first_layer + layer} head {head} {what}", fontsize=8)
            if labels is not None:
                axes.set_xticks(range(s), key_labels, rotation=90, fontsize=6)
                axes.set_yticks(range(t), labels, fontsize=6)
            else:
                axes.tick_params(labelsize=6)
        grid[layer, 0].set_ylabel("query (attends)", fontsize=7)
    for head in range(heads):
        grid[-1, head].set_xlabel("key (attended to)", fontsize=7)
    label = "pre-softmax score (blank: masked)" if scores else "attention weight (0 to 1; a row sums to 1)"
    figure.colorbar(image, ax=grid, fraction=0.5 / (side * heads + COLOUR_BAR_INCHES), label=label)
    what = "pre-softmax scores" if scores else "weights"
    figure.suptitle(f"{kind}attention {what}: each query token's row over the key tokens it may see", fontsize=9)
    return save_png(figure, out)


def encoder_decoder_maps(config: ModelConfig, params, source: np.ndarray, decoder_input: np.ndarray) -> dict:
    """An encoder–decoder's attention weights on one source (s,) read with one decoder input
    (t,), teacher-forced: {"encoder": (encoder_layers, n_head, s, s), "decoder": (n_layer,
    n_head, t, t), "cross": (n_layer, n_head, t, s)}, from one forward pass."""
    from jaxgpt.lab.activations import run_with_cache

    names = {
        "encoder": [f"encoder.blocks.{i}.attn.hook_pattern" for i in range(config.encoder_layers)],
        "decoder": [f"blocks.{i}.attn.hook_pattern" for i in range(config.n_layer)],
        "cross": [f"blocks.{i}.cross_attn.hook_pattern" for i in range(config.n_layer)],
    }
    wanted = [name for group in names.values() for name in group]
    _, cache = run_with_cache(config, params, np.asarray(decoder_input)[None], wanted, sources=np.asarray(source)[None])
    return {group: np.stack([np.asarray(cache[name][0]) for name in in_group]) for group, in_group in names.items()}


def _draw_encoder_decoder(f: flags.FlagValues, config: ModelConfig, params, tokenizer, asked) -> None:
    """attention-maps on an encoder–decoder (a run, or BART's weights): the prompt is a source,
    answered greedily with the caches as `asked` (sampling.Answering) frames it; its
    cross-attention is drawn (answer positions down, source tokens across) in --out, the
    encoder's and the decoder's self-attention beside it."""
    import jax
    import jax.numpy as jnp

    from jaxgpt.model.sampling import SamplingConfig, encode, generate

    source = np.asarray(asked.source(f.prompt))
    if len(source) > config.block_size:
        raise UserError(f"the source is {len(source)} tokens with its ends; give at most {config.block_size}")
    memory = encode(config, params, jnp.asarray(source)[None])
    greedy, start = SamplingConfig(temperature=0.0), jnp.asarray([asked.start], jnp.int32)
    made = generate(
        config, params, start, jax.random.key(0), max_new_tokens=config.block_size - len(asked.start),
        sampling=greedy, eot_id=asked.stop, memory=memory,
    )[0].tolist()  # fmt: skip
    answer = made[: made.index(asked.stop)] if asked.stop in made else made
    decoder_input = np.asarray([*asked.start, *answer])
    maps = encoder_decoder_maps(config, params, source, decoder_input)

    def texts(ids) -> list[str]:
        return token_texts(tokenizer, ids)

    def labels(ids) -> list[str]:
        return tick_labels(token_texts(tokenizer, ids))

    out = Path(f.out) if f.out else Path(f.workdir or ".") / "attention.png"
    written = [draw(maps["cross"], labels(decoder_input), 0, out, key_labels=labels(source), kind="cross ")]
    for side, ids in (("encoder", source), ("decoder", decoder_input)):
        written.append(draw(maps[side], labels(ids), 0, _beside(out, side), kind=f"{side} "))
    if f.html:
        page = Path(f.html)
        for side, name in (
            ("cross", page),
            ("encoder", _beside(page, "encoder")),
            ("decoder", _beside(page, "decoder")),
        ):
            queries = decoder_input if side != "encoder" else source
            keys = texts(source) if side != "decoder" else None
            attention_view(maps[side], texts(queries), keys, title=f"{side} attention: {f.prompt.strip()}").save(name)
    print(f"{f.prompt.strip()} -> {tokenizer.decode(answer)}")
    print(f"wrote {written[0]} (cross-attention: {config.n_layer} decoder layer(s) x {config.n_head} heads), "
          f"{written[1]} and {written[2]} (the encoder's and the decoder's self-attention)")  # fmt: skip
    if f.html:
        print(f"wrote {f.html} and, beside it, its _encoder and _decoder pages (hover a query token)")


def class_token_maps(config: ModelConfig, params, row: dict) -> tuple[np.ndarray, np.ndarray]:
    """(the class token's attention weights (n_layer, n_head, t) over the sequence, position 0
    itself then the patches; its class probabilities) for one image's row (images.image_rows)."""
    captured = capture(config, params, row["inputs"], {"pixels": row["pixels"]})
    logits = captured.logits[0, 0].astype(np.float64)
    probabilities = np.exp(logits - logits.max())
    return captured.weights[:, 0, :, 0, :], probabilities / probabilities.sum()


def draw_over_image(weights: np.ndarray, pixels: np.ndarray, patch: int, title: str, out: Path) -> Path:
    """The image (H, W, C uint8), then a panel per layer and head: the class token's weight on each
    patch (weights (layers, heads, 1 + patches)) laid over the patch's pixels, one colour scale."""
    layers, heads, _ = weights.shape
    h, w, c = pixels.shape
    grey = pixels[..., 0] if c == 1 else pixels
    on_patches = weights[..., 1:].reshape(layers, heads, h // patch, w // patch)
    upsampled = np.kron(on_patches, np.ones((patch, patch)))  # each patch's weight over its pixels
    top = float(on_patches.max())
    figure, grid = plt.subplots(layers, heads + 1, figsize=(1.6 * (heads + 1) + COLOUR_BAR_INCHES, 1.6 * layers),
                                dpi=DPI, squeeze=False, layout="constrained")  # fmt: skip
    for layer in range(layers):
        grid[layer, 0].imshow(grey, cmap="gray", vmin=0, vmax=255)
        grid[layer, 0].set_title("the image", fontsize=7)
        for head in range(heads):
            axes = grid[layer, head + 1]
            axes.imshow(grey, cmap="gray", vmin=0, vmax=255)
            shown = axes.imshow(upsampled[layer, head], cmap="inferno", alpha=0.65, vmin=0.0, vmax=top)
            axes.set_title(f"layer {layer} head {head}; self {weights[layer, head, 0]:.2f}", fontsize=7)
        for axes in grid[layer]:
            axes.set_xticks([]), axes.set_yticks([])
    figure.colorbar(shown, ax=grid, fraction=0.5 / (1.6 * (heads + 1) + COLOUR_BAR_INCHES),
                    label="the class token's attention weight on a patch")  # fmt: skip
    figure.suptitle(title, fontsize=9)
    return save_png(figure, out)


def _draw_image(f: flags.FlagValues) -> None:
    from jaxgpt.config import run_config_from_dict
    from jaxgpt.data import images

    cli.require(f, "workdir", what="the Vision Transformer run whose held-out images --image counts")
    config, params, _, where = inspected.load_model(f, reads_a_prompt=False)
    if not config.patch_size:
        raise UserError("--image draws a Vision Transformer's (model.patch_size) attention; this model reads text: "
                        "pass --prompt instead")  # fmt: skip
    run = run_config_from_dict(json.loads((Path(f.workdir) / "config.json").read_text()))
    held = images.prepare(run.data).split(validation=True)
    if not 0 <= f.image < len(held):
        raise UserError(f"--image {f.image} is out of range: the run holds out images 0 to {len(held) - 1}")
    row = images.image_rows(held, np.asarray([f.image]), config.patch_size)
    weights, probabilities = class_token_maps(config, params, row)
    truth, guess = held.names[held.classes[f.image]], held.names[int(probabilities.argmax())]
    title = (f"held-out image {f.image} ({where}): class {truth}, predicted {guess} at p={probabilities.max():.2f}; "
             "where the class token looks")  # fmt: skip
    out = Path(f.out) if f.out else Path(f.workdir) / f"attention_image_{f.image}.png"
    out = draw_over_image(weights, held.pixels[f.image], config.patch_size, title, out)
    print(f"wrote {out} ({where}, held-out image {f.image} of {run.data.source}: class {truth}, predicted {guess} "
          f"at p={probabilities.max():.2f}; {weights.shape[0]} layer(s) x {weights.shape[1]} heads)")  # fmt: skip


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    f = inspected.parse_flags(argv, __doc__, _define_flags)
    if f.image is not None:
        if f.prompt is not None:
            raise UserError("--image and --prompt both say what the model reads; pass one")
        return _draw_image(f)
    if f.html and f.scores:
        raise UserError("--html shows attention weights; drop --scores for it (the PNG draws the scores)")
    config, params, tokenizer, source = inspected.load_model(f)
    if config.token_mixer != "attention":
        raise UserError(
            f"this model mixes positions by model.token_mixer={config.token_mixer!r}, which has no attention to draw; "
            "its sites (python -m jaxgpt activations) show what the convolution reads"
        )
    if config.encoder_layers:
        return _draw_encoder_decoder(f, config, params, tokenizer, inspected.answering(tokenizer, f.init_from))
    if f.layer is not None and not 0 <= f.layer < config.n_layer:
        raise UserError(f"--layer {f.layer} is out of range; the model has layers 0 to {config.n_layer - 1}")
    ids = inspected.prompt_ids(tokenizer, f.prompt, config)
    maps = attention_maps(config, params, ids, scores=f.scores)
    first = f.layer or 0
    if f.layer is not None:
        maps = maps[f.layer : f.layer + 1]
    tokens = token_texts(tokenizer, ids)
    labels = tick_labels(tokens) if len(ids) <= LABELLED_TOKENS else None
    out = Path(f.out) if f.out else Path(f.workdir or ".") / "attention.png"
    out = draw(maps, labels, first, out, scores=f.scores)
    print(f"wrote {out} ({source}, {len(ids)} tokens, {maps.shape[0]} layer(s) x {maps.shape[1]} heads)")
    if not f.scores and len(ids) > 1:
        print(sink_line(maps[:, None]))
    if f.html:
        page = attention_view(maps, tokens, title=f"attention ({source}): {f.prompt}", first_layer=first).save(f.html)
        print(f"wrote {page} (hover a query token: the weights on each key)")


def _define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_integer("layer", None, "Draw only this layer (0-based).", flag_values=f)
    flags.DEFINE_bool("scores", False, "Draw the pre-softmax scores instead of the weights.", flag_values=f)
    flags.DEFINE_string("out", None, "PNG to write (default: <workdir>/attention.png).", flag_values=f)
    flags.DEFINE_string("html", None, "Also write the weights as an interactive page, this HTML file.", flag_values=f)
    flags.DEFINE_integer("image", None, "A Vision Transformer's held-out image, by index, instead of --prompt.",
                         flag_values=f)  # fmt: skip


def token_texts(tokenizer, ids) -> list[str]:
    """Each token's own text (a BPE token may be part of a character, shown as its replacement)."""
    return [tokenizer.decode([int(i)]) for i in ids]


def tick_labels(texts: list[str]) -> list[str]:
    """Tokens as tick labels: escaped, so a newline or a tab shows as one."""
    return [repr(text)[1:-1] for text in texts]


def _beside(path: Path, side: str) -> Path:
    return path.with_name(f"{path.stem}_{side}{path.suffix}")


if __name__ == "__main__":
    main()
