"""A run's story in one page: python -m jaxgpt timeline --workdir RUN [--out PAGE.html] [--png PLOT.png]

Examples:
  python -m jaxgpt timeline --workdir runs/induction_lab     # runs/induction_lab/timeline.html and .png
  python -m jaxgpt timeline --workdir runs/induction_lab --out page.html --png plot.png

The run is one trained with its measures (python train.py --config configs/induction.py
--workdir runs/induction_lab --config.train.lab=all). Reads its metrics.jsonl, where train.lab logged
them at each evaluation (jaxgpt/lab/watch.py), and what `jaxgpt evaluate --over_checkpoints` took
of its checkpoints, and writes one self-contained HTML page (it opens
from a file with the network off): the loss curves on top, each measure's curves beneath (a line
a head, or a layer boundary), and a step slider that shows every head's attention pattern on the
probe at that step; hover a chart for the values. The PNG holds the same curves, for a paper.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import flags

from jaxgpt.commands import cli
from jaxgpt.errors import UserError
from jaxgpt.job.metrics import read_metrics


def over_checkpoints(workdir: Path, records: list[dict]) -> list[dict]:
    """The measures `jaxgpt evaluate --over_checkpoints` took, of the steps whose training did
    not log them (what was logged stands)."""
    path = workdir / "lab_over_checkpoints.jsonl"
    if not path.is_file():
        return []
    logged = {r["step"] for r in records if "lab_pattern" in r}
    measured = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in measured if r["step"] not in logged]


@cli.command(starts_jax=False)  # the records, the tokenizer and matplotlib alone
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    argv, f = cli.command_flags(argv)
    flags.DEFINE_string("workdir", None, "the run: a train.py workdir trained with train.lab", flag_values=f)
    flags.DEFINE_string("out", None, "the page to write (default: <workdir>/timeline.html)", flag_values=f)
    flags.DEFINE_string("png", None, "the figure to write (default: <workdir>/timeline.png)", flag_values=f)
    cli.parse_flags(argv, __doc__, f)
    cli.require(f, "workdir", what="the run whose measures to draw")
    from jaxgpt.lab.timeline import timeline_data, timeline_figure, timeline_view
    from jaxgpt.tokenizers import load_tokenizer

    workdir = Path(f.workdir)
    records = read_metrics(workdir)
    records = sorted(records + over_checkpoints(workdir, records), key=lambda r: r["step"])
    tokenizer = load_tokenizer(workdir / "tokenizer.json")
    try:
        data = timeline_data(records, lambda ids: [tokenizer.decode([int(i)]) for i in ids])  # a text a token
    except ValueError:
        raise UserError(
            f"{workdir}/metrics.jsonl holds no train.lab measures; train the run with --config.train.lab=all "
            f"(a resume may add it: its later evaluations are measured), or measure its checkpoints: "
            f"python -m jaxgpt evaluate --workdir {workdir} --over_checkpoints"
        ) from None
    title = f"{workdir.name}: the loss and train.lab's measures over training"
    page, png = Path(f.out or workdir / "timeline.html"), Path(f.png or workdir / "timeline.png")
    with cli.writing(page):
        timeline_view(data, title=title).save(page)
    with cli.writing(png):
        timeline_figure(data, png, title=title)
    print(f"wrote {page} ({len(data['steps'])} evaluations, {len(data['measures'])} measures) and {png}")


if __name__ == "__main__":
    main()
