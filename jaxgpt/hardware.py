"""What the hardware is and can do at most: the CPU's name and caches, and the peak FLOP/s
that model FLOPs utilisation (MFU) is measured against."""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp

# Dense bfloat16 peak FLOP/s per device from the vendors' datasheets (no sparsity). Matched
# against jax's device_kind by substring, first match wins.
DATASHEET_PEAK_FLOPS = (
    ("H200", 989e12),
    ("H100", 989e12),  # SXM; the PCIe card is 756e12
    ("A100", 312e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("T4", 65e12),
    ("V100", 125e12),
    ("TPU v6", 918e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5e", 197e12),
    ("TPU v5", 459e12),
    ("TPU v4", 275e12),
    ("TPU v3", 61.5e12),  # per core (123 per chip of 2 cores)
    ("TPU v2", 22.5e12),  # per core (45 per chip of 2 cores)
)


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def cpu_cache_bytes(level: int) -> int | None:
    """Size of the CPU's level-`level` data or unified cache as the OS reports it (Linux
    sysfs; None elsewhere or when the VM hides it)."""
    for index in sorted(CPU_CACHE_DIR.glob("index*")):
        try:
            if int((index / "level").read_text()) != level or (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return None


def describe_cpu() -> str:
    """One line naming the machine, for every benchmark table and the training log."""
    l3 = cpu_cache_bytes(3)
    cache = f", L3 {l3 // 2**20} MiB" if l3 else ""
    return f"{cpu_model()} ({os.cpu_count()} cores{cache})"


def _peak_record() -> Path:
    root = Path(os.environ.get("JAXGPT_CACHE") or Path.home() / ".cache" / "jaxgpt")
    return root / "cpu_peak.json"


@functools.cache
def measured_cpu_peak_flops() -> float:
    """The float32 matmul FLOP/s this CPU has been seen to reach: the ceiling that training
    FLOPs are compared against on CPU (no datasheet number fits every CPU).

    One measurement is at the mercy of whatever else the machine runs at that moment (MFU
    figures swung from 23% to 69% across identical runs when the peak was measured afresh each
    time), so the best figure seen on this machine is kept in the cache folder and each start
    can only raise it: the figure settles at what the CPU does when idle."""
    key = f"{describe_cpu()}; jax {jax.__version__}"
    record = _peak_record()
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    best = max(matmul_flops(), float(known.get(key, 0.0)))
    if best > known.get(key, 0.0):
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            tmp = record.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(known | {key: best}, indent=1))
            tmp.replace(record)
        except OSError:  # a read-only home: the figure is still this start's best
            pass
    return best


def matmul_flops(size: int = 1024, windows: int = 5, seconds: float = 0.2) -> float:
    """FLOP/s of a large float32 matmul: the best of several short windows, since a shared
    machine only ever slows a window down."""
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = 0.0
    for _ in range(windows):
        runs, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            matmul(a).block_until_ready()
            runs += 1
        best = max(best, 2 * size**3 * runs / elapsed)
    return best


def peak_flops(devices=None) -> tuple[float, str]:
    """(peak FLOP/s of all `devices` together, where the number comes from).

    On CPU the fake devices of --xla_force_host_platform_device_count share the same cores,
    so the machine's measured peak is the ceiling whatever their number.
    """
    devices = devices or jax.devices()
    kind = devices[0].device_kind
    if devices[0].platform == "cpu":
        return measured_cpu_peak_flops(), "measured float32 matmul peak of this CPU"
    for name, flops in DATASHEET_PEAK_FLOPS:
        if name.lower() in kind.lower():
            return flops * len(devices), f"datasheet bfloat16 peak of {len(devices)} x {kind}"
    return float("nan"), f"unknown peak for device kind {kind!r}"
