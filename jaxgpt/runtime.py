"""Process-wide JAX settings that must be made before JAX starts its backends or compiles
anything: the persistent compilation cache and, on CPU, one XLA device per core.

Both are measured choices (docs/benchmarks.md):
  - a compiled train step is written to a cache under the user's cache directory, so a second
    run of the same config (a resume, a sample after training) skips most of compilation;
  - XLA gives one CPU device a thread pool over every core, but a small transformer step
    keeps that pool mostly idle; exposing each core as its own device and splitting the
    batch over them (plain data parallelism on the mesh) keeps both cores of a laptop busy.
Scripts call `configure` first thing; a notebook calls it in its first cell. Called after
JAX has started, it changes only what can still change and says so.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import jax

CACHE_ENV = "JAXGPT_COMPILATION_CACHE"  # a directory, or "off"


def compilation_cache_dir() -> Path | None:
    """Where compiled programs are kept: $JAXGPT_COMPILATION_CACHE, else beside the data cache
    ($JAXGPT_CACHE or ~/.cache/jaxgpt) in xla/; None when the variable says "off"."""
    setting = os.environ.get(CACHE_ENV, "")
    if setting.lower() in ("off", "0", "false", "none"):
        return None
    if setting:
        return Path(setting)
    return Path(os.environ.get("JAXGPT_CACHE") or Path.home() / ".cache" / "jaxgpt") / "xla"


def enable_compilation_cache() -> Path | None:
    path = compilation_cache_dir()
    if path is None:
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    # JAX's defaults skip programs that compile in under a second; a small model's train step
    # compiles in about two, its eval step and sampler in less, and all are worth keeping.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def cpu_devices_for(rows: int, cores: int | None = None) -> int:
    """How many CPU devices to split `rows` (the rows of one microbatch) over: the most that
    divides the rows evenly without exceeding the cores."""
    cores = cores or os.cpu_count() or 1
    return max(n for n in range(1, min(cores, rows) + 1) if rows % n == 0)


def _device_count_forced() -> bool:
    return "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "") or bool(
        os.environ.get("JAX_NUM_CPU_DEVICES")
    )


def configure(rows_per_microbatch: int | None = None, single_process: bool = True) -> None:
    """Enable the compilation cache; with `rows_per_microbatch`, also give the CPU backend one
    device per core (dividing those rows) unless the user chose a device count in XLA_FLAGS
    or JAX_NUM_CPU_DEVICES, or this is one of several processes (each then keeps one)."""
    enable_compilation_cache()
    if rows_per_microbatch is None or not single_process or _device_count_forced():
        return
    count = cpu_devices_for(rows_per_microbatch)
    if jax.config.jax_num_cpu_devices == count:
        return
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # the CPU backend already started (a notebook that used JAX first)
        warnings.warn(
            f"JAX has already started, so the CPU keeps its {jax.local_device_count('cpu')} device(s); "
            "call jaxgpt.runtime.configure() before any other JAX call to use one device per core",
            stacklevel=2,
        )
