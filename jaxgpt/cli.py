"""What the command-line scripts share: flag parsing and one-line errors.

Bad input (a UserError, or a flag ml_collections rejects) prints one line naming the problem
and the fix, and exits with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from absl import flags

from jaxgpt.errors import UserError

USAGE_ERROR = 2


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


def parse_flags(argv: list[str]) -> None:
    """Parse argv into absl's FLAGS, turning every rejection into one clear line."""
    config_file = _flag_value(argv, "--config")
    if config_file and not Path(config_file).is_file():
        fail(f"config file {config_file} not found; pass --config a file such as configs/tiny.py")
    try:
        flags.FLAGS(argv)
    except (AttributeError, KeyError) as error:  # ml_collections: an override names no key
        fail(_unknown_key_message(argv, str(error)))
    except flags.Error as error:
        fail(f"{str(error).strip().splitlines()[-1]} (see --help)")
    except Exception as error:  # the config file itself failed to run
        fail(f"config file {config_file} failed to load: {str(error).strip().splitlines()[-1]}")


def _flag_value(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _unknown_key_message(argv: list[str], text: str) -> str:
    # ml_collections says: Did you mean "n_layer" instead of "n_layr"? Find the override that
    # used the bad name to report the full dotted key.
    match = re.search(r'Did you mean "(\w+)" instead of "(\w+)"', text)
    if not match:
        return f"unknown config key in {' '.join(a for a in argv if a.startswith('--config.'))}; check its spelling"
    guess, bad = match.groups()
    for arg in argv:
        parts = arg.split("=")[0].removeprefix("--config.").split(".")
        if arg.startswith("--config.") and bad in parts:
            at = parts.index(bad)
            key, fix = ".".join(parts[: at + 1]), ".".join(parts[:at] + [guess])
            return f"unknown config key {key}; did you mean {fix}?"
    return f"unknown config key {bad}; did you mean {guess}?"


def run(main: Callable[[], None]) -> None:
    """Run main(), reporting a UserError as one line and exit status 2."""
    try:
        main()
    except UserError as error:
        fail(str(error))
    except KeyboardInterrupt:  # a second Ctrl-C: stop without waiting for the step
        print("interrupted; the last complete checkpoint is kept", file=sys.stderr)
        sys.exit(130)
