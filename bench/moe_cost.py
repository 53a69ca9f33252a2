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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from suite import Case, interleaved_variants  # noqa: E402

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
    interleaved_variants(VARIANTS, args.rounds, Path(args.out), "tiny")


if __name__ == "__main__":
    main()
