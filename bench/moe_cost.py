"""What a mixture of experts costs per step, against the dense model it is compared with in
docs/lab.md (section 7): configs/tiny.py; tiny with its MLP four times as wide (as many
parameters as moe_tiny's experts hold); configs/moe_tiny.py (8 experts of half the MLP's width,
2 per token, capacity 1.25); moe_tiny at capacity 1.0 (the experts' rows no more than the
active tokens: the ratio to tiny without the capacity's padding); and moe_tiny dropless.

    python bench/moe_cost.py [--rounds 3] [--out bench/results/moe_cost.json]

Each variant is bench/train_throughput.py in a fresh process (the step train.py runs, on
synthetic batches), the variants interleaved `--rounds` times; the table shows medians and each
variant's step time as a multiple of tiny's, the only figures a shared 2-core machine makes
trustworthy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from suite import Case, jaxgpt_train  # noqa: E402

VARIANTS = {
    "tiny (dense, MLP 512)": Case("tiny", "configs/tiny.py"),
    "tiny, MLP 2048 (= moe_tiny's total)": Case("wide", "configs/tiny.py", ("model.mlp_hidden=2048",)),
    "moe_tiny (8 x 256, top 2, capacity 1.25)": Case("moe", "configs/moe_tiny.py"),
    "moe_tiny at capacity 1.0": Case("capacity1", "configs/moe_tiny.py", ("model.moe.capacity_factor=1.0",)),
    "moe_tiny dropless": Case("dropless", "configs/moe_tiny.py", ("model.moe.capacity_factor=0.0",)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/moe_cost.json")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        for name, case in VARIANTS.items():
            runs[name].append(jaxgpt_train(case, "auto"))
            print(
                f"round {round_ + 1}/{args.rounds}: {name}: {runs[name][-1]['tokens_per_sec']:,.0f} tokens/s",
                flush=True,
            )
    from jaxgpt.hardware.peak_flops import cpu_model

    rows = []
    for name, results in runs.items():
        rows.append(
            {
                "variant": name,
                "step_ms": statistics.median(r["step_ms"] for r in results),
                "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in results),
                "mfu": statistics.median(r["mfu"] for r in results),
            }
        )
    base = rows[0]["step_ms"]
    tiny_runs = next(iter(runs.values()))
    for row, results in zip(rows, runs.values(), strict=True):  # each round's own ratio: the machine moves
        row["vs_tiny_by_round"] = [r["step_ms"] / t["step_ms"] for r, t in zip(results, tiny_runs, strict=True)]
    print(f"\n{cpu_model()}; medians of {args.rounds} interleaved rounds")
    print(f"{'variant':42} {'step ms':>8} {'tokens/s':>9} {'x tiny':>7} {'MFU':>6}")
    for row in rows:
        row["vs_tiny"] = row["step_ms"] / base
        print(
            f"{row['variant']:42} {row['step_ms']:8.1f} {row['tokens_per_sec']:9,.0f} {row['vs_tiny']:7.2f} "
            f"{row['mfu']:6.1%}"
        )
    for row in rows[1:]:
        print(f"{row['variant']}: x tiny round by round {', '.join(f'{r:.2f}' for r in row['vs_tiny_by_round'])}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu_model(), "rounds": args.rounds, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
