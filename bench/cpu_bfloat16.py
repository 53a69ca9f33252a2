"""bfloat16 on this CPU: matmul GFLOP/s by XLA's paths and PyTorch's, and the training step in
float32 and bfloat16 beside PyTorch's (nanoGPT's model rebuilt, bench/torch_reference.py, under
torch.autocast for bfloat16). Names the CPU and its bfloat16 units.

    python bench/cpu_bfloat16.py [--rounds 2] [--matmuls_only] [--out bench/results/cpu_bfloat16.json]

Matmuls, each (M, K) @ (K, N) at the shipped configs' shapes, the best of five windows:
  xla float32           float32 operands and result
  xla bf16 -> bf16      what flax writes under bfloat16 compute (XLA:CPU converts it to float32)
  xla bf16 -> f32       bfloat16 operands, float32 result: the product XLA hands to YNNPACK
  layer f32 / layer bf16  a layer's three products (forward, and its backward's two), float32
                        against jaxgpt/model/products.py's; GFLOP/s of the three together
  torch float32 / bf16  torch.matmul on the same shapes (where torch is installed)
  mkl bf16 -> f32       MKL's cblas_gemm_bf16bf16f32 through ctypes, no compiler needed (where
                        `pip install mkl` put its runtime library beside this Python: about 1.1 GB)
Steps: bench/train_throughput.py (train.py's step) against bench/torch_reference.py, each in a
fresh process, the variants in turn, `--rounds` times; medians.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxgpt.hardware.peak_flops import describe_cpu  # noqa: E402
from jaxgpt.model import products  # noqa: E402

# (M, K, N): nanoGPT's CPU shape (B=12, T=64, d=128: the MLP's up projection), 6 x 384 at T=256,
# B=16 (the same), GPT-2 124M's MLP at 1,024 tokens
MATMULS = {"nanoGPT CPU shape, MLP up": (768, 128, 512), "6x384 T=256, MLP up": (4096, 384, 1536),
           "GPT-2 124M, MLP up": (1024, 768, 3072)}  # fmt: skip
# (label, train_throughput overrides, torch_reference flags)
STEPS = {
    "nanoGPT CPU shape (4x128, T=64, B=12)": (
        ["--config.model.n_layer=4", "--config.model.n_head=4", "--config.model.d_model=128",
         "--config.model.block_size=64", "--config.train.batch_size=12"],
        ["--layers", "4", "--heads", "4", "--width", "128", "--seq", "64", "--batch", "12"],
    ),
    "6x384, T=256, B=16": (
        ["--config.model.n_layer=6", "--config.model.n_head=6", "--config.model.d_model=384",
         "--config.model.block_size=256", "--config.train.batch_size=16"],
        ["--layers", "6", "--heads", "6", "--width", "384", "--seq", "256", "--batch", "16", "--steps", "5"],
    ),
}  # fmt: skip


def rate(run, flops: float, seconds: float = 0.5) -> float:
    """GFLOP/s of run(), which does `flops` and returns when they are done: the best of five
    windows after one call."""
    run()
    best = 0.0
    for _ in range(5):
        runs, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 5:
            run()
            runs += 1
        best = max(best, flops * runs / elapsed / 1e9)
    return best


def jax_rate(fn, *args, flops: float) -> float:
    return rate(lambda: jax.block_until_ready(fn(*args)), flops)


def torch_rate(a: np.ndarray, b: np.ndarray, dtype: str) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    a, b = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in (a, b))
    return rate(lambda: torch.matmul(a, b), 2 * a.shape[0] * a.shape[1] * b.shape[1])  # eager: done on return


@functools.cache
def mkl_gemm():
    """MKL's bfloat16 product with a float32 result, cblas_gemm_bf16bf16f32, from the runtime
    library the `mkl` wheel installs under this Python's prefix; None where there is none."""
    import ctypes

    found = sorted(Path(sys.prefix, "lib").glob("libmkl_rt.so*"))
    if not found:
        return None
    gemm = ctypes.CDLL(str(found[0])).cblas_gemm_bf16bf16f32
    sizes, scalar, pointer = [ctypes.c_int64] * 3, ctypes.c_float, ctypes.c_void_p
    gemm.argtypes = [ctypes.c_int] * 3 + sizes + [scalar, pointer, ctypes.c_int64, pointer, ctypes.c_int64, scalar]
    gemm.argtypes += [pointer, ctypes.c_int64]
    gemm.restype = None
    return gemm


