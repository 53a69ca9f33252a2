"""Plot training curves: python -m jaxgpt plot RUN [RUN ...] [--metric loss] [--out loss.png]

Examples:
  python -m jaxgpt plot runs/tiny runs/llama_tiny --out docs/images/loss.png
  python -m jaxgpt plot runs/tiny --metric tokens_per_sec
  python -m jaxgpt plot runs/moe_tiny --metric expert_load

Reads each run's metrics.jsonl and draws, for the loss, train (solid) and val (dashed) loss
against optimizer steps and against tokens seen, side by side, one colour per run. Another
`--metric` (tokens_per_sec, lr, grad_norm, mfu, ...) gets the same two panels. Tokens seen
are step x batch_size x block_size from the run's config.json (train.rl.length for a run that
learns from rewards, where set: its rows are a prompt and an answer long). `--metric expert_load` draws a
mixture of experts' router instead: for each MoE layer of each run, every expert's share of
the assignments against steps, with the even share (1 / experts) dashed, so a router that
collapses onto a few experts shows as lines leaving it.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
from absl import flags

matplotlib.use("Agg")  # files only: works without a display, on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402

from jaxgpt.commands import cli  # noqa: E402
from jaxgpt.errors import UserError  # noqa: E402
from jaxgpt.job.metrics import read_metrics  # noqa: E402

SIZE_INCHES, DPI = (11, 4), 100  # 1100 x 400 pixels
# What a metric's numbers are, for its axis (a key of metrics.jsonl not named here shows as itself)
UNITS = {
    "loss": "loss (nats per token)",
    "train_loss": "training loss (nats per token)",
    "val_loss": "validation loss (nats per token)",
    "val_bpb": "validation bits per byte",
    "tokens_per_sec": "tokens per second",
    "lr": "learning rate",
    "grad_norm": "gradient norm (before clipping)",
    "mfu": "model FLOPs utilisation (fraction of the peak)",
    "rl_reward": "mean reward of the sampled answers",
    "rl_exact_match": "sampled answers exactly right (fraction)",
    "rl_tied_groups": "groups whose rewards all tie (fraction: no signal)",
    "rl_answer_tokens": "tokens an answer",
    "train_kl": "KL divergence to the starting model (nats per token)",
    "val_exact_match": "held-out answers exactly right (fraction)",
}


def tokens_per_step(workdir: Path) -> int:
    path = workdir / "config.json"
    if not path.is_file():
        raise UserError(f"{path} not found; pass the workdir of a train.py run")
    config = json.loads(path.read_text())
    rl = config["train"].get("rl") or {}  # learning from rewards: rows of train.rl.length, where set
    return config["train"]["batch_size"] * (rl.get("length") or config["model"]["block_size"])


def interval_midpoints(steps: list[int]) -> list[float]:
    """Where to draw each logged training loss: it is the mean over the steps since the previous
    record (prev, step], so at their middle. Drawn at its last step instead, the shorter interval
    that closes at an evaluation step (its mean over later, lower losses) reads as a dip."""
    return [(previous + 1 + step) / 2 for previous, step in zip([0, *steps], steps, strict=False)]


def curves(records: list[dict], metric: str) -> dict[str, tuple[list[float], list[float]]]:
    """label -> (steps, values) for what `metric` names: "loss" is train_loss and val_loss; the
    logged training loss, a mean over its interval, drawn at the interval's middle."""
    keys = {"train": "train_loss", "val": "val_loss"} if metric == "loss" else {metric: metric}
    out = {}
    for label, key in keys.items():
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            steps = [s for s, _ in points]
            out[label] = (interval_midpoints(steps) if key == "train_loss" else steps, [v for _, v in points])
    return out


def plot_runs(workdirs: list[Path], metric: str, out: Path) -> Path:
    return save_png(draw_expert_load(workdirs) if metric == "expert_load" else draw_runs(workdirs, metric), out)


