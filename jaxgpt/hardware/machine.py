"""What this process may use of the machine, read from its environment (and nowhere else in
jaxgpt): the CPU cores it may run on, and where jaxgpt keeps what it derives. No JAX here: the
data preparation reads these on a machine that may never start a backend."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "JAXGPT_CACHE"


def cache_root() -> Path:
    """Where jaxgpt keeps what it derives and can rebuild (prepared tokens, compiled programs,
    the CPU's measured peak): $JAXGPT_CACHE, else ~/.cache/jaxgpt."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "jaxgpt")


def keep(path: Path, text: str) -> None:
    """Write something derived (under cache_root or the compilation cache) whole: beside, then
    renamed into place, so a process started beside this one reads all of it or none. A cache it
    cannot write is only not kept: what was derived is still this process's."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        beside = path.with_name(f"{path.name}.{os.getpid()}.partial")
        beside.write_text(text)
        beside.replace(path)
    except OSError:
        pass


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity mask (what taskset, cgroups and
    container limits leave it), which os.cpu_count() ignores."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
