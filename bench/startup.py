"""What a run costs around its steps: a one-step `train.py` run, whole process, against the
PyTorch reference's one-iteration loop (bench/torch_reference.py --loop: nanoGPT's model built,
the token file opened, its three warm-up iterations and one more, an evaluation of 20 val and 20
train batches, a checkpoint), at nanoGPT's CPU shape (tiny, T=64, batch 12).

    python bench/startup.py [--rounds 5] [--nanogpt PATH] [--out bench/results/startup.json]

The train.py run evaluates and checkpoints at its one step as it would at its last, so both
processes do the same kinds of work: start Python, import, build the model, step, evaluate,
save. Three variants, interleaved `--rounds` times, each a fresh process:
  train.py, programs cached     the compiled programs already in the persistent cache (a rerun,
                                the usual case once a config has run on the machine)
  train.py, a fresh machine     an empty compilation cache: every program compiled
  PyTorch eager                 the reference's loop
and with --nanogpt PATH (a nanoGPT checkout) a fourth, nanoGPT's own train.py: its README CPU
recipe on the same tokens (bench/nanogpt_data.py writes them there) with --max_iters=1, its
evaluation at iteration 0 and two steps, no checkpoint (it saves none before iteration 1).
Every process runs with Python's bytecode cache on, as a user's Python does (an environment that
sets PYTHONDONTWRITEBYTECODE, as some sandboxes do, recompiles the checkout's modules at each start:
about 0.1 s of CPU for jaxgpt's 70 a run imports, little for nanoGPT's three files).
The table shows medians of the wall and CPU seconds, and each variant's time as a multiple of
PyTorch's (and nanoGPT's) in the same round, the median of those ratios: on a shared 2-core
machine only side-by-side ratios are trusted.
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

from nanogpt_data import README_CPU_RECIPE, write_dataset  # noqa: E402
from suite import BENCH, ROOT, clean_env, prepared_tokens  # noqa: E402

SHAPE = {"layers": 4, "heads": 4, "width": 128, "seq": 64, "batch": 12}
ONE_STEP = ["--config", "configs/tiny.py", "--config.model.block_size=64", "--config.train.steps=1", "--quiet"]


def timed(command: list[str], env: dict, cwd: Path = ROOT) -> dict:
    """Wall and CPU seconds of one process run to its end (the CPU of the children it waited for)."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
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


def nanogpt(checkout: Path) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "train.py", *README_CPU_RECIPE.split(), "--dataset=jaxgpt_builtin"]
        return timed(command + ["--max_iters=1", f"--out_dir={out}"], clean_env(), cwd=checkout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout: its own train.py as a fourth variant")
    parser.add_argument("--out", default="bench/results/startup.json")
    args = parser.parse_args()
    tokens = prepared_tokens()
    if args.nanogpt:
        write_dataset(args.nanogpt, "jaxgpt_builtin")
    with tempfile.TemporaryDirectory() as kept:
        train_py(kept)  # fills the cache the "programs cached" variant reads
        variants = {
            "train.py, programs cached": lambda: train_py(kept),
            "train.py, a fresh machine": lambda: train_py(tempfile.mkdtemp(dir=kept)),
            "PyTorch eager": lambda: pytorch(tokens),
        }
        if args.nanogpt:
            variants["nanoGPT's train.py"] = lambda: nanogpt(args.nanogpt)
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            for name, measure in variants.items():
                runs[name].append(measure())
                print(f"round {round_ + 1}/{args.rounds}: {name}: {runs[name][-1]['wall_sec']:.2f} s", flush=True)
    from jaxgpt.hardware.peak_flops import describe_cpu

    yardsticks = {"PyTorch": "PyTorch eager", "nanoGPT": "nanoGPT's train.py"}
    yardsticks = {short: name for short, name in yardsticks.items() if name in runs}
    rows = []
    for name, results in runs.items():
        row = {
            "variant": name,
            "wall_sec": statistics.median(r["wall_sec"] for r in results),
            "cpu_sec": statistics.median(r["cpu_sec"] for r in results),
        }
        for short, yardstick in yardsticks.items():  # each round's ratio, then their median
            ratios = [r["wall_sec"] / y["wall_sec"] for r, y in zip(results, runs[yardstick], strict=True)]
            row[f"vs_{short}"] = statistics.median(ratios)
            row[f"vs_{short}_range"] = [min(ratios), max(ratios)]
        rows.append(row)
    print(f"\n{describe_cpu()}; one step at tiny's T=64 shape, whole process; medians of {args.rounds} rounds")
    print(f"{'variant':28} {'wall s':>7} {'CPU s':>7}" + "".join(f" {'x ' + s + ' (range)':>20}" for s in yardsticks))
    for row in rows:
        ratios = ""
        for short in yardsticks:
            low, high = row[f"vs_{short}_range"]
            cell = f"{row['vs_' + short]:.2f} ({low:.2f}-{high:.2f})"
            ratios += f" {cell:>20}"
        print(f"{row['variant']:28} {row['wall_sec']:7.2f} {row['cpu_sec']:7.2f}{ratios}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": describe_cpu(), "rounds": args.rounds, "shape": SHAPE, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
