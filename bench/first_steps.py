"""Every shipped config's first steps as train.py logs them, to hold a change of the engine to
the bit: run it before the change (`--out before.json`), then after (`--against before.json`),
on the same machine. Each config trains in its own process, a record every step and an
evaluation every `--eval_every`, with a short schedule; the records are kept without their
timings (tokens/s, MFU, elapsed), so two runs of the same code compare equal, and a change that
moves a loss, a gradient norm or a validation figure in its last bit shows as the first record
and field that differ. Configs that download (the Hub's corpora or weights) are left out.

    python bench/first_steps.py --out /tmp/before.json           # the code before the change
    python bench/first_steps.py --against /tmp/before.json       # after it: a table, identical or the first difference
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOWNLOADS = {"gpt2_124m", "finetune_gpt2", "shakespeare_char"}  # the Hub's corpus or weights
SHIPPED = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem not in {"__init__", *DOWNLOADS})
TIMINGS = {"tokens_per_sec", "tokens_per_sec_per_device", "mfu", "elapsed_sec"}
FROM_SCRATCH = {"sft_arithmetic": ["--config.train.init_from="]}  # its base model would need training first


def first_steps(name: str, steps: int, eval_every: int, workdir: Path) -> list[dict] | str:
    """The config's metrics records without timings, or the end of its error output."""
    args = [
        sys.executable, str(ROOT / "train.py"), "--config", f"configs/{name}.py", "--workdir", str(workdir),
        "--quiet", f"--config.train.steps={steps}", "--config.train.log_every=1",
        f"--config.train.eval_every={eval_every}", f"--config.train.checkpoint_every={steps}",
        f"--config.train.warmup_steps={max(1, steps // 4)}", "--config.train.cooldown_steps=0",
        "--config.train.decay_steps=0", *FROM_SCRATCH.get(name, []),
    ]  # fmt: skip
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        return done.stderr[-800:]
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


def first_difference(before, after) -> str:
    """ "identical (N records)", or where the two runs first part."""
    if isinstance(before, str) or isinstance(after, str):
        return "failed: " + (after if isinstance(after, str) else before).strip().splitlines()[-1]
    if before == after:
        return f"identical ({len(after)} records)"
    for a, b in zip(before, after, strict=False):
        if a != b:
            key = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            return f"differs at step {a.get('step')}: {key} {a.get(key)!r} -> {b.get(key)!r}"
    return f"{len(before)} records before, {len(after)} after"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/first_steps.json", help="where to write the records")
    parser.add_argument("--against", help="records written before the change, to compare with")
    parser.add_argument("--configs", default=",".join(SHIPPED), help="comma-separated config names")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval_every", type=int, default=10)
    a = parser.parse_args()
    before = json.loads(Path(a.against).read_text()) if a.against else None
    records = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in a.configs.split(","):
            records[name] = first_steps(name, a.steps, a.eval_every, Path(scratch) / name)
            said = first_difference(before[name], records[name]) if before and name in before else "recorded"
            print(f"{name:18} {said}", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(records, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
