"""Loss against position and context length:
python -m jaxgpt.evaluate --workdir DIR [--workdir DIR ...] [--step N] [--lengths 64,128,256,512,1024]

The same stretch of each run's validation text (its first --tokens tokens) is cut into
back-to-back windows of each length, and each window is scored in one forward pass: the loss
at every position, averaged over the windows. A model that uses its context predicts better
the further into a window it is; one whose positions do not carry past the length it trained
at (model.block_size) gets worse beyond it. Learned position embeddings have no row past
block_size, so longer lengths are refused for those runs, with that reason; RoPE, sinusoidal,
ALiBi and no positions at all are evaluated at any length.

Prints a row per run and length (the loss within the trained length and beyond it) and draws
loss against position at each run's longest length beside mean loss against length, one
colour per run.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import jax
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxgpt.commands import cli  # noqa: E402
from jaxgpt.commands.plot import DPI, SIZE_INCHES, save_png  # noqa: E402
from jaxgpt.config import ModelConfig  # noqa: E402
from jaxgpt.errors import UserError  # noqa: E402

LOGITS_BYTES = 2**28  # windows scored at once: their float32 logits stay under 256 MiB


@dataclasses.dataclass(frozen=True)
class LengthResult:
    length: int
    windows: int
    by_position: np.ndarray  # (length,) mean loss in nats at each position

    def mean(self, start: int = 0, stop: int | None = None) -> float:
        part = self.by_position[start:stop]
        return float(part.mean()) if part.size else float("nan")


def refusal(model: ModelConfig, length: int, split_tokens: int) -> str | None:
    """Why `length` cannot be evaluated for this model and split, or None."""
    if model.position == "learned" and length > model.block_size:
        return (
            f"learned position embeddings have no row past block_size={model.block_size}, so no length "
            f"above it can be scored (train with position=rope, sinusoidal, alibi or none to measure that)"
        )
    if split_tokens < length + 1:
        return f"the validation split has {split_tokens} tokens, fewer than a window of {length} + 1"
    return None


def losses_by_position(model: ModelConfig, params, tokens: np.ndarray, length: int, budget: int) -> LengthResult:
    """The mean loss at each position of the back-to-back windows of `length` + 1 tokens that
    fit in the first `budget` tokens of `tokens` (at least one window)."""
    from jaxgpt.kernels import kernel_fallback
    from jaxgpt.model import GPT
    from jaxgpt.train_step import token_losses

    windows = max(1, min(budget, len(tokens) - 1) // length)
    model = model.replace(
        dtype="float32", remat="none", attention=kernel_fallback(model.attention, jax.default_backend(), training=False)
    )
    score = jax.jit(lambda params, batch: token_losses(GPT(model), params, batch))
    rows = max(1, min(windows, LOGITS_BYTES // (length * model.vocab_size * 4)))
    totals = np.zeros(length)
    for first in range(0, windows, rows):
        starts = [i * length if i < windows else 0 for i in range(first, first + rows)]
        # the last group is filled up with the first window, so every call has one shape; only
        # the real windows are counted
        batch = np.stack([tokens[s : s + length + 1] for s in starts])
        counted = min(rows, windows - first)
        totals += np.asarray(score(params, batch.astype(np.int32)))[:counted].sum(axis=0)
    return LengthResult(length, windows, totals / windows)


def evaluate_run(workdir: Path, lengths: list[int], budget: int, step: int | None, say=print):
    """(run config, step, results by length) of one workdir; refused lengths are said, skipped."""
    from jaxgpt import data
    from jaxgpt.job.checkpoint import load_latest

    run, params, _, step = load_latest(workdir, step=step, warn=say)
    val = data.prepare(run.data, progress=False).val
    results, skipped = [], {}
    for length in lengths:
        if reason := refusal(run.model, length, len(val)):
            skipped.setdefault(reason, []).append(str(length))
            continue
        results.append(losses_by_position(run.model, params, np.asarray(val), length, budget))
    for reason, which in skipped.items():
        say(f"{workdir}: length{'s' * (len(which) > 1)} {', '.join(which)} skipped: {reason}")
    if not results:
        raise UserError(f"no length of {lengths} can be evaluated for {workdir}; see the lines above")
    return run, step, results


def table(rows: list[tuple[str, int, int, LengthResult]]) -> list[str]:
    """rows: (run name, step, block_size, result) -> aligned lines."""
    width = max(len("run"), *(len(name) for name, *_ in rows))
    heading = f"{'step':>6}  {'length':>6}  {'windows':>7}  {'loss':>6}  {'<= block':>8}  {'> block':>7}"
    lines = [f"{'run':{width}}  {heading}"]
    for name, step, block, result in rows:
        beyond = result.mean(block)
        lines.append(
            f"{name:{width}}  {step:>6}  {result.length:>6}  {result.windows:>7}  {result.mean():>6.3f}  "
            f"{result.mean(0, block):>8.3f}  " + (f"{beyond:>7.3f}" if not np.isnan(beyond) else f"{'-':>7}")
        )
    return lines


def smoothed(by_position: np.ndarray, bins: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Means over log-spaced bins of positions: the early positions keep their detail, the
    later ones are averaged over more windows' noise."""
    edges = np.unique(np.geomspace(1, len(by_position) + 1, bins + 1).astype(int)) - 1
    middles = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    means = [by_position[a:b].mean() for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return np.asarray(middles), np.asarray(means)


def draw(runs: list[tuple[str, int, list[LengthResult]]], out: Path) -> Path:
    """runs: (name, block_size, results)."""
    figure, (by_position, by_length) = plt.subplots(1, 2, figsize=SIZE_INCHES, dpi=DPI)
    for i, (name, block, results) in enumerate(runs):
        colour = f"C{i % 10}"
        longest = results[-1]
        positions, losses = smoothed(longest.by_position)
        by_position.plot(positions + 1, losses, color=colour, label=f"{name} (length {longest.length})")
        by_position.axvline(block, color=colour, linestyle=":", alpha=0.6)
        by_length.plot([r.length for r in results], [r.mean() for r in results], "o-", color=colour, label=name)
    by_position.set_xscale("log", base=2)
    by_position.set_xlabel("tokens of context: position + 1 (dotted: the run's block_size)")
    by_length.set_xscale("log", base=2)
    by_length.set_xlabel("window length")
    for axes in (by_position, by_length):
        axes.set_ylabel("validation loss (nats)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    return save_png(figure, out)


def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    cli.run(lambda: _evaluate(argv))


def _lengths(text: str) -> list[int]:
    try:
        lengths = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if lengths[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every length must be at least 1")
    return lengths


def _evaluate(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jaxgpt.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", action="append", type=Path, required=True, help="a run; repeat to compare")
    parser.add_argument("--step", type=int, default=None, help="a kept checkpoint's step (default: the newest)")
    parser.add_argument("--lengths", type=_lengths, default=[64, 128, 256, 512, 1024], help="window lengths")
    parser.add_argument("--tokens", type=int, default=32768, help="validation tokens scored at each length")
    parser.add_argument("--out", type=Path, default=None, help="PNG (default: <first workdir>/loss_by_position.png)")
    args = parser.parse_args(argv)
    rows, drawn = [], []
    for workdir in args.workdir:
        run, step, results = evaluate_run(workdir, args.lengths, args.tokens, args.step)
        rows += [(workdir.name, step, run.model.block_size, r) for r in results]
        drawn.append((workdir.name, run.model.block_size, results))
    print("\n".join(table(rows)))
    print(f"wrote {draw(drawn, args.out or args.workdir[0] / 'loss_by_position.png')}")


if __name__ == "__main__":
    main()
