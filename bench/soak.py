"""A long run's memory: train.py on a small model for thousands of steps, checkpointing and
evaluating often, with the process's resident memory (VmRSS) read every second. Whatever a
step, an evaluation or a save leaves behind shows as growth after warm-up.

    python bench/soak.py [--steps 10000 --every 50] [--out FILE]

Prints RSS at about 20 of the logged steps and the growth from the end of warm-up (the first
logged step at or after 10% of the steps) to the highest after it, writes JSON, and exits 1 if
that growth passes --bound (5% of the RSS at warm-up: a leak of even 1 KB per step over 10,000
steps is ~10 MB, so a real leak in the step, the evaluation or the checkpointing shows on top
of the allocator's own drift). The run is the user's own:
`train.py --config configs/tiny.py` made small, in a temporary workdir.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxgpt.hardware.peak_flops import describe_cpu  # noqa: E402


def resident_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        return None
    return None


def last_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (FileNotFoundError, ValueError, KeyError):  # the trainer may be mid-write
        return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--every", type=int, default=50, help="steps between checkpoints, evaluations and logs")
    parser.add_argument("--bound", type=float, default=0.05, help="allowed growth after warm-up, a share of its RSS")
    parser.add_argument("--out", default="bench/results/soak.json")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="jaxgpt-soak-"))
    every = args.every
    command = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/tiny.py"), "--quiet"]
    command += [f"--workdir={workdir}", f"--config.train.steps={args.steps}", "--config.train.batch_size=8"]
    command += ["--config.model.n_layer=2", "--config.model.d_model=64", "--config.model.block_size=64"]
    command += [f"--config.train.{key}={every}" for key in ("log_every", "eval_every", "checkpoint_every")]
    command += ["--config.train.eval_batches=4", "--config.train.warmup_steps=10"]
    print(f"{describe_cpu()}; train.py, 2 layers x 64 wide, {args.steps} steps, checkpoint + eval every {every}")
    trainer = subprocess.Popen(command, cwd=ROOT)
    samples, start = [], time.perf_counter()  # (seconds, step logged, RSS MiB)
    while trainer.poll() is None:
        rss = resident_mib(trainer.pid)
        if rss is not None:
            samples.append((time.perf_counter() - start, last_step(workdir / "metrics.jsonl"), rss))
        time.sleep(1.0)
    shutil.rmtree(workdir, ignore_errors=True)
    if trainer.returncode != 0:
        sys.exit(f"train.py exited {trainer.returncode}")
    by_step: dict[int, float] = {}
    for _, step, rss in samples:
        if step > 0:
            by_step[step] = max(by_step.get(step, 0.0), rss)  # the peak while that step was the last logged
    warm = min(s for s in by_step if s >= args.steps // 10)
    after = [rss for step, rss in by_step.items() if step >= warm]
    print(f"{'step':>6} {'RSS MiB':>8}")
    shown = sorted(by_step)[:: max(1, len(by_step) // 20)]  # about 20 rows; the JSON has them all
    for step in shown:
        print(f"{step:6d} {by_step[step]:8.1f}")
    growth = max(after) - by_step[warm]
    print(
        f"RSS at step {warm} (end of warm-up) {by_step[warm]:.1f} MiB; highest after it {max(after):.1f} MiB; "
        f"growth {growth:.1f} MiB over {args.steps - warm} steps ({time.perf_counter() - start:.0f} s)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"machine": describe_cpu(), "steps": args.steps, "every": every, "warm_step": warm}
    summary |= {"rss_at_warm_mib": by_step[warm], "rss_max_after_mib": max(after), "growth_mib": growth}
    summary |= {"bound": args.bound}
    out.write_text(json.dumps(summary | {"rss_by_step_mib": by_step}, indent=2))
    print(f"wrote {out}")
    if growth > args.bound * by_step[warm]:
        sys.exit(f"growth {growth:.1f} MiB passes the bound of {args.bound:.0%} of {by_step[warm]:.1f} MiB")


if __name__ == "__main__":
    main()
