"""Compare variants of a config: python -m jaxgpt compare --config tiny --vary model.position=learned,rope

Examples:
  python -m jaxgpt compare --config tiny --vary model.position=learned,rope --steps 20 --out runs/compare-try
  python -m jaxgpt compare --config configs/tiny.py --vary model.position=learned,rope,alibi --out runs/compare-pos
  python -m jaxgpt compare --config tiny --vary model.position=learned,rope --vary model.activation=gelu,swiglu \\
      --seeds 2 --steps 500 --out runs/compare-pos-act

One run per combination of the --vary values and seed (seed = train.seed, train.seed + 1, ...),
each in its own workdir under --out (resumable: rerunning skips finished runs and continues
unfinished ones), on the same data. Then one table, printed and written as <out>/results.md and
<out>/results.json: per variant the final val loss and bits per byte (mean and spread, the
largest minus the smallest, over seeds), parameters, tokens/s and training time; and <out>/loss.png:
each variant's logged training loss as a line and its evaluations as dots (mean over seeds).
train.log_every is lowered where needed so every run logs at least 25 training losses.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

from absl import flags

from jaxgpt.commands import cli
from jaxgpt.commands.interrupt import INTERRUPTED
from jaxgpt.errors import UserError, warn


def define_flags(argv: list[str], f: flags.FlagValues) -> None:
    cli.define_config_flag(f, argv)
    flags.DEFINE_multi_string("vary", [], "section.key=v1,v2,... : one variant per value (repeatable).", flag_values=f)
    flags.DEFINE_integer("seeds", 1, "Runs per variant, seeds train.seed, train.seed + 1, ...", flag_values=f)
    flags.DEFINE_integer("steps", None, "Override train.steps for every run.", flag_values=f)
    flags.DEFINE_string("out", None, "Directory for the runs and the results.", flag_values=f)
    flags.DEFINE_bool("quiet", False, "No progress bars; one line per run.", flag_values=f)


def parse_vary(specs: list[str]) -> list[tuple[str, list[str]]]:
    """['model.position=a,b'] -> [('model.position', ['a', 'b'])]; one line of error otherwise."""
    out = []
    for spec in specs:
        key, eq, values = spec.partition("=")
        if not eq or key.count(".") < 1 or not values:
            raise UserError(f"--vary {spec!r} is not section.key=v1,v2 (e.g. model.position=learned,rope)")
        values = values.split(",")
        # a variant's workdir is named by its values: a repeated one would resume the first's run
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise UserError(
                f"--vary {spec!r} names {', '.join(repeated)} twice; give each value once (--seeds repeats runs)"
            )
        if key in (k for k, _ in out):
            raise UserError(f"--vary names {key} twice; give all its values in one --vary {key}=v1,v2")
        out.append((key, values))
    return out


def variants(vary: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    """Every combination of the varied values, in the order given."""
    keys = [k for k, _ in vary]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in vary))]


def variant_name(variant: dict[str, str]) -> str:
    return ",".join(f"{key.split('.')[-1]}={value}" for key, value in variant.items()) or "base"


def with_values(config, variant: dict[str, str]):
    """A copy of the ConfigDict with each dotted key set, the text read as the key's type."""
    copy = config.copy_and_resolve_references()
    for key, text in variant.items():
        *parents, name = key.split(".")
        copied = copy
        for parent in parents:
            copied = copied[parent]
        copied[name] = typed_value(config, key, text)
    return copy


def typed_value(config, key: str, text: str):
    """`text` read as the type `config` declares for the dotted `key`; one line for a key it lacks."""
    *parents, name = key.split(".")
    node = config
    try:
        for parent in parents:
            node = node[parent]
        kind = node.get_type(name)  # declared: a field left unset (None) has one too, lost by a copy
    except (KeyError, AttributeError):
        raise UserError(f"--vary {key}: no such config key") from None
    return _typed(text, kind, key)


