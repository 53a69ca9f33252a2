"""The attention kernels beyond the readable one (attention.xla_attention), and where each runs.

Each computes exactly what xla_attention computes, with the same arguments (see attention.py;
`mask` is an attention.Mask) and `fallback`, the readable kernel, for what it cannot run:
`dot_product` is jax.nn's (cuDNN flash attention on a GPU, asked for by name), `flash_tpu` is
Pallas's TPU kernel, run once per device under shard_map on a mesh. `kernel_fallback` is the one
policy for a kernel asked for where it cannot run at all. Nothing here imports attention.py,
which picks a kernel from KERNELS by name: the two modules do not import each other.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxgpt.errors import UserError


def dot_product_attention(q, k, v, mask, scale: float | None, fallback=None):
    """`jax.nn.dot_product_attention`: cuDNN's flash attention on a GPU where it runs, XLA's
    attention elsewhere.

    jax.nn picks XLA unless told `implementation="cudnn"` (its automatic choice is XLA at
    jax 0.10 and 0.11, measured on an H200: no cuDNN call in the compiled step), so this asks for
    cuDNN by name where it can run: on a GPU, in bfloat16 or float16, over causal self-attention
    with or without a sliding window (what cuDNN's masks express). jax's own check refuses what
    this GPU or cuDNN version cannot run (a head width over its limit, say) with
    NotImplementedError while tracing, and that case, like ALiBi, a KV-cache step and float32,
    runs XLA's, as does a batch of packed sequences (segments), which cuDNN's kernel as jax.nn
    calls it cannot mask. It takes grouped-query attention natively (query heads as a multiple of
    key/value heads, same head order as ours). A plain causal mask is passed as `is_causal`,
    which lets a fused kernel skip the masked blocks; any other mask is passed as a bias.
    """
    b, t, n_kv, group, d = q.shape
    q = q.reshape(b, t, n_kv * group, d)
    out = cudnn_attention(q, k, v, mask, scale) if cudnn_may_run(q, mask) else None
    if out is None:
        out = jax_nn_xla_attention(q, k, v, mask, scale)
    return out.reshape(b, t, n_kv, group, d)


def jax_nn_xla_attention(q, k, v, mask, scale: float | None):
    """jax.nn's XLA attention over queries with their heads flattened (b, t, heads, d)."""
    if mask.plain_causal:
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True)
    bias = mask.bias(q.shape[1], k.shape[1])  # (b or 1, k or 1, g or 1, t, s)
    bias = bias.reshape(bias.shape[0], -1, *bias.shape[3:]).astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, scale=scale)


def cudnn_may_run(q, mask) -> bool:
    """Whether to ask cuDNN: a GPU, half precision, and a mask cuDNN's kernel expresses."""
    return jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16) and mask.causal_only


def cudnn_attention(q, k, v, mask, scale: float | None):
    """cuDNN's fused attention, or None where jax's check says this GPU cannot run it."""
    try:
        return jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=True, local_window_size=local_window_size(mask), implementation="cudnn"
        )
    except NotImplementedError:
        return None


def local_window_size(mask) -> tuple[int, int] | None:
    """jax.nn's words for our sliding window of w tokens (each query and the w - 1 before it):
    w - 1 keys to the left, none to the right."""
    return (mask.window - 1, 0) if mask.window else None


FLASH_TPU_BLOCK = 128  # the kernel's smallest block along the sequence


def flash_tpu_attention(q, k, v, mask, scale: float | None, fallback=None):
    """Pallas's flash attention kernel for TPU (jax.experimental.pallas.ops.tpu): the scores
    are computed block by block in on-chip memory and never written out whole.

    It works in blocks of 128 positions and wants equal query and key/value head counts, so
    grouped keys and values are repeated to the query heads. Causal self-attention over a
    multiple of 128 positions runs in it, with a batch's segments (packed sequences, padding)
    as the kernel's own segment ids; anything else (a KV-cache decode step, a prompt of another
    length, ALiBi, a sliding window, an encoder) goes to the XLA kernel.

    XLA cannot split a Mosaic kernel over devices by itself, so on a mesh the kernel runs
    under shard_map, once per device on its rows of the batch and its heads: attention never
    mixes batch rows or heads, so no collective is needed. The mesh is the one the step is
    traced under (`jaxgpt.sharding.traced_on`).
    """
    b, t, n_kv, group, d = q.shape
    plain = mask.cache_index is None and mask.slopes is None and not mask.window and mask.causal
    if not plain or t % FLASH_TPU_BLOCK:
        return fallback(q, k, v, mask, scale)
    from jax.experimental.pallas.ops.tpu.flash_attention import SegmentIds, flash_attention

    heads = lambda x: x.reshape(b, t, n_kv * group, d).transpose(0, 2, 1, 3)  # noqa: E731
    repeated = lambda x: heads(jnp.repeat(x[:, :, :, None], group, axis=3))  # noqa: E731
    sm_scale = 1 / math.sqrt(d) if scale is None else scale

    def kernel(q, k, v, segments):
        ids = None if segments is None else SegmentIds(segments, segments)
        return flash_attention(q, k, v, segment_ids=ids, causal=True, sm_scale=sm_scale)

    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        spec = per_device_heads_spec(mesh, b, n_kv)
        rows = PartitionSpec(spec[0]) if mask.segments is not None else None
        kernel = jax.shard_map(kernel, mesh=mesh, in_specs=(spec,) * 3 + (rows,), out_specs=spec, check_vma=False)
    out = kernel(heads(q), repeated(k), repeated(v), mask.segments)
    return out.transpose(0, 2, 1, 3).reshape(b, t, n_kv, group, d)


def per_device_heads_spec(mesh, batch: int, n_kv: int) -> PartitionSpec:
    """How (batch, heads, seq, head_dim) splits over the mesh for a per-device kernel: batch
    rows over data x fsdp and heads over tensor, as the step's activations already are, each
    only where the axis divides it (heads are split by whole key/value groups: query head
    kv * g + i stays with its key/value head)."""
    rows = tuple(axis for axis in ("data", "fsdp") if mesh.shape.get(axis, 1) > 1)
    rows_split = rows and batch % math.prod(mesh.shape[axis] for axis in rows) == 0
    tensor = mesh.shape.get("tensor", 1)
    return PartitionSpec(rows if rows_split else None, "tensor" if tensor > 1 and n_kv % tensor == 0 else None)


# by model.attention's name; "xla", the readable one, is attention.xla_attention
KERNELS = {"dot_product": dot_product_attention, "flash_tpu": flash_tpu_attention}


def kernel_fallback(kernel: str, backend: str, *, training: bool) -> str:
    """The kernel a run on `backend` uses when its config asks for `kernel`: the one place
    that decides what happens to the TPU-only kernel elsewhere. Training refuses it (a run
    silently on another kernel would not be the run asked for); sampling a model trained on a
    TPU uses the XLA kernel, which computes the same attention."""
    if kernel != "flash_tpu" or backend == "tpu":
        return kernel
    if training:
        raise UserError(
            f"model.attention='flash_tpu' is a TPU kernel and this run is on {backend}; "
            "set --config.model.attention=xla (or dot_product)"
        )
    return "xla"
