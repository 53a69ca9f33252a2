"""What the hardware can do at most, for model FLOPs utilisation (MFU)."""

from __future__ import annotations

import functools
import time

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


@functools.cache
def measured_cpu_peak_flops(size: int = 1024, windows: int = 5, seconds: float = 0.2) -> float:
    """FLOP/s of a large float32 matmul on this machine's CPU: the practical ceiling that
    training FLOPs are compared against on CPU (no datasheet number fits every CPU). The best
    of several short windows, since a shared machine only ever slows a window down."""
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
