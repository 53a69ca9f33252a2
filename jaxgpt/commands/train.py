"""Train a model: python train.py --config configs/tiny.py [--config.train.steps=500] [--workdir DIR]

Examples:
  python train.py --config configs/tiny.py                      # the first run: a few minutes on a CPU
  python train.py --config configs/tiny.py --config.train.steps=300 --workdir runs/short
  python train.py --config configs/tiny.py --config.model.n_layer=2 --config.train.lr=1e-3
  python train.py --config configs/tiny.py --fresh               # start over; the old run is kept aside
  python train.py --workdir runs/tiny --config.train.steps=4000   # extend a run: its saved config + this

Rerunning the same command resumes from the newest checkpoint; --workdir alone resumes a run with
the configuration saved in it. Every config key can be set as --config.<section>.<key>=VALUE
(sections model, data, train, mesh; see jaxgpt/config/).

A thin shell over jaxgpt.job.trainer.train_and_evaluate, which notebooks can call directly.
"""

import sys
from pathlib import Path

from absl import flags

from jaxgpt.commands import cli
from jaxgpt.commands.interrupt import INTERRUPTED
from jaxgpt.errors import warn


def define_flags(argv: list[str], f: flags.FlagValues) -> None:
    cli.define_config_flag(f, argv)
    flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config name>).", flag_values=f)
    flags.DEFINE_bool("quiet", False, "No progress bar or status lines.", flag_values=f)
    flags.DEFINE_bool(
        "fresh", False, "Start from step 0 in a used workdir; the old run is moved aside, not deleted.", flag_values=f
    )
    flags.DEFINE_integer(
        "stop_at", None, "Stop after this step with a checkpoint, as on SIGTERM; rerun to resume.", flag_values=f
    )
    flags.DEFINE_integer(
        "from_step",
        None,
        "Resume from this checkpoint, not the newest (after a divergence); later ones are moved aside.",
        flag_values=f,
    )
    flags.DEFINE_bool(
        "verify_data",
        False,
        "Hash the prepared token file at start whatever its size (small ones always are).",
        flag_values=f,
    )
    flags.DEFINE_string("coordinator_address", None, "Multi-process runs: host:port of process 0.", flag_values=f)
    flags.DEFINE_integer("num_processes", None, "Multi-process runs: how many processes.", flag_values=f)
    flags.DEFINE_integer("process_id", None, "Multi-process runs: this process's index, 0-based.", flag_values=f)


@cli.command(
    interrupted="interrupted: stopped at once; rerun the same command to resume from the newest complete "
    "checkpoint (from step 0 if none was written yet)"
)
def main(argv: list[str] | None = None) -> None:
    """The command's entry point (jaxgpt train): bad input exits 2 with one line; Ctrl-C
    in the training loop finishes the step, checkpoints and exits 130, and anywhere else (or a
    second time) ends the run at once."""
    argv, f = cli.command_flags(argv)
    argv = cli.config_from_run(argv)
    define_flags(argv, f)
    cli.parse_flags(argv, __doc__, f)
    cli.require_config(f["config"], ", or --workdir of an earlier run to resume it with its own configuration")
    from jaxgpt.hardware import distributed, runtime
    from jaxgpt.job.trainer import train_and_evaluate  # after flag parsing: a bad flag fails fast

    runtime.configure(single_process=(f.num_processes or 1) == 1, warn=warn)
    distributed.initialize(f.coordinator_address, f.num_processes, f.process_id)

    workdir = f.workdir or str(Path("runs") / Path(f["config"].config_filename).stem)
    last = train_and_evaluate(
        f.config,
        workdir,
        progress=not f.quiet,
        fresh=f.fresh,
        stop_at=f.stop_at,
        from_step=f.from_step,
        verify_data=f.verify_data,
        overrides=cli.config_overrides(argv),
    )
    if last.get("stopped") == "SIGINT":  # stopped cleanly, but at the user's Ctrl-C: as a shell expects
        sys.exit(INTERRUPTED)


if __name__ == "__main__":
    main()
