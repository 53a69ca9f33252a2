"""Retired: python -m jaxgpt seq2seq trained an encoder–decoder with a loop, an optimizer and a
save format of its own. An encoder–decoder now trains through train.py like any run
(model.encoder_layers, on text pairs), so it checkpoints, resumes, shards and logs as they do:

  python train.py --config configs/seq2seq_reverse.py --workdir runs/reverse
  python sample.py --workdir runs/reverse --prompt 31415926 --temperature 0
  python -m jaxgpt attention-maps --workdir runs/reverse --prompt 31415926

This command says so in one line and exits 2 (--help prints this page).
"""

from __future__ import annotations

from jaxgpt.commands import cli

RETIRED = (
    "the seq2seq command is retired: an encoder–decoder trains through train.py now, e.g. "
    "python train.py --config configs/seq2seq_reverse.py --workdir runs/reverse (or configs/seq2seq_sort.py), "
    "then sample.py, evaluate and attention-maps --workdir runs/reverse"
)


def main(argv: list[str] | None = None) -> None:
    """--help says this page, as every command's does; anything else, the line above."""
    argv, f = cli.command_flags(argv)

    def retired():
        if any(arg in ("--help", "-h", "--helpfull") for arg in argv[1:]):
            cli.parse_flags(argv, __doc__, f)  # prints the page and exits 0
        cli.fail(RETIRED)

    cli.run(retired, starts_jax=False)


if __name__ == "__main__":
    main()