def mkl_rate(a: np.ndarray, b: np.ndarray) -> float | None:
    gemm = mkl_gemm()
    if gemm is None:
        return None
    (m, k), n = a.shape, b.shape[1]
    a16, b16 = (np.asarray(jnp.asarray(x, jnp.bfloat16)) for x in (a, b))
    c = np.zeros((m, n), np.float32)
    row_major, as_is = 101, 111  # CBLAS's constants
    run = functools.partial(gemm, row_major, as_is, as_is, m, n, k, 1.0, a16.ctypes.data, k, b16.ctypes.data, n, 0.0)
    run(c.ctypes.data, n)
    expected = a16.astype(np.float32) @ b16.astype(np.float32)
    if not np.allclose(c, expected, rtol=1e-4, atol=1e-3 * np.abs(expected).max()):  # float32 sums, another order
        raise SystemExit("error: MKL's cblas_gemm_bf16bf16f32 gave another product than numpy's")
    return rate(lambda: run(c.ctypes.data, n), 2 * m * k * n)


def matmul_rates() -> dict:
    f32, bf16 = jnp.float32, jnp.bfloat16
    dn = (((1,), (0,)), ((), ()))

    def layer(product):  # a layer's forward product and its backward's two, on a cotangent c
        grads = jax.jit(jax.grad(lambda x, w, c: jnp.sum(product(x, w, dn) * c), (0, 1)))
        return lambda x, w: grads(x, w, cotangent)  # (not a constant, which XLA would fold into a sum)

    rows = {}
    for name, (m, k, n) in MATMULS.items():
        rng = np.random.default_rng(0)
        a, b = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(k, n)).astype(np.float32)
        flops = 2 * m * k * n
        a16, b16 = jnp.asarray(a, bf16), jnp.asarray(b, bf16)
        cotangent = jnp.asarray(rng.normal(size=(m, n)), f32)
        rows[name] = {
            "xla float32": jax_rate(jax.jit(jnp.matmul), a, b, flops=flops),
            "xla bf16 -> bf16": jax_rate(jax.jit(jnp.matmul), a16, b16, flops=flops),
            "xla bf16 -> f32": jax_rate(jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=f32)), a16, b16,
                                        flops=flops),
            "layer f32": jax_rate(layer(jax.lax.dot_general), a, b, flops=3 * flops),
            "layer bf16": jax_rate(layer(products.dot_general), a, b, flops=3 * flops),
            "torch float32": torch_rate(a, b, "float32"),
            "torch bf16": torch_rate(a, b, "bfloat16"),
            "mkl bf16 -> f32": mkl_rate(a, b),
        }  # fmt: skip
    return rows


def last_json(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))


def step_rates(rounds: int) -> dict:
    python = sys.executable
    results = {}
    for label, (overrides, torch_flags) in STEPS.items():
        variants = {
            f"jaxgpt {dtype}": [python, "bench/train_throughput.py", "--config", "configs/tiny.py", *overrides,
                                f"--config.train.dtype={dtype}", "--steps", "5", "--repeats", "3"]
            for dtype in ("float32", "bfloat16")
        }  # fmt: skip
        have_torch = subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0
        for dtype in ("float32", "bfloat16") if have_torch else ():
            variants[f"torch {dtype}"] = [python, "bench/torch_reference.py", *torch_flags, "--dtype", dtype]
        seen = {name: [] for name in variants}
        for _ in range(rounds):
            for name, command in variants.items():
                seen[name].append(last_json(command)["tokens_per_sec"])
                print(f"  {label}: {name} {seen[name][-1]:,.0f} tokens/s", file=sys.stderr)
        results[label] = {name: statistics.median(values) for name, values in seen.items()}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--matmuls_only", action="store_true", help="the products' table alone, no steps")
    parser.add_argument("--out", default="bench/results/cpu_bfloat16.json")
    args = parser.parse_args()
    units = ", ".join(products.bfloat16_units()) or "none"
    machine = f"{describe_cpu()}; bfloat16 units: {units}; jax {jax.__version__}"
    matmuls = matmul_rates()
    steps = {} if args.matmuls_only else step_rates(args.rounds)
    print(machine)
    columns = list(next(iter(matmuls.values())))
    print(f"{'matmul GFLOP/s':30s}" + "".join(f"{c:>18s}" for c in columns))
    for name, row in matmuls.items():
        print(f"{name:30s}" + "".join(f"{'-' if v is None else f'{v:,.0f}':>18s}" for v in row.values()))
    print(f"step tokens/s (medians of {args.rounds} rounds)" if steps else "(steps not measured: --matmuls_only)")
    for label, row in steps.items():
        f32 = row["jaxgpt float32"]
        cells = ", ".join(f"{name} {value:,.0f} ({value / f32:.2f}x)" for name, value in row.items())
        print(f"  {label}: {cells}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine, "matmuls": matmuls, "steps": steps}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