def expert_loads(records: list[dict]) -> dict[str, tuple[list[int], list[list[float]]]]:
    """MoE layer ("block_3") -> (steps, each step's load per expert), from router_record's keys."""
    layers: dict[str, dict[int, dict[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            parts = key.split("/")  # router/block_3/load/5
            if len(parts) == 4 and parts[0] == "router" and parts[2] == "load":
                layers.setdefault(parts[1], {}).setdefault(record["step"], {})[int(parts[3])] = value
    return {
        layer: (sorted(by_step), [[loads[e] for e in sorted(loads)] for _, loads in sorted(by_step.items())])
        for layer, by_step in sorted(layers.items(), key=lambda item: int(item[0].split("_")[1]))
    }


def draw_expert_load(workdirs: list[Path]):
    """A row of panels per run, one per MoE layer: every expert's load against steps."""
    runs = [(workdir, expert_loads(read_metrics(workdir))) for workdir in workdirs]
    runs = [(workdir, layers) for workdir, layers in runs if layers]
    if not runs:
        raise UserError(
            f"no expert loads in the metrics of {', '.join(map(str, workdirs))}; train a config with model.moe"
        )
    columns = max(len(layers) for _, layers in runs)
    names = [w.name for w in workdirs]
    figure, axes = plt.subplots(
        len(runs), columns, figsize=(max(3 * columns, SIZE_INCHES[0]), SIZE_INCHES[1] * len(runs)), dpi=DPI,
        squeeze=False,
    )  # fmt: skip
    for row, (workdir, layers) in zip(axes, runs, strict=True):
        name = f"{workdir.parent.name}/{workdir.name}" if names.count(workdir.name) > 1 else workdir.name
        for ax, (layer, (steps, loads)) in zip(row, layers.items(), strict=False):
            experts = len(loads[0])
            for e in range(experts):
                ax.plot(steps, [load[e] for load in loads], color=f"C{e % 10}", label=f"expert {e}")
            ax.axhline(1 / experts, color="black", linestyle="--", linewidth=1, label="even share")
            ax.set_title(f"{name} {layer}", fontsize="small")
            ax.set_xlabel("step")
            ax.set_ylabel("share of assignments")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize="x-small")
    figure.suptitle("each expert's share of its layer's assignments over training (dashed: an even share)")
    return figure


def draw_runs(workdirs: list[Path], metric: str):
    """The figure plot_runs writes: per run, its curves against steps and against tokens seen.
    Evaluations are marked as well as joined, so a run evaluated once still shows its point."""
    figure, (by_step, by_tokens) = plt.subplots(1, 2, figsize=SIZE_INCHES, dpi=DPI)
    drawn = 0
    for i, workdir in enumerate(workdirs):
        records = read_metrics(workdir)
        per_step = tokens_per_step(workdir)
        colour = f"C{i % 10}"
        for label, (steps, values) in curves(records, metric).items():
            style = "o--" if label == "val" else "-"
            name = f"{workdir.name} {label}" if metric == "loss" else workdir.name
            by_step.plot(steps, values, style, color=colour, label=name)
            by_tokens.plot([s * per_step for s in steps], values, style, color=colour, label=name)
            drawn += 1
    if not drawn:
        plt.close(figure)
        raise UserError(f"no {metric!r} values in the metrics of {', '.join(map(str, workdirs))}; try --metric loss")
    for axes, xlabel in ((by_step, "step"), (by_tokens, "tokens seen")):
        axes.set_xlabel(xlabel)
        axes.set_ylabel(UNITS.get(metric, metric))
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    what = (
        "loss: train (each logging interval's mean, solid) and val (each evaluation, dashed)"
        if metric == "loss"
        else UNITS.get(metric, metric)
    )
    figure.suptitle(f"{what}, against steps and against tokens seen", fontsize="medium")
    return figure


def save_png(figure, out: Path) -> Path:
    """Lay out, write and free a figure; its size in pixels is its size in inches x its dpi.
    A path that cannot be written (a read-only workdir) is one line offering --out: what the
    command printed before it (a table) stands."""
    if figure.get_layout_engine() is None:  # one chosen where it was drawn stands (constrained)
        figure.tight_layout()
    try:
        with cli.writing(out):
            figure.savefig(out, dpi=figure.dpi)
    finally:
        plt.close(figure)
    return out


@cli.command(starts_jax=False)  # matplotlib alone
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    argv, f = cli.command_flags(argv)
    flags.DEFINE_string("metric", "loss", "loss (train and val), or any key of metrics.jsonl.", flag_values=f)
    flags.DEFINE_string("out", None, "PNG to write (default: <first run>/<metric>.png).", flag_values=f)
    runs = [Path(run) for run in cli.parse_flags(argv, __doc__, f, takes_words=True)]
    if not runs:
        raise UserError("no run given; name one or more workdirs of train.py runs: jaxgpt plot runs/tiny")
    out = Path(f.out) if f.out else runs[0] / f"{f.metric}.png"
    print(f"wrote {plot_runs(runs, f.metric, out)}")


if __name__ == "__main__":
    main()
