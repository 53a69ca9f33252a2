"""What cutting heads out saves per training step (`evaluate --prune F --out DIR`, docs/lab.md
section 19): configs/tiny.py's step with its 4 heads a layer, and with 3, 2 and 1, each head as
wide as before (head_dim 32): the models the pruned runs of 25%, 50% and 75% fine-tune.

    python bench/pruned_step.py [--rounds 3] [--out bench/results/pruned_step.json]

Each variant is bench/train_throughput.py in a fresh process (the step train.py runs, on
synthetic batches), the variants interleaved `--rounds` times; the table shows medians and each
variant's step time as a multiple of the unpruned model's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from suite import Case, interleaved_variants  # noqa: E402

HEAD_DIM = "model.head_dim=32"  # tiny's, d_model 128 / 4 heads: a pruned head keeps its width
VARIANTS = {
    f"tiny, {heads} heads a layer": Case(f"heads{heads}", "configs/tiny.py", (f"model.n_head={heads}", HEAD_DIM))
    for heads in (4, 3, 2, 1)
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/pruned_step.json")
    args = parser.parse_args()
    interleaved_variants(VARIANTS, args.rounds, Path(args.out), "unpruned")


if __name__ == "__main__":
    main()
