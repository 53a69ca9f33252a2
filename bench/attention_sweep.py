"""Attention's O(T^2), measured: the train step's time and temporary memory against sequence
length, for each attention kernel.

    python bench/attention_sweep.py [--lengths 128,256,512,1024,2048] [--out bench/results/attention_sweep.json]

configs/tiny.py at batch 4, one microbatch, no rematerialisation, one CPU device, at each
length T (the learned position table grows with it):
  cpu   the `xla` and `dot_product` kernels run here: step time (bench/train_throughput.py in
        a fresh process, the median of 3 timings of 5 steps) and XLA's temporaries;
  tpu   the `xla` and `flash_tpu` kernels compiled for a v5e-1 here (libtpu's compile-only
        device; requirements-tpu.txt, skipped without it): the compiler's temporaries, which is
        where a fused kernel that never materialises the T x T scores shows.
Prints a table, draws <out>.png (memory and time against T, log-log) and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from suite import Case, jaxgpt_train  # noqa: E402

BASE = ("train.batch_size=4", "train.microbatches=1", "model.remat=none")
TPU_WORKER = """
import json, os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from jaxgpt.config_files import resolve
from jaxgpt.hardware import tpu
import runpy
config = runpy.run_path("configs/tiny.py")["get_config"]()
config.model.update(block_size=int(sys.argv[1]), attention=sys.argv[2], remat="none")
config.train.update(batch_size=4, microbatches=1)
config.mesh.data = 1
target = tpu.target("tpu-v5e-1")
step = tpu.compile_train_step(resolve(config, vocab_size=96), tpu.compile_only_devices(target), target)
print(json.dumps({"temp_mb": step.temporaries_bytes / 2**20}))
"""


def cpu_row(length: int, kernel: str) -> dict:
    case = Case(f"T={length}", "configs/tiny.py", (*BASE, f"model.block_size={length}", f"model.attention={kernel}"),
                steps=5, repeats=3)  # fmt: skip
    result = jaxgpt_train(case, "1")
    return {"where": "cpu", "kernel": kernel, "length": length, "step_ms": result["step_ms"],
            "temp_mb": result["step_temp_mb"]}  # fmt: skip


def tpu_row(length: int, kernel: str) -> dict | None:
    done = subprocess.run(
        [sys.executable, "-c", TPU_WORKER, str(length), kernel], capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode != 0:
        return None
    return {"where": "tpu-v5e-1 (compiled)", "kernel": kernel, "length": length, "step_ms": None,
            **json.loads(done.stdout.strip().splitlines()[-1])}  # fmt: skip


def draw(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, time) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    for key in sorted({(r["where"], r["kernel"]) for r in rows}):
        line = [r for r in rows if (r["where"], r["kernel"]) == key]
        memory.plot([r["length"] for r in line], [r["temp_mb"] for r in line], "o-", label=" ".join(key))
        if line[0]["step_ms"] is not None:
            time.plot([r["length"] for r in line], [r["step_ms"] for r in line], "o-", label=" ".join(key))
    for axes, label in ((memory, "step temporaries (MiB)"), (time, "step time on this CPU (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("sequence length T")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="128,256,512,1024,2048")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention_sweep.json"))
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for kernel in ("xla", "dot_product"):
        for length in lengths:
            rows.append(cpu_row(length, kernel))
            print(f"cpu {kernel} T={length}: {rows[-1]['step_ms']:.1f} ms, {rows[-1]['temp_mb']:.1f} MiB", flush=True)
    for kernel in ("xla", "flash_tpu"):
        for length in lengths:
            if (row := tpu_row(length, kernel)) is None:
                print(f"tpu {kernel} T={length}: not compiled (libtpu missing, or the compiler refused)", flush=True)
                continue
            rows.append(row)
            print(f"tpu-v5e-1 {kernel} T={length}: {row['temp_mb']:.1f} MiB", flush=True)
    from jaxgpt.hardware.peak_flops import describe_cpu

    print(f"\n{describe_cpu()}; configs/tiny.py, batch 4, one microbatch, no remat, one device")
    print(f"{'where':22} {'kernel':12} " + "".join(f"{f'T={t}':>12}" for t in lengths))
    for where, kernel in dict.fromkeys((r["where"], r["kernel"]) for r in rows):
        line = {r["length"]: r for r in rows if (r["where"], r["kernel"]) == (where, kernel)}
        cells = [f"{line[t]['temp_mb']:.1f} MiB" if t in line else "-" for t in lengths]
        print(f"{where:22} {kernel:12} " + "".join(f"{c:>12}" for c in cells))
        if line[lengths[0]]["step_ms"] is not None:
            print(f"{'':22} {'':12} " + "".join(f"{line[t]['step_ms']:>9.1f} ms" for t in lengths))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": describe_cpu(), "rows": rows}, indent=1) + "\n")
    draw(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
