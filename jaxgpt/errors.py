"""The one exception type for bad input: a config, a data source, a checkpoint, a CLI flag.

Command-line shells print its message as one line and exit with status 2; anything else is a
bug and keeps its traceback.
"""


class UserError(Exception):
    """Input that cannot work. The message names what was wrong, the value seen, and the fix."""
