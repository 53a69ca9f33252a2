"""Training throughput of the compiled train_step: tokens/s, MFU, step time, compile time, memory.

    python bench/train_throughput.py [--steps 30] [--repeats 5] [--out bench/results/train_throughput.json]

Each case times `--steps` steps `--repeats` times after a warmup and reports the median, on
synthetic batches already on the device: this measures the step itself, not data loading
(which a host thread prefetches during training). MFU = flops_per_token (6N + 12LdT) x
tokens/s / peak, with the CPU's peak measured by a large float32 matmul.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxgpt.config import ModelConfig, TrainConfig  # noqa: E402
from jaxgpt.hardware import peak_flops  # noqa: E402
from jaxgpt.model import GPT, count_params, flops_per_token  # noqa: E402
from jaxgpt.optimizer import make_optimizer  # noqa: E402
from jaxgpt.train_step import create_train_state, train_step  # noqa: E402

# (name, model shape, batch size): the shapes nanoGPT's figures in docs/benchmarks.md use.
CASES = [
    ("tiny 4L/4H/128d, T=64, B=12", dict(n_layer=4, n_head=4, d_model=128, block_size=64), 12),
    ("configs/tiny.py: T=128, B=12", dict(n_layer=4, n_head=4, d_model=128, block_size=128), 12),
    ("char 6L/6H/384d, T=256, B=16", dict(n_layer=6, n_head=6, d_model=384, block_size=256), 16),
]
VOCAB = 96  # a character vocabulary's size


def measure(name: str, shape: dict, batch_size: int, steps: int, repeats: int) -> dict:
    model_config = ModelConfig(vocab_size=VOCAB, dropout=0.0, **shape)
    train_config = TrainConfig(steps=1000, batch_size=batch_size, warmup_steps=10)
    optimizer = make_optimizer(train_config)
    state = jax.jit(partial(create_train_state, model_config, optimizer, 0))()
    step = jax.jit(partial(train_step, model=GPT(model_config), optimizer=optimizer), donate_argnums=0)
    rng = np.random.default_rng(0)
    batches = [
        jax.device_put(rng.integers(0, VOCAB, (batch_size, shape["block_size"] + 1), dtype=np.int32)) for _ in range(4)
    ]

    start = time.perf_counter()
    compiled = step.lower(state, batches[0]).compile()
    compile_sec = time.perf_counter() - start
    memory = compiled.memory_analysis()

    for i in range(3):  # warmup
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
    tokens_per_sec = batch_size * shape["block_size"] / step_sec
    peak, _ = peak_flops()
    return {
        "case": name,
        "params": count_params(state.params),
        "step_ms": 1000 * step_sec,
        "tokens_per_sec": tokens_per_sec,
        "mfu": flops_per_token(model_config, shape["block_size"]) * tokens_per_sec / peak,
        "compile_sec": compile_sec,
        "step_temp_mb": memory.temp_size_in_bytes / 2**20 if memory else None,
        "step_spread": (max(times) - min(times)) / step_sec,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results/train_throughput.json")
    args = parser.parse_args()

    peak, source = peak_flops()
    device = jax.devices()[0]
    machine = platform.processor() or platform.machine()
    print(f"{jax.device_count()} x {device.device_kind} ({machine}); peak {peak / 1e9:,.0f} GFLOP/s ({source})")
    rows = [measure(name, shape, batch, args.steps, args.repeats) for name, shape, batch in CASES]
    header = f"{'case':32} {'params':>10} {'step ms':>9} {'tokens/s':>10} {'MFU':>6} {'compile s':>10} {'temp MB':>8}"
    print(header)
    for r in rows:
        print(
            f"{r['case']:32} {r['params']:>10,} {r['step_ms']:>9.1f} {r['tokens_per_sec']:>10,.0f} {r['mfu']:>6.1%} "
            f"{r['compile_sec']:>10.1f} {r['step_temp_mb']:>8.1f}"
        )
    result = {
        "device": device.device_kind,
        "device_count": jax.device_count(),
        "peak_flops": peak,
        "peak_source": source,
        "jax": jax.__version__,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
