"""Sample from a trained run: python sample.py --workdir runs/tiny (the same as `jaxgpt sample`
once the package is installed; the command lives in jaxgpt/commands/sample.py, and --help lists its flags)."""

from jaxgpt.commands.cli import run_as_the_process
from jaxgpt.commands.sample import main

if __name__ == "__main__":
    run_as_the_process(main)
