"""bfloat16 training on a CPU: the projections' matrix products in bfloat16, at the speed of the
CPU's bfloat16 units (AMX, AVX512-BF16), and everything else in float32.

XLA:CPU hands a product to its bfloat16 library (YNNPACK) only when both operands are bfloat16,
the result is float32, and the left operand is laid out with its contracted axis last. The
product flax writes under bfloat16 compute returns bfloat16, and two of the three products of
its backward pass contract the left operand's first axis: XLA converted all of them to float32
and multiplied at float32 speed. And a CPU has no bfloat16 arithmetic for the elementwise work
(XLA converts each operation to float32 and back), which then took twice float32's time. So on
a CPU, train.dtype=bfloat16 means: activations, norms, softmax and the rest in float32 (the
model's compute dtype there, `compute_dtype`), and each projection's product (`dot_general`,
forward and backward) on operands rounded to bfloat16, accumulated and returned in float32:
the rounding the bfloat16 units need, and nothing more. docs/benchmarks.md measures it.

On a TPU or GPU, bfloat16 is the compute dtype throughout and flax's own products run at the
chip's speed: `on_cpu_in_bfloat16` is false there, and on a CPU without bfloat16 units.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax

# the platform a program is traced for, where it is not the default backend's (a TPU step
# compiled ahead of time on a CPU machine: jaxgpt/hardware/tpu.py)
CPUINFO = Path("/proc/cpuinfo")

_TARGET_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("target_platform", default=None)


@contextlib.contextmanager
def traced_for(platform: str):
    """Trace programs inside for `platform` rather than the machine's own backend."""
    token = _TARGET_PLATFORM.set(platform)
    try:
        yield
    finally:
        _TARGET_PLATFORM.reset(token)


# the /proc/cpuinfo flags of the bfloat16 units XLA:CPU's library uses, and their names
BFLOAT16_UNITS = {"amx_bf16": "AMX", "avx512_bf16": "AVX512-BF16"}


def units_among(flags) -> tuple[str, ...]:
    """The bfloat16 units that a CPU's /proc/cpuinfo flags name, by BFLOAT16_UNITS' names."""
    return tuple(name for flag, name in BFLOAT16_UNITS.items() if flag in flags)


@functools.cache
def bfloat16_units() -> tuple[str, ...]:
    """The bfloat16 units this machine's CPU has (Intel's AMX or AVX512-BF16, AMD's AVX512-BF16
    from Zen 4), read from Linux's /proc/cpuinfo; none where it cannot be read."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return units_among(flags)


def cpu_has_bfloat16_units() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware. Elsewhere bfloat16 products would be
    emulated: no reason to take this path there."""
    return bool(bfloat16_units())


def on_cpu_in_bfloat16(config) -> bool:
    """Whether a model of `config` (a ModelConfig) computing in bfloat16 is traced for a CPU with
    bfloat16 units. (On other CPUs bfloat16 stays the compute dtype throughout, as it was.)"""
    platform = _TARGET_PLATFORM.get() or jax.default_backend()
    return jnp.dtype(config.dtype) == jnp.bfloat16 and platform == "cpu" and cpu_has_bfloat16_units()


def compute_dtype(config):
    """The dtype a model of `config` computes its activations in: config.dtype, except float32
    on a CPU (whose products still round their operands to bfloat16: `dot_general`)."""
    return jnp.dtype(jnp.float32 if on_cpu_in_bfloat16(config) else config.dtype)


def dot_general_for(config) -> dict:
    """The keyword a flax Dense or DenseGeneral takes for its product: this module's on a CPU
    computing in bfloat16, flax's own elsewhere."""
    return {"dot_general": dot_general} if on_cpu_in_bfloat16(config) else {}


def _as_matrices(x: jnp.ndarray, w: jnp.ndarray, contracted: int, transposed: bool):
    """(..., K...) and (K..., N...), or (N, K) when `transposed`, as the (M, K) matrix and the
    (K, N) or (N, K) one of one product."""
    k = math.prod(x.shape[x.ndim - contracted :])
    return x.reshape(-1, k), w if transposed else w.reshape(k, -1)


def _row_major_transpose(x: jnp.ndarray) -> jnp.ndarray:
    """x.T as an array of its own, laid out row by row. A plain transpose reaches the product as a
    column-major view of x, which XLA folds into the product (then not one the library takes);
    an optimization barrier on it with a unit axis in front makes XLA write the transposed copy
    (the unit axis, unlike a flattening, keeps a sharded axis sharded)."""
    return lax.optimization_barrier(x.T[None])[0]


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _product(x: jnp.ndarray, w: jnp.ndarray, contracted: int, transposed: bool) -> jnp.ndarray:
    """x's last `contracted` axes against w's first ones (or, `transposed`, against the last axis
    of a matrix w: x @ w.T, the tied LM head's product with the embedding): operands rounded to
    bfloat16, the sum accumulated and returned in float32."""
    return _product_forward(x, w, contracted, transposed)[0]


def _product_forward(x, w, contracted, transposed):
    xm, wm = _as_matrices(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), contracted, transposed)
    y = lax.dot_general(xm, wm, (((1,), (1 if transposed else 0,)), ((), ())), preferred_element_type=jnp.float32)
    out_shape = x.shape[: x.ndim - contracted] + (w.shape[:1] if transposed else w.shape[contracted:])
    return y.reshape(out_shape), (xm, wm, x.shape, w.shape)


def _product_backward(contracted, transposed, residuals, g):
    xm, wm, x_shape, w_shape = residuals
    gm = g.reshape(xm.shape[0], -1).astype(jnp.bfloat16)
    f32 = jnp.float32
    if transposed:  # y = x @ w.T
        dx = lax.dot(gm, wm, preferred_element_type=f32)  # g @ w
        dw = lax.dot(_row_major_transpose(gm), xm, preferred_element_type=f32)  # g.T @ x
    else:  # y = x @ w
        dx = lax.dot_general(gm, wm, (((1,), (1,)), ((), ())), preferred_element_type=f32)  # g @ w.T
        dw = lax.dot(_row_major_transpose(xm), gm, preferred_element_type=f32)  # x.T @ g
    return dx.reshape(x_shape), dw.reshape(w_shape)


_product.defvjp(_product_forward, _product_backward)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    """lax.dot_general's signature (what flax calls). A projection's product (lhs's trailing
    axes against rhs's leading ones, or a matrix rhs's last axis; no batch axes; float32
    operands) goes through `_product`; any other goes to lax.dot_general unchanged."""
    (lhs_contracting, rhs_contracting), batch = dimension_numbers
    n = len(lhs_contracting)
    trailing = tuple(lhs_contracting) == tuple(range(lhs.ndim - n, lhs.ndim))
    leading = tuple(rhs_contracting) == tuple(range(n))
    transposed = n == 1 and rhs.ndim == 2 and tuple(rhs_contracting) == (1,)
    if (
        tuple(map(tuple, batch)) == ((), ())
        and trailing
        and (leading or transposed)
        and lhs.dtype == rhs.dtype == jnp.float32
        and preferred_element_type in (None, jnp.float32)
    ):
        return _product(lhs, rhs, n, not leading)
    return lax.dot_general(
        lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type, **kwargs
    )
