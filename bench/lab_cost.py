"""What train.lab costs a run: the seconds its measures take (jaxgpt/lab/watch.py, every
measure, at the config's own evaluation interval) against the run's whole time.

    python bench/lab_cost.py [--configs tiny,induction] [--steps 0] [--out bench/results/lab_cost.json]

Each config trains once with train.lab=all (--steps 0: its own length), in this process; every
call of the measures is timed to its result on the host: the first, beside the step's compile
(where the trainer sets it going, as evaluation's programs), compiles their program. The share
is the loop's calls' seconds over the run's wall time from train_and_evaluate's start to its
end, timed in the same run, so the machine's load at one moment moves both alike; beside it the
same config's wall time without train.lab, run just before it in the same process (one pair: a
difference of a few percent is within a pair's noise on a shared machine). The CPU is named in
the table and the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxgpt.hardware import runtime  # noqa: E402


def lab_cost(name: str, steps: int) -> dict:
    import importlib.util

    from jaxgpt.job.trainer import train_and_evaluate
    from jaxgpt.lab import watch

    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    if steps:
        config.train.steps = steps
    calls: list[float] = []
    measure = watch.Watch.measure

    def timed(self, params):
        started = time.perf_counter()
        record = measure(self, params)
        calls.append(time.perf_counter() - started)
        return record

    def run(lab: str) -> tuple[float, dict]:
        config.train.lab = lab
        with tempfile.TemporaryDirectory() as workdir:
            started = time.perf_counter()
            last = train_and_evaluate(config, Path(workdir) / "run", progress=False)
            return time.perf_counter() - started, last

    without, _ = run("")
    watch.Watch.measure = timed
    try:
        wall, last = run("all")
    finally:
        watch.Watch.measure = measure
    return {
        "config": name,
        "steps": config.train.steps,
        "eval_every": config.train.eval_every,
        "evaluations": len(calls),
        "first_call_s": calls[0],  # beside the step's compile
        "in_loop_s": sum(calls[1:]),  # what the loop waits for
        "run_s": wall,
        "run_without_lab_s": without,
        "in_loop_share": sum(calls[1:]) / wall,
        "wall_difference": wall / without - 1,
        "val_loss": last["val_loss"],
    }


def main() -> None:
    from jaxgpt.hardware.peak_flops import cpu_model, cpuinfo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="tiny,induction")
    parser.add_argument("--steps", type=int, default=0, help="train this many steps (0: the config's own)")
    parser.add_argument("--out", default=str(ROOT / "bench/results/lab_cost.json"))
    args = parser.parse_args()
    runtime.configure()  # as train.py: a CPU device a core, no TPU backend looked for
    info = cpuinfo()
    cpu = f"{cpu_model()} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    rows = [lab_cost(name, args.steps) for name in args.configs.split(",")]
    print(f"train.lab=all on {cpu}; the first call, beside the step's compile, compiles the measures' program")
    head = f"{'config':<12}{'steps':>7}{'evals':>7}{'first call':>12}{'in the loop':>13}{'run':>9}{'share':>8}"
    print(head + f"{'run without':>13}{'difference':>12}")
    for r in rows:
        print(
            f"{r['config']:<12}{r['steps']:>7}{r['evaluations']:>7}{r['first_call_s']:>11.2f}s"
            f"{r['in_loop_s']:>12.2f}s{r['run_s']:>8.1f}s{r['in_loop_share']:>8.2%}{r['run_without_lab_s']:>12.1f}s"
            f"{r['wall_difference']:>+12.1%}"
        )
    Path(args.out).write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
