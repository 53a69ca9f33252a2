"""Train a model: python train.py --config configs/tiny.py (the same as `jaxgpt train` once the
package is installed; the command lives in jaxgpt/commands/train.py, and --help lists its flags)."""

from jaxgpt.commands.cli import run_as_the_process
from jaxgpt.commands.train import main

if __name__ == "__main__":
    run_as_the_process(main)
