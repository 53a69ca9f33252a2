"""The attention kernels beyond the readable one (attention.xla_attention), and where each runs.

Each computes exactly what xla_attention computes, with the same arguments (see attention.py;
`mask` is an attention.Mask) and `fallback`, the readable kernel, for what it cannot run:
`dot_product` is jax.nn's (cuDNN flash attention on a GPU), `flash_tpu` is Pallas's TPU kernel,
run once per device under shard_map on a mesh. `kernel_fallback` is the one policy for a kernel
asked for where it cannot run at all. Nothing here imports attention.py, which picks a kernel
from KERNELS by name: the two modules do not import each other.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxgpt.errors import UserError


def dot_product_attention(q, k, v, mask, scale: float | None, fallback=None):
    """`jax.nn.dot_product_attention`: XLA on CPU/TPU, cuDNN flash attention on GPU when it can.

    It takes grouped-query attention natively (query heads as a multiple of key/value heads,
    same head order as ours). A plain causal mask is passed as `is_causal`, which lets cuDNN
    skip the masked blocks; any other mask is passed as a bias.
    """
    b, t, n_kv, group, d = q.shape
    q = q.reshape(b, t, n_kv * group, d)
    if mask.plain_causal:
        out = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True)
    else:
        bias = mask.bias(t, k.shape[1])
        bias = bias.reshape(1, -1, *bias.shape[2:]).astype(q.dtype)
        out = jax.nn.dot_product_attention(q, k, v, bias=bias, scale=scale)
    return out.reshape(b, t, n_kv, group, d)


FLASH_TPU_BLOCK = 128  # the kernel's smallest block along the sequence


def flash_tpu_attention(q, k, v, mask, scale: float | None, fallback=None):
    """Pallas's flash attention kernel for TPU (jax.experimental.pallas.ops.tpu): the scores
    are computed block by block in on-chip memory and never written out whole.

    It works in blocks of 128 positions and wants equal query and key/value head counts, so
    grouped keys and values are repeated to the query heads. Only plain causal self-attention
    over a multiple of 128 positions runs in it; anything else (a KV-cache decode step, a
    prompt of another length, ALiBi, a sliding window) goes to the XLA kernel.

    XLA cannot split a Mosaic kernel over devices by itself, so on a mesh the kernel runs
    under shard_map, once per device on its rows of the batch and its heads: attention never
    mixes batch rows or heads, so no collective is needed. The mesh is the one the step is
    traced under (`jaxgpt.sharding.traced_on`).
    """
    b, t, n_kv, group, d = q.shape
    if not mask.plain_causal or t % FLASH_TPU_BLOCK:
        return fallback(q, k, v, mask, scale)
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    heads = lambda x: x.reshape(b, t, n_kv * group, d).transpose(0, 2, 1, 3)  # noqa: E731
    repeated = lambda x: heads(jnp.repeat(x[:, :, :, None], group, axis=3))  # noqa: E731
    sm_scale = 1 / math.sqrt(d) if scale is None else scale
    kernel = partial(flash_attention, causal=True, sm_scale=sm_scale)
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        spec = per_device_heads_spec(mesh, b, n_kv)
        kernel = jax.shard_map(kernel, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)
    out = kernel(heads(q), repeated(k), repeated(v))
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
