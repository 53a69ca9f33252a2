"""The one exception type for bad input (a config, a data source, a checkpoint, a CLI flag),
and the one way to tell the user something they must know.

Command-line shells print a UserError's message as one line and exit with status 2; anything
else is a bug and keeps its traceback.
"""

import sys


class UserError(Exception):
    """Input that cannot work. The message names what was wrong, the value seen, and the fix."""


def warn(message: str) -> None:
    """Something the user must know even with progress output off: one line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """warn(), but once per process for a given message: for code that runs twice, as a config
    file does (checked, then loaded by ml_collections)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warn(message)
