"""When the induction circuit forms: configs/induction.py trained with train.lab at a fine
evaluation interval, a few seeds, and for each the step where each event is first seen.

    python bench/induction_timeline.py [--seeds 0,1,2] [--eval_every 25] [--out bench/results/induction_timeline.json]

Events, each the first evaluation at which a measure has gone half of its way from its first
evaluation's value to its last's (docs/lab.md, "Watching a circuit form"):
  loss falls         val_loss
  previous-token     layer 0's best previous-token score (the best head at each evaluation)
  induction          layer 1's best induction score
and the largest rise of the training loss between two consecutive logged intervals before the
fall (the bump Olsson et al. see as the heads form), with its step. The CPU is named.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def halfway(records: list[dict], value) -> int | None:
    """The first step at which `value` of a record has gone half its way from the first record's to the last's."""
    first, last = value(records[0]), value(records[-1])
    middle = (first + last) / 2
    return next((r["step"] for r in records if (value(r) - middle) * (last - first) >= 0), None)


def timeline(seed: int, eval_every: int) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        args = [
            sys.executable, str(ROOT / "train.py"), "--config", "configs/induction.py", "--workdir", workdir, "--quiet",
            f"--config.train.seed={seed}", f"--config.train.eval_every={eval_every}",
            f"--config.train.log_every={eval_every}", "--config.train.lab=induction,previous_token,entropy",
        ]  # fmt: skip
        subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
        records = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "val_loss" in r]
    first, last = evaluated[0]["val_loss"], evaluated[-1]["val_loss"]
    fall = halfway(evaluated, lambda r: r["val_loss"])
    before = [r for r in records if "train_loss" in r and r["step"] <= (fall or records[-1]["step"])]
    rises = [(b["train_loss"] - a["train_loss"], b["step"]) for a, b in zip(before, before[1:], strict=False)]
    bump, bump_step = max(rises) if rises else (0.0, None)
    return {
        "seed": seed,
        "loss_falls": fall,
        "previous_token": halfway(evaluated, lambda r: max(r["lab_previous_token"][0])),
        "induction": halfway(evaluated, lambda r: max(r["lab_induction"][1])),
        "largest_rise": bump,
        "largest_rise_step": bump_step,
        "val_loss": [first, last],
        "previous_token_first_last": [
            max(evaluated[0]["lab_previous_token"][0]),
            max(evaluated[-1]["lab_previous_token"][0]),
        ],
        "induction_first_last": [max(evaluated[0]["lab_induction"][1]), max(evaluated[-1]["lab_induction"][1])],
        "final_induction": evaluated[-1]["lab_induction"],
        "final_previous_token": evaluated[-1]["lab_previous_token"],
    }


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from jaxgpt.hardware.peak_flops import cpu_model, cpuinfo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--out", default=str(ROOT / "bench/results/induction_timeline.json"))
    args = parser.parse_args()
    info = cpuinfo()
    cpu = f"{cpu_model()} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    rows = [timeline(int(seed), args.eval_every) for seed in args.seeds.split(",")]
    print(f"configs/induction.py, an evaluation every {args.eval_every} steps, on {cpu}")
    print(f"{'seed':<6}{'loss falls':>12}{'prev-token rises':>18}{'induction rises':>17}{'largest rise':>22}")
    for r in rows:
        rise = f"{r['largest_rise']:+.3f} at {r['largest_rise_step']}"
        print(f"{r['seed']:<6}{r['loss_falls']!s:>12}{r['previous_token']!s:>18}{r['induction']!s:>17}{rise:>22}")
    Path(args.out).write_text(json.dumps({"cpu": cpu, "eval_every": args.eval_every, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
