"""The figures the docs quote from long runs, over seeds and over the step layouts CPUs choose.

    python bench/doc_figures.py [--runs dates,arithmetic,sft_arithmetic,tiny] [--seeds 3]
                                [--out bench/results/doc_figures.json]

A run's losses are the same to the bit on one machine, but not from one CPU to another: each
splits the batch over its cores and its cores' rows into microbatches (the fewest whose step fits
the L3 cache the OS reports: 32 MiB on a Zen 4 VM, 480 MiB on a 2-vCPU Xeon), so the compiled
program sums its float32 gradients in another order, and a 1e-7 difference in the first step
grows over a thousand steps of fine-tuning into another model. So each documented figure of a
long run is measured here over `--seeds` seeds in this machine's layout, and for seed 0 in the
layouts other CPUs choose: one microbatch a core (a large reported cache) and one core for the
whole batch (JAXGPT_CPU_CORES=1). The docs quote the spread (min to max), and name the machine.

Each run is train.py in a fresh process, as a user runs it; dates is scored by `jaxgpt evaluate`
on every held-out pair, as docs/configuration.md quotes it; sft_arithmetic starts from its
layout's arithmetic run, as the docs' two commands do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = {  # name -> (config overrides, environment): the step layouts CPUs choose
    "as this machine chooses": ((), {}),
    "one microbatch a core (a large reported cache)": (("--config.train.microbatches=1",), {}),
    "one core, the whole batch": ((), {"JAXGPT_CPU_CORES": "1"}),
}


def train(config: str, workdir: Path, seed: int, layout: str, *extra: str) -> dict:
    """train.py in a fresh process: its last evaluation and the line saying how it split the step."""
    overrides, env = LAYOUTS[layout]
    args = [sys.executable, "train.py", "--config", config, "--workdir", str(workdir)]  # not --quiet: its layout line
    args += [f"--config.train.seed={seed}", *overrides, *extra]
    done = subprocess.run(args, cwd=ROOT, env=os.environ | env, capture_output=True, text=True, check=True)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "val_loss" in r][-1]
    split = re.search(r"^.*(microbatch|one program).*?(?=;|$)", done.stdout + done.stderr, re.M)
    return {"step": last["step"], "val_loss": last["val_loss"], "val_exact_match": last.get("val_exact_match"),
            "layout_line": split.group(0) if split else ""}  # fmt: skip


def evaluated_exact(workdir: Path) -> float:
    """`jaxgpt evaluate`'s share of every held-out pair exactly right."""
    done = subprocess.run([sys.executable, "-m", "jaxgpt", "evaluate", "--workdir", str(workdir)], cwd=ROOT,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return float(re.search(r"([\d.]+)% .*exactly right", done.stdout).group(1)) / 100


def measure(name: str, seed: int, layout: str, scratch: Path) -> dict:
    workdir = scratch / f"{name}-{seed}-{list(LAYOUTS).index(layout)}"
    if name == "sft_arithmetic":  # from its layout's base run, as the docs' two commands run
        base = scratch / f"arithmetic-0-{list(LAYOUTS).index(layout)}"
        if not (base / "checkpoints").is_dir():
            train("configs/arithmetic.py", base, 0, layout)
        return train("configs/sft_arithmetic.py", workdir, seed, layout, f"--config.train.init_from={base}")
    result = train(f"configs/{name}.py", workdir, seed, layout)
    if name == "dates":
        result["evaluate_exact"] = evaluated_exact(workdir)
    return result


def spread(values: list[float]) -> dict:
    return {"min": min(values), "max": max(values), "mean": statistics.mean(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="dates,arithmetic,sft_arithmetic,tiny")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "doc_figures.json"))
    args = parser.parse_args()
    from jaxgpt.hardware.peak_flops import describe_cpu

    cases = [(s, next(iter(LAYOUTS))) for s in range(args.seeds)] + [(0, layout) for layout in list(LAYOUTS)[1:]]
    figures = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.runs.split(","):
            rows = []
            for seed, layout in cases:
                rows.append(measure(name, seed, layout, Path(scratch)) | {"seed": seed, "layout": layout})
                print(f"{name}, seed {seed}, {layout}: {json.dumps(rows[-1])}", flush=True)
            keys = [k for k in ("val_loss", "val_exact_match", "evaluate_exact") if rows[0].get(k) is not None]
            figures[name] = {"runs": rows, "spread": {k: spread([r[k] for r in rows]) for k in keys}}
    print(f"\n{describe_cpu()}: {args.seeds} seeds in this machine's layout, and seed 0 in {len(LAYOUTS) - 1} others")
    print("| run | figure | min | max | mean |\n|---|---|---|---|---|")
    for name, figure in figures.items():
        for key, s in figure["spread"].items():
            print(f"| {name} | {key} | {s['min']:.4f} | {s['max']:.4f} | {s['mean']:.4f} |")
    Path(args.out).write_text(json.dumps({"cpu": describe_cpu(), "figures": figures}, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