def check_values_differ(config, vary: list[tuple[str, list[str]]]) -> None:
    """One line where two values given for a key are one value once read as its type (2 and
    002, 0.001 and 1e-3, true and True): the variants would train the same run twice."""
    for key, texts in vary:
        seen: dict = {}
        for text in texts:
            value = typed_value(config, key, text)
            if value in seen:
                raise UserError(
                    f"--vary {key}={','.join(texts)}: {seen[value]} and {text} are the same value ({value!r}); "
                    "give each value once (--seeds repeats runs)"
                )
            seen[value] = text


def _typed(text: str, kind: type, key: str):
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise UserError(f"--vary {key}={text}: expected true or false")
        return text.lower() == "true"
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise UserError(f"--vary {key}={text}: expected {what}") from None
    return text


def scored_key(records: list[dict], key: str) -> str:
    """The metric a run is judged by: its past-only score when it has one (a model trained
    without the causal mask, whose own val loss sees the future), else `key`."""
    past_only = f"{key}_past_only"
    return past_only if any(past_only in r for r in records) else key


def summarise(rows: list[dict]) -> list[dict]:
    """One line per variant from its seeds' final records: means and spreads."""
    out = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        runs = [r for r in rows if r["variant"] == name]
        line = {"variant": name, "seeds": len(runs), "params": runs[0]["params"], "scored": runs[0]["scored"]}
        for key in ("val_loss", "val_bpb", "val_exact_match", "rl_reward", "tokens_per_sec", "elapsed_sec"):
            values = [r.get(key, math.nan) for r in runs]
            line[key] = sum(values) / len(values)
            line[f"{key}_spread"] = max(values) - min(values)
        out.append(line)
    return out


def scored_as(final: dict, loss_key: str) -> str:
    """How a run's val loss was scored: "past-only", "masked", "classified" or "as trained"."""
    if loss_key != "val_loss":
        return "past-only"
    if "val_confusion" in final:
        return "classified"
    return "masked" if "val_accuracy" in final else "as trained"


def markdown(summary: list[dict]) -> str:
    answers = any(not math.isnan(s["val_exact_match"]) for s in summary)  # pairs, conversations, classifiers
    generated = any(not math.isnan(s["val_exact_match"]) and s["scored"] != "classified" for s in summary)
    rewarded = any(not math.isnan(s["rl_reward"]) for s in summary)  # learning from rewards
    columns = "| variant | seeds | val loss | val bits/byte |" + (" exact match |" if answers else "")
    columns += (" sampled reward |" if rewarded else "") + " params | tokens/s* | training s* |"
    head = columns + "\n" + "|---" * (7 + answers + rewarded) + "|\n"
    marks = {"past-only": " (past-only)", "masked": " (masked)", "classified": " (classifier)"}

    def spread(s: dict, key: str, form: str) -> str:
        return "-" if math.isnan(s[key]) else f"{s[key]:{form}} ± {s[f'{key}_spread'] / 2:{form}}"

    body = "".join(
        f"| {s['variant'] + marks.get(s['scored'], '')} | {s['seeds']} | {spread(s, 'val_loss', '.4f')} | "
        f"{spread(s, 'val_bpb', '.4f')} |"
        + (f" {spread(s, 'val_exact_match', '.1%')} |" if answers else "")
        + (f" {spread(s, 'rl_reward', '.3f')} |" if rewarded else "")
        + f" {s['params']:,} | {s['tokens_per_sec']:,.0f} | {s['elapsed_sec']:,.0f} |\n"
        for s in summary
    )
    notes = (
        "\n(± half the spread, largest minus smallest, over seeds)\n"
        + (
            "(exact match: the held-out examples whose every answer token is the most likely one, what greedy "
            "decoding writes)\n"
            if generated
            else ""
        )
        + (
            "(sampled reward: the mean reward of the answers sampled over the last logging interval)\n"
            if rewarded
            else ""
        )
        + "(* wall-clock, each run timed alone in its turn: they move with whatever else the machine was doing "
        "then, so they compare variants only on an otherwise idle machine; the losses do not depend on it)\n"
    )
    if any(s["scored"] == "past-only" for s in summary):
        notes += (
            "(past-only: trained without the causal mask, so its own val loss sees the token it predicts; scored "
            "here under the mask, each token from the tokens before it, as in generation)\n"
        )
    if any(s["scored"] == "masked" for s in summary):
        notes += (
            "(masked: an encoder's loss on the tokens it hides, read from both sides; not comparable with a "
            "next-token loss, and not a rate of compression, so no bits per byte)\n"
        )
    if any(s["scored"] == "classified" for s in summary):
        notes += (
            "(classifier: the loss over each held-out text's class, one position a text; its exact match is the "
            "share of texts classified right)\n"
        )
    return head + body + notes


