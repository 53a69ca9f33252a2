"""The README's first run beside a process that keeps one core busy, several times over: does every
run finish? The CPU step the trainer chooses must survive a loaded machine; the two-device default
it replaced aborted (SIGABRT, XLA's "Expected 2 threads to join the rendezvous") in about one run
in eight under this load. CI runs this once (tests/test_runtime.py); run the whole set before
changing how the CPU step is chosen (jaxgpt/hardware/step_choice.py, core_parallel.py, runtime.py).

    python bench/busy_machine.py [--runs 3 --steps 400] [--config configs/tiny.py] [--out FILE]

Prints each run's exit status, wall time and last logged step, and writes JSON. Exits 1 if any
run failed, so it can gate a change.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxgpt.hardware.peak_flops import describe_cpu  # noqa: E402


def train_beside_a_busy_core(workdir: Path, steps: int, timeout: float = 900, config: str = "configs/tiny.py") -> dict:
    """One `train.py --config CONFIG` of `steps` steps while another process spins on a
    core, in the user's environment (no fake devices). Returns what a reader of the run needs."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env["PYTHONPATH"] = str(ROOT)
    half = max(steps // 2, 1)
    command = [sys.executable, str(ROOT / "train.py"), f"--config={config}", f"--workdir={workdir}"]
    command += [f"--config.train.steps={steps}", f"--config.train.eval_every={half}"]
    command += [f"--config.train.checkpoint_every={half}", "--quiet"]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    start = time.perf_counter()
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        busy.kill()
        busy.wait()
    metrics = workdir / "metrics.jsonl"
    last = json.loads(metrics.read_text().splitlines()[-1]) if metrics.exists() else {}
    return {
        "returncode": result.returncode,
        "seconds": time.perf_counter() - start,
        "last_step": last.get("step"),
        "stderr_tail": result.stderr[-3000:] if result.returncode else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--config", default="configs/tiny.py", help="the config trained (configs/tiny.py: the README's)"
    )
    parser.add_argument("--out", default="bench/results/busy_machine.json")
    args = parser.parse_args()
    print(f"{describe_cpu()}; {args.runs} runs of {args.config}, {args.steps} steps, beside one busy core")
    runs = []
    with tempfile.TemporaryDirectory(prefix="jaxgpt-busy-") as scratch:
        for i in range(args.runs):
            runs.append(train_beside_a_busy_core(Path(scratch) / f"run{i}", args.steps, config=args.config))
            r = runs[-1]
            print(f"run {i + 1}: exit {r['returncode']}, {r['seconds']:.0f} s, last step {r['last_step']}", flush=True)
            if r["returncode"]:
                print(r["stderr_tail"], file=sys.stderr)
    finished = sum(r["returncode"] == 0 and r["last_step"] == args.steps for r in runs)
    print(f"{finished} of {args.runs} runs finished")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": describe_cpu(), "config": args.config, "steps": args.steps, "runs": runs}, indent=2)
    )
    print(f"wrote {out}")
    sys.exit(0 if finished == args.runs else 1)


if __name__ == "__main__":
    main()
