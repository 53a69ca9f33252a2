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
