"""Ctrl-C, counted. A command's watcher (jaxgpt/commands/interrupt.py) ends it at once on a
SIGINT that no handler of the command's own takes; a training loop's clean stop
(jaxgpt/job/stopping.py) takes the first. The watcher reads each signal from a pipe, on a
thread of its own, and may read the first one only after the loop's handler has run and put the
watcher's handler back: judged by the handler alone, that first Ctrl-C looked like a second and
ended the run at once, without its checkpoint (seen once under `script`; reproduced by sending
SIGINT into a clean stop 300 times). So a handler that takes one says so here, and the watcher
acts only on a SIGINT beyond those taken.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_taken = 0


def take() -> None:
    """Called by a handler of a command's own that takes a SIGINT (it stops cleanly instead)."""
    global _taken
    with _lock:
        _taken += 1


def taken() -> int:
    """How many SIGINTs handlers of the command's own have taken so far."""
    with _lock:
        return _taken
