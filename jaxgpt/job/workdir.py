"""A run's directory: making it, locking it against a second trainer, and moving old runs aside.

Nothing here ever deletes a user's file. A workdir that cannot be used (a file, a read-only
folder, one another trainer holds) is refused with a UserError naming it and the fix.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path

from jaxgpt.errors import UserError
from jaxgpt.job.checkpoint import unused_sibling

LOCK_NAME = "train.lock"
# What a run keeps in its workdir, and whether each is a file or a folder (jaxgpt/job/trainer.py)
RUN_FILES = {
    LOCK_NAME: "file",
    "config.json": "file",
    "tokenizer.json": "file",
    "metrics.jsonl": "file",
    "checkpoints": "folder",
    "tensorboard": "folder",
}


def check_not_under_a_file(workdir: Path) -> None:
    """One line where `workdir`, or a folder above it, is a file: it can never be made."""
    for parent in [workdir, *workdir.parents]:
        if parent.exists() and not parent.is_dir():
            what = "is a file" if parent == workdir else f"is under {parent}, which is a file"
            raise UserError(f"workdir {workdir} {what}; pass --workdir a directory (new or from an earlier run)")


def make(workdir: Path) -> None:
    """Create `workdir` (and its parents), or say in one line why it cannot be."""
    check_not_under_a_file(workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe = workdir / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise UserError(
            f"cannot write to workdir {workdir} ({error.strerror}); pass --workdir a folder you can write to"
        ) from None
    check_run_files(workdir)


def check_run_files(workdir: Path) -> None:
    """One line, before any work, where a name the run uses is taken by the other kind of thing
    (a folder called train.lock, a file called tensorboard): the run would fail on it later."""
    for name, kind in RUN_FILES.items():
        path = workdir / name
        found = "folder" if path.is_dir() else "file" if path.exists() else None
        if found and found != kind:
            raise UserError(
                f"{path} is a {found}, where a run keeps its {name} {kind}; nothing was changed. Move it out of the "
                "workdir (or pass another --workdir) and rerun"
            )


def move_aside(workdir: Path) -> Path:
    """Rename a whole earlier run to `<workdir>.previous-<n>` (--fresh)."""
    aside = unused_sibling(workdir, "previous")
    workdir.rename(aside)
    return aside


@contextlib.contextmanager
def locked(workdir: Path):
    """Hold `<workdir>/train.lock` while training, so a second trainer started on the same
    workdir (a double-launched job) is refused at once instead of both writing the same files.

    The lock is the operating system's (flock): it is released when the process ends however
    it ends, so a crashed run never leaves a stale lock behind. The file records the holder's
    pid and host for the message the second trainer prints.
    """
    path = workdir / LOCK_NAME
    handle = open(path, "a+")  # noqa: SIM115  (held open for the whole run)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UserError(
            f"workdir {workdir} is in use by a trainer still running ({holder}); wait for it to finish, stop it, "
            "or pass another --workdir"
        ) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the lock; the file stays, harmless and reused