POINTS_PER_CURVE = 25  # logged training losses per run, at least, so a short run still draws a curve


def log_often_enough(config) -> str | None:
    """Lower train.log_every so each run logs at least POINTS_PER_CURVE training losses (a
    10-step comparison at the config's log_every of 50 would draw one point); a note saying
    so, or None. Logging changes no loss."""
    t = config.train
    wanted = max(1, t.steps // POINTS_PER_CURVE)
    if t.log_every <= wanted:
        return None
    old, t.log_every = t.log_every, wanted
    return f"train.log_every {old} -> {wanted}, so each run's curve has {t.steps // wanted} points"


def plot(runs: dict[str, list[Path]], out: Path, vary: list[tuple[str, list[str]]]) -> Path:
    """Loss against steps, one colour per variant (mean over its seeds): the logged training
    loss as a line (each interval's mean at its middle), each evaluation's val loss as a dot of
    the same colour; titled by what varied."""
    import numpy as np
    from matplotlib.lines import Line2D

    from jaxgpt.commands.plot import interval_midpoints, plt, save_png
    from jaxgpt.job.metrics import read_metrics

    def mean_curve(workdirs: list[Path], key: str) -> tuple[list[float], np.ndarray]:
        curves = [[(r["step"], r[key]) for r in read_metrics(w) if r.get(key) is not None] for w in workdirs]
        steps = [s for s, _ in curves[0]]
        return interval_midpoints(steps) if key == "train_loss" else steps, np.mean(
            [[v for _, v in curve] for curve in curves], axis=0
        )

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for i, (name, workdirs) in enumerate(runs.items()):
        colour = f"C{i % 10}"
        val_key = scored_key(read_metrics(workdirs[0]), "val_loss")
        label = name + (" (val: past-only)" if val_key != "val_loss" else "")
        axes.plot(*mean_curve(workdirs, "train_loss"), color=colour, alpha=0.85, linewidth=1.5, label=label)
        axes.plot(*mean_curve(workdirs, val_key), "o", color=colour, markeredgecolor="black", markersize=6)
    seeds = len(next(iter(runs.values())))
    varied = " x ".join(f"{key} in {{{', '.join(values)}}}" for key, values in vary)
    axes.set_title(f"{varied}: {len(runs)} variants" + (f", mean of {seeds} seeds" if seeds > 1 else ""))
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats per token)")
    axes.grid(alpha=0.3)
    kinds = [
        Line2D([], [], color="grey", label="train loss (logged)"),
        Line2D([], [], color="grey", marker="o", markeredgecolor="black", linestyle="", label="val loss"),
    ]
    axes.add_artist(axes.legend(handles=kinds, loc="upper center", fontsize="small"))
    axes.legend(fontsize="small", loc="upper right")
    return save_png(figure, out)


class Stopped(Exception):
    """A variant's run was asked to stop before it finished: the comparison stops with it (it
    has no evaluation to report yet), and rerunning the command continues it."""


def on_purpose(vary: list[tuple[str, list[str]]], overrides) -> tuple[str, ...]:
    """The config keys a comparison sets on purpose: those it varies, and the command line's."""
    return (*overrides, *(key for key, _ in vary))


