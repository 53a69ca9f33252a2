"""The experts' products of a mixture-of-experts layer three ways, forward and backward, at one
microbatch's shapes: whether a grouped matmul beats the capacity buffers jaxgpt/model/moe.py uses.

    python bench/expert_products.py [--experts 8 --width 128 --hidden 256 --seq 128 --batch 2
                                     --top_k 2 --capacity_factor 1.25] [--out FILE]

The defaults are configs/moe_tiny.py's, at the 2 sequences a microbatch its step runs per core
on a 2-core CPU (6 rows a core in 3 microbatches). Each way is the expert MLP (up, GELU, down)
and its gradient with respect to the rows and both weights, jitted, on one device:

- capacity buffers: the layer as shipped, every expert's `rows = ceil(capacity_factor * t *
  top_k / experts)` buffer rows a sequence, one batched matmul over (experts, batch, rows, d);
  padded rows are multiplied too, and assignments past the capacity are dropped.
- capacity buffers, dropless: the same with rows = t (what `capacity_factor=0` does).
- grouped (jax.lax.ragged_dot): the assignments sorted by expert, one row each, every group
  multiplied by its own expert's matrix: exactly the assignments' work, nothing dropped.

A grouped matmul is only worth having where the backend lowers it to one; the useful GFLOP/s
(the assignments' FLOPs, fwd + bwd = 3 x forward, over the time) say whether it does. The
grouped result is checked against a per-expert NumPy product first. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxgpt.hardware import runtime  # noqa: E402
from jaxgpt.hardware.peak_flops import describe_cpu  # noqa: E402


def expert_mlp_buffers(buffers, up, down):
    """(experts, batch, rows, d) through each expert's MLP, as jaxgpt/model/moe.py computes it."""
    h = jax.nn.gelu(jnp.einsum("ebrd,edh->ebrh", buffers, up))
    return jnp.einsum("ebrh,ehd->ebrd", h, down)


def expert_mlp_grouped(rows, up, down, group_sizes):
    """(assignments, d), sorted by expert with group_sizes rows each, through its expert's MLP."""
    h = jax.nn.gelu(jax.lax.ragged_dot(rows, up, group_sizes))
    return jax.lax.ragged_dot(h, down, group_sizes)


def with_gradient(mlp):
    """The MLP's value and its gradient with respect to the rows and both weights, given the
    output's cotangent, as the backward pass of a step needs them."""

    def step(x, up, down, cotangent, *rest):
        out, pullback = jax.vjp(lambda x, up, down: mlp(x, up, down, *rest), x, up, down)
        return out, pullback(cotangent)

    return jax.jit(step)


def seconds_per_call(f, args, seconds: float = 1.0) -> float:
    """The best of five windows' mean time per call."""
    jax.block_until_ready(f(*args))
    best = math.inf
    for _ in range(5):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 5:
            jax.block_until_ready(f(*args))
            calls += 1
        best = min(best, elapsed / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--top_k", type=int, default=2)
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument("--out", default="bench/results/expert_products.json")
    args = parser.parse_args()
    runtime.configure()  # the platform and devices train.py would use
    e, d, hidden, t, b, k = args.experts, args.width, args.hidden, args.seq, args.batch, args.top_k
    rng = np.random.default_rng(0)
    up = jnp.asarray(rng.normal(size=(e, d, hidden)) / math.sqrt(d), jnp.float32)
    down = jnp.asarray(rng.normal(size=(e, hidden, d)) / math.sqrt(hidden), jnp.float32)
    # a routing: each token's top_k distinct experts drawn uniformly, as an untrained router's are
    chosen = np.argsort(rng.random((b * t, e)), axis=1)[:, :k].reshape(-1)
    group_sizes = np.bincount(chosen, minlength=e).astype(np.int32)
    assignments = b * t * k
    rows = jnp.asarray(rng.normal(size=(assignments, d)), jnp.float32)  # sorted by expert: group g's rows are a run

    with jax.default_matmul_precision("highest"):  # the check in full float32 (a GPU's default may be TF32)
        grouped = np.asarray(expert_mlp_grouped(rows, up, down, jnp.asarray(group_sizes)))
    starts = np.concatenate([[0], np.cumsum(group_sizes)])
    x64, up64, down64 = (np.asarray(a, np.float64) for a in (rows, up, down))
    for g in range(e):  # each group by its own expert, in float64 (tanh GELU, as jax.nn.gelu)
        z = x64[starts[g] : starts[g + 1]] @ up64[g]
        h = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
        np.testing.assert_allclose(grouped[starts[g] : starts[g + 1]], h @ down64[g], rtol=1e-4, atol=1e-4)

    capacity = min(t, math.ceil(args.capacity_factor * t * k / e))
    ways = {
        f"capacity buffers ({args.capacity_factor:g})": (expert_mlp_buffers, (e, b, capacity, d), ()),
        "capacity buffers, dropless": (expert_mlp_buffers, (e, b, t, d), ()),
        "grouped (jax.lax.ragged_dot)": (expert_mlp_grouped, (assignments, d), (jnp.asarray(group_sizes),)),
    }
    useful_flops = 3 * 2 * assignments * d * hidden * 2  # fwd + bwd, up and down, the assignments only
    device = jax.devices()[0]
    print(f"{describe_cpu() if device.platform == 'cpu' else device.device_kind}, one device; "
          f"{e} experts {d} -> {hidden} -> {d}, {b} x {t} tokens, top {k}: {assignments} assignments")  # fmt: skip
    print(f"{'way':34}{'rows computed':>14}{'ms fwd+bwd':>12}{'useful GFLOP/s':>16}{'x buffers':>11}")
    results, first = [], None
    for name, (mlp, shape, rest) in ways.items():
        x = jnp.asarray(rng.normal(size=shape), jnp.float32)
        seconds = seconds_per_call(with_gradient(mlp), (x, up, down, jnp.ones_like(x), *rest))
        first = first or seconds
        computed = int(np.prod(shape[:-1]))
        row = {"way": name, "rows_computed": computed, "ms": seconds * 1e3,
               "useful_gflops": useful_flops / seconds / 1e9, "x_buffers": seconds / first}  # fmt: skip
        results.append(row)
        print(f"{name:34}{computed:>14,}{row['ms']:>12.3f}{row['useful_gflops']:>16.1f}{row['x_buffers']:>10.2f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = describe_cpu() if device.platform == "cpu" else device.device_kind
    shape = {key: value for key, value in vars(args).items() if key != "out"}
    out.write_text(json.dumps({"machine": machine, "jax": jax.__version__, "shape": shape, "rows": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
