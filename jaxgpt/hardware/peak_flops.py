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

from jaxgpt.hardware.machine import cache_root, keep
from jaxgpt.model.products import units_among

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


CPUINFO = Path("/proc/cpuinfo")
SYS_CPU = Path("/sys/devices/system/cpu")


def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where there is none)."""
    try:
        block = CPUINFO.read_text().split("\n\n")[0]
    except OSError:
        return {}
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in block.splitlines())}


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (platform.processor() elsewhere)."""
    return cpuinfo().get("model name") or platform.processor() or platform.machine()


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


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on: two hyperthreads of one core
    share its FMA units, so they count once (Linux sysfs topology; the CPU count elsewhere)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = SYS_CPU / f"cpu{cpu}" / "topology"
        try:
            cores.add(tuple((topology / name).read_text().strip() for name in ("physical_package_id", "core_id")))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return len(cores)


def cpu_clock_hz() -> tuple[float, str] | None:
    """(clock, where it was read): the maximum clock cpufreq reports, else the clock in
    /proc/cpuinfo, which a VM without cpufreq reports as the nominal (base) clock."""
    try:
        return int((SYS_CPU / "cpu0" / "cpufreq" / "cpuinfo_max_freq").read_text()) * 1e3, "cpufreq maximum"
    except (OSError, ValueError):
        pass
    try:
        return float(cpuinfo()["cpu MHz"]) * 1e6, "clock in /proc/cpuinfo"
    except (KeyError, ValueError):
        return None


def float32_flops_per_cycle(info: dict[str, str]) -> tuple[int, str] | None:
    """Float32 FLOPs one x86 core can issue per cycle, from its instruction-set flags: vector
    lanes x 2 (a fused multiply-add is two FLOPs) x FMA units. The number of FMA units is not
    in any flag; two is what server cores since Haswell and Zen 2 have (an AVX-512 Xeon with
    one 512-bit unit, some Silver and Bronze parts, does half this). None for other CPUs."""
    flags = set(info.get("flags", "").split())
    if "avx512f" in flags:
        if info.get("vendor_id") == "AuthenticAMD" and int(info.get("cpu family", 0)) < 26:
            return 32, "AVX-512 on two 256-bit FMA units (Zen 4)"
        return 64, "AVX-512, two 512-bit FMA units"
    if {"avx2", "fma"} <= flags:
        return 32, "AVX2, two 256-bit FMA units"
    if "avx" in flags:
        return 16, "AVX, one 256-bit multiply and one add"
    if "sse2" in flags:
        return 8, "SSE, one 128-bit multiply and one add"
    return None


def flops_per_cycle(info: dict[str, str], dtype: str = "float32") -> tuple[int, str] | None:
    """FLOPs one x86 core can issue per cycle in products of `dtype`. A bfloat16 run computes
    its projections' products on bfloat16 units where the CPU has them (jaxgpt/model/products.py):
    AMX's tiles, 1,024 FLOPs a cycle (a 16 x 32 by 32 x 16 product every 16 cycles), or
    AVX512-BF16's dot products, two bfloat16 pairs where float32 has one number; without them
    its products run at float32's rate. None where float32's is unknown."""
    float32 = float32_flops_per_cycle(info)
    if dtype != "bfloat16" or float32 is None:
        return float32
    units = units_among(set(info.get("flags", "").split()))  # what products.py multiplies on
    if "AMX" in units:
        return 1024, "AMX-BF16 tiles"
    if "AVX512-BF16" in units:
        return 2 * float32[0], f"AVX512-BF16 dot products: twice float32's {float32[0]}, {float32[1]}"
    return float32[0], f"no bfloat16 units: float32's rate, {float32[1]}"


def computed_cpu_peak(dtype: str = "float32") -> tuple[float, str] | None:
    """(FLOP/s, how): physical cores x clock x `dtype`'s FLOPs per cycle. It does not depend on
    what else the machine is doing; None where the clock or the instruction set is unknown."""
    clock, per_cycle = cpu_clock_hz(), flops_per_cycle(cpuinfo(), dtype)
    if clock is None or per_cycle is None:
        return None
    cores = physical_cores()
    return cores * clock[0] * per_cycle[0], (
        f"{cores} cores x {clock[0] / 1e9:.2f} GHz ({clock[1]}) x {per_cycle[0]} {dtype} FLOP/cycle ({per_cycle[1]})"
    )


