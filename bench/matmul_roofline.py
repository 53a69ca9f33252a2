"""How fast this device multiplies the matrices of one training shape, each alone: the ceiling
on MFU that the shape's matmuls set before anything else in the step costs time.

    python bench/matmul_roofline.py [--width 384 --heads 6 --seq 256 --batch 16] [--out FILE]

For each matmul of a transformer block's forward pass (the backward pass runs the same shapes
transposed) it times the jitted einsum and reports GFLOP/s and the share of the peak that
jaxgpt.hardware uses for MFU. Prints a table and writes JSON.
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

from jaxgpt.hardware import peak_flops  # noqa: E402


def rate(equation: str, a_shape: tuple, b_shape: tuple, seconds: float = 0.5) -> float:
    """FLOP/s of einsum(equation, a, b), the best of five windows."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=a_shape).astype(np.float32))
    b = jnp.asarray(rng.normal(size=b_shape).astype(np.float32))
    f = jax.jit(lambda a, b: jnp.einsum(equation, a, b))
    out_shape = jax.eval_shape(f, a, b).shape
    contracted = a_shape[-1]  # every equation below contracts a's last axis
    flops = 2 * np.prod(out_shape) * contracted
    f(a, b).block_until_ready()
    best = 0.0
    for _ in range(5):
        runs, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 5:
            f(a, b).block_until_ready()
            runs += 1
        best = max(best, flops * runs / elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", default="bench/results/matmul_roofline.json")
    args = parser.parse_args()
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
    print(f"peak {peak / 1e9:,.0f} GFLOP/s ({source}); shape d={d}, T={t}, heads={h}, batch={args.batch}")
    print(f"{'matmul':26} {'GFLOP/s':>9} {'of peak':>8}")
    results = []
    for name, (equation, a_shape, b_shape) in cases.items():
        flops_per_sec = rate(equation, a_shape, b_shape)
        results.append({"matmul": name, "gflops": flops_per_sec / 1e9, "of_peak": flops_per_sec / peak})
        print(f"{name:26} {flops_per_sec / 1e9:>9,.0f} {flops_per_sec / peak:>8.0%}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"peak_flops": peak, "peak_source": source, "shape": vars(args), "rows": results}
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
