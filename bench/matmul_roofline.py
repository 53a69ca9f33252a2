"""How fast this machine multiplies the matrices of one training shape, each alone: the ceiling
on MFU that the shape's matmuls set before anything else in the step costs time.

    python bench/matmul_roofline.py [--width 384 --heads 6 --seq 256 --batch 16] [--out FILE]

For each matmul of a transformer block's forward pass (the backward pass runs the same shapes
transposed) it times the jitted einsum two ways: on one CPU device (XLA spreading it over its
threads), and split by rows over one device per core, each core multiplying its share at the
same time (how train.py runs a step on CPU, jaxgpt/hardware/core_parallel.py). It reports GFLOP/s and the
share of the peak that jaxgpt.hardware.peak_flops uses for MFU, and the block's ceiling: its matmul FLOPs
over the time they take at these rates, the MFU a step made of nothing but these matmuls would
reach. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxgpt.hardware import runtime  # noqa: E402
from jaxgpt.hardware.peak_flops import describe_cpu, peak_flops  # noqa: E402


def matmul_flops(a_shape: tuple, b_shape: tuple) -> int:
    """FLOPs of one of the einsums below: each contracts a's last axis, and b's last is the
    output's (batched ones share their leading axis)."""
    return 2 * int(np.prod(a_shape)) * b_shape[-1]


def rate(equation: str, a_shape: tuple, b_shape: tuple, devices: list, seconds: float = 0.5) -> float:
    """FLOP/s of einsum(equation, a, b) with a's first axis split evenly over `devices`, each
    device multiplying its share at the same time; the best of five windows."""
    rng = np.random.default_rng(0)
    share = (a_shape[0] // len(devices), *a_shape[1:])
    b_share = b_shape if len(b_shape) == 2 else (share[0], *b_shape[1:])  # batched: b splits too
    pairs = [
        (jax.device_put(rng.normal(size=share).astype(np.float32), device),
         jax.device_put(rng.normal(size=b_share).astype(np.float32), device))
        for device in devices
    ]  # fmt: skip
    f = jax.jit(lambda a, b: jnp.einsum(equation, a, b))
    flops = matmul_flops(share, b_share) * len(devices)
    jax.block_until_ready([f(a, b) for a, b in pairs])
    best = 0.0
    for _ in range(5):
        runs, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 5:
            jax.block_until_ready([f(a, b) for a, b in pairs])
            runs += 1
        best = max(best, flops * runs / elapsed)
    return best


def ceiling(flops_and_rates: list[tuple[float, float]]) -> float:
    """FLOP/s of a sequence of matmuls run one after another: total FLOPs over total time."""
    return sum(f for f, _ in flops_and_rates) / sum(f / r for f, r in flops_and_rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", default="bench/results/matmul_roofline.json")
    args = parser.parse_args()
    runtime.configure()  # one CPU device per core, as train.py
    d, t, h = args.width, args.seq, args.heads
    tokens = args.batch * t
    head_dim = d // h
    cases = {
        "qkv projection": ("md,dk->mk", (tokens, d), (d, 3 * d)),
        "attention scores q k^T": ("bqd,bdk->bqk", (args.batch * h, t, head_dim), (args.batch * h, head_dim, t)),
        "attention weights x v": ("bqk,bkd->bqd", (args.batch * h, t, t), (args.batch * h, t, head_dim)),
        "output projection": ("md,dk->mk", (tokens, d), (d, d)),
        "MLP up": ("md,dk->mk", (tokens, d), (d, 4 * d)),
        "MLP down": ("md,dk->mk", (tokens, 4 * d), (4 * d, d)),
    }
    peak, source = peak_flops()
    cores = runtime.core_devices()
    ways = {"one_device": cores[:1], "per_core": cores}  # the second: split over the cores, as train.py
    titles = {"one_device": "one device", "per_core": f"{len(cores)} cores"}
    print(f"peak {peak / 1e9:,.0f} GFLOP/s ({source}); shape d={d}, T={t}, heads={h}, batch={args.batch}")
    print(f"{describe_cpu()}; GFLOP/s (share of the peak)")
    print(f"{'matmul':26}" + "".join(f"{titles[way]:>18}" for way in ways))
    results, timed = [], {way: [] for way in ways}
    for name, (equation, a_shape, b_shape) in cases.items():
        flops = matmul_flops(a_shape, b_shape)
        row = {"matmul": name, "flops": flops}
        for way, devices in ways.items():
            row[way] = rate(equation, a_shape, b_shape, devices)
            timed[way].append((flops, row[way]))
        results.append(row)
        print(f"{name:26}" + "".join(f"{row[w] / 1e9:>10,.0f} ({row[w] / peak:>4.0%})" for w in ways))
    block = {way: ceiling(pairs) for way, pairs in timed.items()}
    print(
        f"{'block ceiling (by FLOPs)':26}"
        + "".join(f"{block[w] / 1e9:>10,.0f} ({block[w] / peak:>4.0%})" for w in ways)
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": describe_cpu(),
        "peak_flops": peak,
        "peak_source": source,
        "shape": {key: value for key, value in vars(args).items() if key != "out"},
        "cores": len(cores),
        "rows": results,
        "block_ceiling": block,
    }
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
