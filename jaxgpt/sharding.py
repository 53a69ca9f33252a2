"""Where arrays live: the device mesh and the rules that place parameters, optimizer state and
batches on it.

The mesh has four axes:
  data    pure data parallelism: each slice holds every parameter, sees its part of the batch;
  fsdp    data parallelism with parameters and optimizer state sharded across the axis
          (ZeRO-3 / FSDP): each large weight is split along one dimension, gathered for use;
  expert  expert parallelism (GShard): a mixture of experts' experts split across the axis;
          everything else sees its part of the batch, as on `data`. Tokens travel to their
          experts' devices and back by an all-to-all around the experts (experts_split);
  tensor  tensor parallelism (Megatron): attention heads and the MLP hidden dimension split.
The batch is split over data x fsdp x expert. `train_step` never changes: jit compiles it for
whatever shardings its inputs have, and XLA (GSPMD) inserts the collectives.
"""

from __future__ import annotations

import functools
import math

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgpt.config import MeshConfig

AXES = ("data", "fsdp", "expert", "tensor")
# Auto axis types: linen modules do not annotate shardings, so GSPMD propagates them from the
# inputs (Explicit axes would make nn.Embed fail)
AXIS_TYPES = (jax.sharding.AxisType.Auto,) * len(AXES)
BATCH = ("data", "fsdp", "expert")
ROWS_BESIDE_EXPERTS = ("data", "fsdp")  # a batch's split while its experts are split over `expert`

# Per parameter (module name, parameter name): the mesh axis each dimension is split over.
# Layer-scanned parameters have an extra leading layer axis, never split.
RULES: dict[tuple[str, str], tuple[str | None, ...]] = {
    ("wte", "embedding"): ("tensor", "fsdp"),  # (vocab, d_model)
    ("wpe", "embedding"): (None, "fsdp"),  # (block_size, d_model)
    ("patch_embed", "kernel"): (None, "fsdp"),  # a Vision Transformer's (patch values, d_model)
    # a block's value embeddings (vocab, kv_heads x head_dim): the width split as the values' heads are
    ("value_embed", "embedding"): ("fsdp", "tensor"),
    ("qkv", "kernel"): ("fsdp", "tensor", None, None),  # (d_model, kv_heads, group + 2, head_dim)
    ("qkv", "bias"): ("tensor", None, None),
    ("out", "kernel"): ("tensor", None, None, "fsdp"),  # (kv_heads, group, head_dim, d_model)
    ("up", "kernel"): ("fsdp", "tensor"),  # (d_model, hidden), or (d_model, 2, hidden) for SwiGLU
    ("up", "bias"): ("tensor",),
    ("down", "kernel"): ("tensor", "fsdp"),  # (hidden, d_model)
    ("lm_head", "kernel"): ("fsdp", "tensor"),  # (d_model, vocab)
    ("classifier", "kernel"): ("fsdp", None),  # a classifier's (d_model, classes): a few columns, not split
    # BERT's prediction head (d_model, d_model), its norm reading the whole width after it: split over fsdp alone
    ("head_dense", "kernel"): ("fsdp", None),
    # multi-token prediction's (2 d_model, d_model): the joined stream and embedding in, likewise
    ("project", "kernel"): ("fsdp", None),
    ("gate", "kernel"): ("fsdp", "tensor", None, None),  # the attention gate's (d_model, kv_heads, group, d or 1)
    # the convolution mixer's (jaxgpt/model/convolution.py): its values' (d_model, d_model), its
    # taps (width, d_model) and its output's (d_model, d_model), the features split as heads are
    ("value", "kernel"): ("fsdp", "tensor"),
    ("conv", "taps"): (None, "tensor"),
    ("conv_out", "kernel"): ("tensor", "fsdp"),
    ("q", "kernel"): ("fsdp", "tensor", None, None),  # cross-attention's (d_model, kv_heads, group, head_dim)
    ("kv", "kernel"): ("fsdp", "tensor", None, None),  # and its (d_model, kv_heads, 2, head_dim)
    # Low-rank adapters (jaxgpt/model/lora.py), A (inputs..., rank) and B (rank, outputs...): each
    # split as its projection's inputs and outputs are, so x A B is split as x W is.
    ("qkv", "lora_a"): ("fsdp", None),
    ("qkv", "lora_b"): (None, "tensor", None, None),
    ("out", "lora_a"): ("tensor", None, None, None),
    ("out", "lora_b"): (None, "fsdp"),
    ("up", "lora_a"): ("fsdp", None),
    ("up", "lora_b"): (None, "tensor"),
    ("down", "lora_a"): ("tensor", None),
    ("down", "lora_b"): (None, "fsdp"),
    ("q", "lora_a"): ("fsdp", None),
    ("q", "lora_b"): (None, "tensor", None, None),
    ("kv", "lora_a"): ("fsdp", None),
    ("kv", "lora_b"): (None, "tensor", None, None),
}
SWIGLU_UP = {"kernel": ("fsdp", None, "tensor"), "bias": (None, "tensor"), "lora_b": (None, None, "tensor")}
# A mixture of experts (jaxgpt/model/moe.py): the experts split over the expert axis, each expert's
# MLP split as the MLP is.
EXPERT_RULES = {
    "experts_up": ("expert", "fsdp", "tensor"),  # (experts, d_model, hidden)
    "experts_up_bias": ("expert", None, "tensor"),  # (experts, 1, hidden)
    "experts_down": ("expert", "tensor", "fsdp"),  # (experts, hidden, d_model)
    "experts_down_bias": ("expert", None, None),  # (experts, 1, d_model)
}
EXPERT_SWIGLU_UP = {
    "experts_up": ("expert", "fsdp", None, "tensor"),
    "experts_up_bias": ("expert", None, None, "tensor"),
}


