"""Process-wide JAX settings, made before JAX starts its backends or compiles anything.

  - The persistent compilation cache: a compiled train step is written under the user's
    cache directory, so a second run of the same config (a resume, a sample after training)
    skips most of compilation.
  - On a CPU, one XLA device, whatever the core count. XLA's CPU backend can also expose each
    core as a device, and splitting the batch over them was faster on some machines, but then
    every step ends in an all-reduce between devices of one process, and XLA's in-process
    collectives block threads of pools the devices share: when one device's thread is starved
    (a busy machine) the other waits in the rendezvous until XLA ends the process (SIGABRT
    after 40 s, "Expected 2 threads to join the rendezvous"). A single device has no
    collectives to wait in; docs/benchmarks.md has the measurements behind the choice.
    JAX_NUM_CPU_DEVICES or XLA_FLAGS=--xla_force_host_platform_device_count=N still give N
    devices to whoever asks, with a warning.
Scripts call `configure` first thing; a notebook calls it in its first cell.
"""

from __future__ import annotations

import os
import warnings
from functools import partial
from pathlib import Path

import jax

CACHE_ENV = "JAXGPT_COMPILATION_CACHE"  # a directory, or "off"
COLLECTIVES_WARNING = (
    "{n} CPU devices in one process end every step in an in-process all-reduce, which XLA aborts "
    "(SIGABRT) when a busy machine starves one device's thread for 40 s; the default of one CPU device "
    "cannot hit this (unset JAX_NUM_CPU_DEVICES / --xla_force_host_platform_device_count)"
)


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
    """Keep compiled programs in compilation_cache_dir(), unless caching is off or a cache
    directory was already chosen (by the user, or an earlier call)."""
    path = compilation_cache_dir()
    if path is None:
        return None
    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)
    jax.config.update("jax_compilation_cache_dir", str(path))
    # JAX's defaults skip programs that compile in under a second; a small model's train step
    # compiles in about two, its eval step and sampler in less, and all are worth keeping.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def requested_cpu_devices() -> int | None:
    """The CPU device count the user asked for through the environment, if any."""
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith("--xla_force_host_platform_device_count="):
            return int(flag.split("=", 1)[1])
    if os.environ.get("JAX_NUM_CPU_DEVICES"):
        return int(os.environ["JAX_NUM_CPU_DEVICES"])
    return None


def configure(single_process: bool = True, warn=None) -> None:
    """Enable the compilation cache; warn (through `warn`, default `warnings.warn`) when one
    process was given several CPU devices. Starts no backend: multi-process runs initialise
    jax.distributed after this."""
    enable_compilation_cache()
    requested = requested_cpu_devices()
    if single_process and requested and requested > 1 and os.environ.get("JAX_PLATFORMS", "cpu").startswith("cpu"):
        (warn or partial(warnings.warn, stacklevel=2))(COLLECTIVES_WARNING.format(n=requested))
