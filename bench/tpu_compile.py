"""What every shipped config needs of a TPU, from the TPU compiler, on this machine.

    python bench/tpu_compile.py [--targets tpu-v5e-8,tpu-v6e-1] [--out bench/results/tpu_compile.json]

Each config's train step, as shipped (its mesh over the slice's devices, its batch), compiled
for each target's compile-only devices (requirements-tpu.txt; jaxgpt/hardware/tpu.py): memory per device
and the step time the datasheet peak implies at 40% MFU. A batch that does not split over all
the devices uses the largest data axis it splits over. Where the compiler refuses the step, its
words are the row. Configs whose vocabulary comes from data this machine cannot reach take the
size that data has (tiny_shakespeare: 65 characters; the GPT-2 BPE: 50,257).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxgpt import data  # noqa: E402
from jaxgpt.config_files import resolve  # noqa: E402
from jaxgpt.hardware import tpu  # noqa: E402
from jaxgpt.hardware.peak_flops import describe_cpu  # noqa: E402

UNREACHABLE_VOCAB = {"shakespeare_char": 65, "finetune_gpt2": 50257}  # the Hub / tiktoken's download


def measure(config_name: str, target_name: str) -> dict:
    config = importlib.import_module(f"configs.{config_name}").get_config()
    if config_name in UNREACHABLE_VOCAB:
        config.model.vocab_size = UNREACHABLE_VOCAB[config_name]
    target = tpu.target(target_name)
    devices = tpu.compile_only_devices(target)
    config.mesh.data = max(
        d for d in range(1, len(devices) + 1) if config.train.batch_size % d == 0 and len(devices) % d == 0
    )
    run = resolve(config, vocab_size=data.vocab_size_for(config))
    row = dict(config=config_name, target=target_name, mesh=config.mesh.data)
    started = time.perf_counter()
    try:
        step = tpu.compile_train_step(run, devices, target)
    except tpu.OutOfMemory as refused:
        return row | dict(fits=False, compiler=str(refused), compile_s=time.perf_counter() - started)
    return row | dict(
        fits=step.fits(target),
        params_mib=step.params_bytes / 2**20,
        optimizer_mib=step.optimizer_bytes / 2**20,
        temporaries_mib=step.temporaries_bytes / 2**20,
        total_gib=step.total_bytes / 2**30,
        hbm_gib=target.hbm_bytes / 2**30,
        step_ms_at_40pct=step.seconds_at(target, 0.4) * 1e3,
        compile_s=time.perf_counter() - started,
    )


def table_cells(r: dict) -> str:
    if "compiler" in r:
        return f"compiler: {r['compiler']} | | no | "
    memory = f"{r['params_mib']:,.1f} + {r['optimizer_mib']:,.1f} + {r['temporaries_mib']:,.1f} MiB"
    fits = "yes" if r["fits"] else "no"
    return f"{memory} = {r['total_gib']:.2f} GiB | {r['hbm_gib']:.0f} GiB | {fits} | {r['step_ms_at_40pct']:,.3g} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="tpu-v5e-8,tpu-v6e-1")
    parser.add_argument("--configs", default=",".join(sorted(p.stem for p in (ROOT / "configs").glob("[a-z]*.py"))))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "tpu_compile.json"))
    args = parser.parse_args()
    rows = [measure(c, t) for c in args.configs.split(",") for t in args.targets.split(",")]
    print(f"compiled on {describe_cpu()}; libtpu's compile-only devices\n")
    print(
        "| config | target | data axis | per device: params + optimizer + temporaries | of HBM | fits | step, 40% MFU |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['target']} | {r['mesh']} | " + table_cells(r) + " |")
    Path(args.out).write_text(json.dumps(dict(cpu=describe_cpu(), rows=rows), indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
