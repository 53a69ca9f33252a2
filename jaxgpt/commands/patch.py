"""Which layers, positions and heads carry a prediction (activation patching):
python -m jaxgpt patch --workdir DIR --clean TEXT --corrupted TEXT --answer TOKEN --wrong TOKEN [--out DIR]

Examples:
  python -m jaxgpt patch --workdir runs/induction --clean kvbrmqxdwpkvbrmqxdw \\
      --corrupted kvbrmqxdypkvbrmqxdw --answer p --wrong y --out runs/induction/patching
  python -m jaxgpt patch --init_from gpt2 --clean "When Mary and John went to the store, John gave a drink to" \\
      --corrupted "When Mary and John went to the store, Mary gave a drink to" --answer " Mary" --wrong " John"

The first example's model has an induction circuit to find (python train.py --config
configs/induction.py; docs/lab.md section 13). The clean prompt makes the model prefer --answer
to --wrong as its next token; the corrupted one,
changed where it matters, does not. Each activation of the clean run is copied into the
corrupted run in turn, and the command prints how much of the logit difference
logit(answer) - logit(wrong) it brings back (1: all, 0: none; jaxgpt/lab/patching.py): per layer
and position for the residual stream entering each block (resid_pre), attention's output
(attn_out) and the MLP's (mlp_out), and per layer and head for each head's output. Then the
same table estimated from one backward pass (attribution patching) and how far it is from the
real one, and the clean difference split into what each head and MLP writes (direct logit
attribution). Prompts of different lengths are padded (the batch contract's segments); patching
position p copies the clean run's position p. --out DIR gets patching.png (a heatmap per
table), patching.html (the same to touch: hover a cell for its value) and patching.json.

Each fraction divides by the clean run's difference less the corrupted run's: where the model
does not prefer --answer on the clean prompt, or the two runs differ by less than a nat, the
command says so in a line (and on the pictures), for the fractions then measure noise.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
from absl import flags

from jaxgpt.commands import cli, inspected
from jaxgpt.commands.attention_maps import tick_labels, token_texts
from jaxgpt.commands.plot import plt, save_png
from jaxgpt.errors import UserError, warn
from jaxgpt.lab import patching
from jaxgpt.lab.views import patching_view

CELL = 7  # characters per column of the printed tables
# Nats of logit difference between the clean and corrupted runs below which the fractions mean
# little: each is (patched - corrupted) / (clean - corrupted), and a patched run's own difference
# moves by tenths of a nat for reasons of its own, so a denominator under 1 (a factor of e in the
# odds) turns those into whole fractions
MEANINGFUL_GAP = 1.0
WHAT = {
    "resid_pre": "the residual stream entering each block",
    "attn_out": "what attention writes",
    "mlp_out": "what the MLP writes",
    "head_out": "each head's output before W_O, at every position",
}


def one_token(tokenizer, text: str, flag: str) -> int:
    """The id of `text`, refused unless it is exactly one token."""
    ids = list(tokenizer.encode(text))
    if len(ids) != 1:
        raise UserError(
            f"--{flag} {text!r} is {len(ids)} tokens; give the text of one token (a BPE word often starts with a space)"
        )
    return int(ids[0])


def doubts(clean: float, corrupted: float, answer: str, wrong: str) -> list[str]:
    """What makes a patching's fractions mean little, a line each: a clean run that does not
    prefer the answer, and runs that barely differ on the metric."""
    lines = []
    if clean <= 0:
        lines.append(
            f"the clean prompt does not prefer {answer!r} to {wrong!r} (logit difference {clean:.3f}): the model lacks "
            "the behaviour patching looks for here, so there is nothing of it to locate"
        )
    if abs(clean - corrupted) < MEANINGFUL_GAP:
        lines.append(
            f"the clean and corrupted runs differ by {abs(clean - corrupted):.3f} in logit difference, under "
            f"{MEANINGFUL_GAP:g} nat: every fraction divides by it, so they measure noise; choose prompts the model "
            "tells apart (docs/lab.md section 13 has one)"
        )
    return lines


def columns(kind: str, labels: list[str], heads: int) -> list[str]:
    return [f"head {h}" for h in range(heads)] if patching.SWEEPS[kind][1] == "head" else labels


def table(name: str, values: np.ndarray, labels: list[str], shown: int) -> list[str]:
    """A patching table as text: a row per layer, the last `shown` columns."""
    first = max(0, values.shape[1] - shown)
    lines = [f"{name}: {WHAT[name]}"]
    lines.append(" " * 8 + "".join(label[: CELL - 1].rjust(CELL) for label in labels[first:]))
    for layer, row in enumerate(values):
        lines.append(f"layer {layer:<2}" + "".join(f"{v:>{CELL}.2f}" for v in row[first:]))
    return lines


def draw(tables: dict[str, np.ndarray], labels: dict[str, list[str]], title: str, out: Path) -> Path:
    """A heatmap per table, one above the other, on one blue-red scale symmetric about 0: layers
    down, the prompt's positions (or the heads) across; the title names the two runs' logit
    differences each fraction is measured between, and any doubt about them."""
    limit = max(1.0, max(float(np.abs(v).max()) for v in tables.values()))
    widest = max(v.shape[1] for v in tables.values())
    heights = [0.3 * v.shape[0] + 0.9 for v in tables.values()]
    figure, grid = plt.subplots(
        len(tables),
        1,
        figsize=(max(4.5, 0.2 * widest + 2.5), sum(heights) + 0.6),
        dpi=100,
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": heights},
    )
    for axes, (name, values) in zip(grid[:, 0], tables.items(), strict=True):
        image = axes.imshow(values, cmap="RdBu", vmin=-limit, vmax=limit, interpolation="nearest", aspect="auto")
        axes.set_title(f"{name}: {WHAT[name]}", fontsize=8)
        axes.set_xticks(range(values.shape[1]), labels[name], fontsize=6)
        axes.set_yticks(range(values.shape[0]), [f"layer {i}" for i in range(values.shape[0])], fontsize=7)
        across = "head" if patching.SWEEPS[name][1] == "head" else "position (the clean prompt's token)"
        axes.set_xlabel(across, fontsize=7)
        axes.set_ylabel("layer", fontsize=7)
    width = int(figure.get_figwidth() * 14)  # characters of a 9-point title a line
    figure.suptitle("\n".join(textwrap.fill(line, width) for line in title.splitlines()), fontsize=9)
    figure.colorbar(image, ax=grid, label="fraction of the logit difference restored", shrink=0.8)
    return save_png(figure, out)


def attribution_summary(full: patching.Patching, estimate: patching.Patching) -> str:
    """How far the one-backward-pass estimate is from the real table, per sweep."""
    parts = []
    for kind, values in full.restored.items():
        gap = float(np.abs(values - estimate.restored[kind]).max())
        parts.append(f"{kind} {gap:.2f}")
    return "attribution patching (one backward pass) estimates the same tables; largest gap from them: " + ", ".join(
        parts
    )


def attribution_lines(dla: patching.LogitAttribution, top: int = 6) -> list[str]:
    """The largest parts of the direct logit attribution."""
    parts = {"embeddings": dla.embeddings}
    for layer, row in enumerate(dla.heads):
        parts |= {f"layer {layer} head {h}": float(v) for h, v in enumerate(row)}
        parts[f"layer {layer} MLP"] = float(dla.mlp[layer])
    largest = sorted(parts.items(), key=lambda item: -abs(item[1]))[:top]
    shown = ", ".join(f"{name} {value:+.2f}" for name, value in largest)
    return [f"direct logit attribution of the clean difference {dla.total:.3f} (largest parts): {shown}"]


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    f = inspected.parse_flags(argv, __doc__, _define_flags, prompt=False)
    cli.require(f, "clean", what="the prompt the model gets right")
    cli.require(f, "corrupted", what="the prompt changed where the answer depends on it")
    for name in ("answer", "wrong"):
        cli.require(f, name, what="the next token compared: --answer the clean prompt's, --wrong the corrupted's")
    config, params, tokenizer, source = inspected.load_model(f)
    where = f.workdir or f.init_from
    cli.refuse_unless_served(config, "patch", where, "patching compares next-token predictions")
    cli.refuse_an_encoder_decoder(config, where, "patching reads a decoder given text alone")
    clean = inspected.prompt_ids(tokenizer, f.clean, config)
    corrupted = inspected.prompt_ids(tokenizer, f.corrupted, config)
    answer, wrong = one_token(tokenizer, f.answer, "answer"), one_token(tokenizer, f.wrong, "wrong")
    if answer == wrong:
        raise UserError("--answer and --wrong are the same token; the logit difference between them is always 0")
    prompts = patching.prompt_pair(clean, corrupted, answer, wrong)
    clean_diff, corrupted_diff = patching.logit_differences(config, params, prompts)
    if abs(clean_diff - corrupted_diff) < 1e-6:
        raise UserError(
            f"the clean and corrupted prompts give the same logit difference ({clean_diff:.4f}): nothing to restore; "
            "change the corrupted prompt where the answer depends on it"
        )
    full = patching.activation_patching(config, params, prompts)
    estimate = patching.attribution_patching(config, params, prompts)
    labels = tick_labels(token_texts(tokenizer, clean)) + ["·"] * (prompts.tokens.shape[1] - len(clean))
    print(
        f"patching ({source}; {len(clean)} and {len(corrupted)} tokens): {f.answer!r} against {f.wrong!r} "
        f"at the last token; logit difference clean {full.clean:.3f}, corrupted {full.corrupted:.3f}"
    )
    warned = doubts(full.clean, full.corrupted, f.answer, f.wrong)
    for line in warned:
        warn(line)
    where_shown = "" if prompts.tokens.shape[1] <= f.positions else f" (the last {f.positions} positions: --positions)"
    print(f"fraction of the difference restored by patching each activation (1: all, 0: none){where_shown}")
    column_labels = {kind: columns(kind, labels, config.n_head) for kind in full.restored}
    for kind, values in full.restored.items():
        print("\n".join(table(kind, values, column_labels[kind], f.positions)))
    print(attribution_summary(full, estimate))
    if patching.attribution_refusal(config) is None:
        dla = patching.direct_logit_attribution(config, params, prompts.tokens[:1], int(prompts.last[0]), answer, wrong)
        print("\n".join(attribution_lines(dla)))
    written = write_outputs(f, source, full, estimate, column_labels, warned)
    print(f"wrote {', '.join(map(str, written))}")


def write_outputs(f, source: str, full, estimate, column_labels: dict, warned: list[str]) -> list[Path]:
    """The patching tables drawn (PNG), as a page to touch (HTML) and as numbers (JSON), in
    --out (default: <workdir>/patching), each titled with the logit differences and warnings."""
    out = Path(f.out) if f.out else Path(f.workdir or ".") / "patching"
    title = f"patching ({source}): {f.answer!r} vs {f.wrong!r}; logit difference clean {full.clean:.3f}, " + (
        f"corrupted {full.corrupted:.3f}" + ("\nwarning: " + "; ".join(warned) if warned else "")
    )
    note = f"logit difference clean {full.clean:.3f}, corrupted {full.corrupted:.3f}; a cell: the fraction restored"
    note = " ".join(f"Warning: {line}." for line in warned) + (" " if warned else "") + note
    written = [draw(full.restored, column_labels, title, out / "patching.png")]
    with cli.writing(out / "patching.html", "a folder"):
        written.append(patching_view(full.restored, column_labels, title=title, note=note).save(out / "patching.html"))
    record = {
        "source": source,
        "clean": f.clean,
        "corrupted": f.corrupted,
        "answer": f.answer,
        "wrong": f.wrong,
        "logit_difference": {"clean": full.clean, "corrupted": full.corrupted},
        "columns": column_labels,
        "restored": {kind: values.tolist() for kind, values in full.restored.items()},
        "attribution_patching": {kind: values.tolist() for kind, values in estimate.restored.items()},
    }
    with cli.writing(out / "patching.json", "a folder"):
        (out / "patching.json").write_text(json.dumps(record, indent=1))
    return [*written, out / "patching.json"]


def _define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_string("clean", None, "The prompt the model answers right.", flag_values=f)
    flags.DEFINE_string("corrupted", None, "The prompt changed where the answer depends on it.", flag_values=f)
    flags.DEFINE_string("answer", None, "The clean prompt's next token (text of one token).", flag_values=f)
    flags.DEFINE_string("wrong", None, "The token compared with it (the corrupted prompt's).", flag_values=f)
    flags.DEFINE_integer("positions", 16, "Print the last this many positions.", lower_bound=1, flag_values=f)
    flags.DEFINE_string(
        "out", None, "Directory to write the PNG, HTML and JSON to (default: <workdir>/patching).", flag_values=f
    )


if __name__ == "__main__":
    main()
