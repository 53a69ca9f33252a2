"""What a run costs around its steps: a one-step `train.py` run, whole process, against the
PyTorch reference's one-iteration loop (bench/torch_reference.py --loop: nanoGPT's model built,
the token file opened, its three warm-up iterations and one more, an evaluation of 20 val and 20
train batches, a checkpoint), at nanoGPT's CPU shape (tiny, T=64, batch 12).

    python bench/startup.py [--rounds 5] [--out bench/results/startup.json]

The train.py run evaluates and checkpoints at its one step as it would at its last, so both
processes do the same kinds of work: start Python, import, build the model, step, evaluate,
save. Three variants, interleaved `--rounds` times, each a fresh process:
  train.py, programs cached     the compiled programs already in the persistent cache (a rerun,
                                the usual case once a config has run on the machine)
  train.py, a fresh machine     an empty compilation cache: every program compiled
  PyTorch eager                 the reference's loop
The table shows medians of the wall and CPU seconds, and each train.py variant's time as a
multiple of PyTorch's in the same round (the median of those ratios): on a shared 2-core machine
only side-by-side ratios are trusted.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite import BENCH, ROOT, clean_env, prepared_tokens  # noqa: E402

SHAPE = {"layers": 4, "heads": 4, "width": 128, "seq": 64, "batch": 12}
ONE_STEP = ["--config", "configs/tiny.py", "--config.model.block_size=64", "--config.train.steps=1", "--quiet"]


def timed(command: list[str], env: dict) -> dict:
    """Wall and CPU seconds of one process run to its end (the CPU of the children it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"error: {' '.join(command[:3])} failed:\n{result.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_sec": wall, "cpu_sec": cpu}


def train_py(cache: str) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        command = [sys.executable, "train.py", *ONE_STEP, f"--workdir={workdir}"]
        return timed(command, clean_env(JAXGPT_COMPILATION_CACHE=cache))


def pytorch(tokens: dict) -> dict:
    command = [sys.executable, str(BENCH / "torch_reference.py"), "--vocab", str(tokens["vocab"])]
    command += [f"--{k}={v}" for k, v in SHAPE.items()]
    command += ["--loop", tokens["path"], "--steps=1", "--eval_every=1", "--eval_batches=20", "--checkpoint_every=1"]
    return timed(command, clean_env())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/startup.json")
    args = parser.parse_args()
    tokens = prepared_tokens()
    with tempfile.TemporaryDirectory() as kept:
        train_py(kept)  # fills the cache the "programs cached" variant reads
        variants = {
            "train.py, programs cached": lambda: train_py(kept),
            "train.py, a fresh machine": lambda: train_py(tempfile.mkdtemp(dir=kept)),
            "PyTorch eager": lambda: pytorch(tokens),
        }
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            for name, measure in variants.items():
                runs[name].append(measure())
                print(f"round {round_ + 1}/{args.rounds}: {name}: {runs[name][-1]['wall_sec']:.2f} s", flush=True)
    from jaxgpt.hardware.peak_flops import describe_cpu

    torch_walls = [r["wall_sec"] for r in runs["PyTorch eager"]]
    rows = []
    for name, results in runs.items():
        ratios = [r["wall_sec"] / t for r, t in zip(results, torch_walls, strict=True)]
        rows.append(
            {
                "variant": name,
                "wall_sec": statistics.median(r["wall_sec"] for r in results),
                "cpu_sec": statistics.median(r["cpu_sec"] for r in results),
                "vs_pytorch": statistics.median(ratios),
                "vs_pytorch_range": [min(ratios), max(ratios)],
            }
        )
    print(f"\n{describe_cpu()}; one step at tiny's T=64 shape, whole process; medians of {args.rounds} rounds")
    print(f"{'variant':28} {'wall s':>7} {'CPU s':>7} {'x PyTorch (range)':>20}")
    for row in rows:
        low, high = row["vs_pytorch_range"]
        ratio = f"{row['vs_pytorch']:.2f} ({low:.2f}-{high:.2f})"
        print(f"{row['variant']:28} {row['wall_sec']:7.2f} {row['cpu_sec']:7.2f} {ratio:>20}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": describe_cpu(), "rounds": args.rounds, "shape": SHAPE, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
