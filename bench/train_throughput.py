"""Training throughput of one config, as train.py would run it: tokens/s, step time, MFU,
compile time, memory. trace_sec is building the initial state and tracing the step to
StableHLO (Python); compile_sec is XLA compiling it, through the persistent compilation cache
unless JAXGPT_COMPILATION_CACHE=off. bench/suite.py runs this once per case and variant, each in a fresh
process (the CPU device count is fixed when JAX starts).

    python bench/train_throughput.py --config configs/tiny.py --set model.block_size=64 [--devices auto|N]

The step is `jaxgpt.train_step.compiled_steps`, the one train.py trains with, on the mesh train.py
builds, timed on synthetic batches already on the devices: this measures the step, not data
loading (a host thread prefetches batches during training). Median of `--repeats` timings of
`--steps` steps after 3 warmup steps. MFU = flops_per_token (6N + 12LdT, jaxgpt/model.py) x
tokens/s / peak, the peak being the CPU's measured float32 matmul rate or the accelerator's
datasheet bfloat16 peak. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import runpy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxgpt import runtime  # noqa: E402  (imports jax without starting it)


def load_config(path: str, overrides: list[str]):
    config = runpy.run_path(path)["get_config"]()
    for item in overrides:
        key, value = item.split("=", 1)
        *parents, name = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        try:
            node[name] = json.loads(value)
        except ValueError:  # a bare string such as dots
            node[name] = value
    return config


def measure(config, vocab_size: int, steps: int, repeats: int, compile_only: bool = False) -> dict:
    import jax
    import numpy as np

    from jaxgpt import sharding
    from jaxgpt.autotune import fill_microbatches
    from jaxgpt.config import resolve
    from jaxgpt.hardware import peak_flops
    from jaxgpt.model import count_params, flops_per_token
    from jaxgpt.train_step import compiled_steps

    run = resolve(config, vocab_size=vocab_size)
    mesh = sharding.make_mesh(run.mesh)
    run = fill_microbatches(run, mesh).run
    start = time.perf_counter()
    state, step, _ = compiled_steps(run, mesh)
    batch, seq = run.train.batch_size, run.model.block_size
    rng = np.random.default_rng(0)
    batches = [
        jax.device_put(rng.integers(0, vocab_size, (batch, seq + 1), dtype=np.int32), sharding.batch_sharding(mesh))
        for _ in range(4)
    ]
    lowered = step.lower(state, batches[0])
    trace_sec = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_sec = time.perf_counter() - start
    if compile_only:
        return {"trace_sec": trace_sec, "compile_sec": compile_sec}
    memory = compiled.memory_analysis()

    for i in range(3):
        state, metrics = compiled(state, batches[i % 4])
    jax.block_until_ready(metrics)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            state, metrics = compiled(state, batches[i % 4])
        jax.block_until_ready(metrics)
        times.append((time.perf_counter() - start) / steps)
    step_sec = statistics.median(times)
    tokens_per_sec = batch * seq / step_sec
    devices = mesh.devices.flatten().tolist()
    peak, source = peak_flops(devices)
    return {
        "devices": len(devices),
        "microbatches": run.train.microbatches,
        "device_kind": devices[0].device_kind,
        "params": count_params(state.params),
        "step_ms": 1000 * step_sec,
        "tokens_per_sec": tokens_per_sec,
        "mfu": flops_per_token(run.model, seq) * tokens_per_sec / peak,
        "peak_flops": peak,
        "peak_source": source,
        "trace_sec": trace_sec,
        "compile_sec": compile_sec,
        "step_temp_mb": memory.temp_size_in_bytes / 2**20 if memory else None,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "spread": (max(times) - min(times)) / step_sec,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], help="override, e.g. model.block_size=64")
    parser.add_argument("--vocab", type=int, default=96, help="vocabulary size (96: a character vocabulary)")
    parser.add_argument("--devices", default="auto", help="CPU devices: auto (what train.py picks) or a number")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile_only", action="store_true", help="report the seconds to build and compile the step")
    args = parser.parse_args()

    import jax

    config = load_config(args.config, args.set)
    if args.devices == "auto":
        runtime.configure()
    else:
        runtime.enable_compilation_cache()
        jax.config.update("jax_num_cpu_devices", int(args.devices))
    print(json.dumps(measure(config, args.vocab, args.steps, args.repeats, args.compile_only)))


if __name__ == "__main__":
    main()