def make_mesh(config: MeshConfig, devices=None) -> Mesh:
    """The one mesh of a run over `devices` (default: all of JAX's; a training job passes
    jaxgpt.hardware.runtime.mesh_devices(), which knows when CPU devices stand for cores).
    Its axes are AXIS_TYPES."""
    devices = devices if devices is not None else jax.devices()
    shape = config.shape(len(devices))
    return _mesh(shape, devices[: math.prod(shape)])  # a mesh may use a divisor of the devices, e.g. one


def _mesh(shape: tuple[int, ...], devices) -> Mesh:
    return jax.make_mesh(shape, AXES, axis_types=AXIS_TYPES, devices=devices)


def traced_on(mesh: Mesh, fn):
    """`fn`, traced with `mesh` as the context mesh. Parts of the model that run per device
    under shard_map (the TPU flash kernel) read the mesh from this context rather than from an
    argument, so the model's code does not change with the devices it is split over."""

    def on_mesh(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)

    # Keep the function's own name (through partials): jit names the program, and with it the
    # persistent compilation cache's entries, after it.
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    on_mesh.__name__ = on_mesh.__qualname__ = inner.__name__
    return on_mesh


def partition_spec(path, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """The rule for one array, found by the last two names on its path (the same names in
    the params tree and in the optimizer's moment trees). A dimension the axis size does not
    divide stays whole; anything without a rule (norms, scalars, biases of d_model) is replicated."""
    names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
    if len(names) < 2:
        return PartitionSpec()
    module, param = names[-2], names[-1]
    axes = RULES.get((module, param))
    if module == "up" and len(shape) >= 2 and shape[-2] == 2 and param in SWIGLU_UP:  # SwiGLU's fused (..., 2, hidden)
        axes = SWIGLU_UP[param]
    if module == "moe":
        swiglu = param in EXPERT_SWIGLU_UP and len(shape) >= 3 and shape[-2] == 2
        axes = (EXPERT_SWIGLU_UP if swiglu else EXPERT_RULES).get(param)
    if axes is None or len(shape) < len(axes):
        return PartitionSpec()
    axes = (None,) * (len(shape) - len(axes)) + axes  # a scanned layer axis stays whole
    splits = lambda axis, dim: axis is not None and mesh.shape[axis] > 1 and dim % mesh.shape[axis] == 0  # noqa: E731
    return PartitionSpec(*(axis if splits(axis, dim) else None for axis, dim in zip(axes, shape, strict=True)))


def shardings_like(tree, mesh: Mesh):
    """NamedShardings for every leaf of `tree` (arrays or shape structs) by the rules."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, partition_spec(path, tuple(leaf.shape), mesh)), tree
    )


def laid_out(shapes, mesh: Mesh):
    """`shapes` (jax.ShapeDtypeStruct leaves, as from jax.eval_shape), each with its sharding by
    the rules: what to lower, compile or restore onto without allocating anything."""
    return jax.tree.map(
        lambda s, where: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=where), shapes, shardings_like(shapes, mesh)
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batch rows split over data x fsdp; sequence positions whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH, None))


def rows_sharding(mesh: Mesh, rows: int) -> NamedSharding:
    """A leading axis of `rows` split over data x fsdp where they divide evenly, else whole on
    every device: how a rollout's answers are decoded, each device its share of the rows."""
    return NamedSharding(mesh, PartitionSpec(BATCH) if rows % data_parallel_size(mesh) == 0 else PartitionSpec())


def rows_beside(params, rows: int) -> NamedSharding | None:
    """Where rows decoded by `params` go: split over the mesh the parameters are laid out on
    (rows_sharding), or, for parameters on no mesh, nowhere in particular (None: the default
    device, where jit moves them beside the parameters)."""
    where = jax.tree.leaves(params)[0].sharding
    return rows_sharding(where.mesh, rows) if isinstance(where, NamedSharding) else None


def data_parallel_size(mesh: Mesh) -> int:
    """How many ways a batch's rows are split."""
    return math.prod(mesh.shape[axis] for axis in BATCH)


def experts_split(x: jax.Array) -> jax.Array:
    """`x` (experts, batch, ...) laid out for the experts' matmuls: experts split over the
    expert axis, rows over data x fsdp. From the batch's own layout (rows over data x fsdp x
    expert) that is one all-to-all over the expert axis, which GSPMD inserts; `rows_split` is
    the way back. Unchanged outside a mesh with an expert axis (one device, a core's program)."""
    return _constrained(x, PartitionSpec("expert", ROWS_BESIDE_EXPERTS))


def rows_split(x: jax.Array) -> jax.Array:
    """`x` (experts, batch, ...) back in the batch's layout: rows over data x fsdp x expert."""
    return _constrained(x, PartitionSpec(None, BATCH))


def _constrained(x: jax.Array, spec: PartitionSpec) -> jax.Array:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get("expert", 1) == 1:
        return x
    return jax.lax.with_sharding_constraint(x, spec)


def global_batch(mesh: Mesh, make_rows, batch_size: int):
    """The batch's (batch, ...) arrays (jaxgpt/training/batch.py) sharded over data x fsdp, each process
    supplying only its rows: make_rows(start, stop) builds rows [start, stop) of the global
    batch, each of its arrays."""
    sharding = batch_sharding(mesh)
    per_process = batch_size // jax.process_count()
    start = jax.process_index() * per_process
    return jax.tree.map(
        lambda local: jax.make_array_from_process_local_data(sharding, local, (batch_size, *local.shape[1:])),
        make_rows(start, start + per_process),
    )
