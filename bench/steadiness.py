"""How steady this machine is: the same float32 matmul timed in back-to-back windows as long as
one of train.py's logging intervals, and the spread of the rates, (max - min) / median, as the
spread of a run's logged tokens/s is computed (docs/benchmarks.md). Nothing in the workload
changes from one window to the next, so its spread is the machine's own: a training run on the
same machine cannot be steadier than this.

    python bench/steadiness.py [--window 4.5 --duration 180] [--out FILE]

Prints the rate of every window and the spread, and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxgpt.hardware.peak_flops import describe_cpu, matmul_flops  # noqa: E402


def spread(rates: list[float]) -> float:
    return (max(rates) - min(rates)) / statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=4.5, help="seconds per window (train.py logs every ~4.5 s)")
    parser.add_argument("--duration", type=float, default=180, help="seconds in all")
    parser.add_argument("--out", default="bench/results/steadiness.json")
    args = parser.parse_args()
    print(f"{describe_cpu()}; 1024x1024 float32 matmul in {args.window:g} s windows for {args.duration:g} s")
    rates, start = [], time.perf_counter()
    while time.perf_counter() - start < args.duration:
        rates.append(matmul_flops(windows=1, seconds=args.window))
        print(f"{time.perf_counter() - start:7.1f} s {rates[-1] / 1e9:8.1f} GFLOP/s", flush=True)
    summary = {
        "machine": describe_cpu(),
        "window_sec": args.window,
        "windows": len(rates),
        "median_gflops": statistics.median(rates) / 1e9,
        "min_gflops": min(rates) / 1e9,
        "max_gflops": max(rates) / 1e9,
        "spread": spread(rates),
    }
    print(
        f"median {summary['median_gflops']:.1f} GFLOP/s, {summary['min_gflops']:.1f}-{summary['max_gflops']:.1f}; "
        f"spread {summary['spread']:.1%}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary | {"gflops": [r / 1e9 for r in rates]}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
