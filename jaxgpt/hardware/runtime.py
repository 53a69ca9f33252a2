"""Process-wide JAX settings, made before JAX starts its backends or compiles anything.

  - The persistent compilation cache: a compiled train step is written under the user's
    cache directory, so a second run of the same config (a resume, a sample after training)
    skips most of compilation; at most 2 GiB, least recently used programs evicted first.
  - On a CPU, one XLA device per core the process may use, for the trainer to run one
    single-device program per core on its share of the batch (jaxgpt/hardware/core_parallel.py). Every
    mesh built without naming its devices still has one CPU device: a mesh over several CPU
    devices ends every step in an in-process all-reduce, and XLA's CPU collectives block
    threads of pools the devices share, so when one device's thread is starved (a busy machine)
    the other waits in the rendezvous until XLA ends the process (SIGABRT after 40 s, "Expected 2
    threads to join the rendezvous"). Per-core programs have no collective to wait in.
    $JAXGPT_CPU_CORES sets the core count (1: one device, nothing per core).
    JAX_NUM_CPU_DEVICES or XLA_FLAGS=--xla_force_host_platform_device_count=N still give meshes
    of N devices to whoever asks, with a warning.
  - No TPU backend where there is no TPU: with libtpu installed (to compile for TPUs ahead of
    time), JAX tries a TPU backend first at every start, and libtpu prints errors about the TPU
    it cannot find before JAX falls back to the CPU. A machine with no TPU chip and no NVIDIA GPU
    gets the CPU backend alone; JAX_PLATFORMS, where set, decides instead.
Scripts call `configure` first thing; a notebook calls it in its first cell.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from functools import partial
from pathlib import Path

import jax

from jaxgpt.errors import UserError
from jaxgpt.hardware import memory
from jaxgpt.hardware.machine import cache_root, usable_cores

CACHE_ENV = "JAXGPT_COMPILATION_CACHE"  # a directory, or "off"
COMPILATION_CACHE_BYTES = 2 << 30  # configs/tiny.py's compiled train step: ~0.3 MB on CPU
CORES_ENV = "JAXGPT_CPU_CORES"  # how many CPU cores train; 1: one device
COLLECTIVES_WARNING = (
    "{n} CPU devices in one process end every step in an in-process all-reduce, which XLA aborts "
    "(SIGABRT) when a busy machine starves one device's thread for 40 s; the default (one program per core, "
    "no collectives) cannot hit this (unset JAX_NUM_CPU_DEVICES / --xla_force_host_platform_device_count)"
)

_cpu_devices_are_cores = False  # set by configure: the CPU devices stand for cores, not a mesh


def compilation_cache_dir() -> Path | None:
    """Where compiled programs are kept: $JAXGPT_COMPILATION_CACHE, else beside the data cache
    ($JAXGPT_CACHE or ~/.cache/jaxgpt) in xla/; None when the variable says "off"."""
    setting = os.environ.get(CACHE_ENV, "")
    if setting.lower() in ("off", "0", "false", "none"):
        return None
    if setting:
        return Path(setting)
    return cache_root() / "xla"


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
    # A size limit makes JAX evict the least recently used programs and take a file lock around
    # every read and write, so runs started at once (a sweep, the test suite's workers) never
    # read a program another is still writing.
    jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_BYTES)
    return path


def platforms_without_a_tpu(libtpu_installed: bool, tpu_chips: int, nvidia_gpu: bool) -> str | None:
    """The JAX platforms for this machine when JAX would otherwise try a TPU that is not there:
    "cpu" with libtpu installed, no TPU chip on the PCI bus and no NVIDIA GPU (where a GPU is,
    its backend is JAX's to choose); None where JAX's own choice is right."""
    return "cpu" if libtpu_installed and tpu_chips == 0 and not nvidia_gpu else None


def _platforms_for_this_machine() -> str | None:
    try:  # JAX's own look at the PCI bus and /dev, the one it makes before starting libtpu
        from jax._src import hardware_utils

        chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
        nvidia = hardware_utils.has_visible_nvidia_gpu()
    except (ImportError, AttributeError, OSError):  # another JAX: leave the choice to it
        return None
    return platforms_without_a_tpu(importlib.util.find_spec("libtpu") is not None, chips, nvidia)


def start_up() -> None:
    """What every command does before JAX starts a backend (jaxgpt.commands.cli.run calls it):
    one line for an address-space limit JAX and XLA cannot run under (they would abort later
    with std::bad_alloc, or fail to start a thread), then the platforms chosen."""
    memory.check_address_space()
    choose_platforms()


def choose_platforms() -> None:
    """Leave out the TPU backend where there is no TPU (the module's doc says why). JAX_PLATFORMS,
    or a choice already made, decides instead."""
    if "JAX_PLATFORMS" not in os.environ and not jax.config.jax_platforms:
        platforms = _platforms_for_this_machine()
        if platforms:
            jax.config.update("jax_platforms", platforms)


def requested_cpu_devices() -> int | None:
    """The CPU device count the user asked for through the environment, if any."""
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith("--xla_force_host_platform_device_count="):
            return int(flag.split("=", 1)[1])
    if os.environ.get("JAX_NUM_CPU_DEVICES"):
        return int(os.environ["JAX_NUM_CPU_DEVICES"])
    return None


def cpu_cores() -> int:
    """The CPU cores to train on: $JAXGPT_CPU_CORES, else every core this process may run on
    (its affinity mask: what taskset, cgroups and container limits leave it)."""
    setting = os.environ.get(CORES_ENV, "")
    if setting:
        if not setting.isdigit() or int(setting) < 1:
            raise UserError(f"{CORES_ENV}={setting!r} is not a core count; set it to a whole number >= 1, or unset it")
        return int(setting)
    return usable_cores()


def mesh_devices() -> list:
    """The devices a mesh spans when none are named: all of the default backend's, except the
    per-core CPU devices `configure` made, of which a mesh takes one (see the module's doc)."""
    devices = jax.devices()
    return devices[:1] if _cpu_devices_are_cores and devices[0].platform == "cpu" else devices


def core_devices() -> list:
    """The CPU devices that stand for cores (one, unless `configure` made one per core)."""
    devices = jax.devices("cpu")
    return devices if _cpu_devices_are_cores else devices[:1]


def configure(single_process: bool = True, warn=None) -> None:
    """Enable the compilation cache; leave out the TPU backend where there is no TPU; give JAX
    one CPU device per core (single-process runs with no device count in the environment); warn
    (through `warn`, default `warnings.warn`) when one process was given several CPU devices for
    meshes. Starts no backend: multi-process runs initialise jax.distributed after this."""
    global _cpu_devices_are_cores
    start_up()  # again for callers outside a command (a notebook, a benchmark)
    enable_compilation_cache()
    requested = requested_cpu_devices()
    if single_process and requested and requested > 1 and os.environ.get("JAX_PLATFORMS", "cpu").startswith("cpu"):
        (warn or partial(warnings.warn, stacklevel=2))(COLLECTIVES_WARNING.format(n=requested))
    cores = cpu_cores()
    if single_process and requested is None and cores > 1 and not _cpu_devices_are_cores:
        try:
            jax.config.update("jax_num_cpu_devices", cores)
            _cpu_devices_are_cores = True
        except RuntimeError:  # JAX already started (a notebook's later cell): stay on one device
            pass