def _peak_record() -> Path:
    return cache_root() / "cpu_peak.json"


# A measurement counts only if the rest of the machine used less than this share of its CPUs
# meanwhile: under load a matmul ran at 40-60% of its idle speed even per CPU-second (shared
# caches, the hypervisor), so a busy measurement says nothing about the hardware.
IDLE_SHARE = 0.05


def _machine_busy_seconds() -> float | None:
    """CPU-seconds all processes (and the hypervisor, as steal) have used since boot."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    jiffies = [int(field) for field in fields]
    idle = jiffies[3] + jiffies[4]  # idle + iowait; steal (field 8) counts as busy
    return (sum(jiffies[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def measure_when_idle(measure) -> tuple[float, bool]:
    """(measure(), whether the rest of the machine was idle while it ran)."""
    busy, own, started = _machine_busy_seconds(), os.times(), time.perf_counter()
    result = measure()
    wall, busy_after, own_after = time.perf_counter() - started, _machine_busy_seconds(), os.times()
    if busy is None or busy_after is None:
        return result, False
    others = (busy_after - busy) - (own_after.user + own_after.system - own.user - own.system)
    return result, others <= IDLE_SHARE * wall * (os.cpu_count() or 1)


def idle_measured_cpu_peak(once: bool = False) -> float:
    """The best float32 matmul FLOP/s seen on this machine while it was otherwise idle (0 if
    never): measured now, kept in the cache folder, only ever raised. With `once`, a start
    that finds one on record takes it without measuring (the measurement costs a second)."""
    key = f"{describe_cpu()}; jax {jax.__version__}"
    record = _peak_record()
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    best = float(known.get(key, 0.0))
    if once and best:
        return best
    flops, idle = measure_when_idle(matmul_flops)
    if idle and flops > best:
        best = flops
        keep(record, json.dumps(known | {key: best}, indent=1))  # a read-only home: still this start's best
    return best


@functools.cache
def cpu_peak_flops(dtype: str = "float32") -> tuple[float, str]:
    """(FLOP/s, where from): the ceiling a run computing in `dtype` compares its training FLOPs
    against on CPU.

    The reference is computed from the hardware (cores x clock x FLOPs per cycle), so it is the
    same at every start on a machine, the first included, whatever else runs. A float32 matmul
    measured while the machine was idle is shown beside it as a check, never used in its place:
    where it beats float32's computed figure, the cores run faster than the clock the OS reports
    (a VM hiding its boost clock), and the line says so. Only where no clock or instruction set
    is known is the best idle measurement the reference (then it may rise from one start to the
    next). As a check it is measured only until one idle measurement is on record, so later
    starts spend no second on it."""
    computed, float32 = computed_cpu_peak(dtype), computed_cpu_peak()
    measured = idle_measured_cpu_peak(once=computed is not None)
    matmul = "idle matmul" if dtype == "float32" else "idle float32 matmul"
    check = f"; {matmul} measured {measured / 1e9:,.0f}" if measured else f"; no {matmul} measurement yet"
    if computed:
        faster = ", faster than this clock allows: MFU against it reads high" if measured > float32[0] else ""
        return computed[0], computed[1] + check + faster
    if measured:
        return measured, "float32 matmul measured on this machine while idle (no clock or FLOPs per cycle known)"
    return float("nan"), "unknown: no clock or FLOPs per cycle known and no idle measurement yet"


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


def peak_flops(devices=None, dtype: str = "float32") -> tuple[float, str]:
    """(peak FLOP/s of all `devices` together for a run computing in `dtype`, where the number
    comes from).

    On CPU the fake devices of --xla_force_host_platform_device_count share the same cores,
    so the machine's peak is the ceiling whatever their number, and a bfloat16 run's is its
    bfloat16 units'. An accelerator's is its datasheet's dense bfloat16 peak, the convention
    MFU is quoted in, whatever the run's dtype.
    """
    devices = devices or jax.devices()
    kind = devices[0].device_kind
    if devices[0].platform == "cpu":
        return cpu_peak_flops(dtype)
    for name, flops in DATASHEET_PEAK_FLOPS:
        if name.lower() in kind.lower():
            return flops * len(devices), f"datasheet bfloat16 peak of {len(devices)} x {kind}"
    return float("nan"), f"unknown peak for device kind {kind!r}"