def compare(
    config, vary: list[tuple[str, list[str]]], seeds: int, out: Path, *, progress: bool, say=print, overrides=()
):
    """Run (or resume) every variant x seed under `out`; write and return the summary. The keys
    varied are set on purpose, as `overrides` (the command line's) are: a run starting from
    weights takes the rest of its model from them (jaxgpt/job/pretrained.py)."""
    import jax

    from jaxgpt.config import run_config_from_dict
    from jaxgpt.job.metrics import read_metrics
    from jaxgpt.job.trainer import train_and_evaluate
    from jaxgpt.model.transformer import count_params, init_params

    rows, runs = [], {}
    combos = variants(vary)
    total = len(combos) * seeds
    for n, (variant, seed) in enumerate(itertools.product(combos, range(seeds)), start=1):
        name = variant_name(variant)
        run_config = with_values(config, variant)
        run_config.train.seed = config.train.seed + seed
        workdir = out / name / f"seed{seed}"
        say(f"[{n}/{total}] {name}, seed {run_config.train.seed}: {workdir}")
        last = train_and_evaluate(run_config, workdir, progress=progress, overrides=on_purpose(vary, overrides))
        if last.get("stopped"):  # asked to stop (Ctrl-C, SIGTERM): its checkpoint is written, the rest waits
            raise Stopped(f"{name}, seed {run_config.train.seed}, stopped at step {last['step']}")
        records = read_metrics(workdir)
        final = [r for r in records if "val_loss" in r][-1]
        loss_key, bpb_key = scored_key(records, "val_loss"), scored_key(records, "val_bpb")
        model = run_config_from_dict(json.loads((workdir / "config.json").read_text())).model
        classifier = "val_confusion" in final
        params = count_params(jax.eval_shape(lambda m=model: init_params(m, jax.random.key(0))))
        rows.append(
            {
                "variant": name,
                "seed": run_config.train.seed,
                "params": params,
                **{k: final[k] for k in ("step", "tokens_per_sec", "elapsed_sec")},
                "val_loss": final[loss_key],
                "val_bpb": final.get(bpb_key, math.nan),  # none for a masked-token loss
                "val_exact_match": final.get(
                    "val_exact_match", final.get("val_accuracy", math.nan) if classifier else math.nan
                ),  # pairs, conversations, a classifier's texts
                "scored": scored_as(final, loss_key),
                "rl_reward": next((r["rl_reward"] for r in reversed(records) if "rl_reward" in r), math.nan),
            }
        )
        runs.setdefault(name, []).append(workdir)
    summary = summarise(rows)
    table = markdown(summary)
    (out / "results.md").write_text(table)
    (out / "results.json").write_text(json.dumps({"vary": dict(vary), "runs": rows, "summary": summary}, indent=2))
    plot(runs, out / "loss.png", vary)
    return summary, table


@cli.command(interrupted="interrupted; rerun the same command: finished runs are skipped, the others resume")
def main(argv: list[str] | None = None) -> None:
    """The command's entry point (jaxgpt compare)."""
    argv, f = cli.command_flags(argv)
    define_flags(argv, f)
    cli.parse_flags(argv, __doc__, f)
    cli.require_config(f["config"])
    vary = parse_vary(f.vary)
    if f.seeds < 1:
        cli.fail(f"--seeds={f.seeds} must be at least 1")
    config = f.config
    if f.steps is not None:
        config.train.steps = f.steps
    check_values_differ(config, vary)
    if note := log_often_enough(config):
        print(f"note: {note}")
    out = Path(f.out or Path("runs") / ("compare-" + "-".join(k.split(".")[-1] for k, _ in vary)))
    from jaxgpt.hardware import runtime

    runtime.configure(warn=warn)
    from jaxgpt.job.setup import check_runnable

    overrides = cli.config_overrides(argv)
    for variant in variants(vary):  # every variant checked as train.py would, before the first run
        check_runnable(with_values(config, variant), overrides=on_purpose(vary, overrides))
    try:
        _, table = compare(config, vary, f.seeds, out, progress=not f.quiet, overrides=overrides)
    except Stopped as stopped:
        print(f"{stopped}; rerun the same command: finished runs are skipped, the others resume", file=sys.stderr)
        sys.exit(INTERRUPTED)
    print(table)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'loss.png'}")


if __name__ == "__main__":
    main()
