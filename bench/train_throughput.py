"""Training throughput of one config, as train.py would run it: tokens/s, step time, MFU,
compile time, memory. trace_sec is building the initial state and tracing the step to
StableHLO (Python); compile_sec is XLA compiling it, through the persistent compilation cache
unless JAXGPT_COMPILATION_CACHE=off. bench/suite.py runs this once per case and variant, each in a fresh
process (the CPU device count is fixed when JAX starts).

    python bench/train_throughput.py --config configs/tiny.py --config.model.block_size=64 [--devices auto|N]

The step is `jaxgpt.hardware.step_choice.choose_step`'s, the one train.py trains with (per CPU core, or over the
mesh train.py builds), timed on synthetic batches already on the devices: this measures the step, not data
loading (a host thread prefetches batches during training). Median of `--repeats` timings of
`--steps` steps after 3 warmup steps. MFU = flops_per_token (6N + 12LdT, jaxgpt/model/transformer.py) x
tokens/s / peak, the peak being the CPU's measured float32 matmul rate or the accelerator's
datasheet bfloat16 peak. host_cpu_ms is the CPU time of the host's thread a step (time.thread_time):
Python's dispatching and placing of arrays, which on a CPU runs on the cores the step needs.
Prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import flags  # noqa: E402

from jaxgpt.commands import cli  # noqa: E402  (imports jax without starting it)
from jaxgpt.hardware import runtime

CONFIG = cli.define_config_flag()  # with --config.<section>.<key>=VALUE overrides, as train.py
VOCAB = flags.DEFINE_integer("vocab", 96, "vocabulary size (96: a character vocabulary)")
DEVICES = flags.DEFINE_string("devices", "auto", "CPU devices: auto (what train.py picks) or a number")
STEPS = flags.DEFINE_integer("steps", 20, "steps per timing")
REPEATS = flags.DEFINE_integer("repeats", 5, "timings; the median is reported")
COMPILE_ONLY = flags.DEFINE_bool("compile_only", False, "report the seconds to build and compile the step")


@dataclasses.dataclass
class PreparedStep:
    run: object  # the RunConfig train.py would train with (microbatches filled in)
    mesh: object
    state: object
    compiled: object  # (state, batch) -> (state, metrics): train.py's step, compiled
    batches: list  # synthetic batches, already on the devices
    cores: int  # CPU cores the batch is split over (1: the plain one-device step)
    trace_sec: float
    compile_sec: float


def prepare(config, vocab_size: int) -> PreparedStep:
    """The step train.py would run for `config`, built and compiled, with batches to feed it."""
    import jax
    import numpy as np

    from jaxgpt import sharding
    from jaxgpt.config_files import resolve
    from jaxgpt.hardware.mesh_step import state_layout
    from jaxgpt.hardware.step_choice import choose_step
    from jaxgpt.training.batch import windows_batch
    from jaxgpt.training.program import training_program

    run = resolve(config, vocab_size=vocab_size)
    mesh = sharding.make_mesh(run.mesh, runtime.mesh_devices())
    program = training_program(run)
    layout, create = state_layout(program, mesh)
    program, step, _ = choose_step(program, mesh, layout)  # as train.py: per CPU core, or over the mesh
    run = program.run
    start = time.perf_counter()
    state = create()
    batch, seq = run.train.batch_size, run.model.block_size
    rng = np.random.default_rng(0)
    where = sharding.batch_sharding(step.batch_mesh)
    windows = [rng.integers(0, vocab_size, (batch, seq + 1), dtype=np.int32) for _ in range(4)]
    batches = [jax.device_put(windows_batch(w), where) for w in windows]  # the batch contract's dict
    step.trace(state, batches[0])
    trace_sec = time.perf_counter() - start
    start = time.perf_counter()
    compiled = step.compile(state, batches[0])
    compile_sec = time.perf_counter() - start
    cores = len(step.devices)
    return PreparedStep(run, mesh, state, compiled, batches, cores, trace_sec, compile_sec)


def measure(config, vocab_size: int, steps: int, repeats: int, compile_only: bool = False) -> dict:
    import jax

    from jaxgpt.hardware.peak_flops import peak_flops
    from jaxgpt.model.transformer import count_params, flops_per_token

    prepared = prepare(config, vocab_size)
    run, state, compiled, batches = prepared.run, prepared.state, prepared.compiled, prepared.batches
    if compile_only:
        return {"trace_sec": prepared.trace_sec, "compile_sec": prepared.compile_sec}
    memory = compiled.memory_analysis()
    batch, seq = run.train.batch_size, run.model.block_size

    for i in range(3):
        state, metrics = compiled(state, batches[i % 4])
    jax.block_until_ready(metrics)
    times, host_times = [], []
    for _ in range(repeats):
        start, host_start = time.perf_counter(), time.thread_time()
        for i in range(steps):
            state, metrics = compiled(state, batches[i % 4])
        jax.block_until_ready(metrics)
        times.append((time.perf_counter() - start) / steps)
        host_times.append((time.thread_time() - host_start) / steps)
    step_sec = statistics.median(times)
    tokens_per_sec = batch * seq / step_sec
    devices = prepared.mesh.devices.flatten().tolist()
    peak, source = peak_flops(devices, run.model.dtype)
    return {
        "devices": len(devices),
        "cores": prepared.cores,
        "microbatches": run.train.microbatches,
        "device_kind": devices[0].device_kind,
        "params": count_params(state.params),
        "step_ms": 1000 * step_sec,
        # the CPU the host's thread spent a step dispatching and placing arrays (and waiting,
        # where JAX's runtime spins), on cores the step shares on a CPU
        "host_cpu_ms": 1000 * statistics.median(host_times),
        "tokens_per_sec": tokens_per_sec,
        "mfu": flops_per_token(run.model, seq) * tokens_per_sec / peak,
        "peak_flops": peak,
        "peak_source": source,
        "trace_sec": prepared.trace_sec,
        "compile_sec": prepared.compile_sec,
        "step_temp_mb": memory.temp_size_in_bytes / 2**20 if memory else None,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "spread": (max(times) - min(times)) / step_sec,
    }


def main() -> None:
    cli.parse_flags(sys.argv, usage=__doc__)
    cli.require_config(CONFIG)
    import jax

    if DEVICES.value == "auto":
        runtime.configure()
    else:
        runtime.enable_compilation_cache()
        jax.config.update("jax_num_cpu_devices", int(DEVICES.value))
    print(json.dumps(measure(CONFIG.value, VOCAB.value, STEPS.value, REPEATS.value, COMPILE_ONLY.value)))


if __name__ == "__main__":
    main()
