"""Ctrl-C ends any command at once, at any moment, with exit status 130 and one line.

Left to Python, SIGINT becomes a KeyboardInterrupt raised wherever the main thread happens to be:
inside JAX that can be a wait on XLA's compile threads or a C++ call back into Python, and
unwinding from there, then finalising the interpreter while XLA's threads still run, crashed the
process (SIGSEGV: 12 of 12 interrupts 1.5-3 s into a fresh run on a 2-core Zen 5, 3 of 4 on a
Zen 3). Here the signal is never raised as an exception: its C-level handler writes the signal's number to a pipe
(`signal.set_wakeup_fd`), and a watcher thread reading the pipe prints the command's line and
ends the process with `os._exit(130)`, which skips that finalisation. What a command writes is
written whole or not at all either way (checkpoints and prepared shards under temporary names,
renamed when complete; a metrics line cut short is dropped on resume).

A training loop first gets the chance to stop cleanly: while it holds SIGINT with a handler of
its own (jaxgpt.job.stopping.StopRequests), the watcher leaves the signal to it, and it puts this
module's handler back for the second Ctrl-C, which then ends the command at once. The watcher
counts: it acts on a SIGINT beyond those such handlers took (jaxgpt/interrupts.py), since it may
read the first one only after the loop's handler has already put this module's back.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from jaxgpt import interrupts

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process ended by Ctrl-C


def flush_output() -> None:
    """stdout and stderr flushed, whatever state they are in."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # closed, or being written by the main thread
            pass


def _leave_it_to_the_watcher(signum, frame) -> None:
    """The Python-level handler: the watcher thread has already acted on the signal."""


def ends_at_once(seen: int, taken: int, handler) -> bool:
    """Whether the watcher, having read its `seen`-th SIGINT, ends the command: where no handler
    of the command's own holds the signal now, and one of those read was taken by none."""
    return handler is _leave_it_to_the_watcher and seen > taken


_watcher: dict = {}  # the one watcher a process runs: its pipe's write end, and the line it prints


def end_at_once_on_interrupt(line: str) -> None:
    """From now on, Ctrl-C prints `line` to stderr and exits INTERRUPTED, unless a handler of
    the command's own holds SIGINT (a training loop's clean stop). Only the main thread may
    install signal handlers: elsewhere (a notebook's worker thread) this does nothing. A second
    command in the same process (a notebook, the tests) keeps the watcher and changes its line."""
    if threading.current_thread() is not threading.main_thread():
        return
    _watcher["line"] = line
    if "write_end" not in _watcher:
        read_end, _watcher["write_end"] = os.pipe()
        os.set_blocking(_watcher["write_end"], False)  # the C handler must never block on a full pipe
        threading.Thread(target=_watch, args=(read_end,), name="jaxgpt-interrupt", daemon=True).start()
    signal.signal(signal.SIGINT, _leave_it_to_the_watcher)
    signal.set_wakeup_fd(_watcher["write_end"], warn_on_full_buffer=False)


def _watch(read_end: int) -> None:
    seen = 0  # SIGINTs read from the pipe
    while True:
        for signum in os.read(read_end, 64):
            seen += signum == signal.SIGINT
            if signum == signal.SIGINT and ends_at_once(seen, interrupts.taken(), signal.getsignal(signal.SIGINT)):
                flushing = threading.Thread(target=flush_output, daemon=True)
                flushing.start()
                flushing.join(timeout=1.0)  # what was printed before, unless a stream is stuck
                os.write(2, f"\n{_watcher['line']}\n".encode())
                os._exit(INTERRUPTED)
