"""Pre-flight checks of a config before a long run: python -m jaxgpt check --config configs/X.py

Examples:
  python -m jaxgpt check --config configs/tiny.py
  python -m jaxgpt check --config configs/gpt2_124m.py --config.train.batch_size=8
  python -m jaxgpt check --config configs/gpt2_124m.py --target tpu-v5e-8

Checks, on the config's own model, data and mesh: the initial loss against ln(vocab_size),
per-layer gradient norms at initialisation, that one batch can be overfit, the model's size
and FLOPs per token, and memory per device (jaxgpt/commands/preflight.py says why each matters).
Prints a table; exits 1 if any check fails, naming it, and 2 on a bad config.

With --target, nothing runs: the config's train step is compiled for that TPU slice on this
machine (libtpu's compile-only devices; jaxgpt/hardware/tpu.py) and the memory each device needs, the
FLOPs per step and the step time the chip's peak implies are printed; if it does not fit, exit
1 naming the smallest change that does.
"""

from __future__ import annotations

import os
import sys

from absl import flags

from jaxgpt.commands import cli
from jaxgpt.errors import warn


def define_flags(argv: list[str], f: flags.FlagValues) -> None:
    cli.define_config_flag(f, argv)
    flags.DEFINE_integer("overfit_steps", 100, "Steps of training on one batch for the overfit check.", flag_values=f)
    flags.DEFINE_string(
        "target",
        None,
        "Compile for this TPU instead (tpu-v5e-8, tpu-v6e-1, ...; requirements-tpu.txt) and report memory.",
        flag_values=f,
    )
    flags.DEFINE_float(
        "mfu", 0.4, "With --target: the model FLOPs utilisation the step time estimate assumes.", flag_values=f
    )


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point (jaxgpt check)."""
    argv, f = cli.command_flags(argv)
    define_flags(argv, f)
    cli.parse_flags(argv, __doc__, f)
    cli.require_config(f["config"])
    if f.target:
        # Compile-only TPU devices need no TPU backend; without this, libtpu would try to start one.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        from jaxgpt import data
        from jaxgpt.hardware import tpu

        failure = tpu.check(f.config, f.target, f.mfu, vocab_size=data.vocab_size_for(f.config))
        if failure:
            print(failure, file=sys.stderr)
            sys.exit(1)
        return
    from jaxgpt.commands.preflight import print_table, run_checks
    from jaxgpt.hardware import runtime  # after flag parsing: --help and bad flags need no JAX

    runtime.configure(warn=warn)
    rows = run_checks(f.config, f.overfit_steps, cli.config_overrides(argv))
    print_table(rows)
    failed = [r.name for r in rows if r.passed is False]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
