"""Whether a run can fit in memory, decided from shapes before anything is allocated.

`footprint` is a lower bound on what one training step holds per device and on the host:
parts whose size follows from the shapes alone, however XLA schedules the step. Parameters and
optimizer state are exact (from `jax.eval_shape`); on top of them one gradient per parameter;
for one microbatch the float32 logits and what the backward pass needs of each layer (below);
on the host the batch in use and the one prepared ahead, and the validation windows' offsets.
Anything the estimate leaves out only adds, so a run it refuses cannot fit; one it passes may
still not (`python -m jaxgpt check` prints the compiled program's own figure).

Both `train.py` and `jaxgpt check` call `check_fits` before preparing a batch or a state, so an
absurd `--config.train.batch_size=1000000000` is one line, not a numpy MemoryError later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import resource
from pathlib import Path

import jax
import numpy as np

from jaxgpt import sharding
from jaxgpt.config import RunConfig, with_train
from jaxgpt.errors import UserError

GiB = 2**30
MATERIALISED_SCORES = ("xla", "dot_product")  # flash_tpu keeps only blocks of the scores
CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")  # a container's own ceiling (cgroup v2)


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Bytes a training step must hold at least: per device, and on the host."""

    state: int  # parameters and optimizer state, per device (exact)
    gradients: int  # one float32 gradient per parameter, per device
    activations: int  # one microbatch's logits, layer inputs and scores, per device
    host: int  # token batches and validation offsets in the host's memory

    @property
    def device(self) -> int:
        return self.state + self.gradients + self.activations


def shard_bytes(layout) -> int:
    """Bytes one device holds of a tree of sharded shape structs (every device holds as much:
    the rules only split dimensions the axis divides)."""
    return sum(
        math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(layout)
    )


def bytes_per_device(tree) -> int:
    """Bytes of `tree`'s arrays held by the first device (its shards, or whole copies)."""
    device = jax.devices()[0]
    total = 0
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            if shard.device == device:
                total += int(np.prod(shard.data.shape)) * leaf.dtype.itemsize
    return total


def state_bytes(layout) -> tuple[int, int]:
    """(parameters with optimizer state, parameters alone), per device, from the state's
    `layout` (mesh_step.state_layout: shapes and shardings, nothing allocated)."""
    params = shard_bytes(layout.params)
    return params + shard_bytes(layout.opt_state), params


def position_table_bytes(layout) -> tuple[int, int]:
    """(state bytes, parameter bytes) per device of the learned position table (wpe) and its
    optimizer moments: the only part of the state that grows with block_size, row for row (its
    rows are never split over the mesh), so a smaller block's state follows without a layout."""

    def table(tree) -> int:
        leaves = jax.tree_util.tree_leaves_with_path(tree)
        return shard_bytes([leaf for path, leaf in leaves if any(getattr(k, "key", None) == "wpe" for k in path)])

    params = table(layout.params)
    return params + table(layout.opt_state), params


def footprint(run: RunConfig, mesh, state: tuple[int, int]) -> Footprint:
    """The lower bound described above; `state` is the run's `state_bytes`."""
    model, train = run.model, run.train
    state_total, params = state
    batch_devices = sharding.data_parallel_size(mesh)
    # microbatches=0 lets the machine choose (step_choice.py): it may choose rows of one
    rows = math.ceil(train.batch_size / (train.microbatches or train.batch_size) / batch_devices)
    compute = 2 if train.dtype == "bfloat16" else 4
    t = model.block_size
    logits = t * model.vocab_size * 4  # softmax and loss in float32
    heads_here = max(model.n_head // mesh.shape["tensor"], 1)
    hidden_here = model.mlp_hidden // mesh.shape["tensor"] if model.mlp else 0  # attention-only: no MLP
    probabilities = heads_here * t * t * compute if model.attention in MATERIALISED_SCORES else 0
    # What the backward pass needs of a layer, per token: its input, and the inputs of the
    # weight gradients no policy recomputes without a matmul (the MLP's hidden activations and
    # the attention probabilities). Full remat keeps only the input, then recomputes the
    # rest one layer at a time.
    inner = hidden_here * t * compute + probabilities
    layer_input = t * model.d_model * compute
    kept = model.n_layer * layer_input + (inner if model.remat == "full" else model.n_layer * inner)
    window = train.batch_size * (t + 1) * 4  # int32 tokens
    return Footprint(
        state=state_total,
        gradients=params,
        activations=rows * (logits + kept),
        host=2 * window + train.eval_batches * train.batch_size * 8,  # + int64 window offsets
    )


def host_memory_bytes() -> int:
    """The machine's memory, or the container's limit where that is lower, or what the
    process's address-space limit leaves beside the runtime's own share. The total, not what
    is free at this moment: a verdict must not change with the machine's load."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = CGROUP_LIMIT.read_text().strip()
    except OSError:
        limit = ""
    total = min(total, int(limit)) if limit.isdigit() else total
    mappable = address_space_limit()
    return total if mappable is None else min(total, max(mappable - RUNTIME_ADDRESS_SPACE, 0))


# What JAX and XLA map for themselves, beyond the run's own arrays: configs/tiny.py peaked at
# 2.39 GiB of address space (VmPeak; 27 threads on 2 cores) holding 0.9 GiB resident, and with
# `ulimit -v` below about 2.8 GiB it died in XLA (std::bad_alloc, or no room for a thread).
RUNTIME_ADDRESS_SPACE = 5 * GiB // 2


def check_address_space() -> int | None:
    """One line, before JAX starts a backend or compiles anything (where it would abort), when
    the address-space limit leaves JAX and XLA too little to run at all; else the limit, or
    None if there is none."""
    mappable = address_space_limit()
    if mappable is not None and mappable <= RUNTIME_ADDRESS_SPACE:
        raise UserError(
            f"this process may map at most {mappable / GiB:.1f} GiB (ulimit -v), and JAX and XLA alone map about "
            f"{RUNTIME_ADDRESS_SPACE / GiB:.1f} GiB; raise the limit (ulimit -v unlimited) and rerun"
        )
    return mappable


def address_space_limit() -> int | None:
    """The process's address-space limit (`ulimit -v`, RLIMIT_AS) in bytes, or None if unset."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def device_memory_limit(device) -> int | None:
    """Bytes the runtime lets one accelerator allocate (None on a CPU, or where not reported:
    compile-only devices have no runtime to ask)."""
    try:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    except jax.errors.JaxRuntimeError:
        stats = None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


class OutOfMemory(Exception):
    """An accelerator compiler's own verdict that a program does not fit, in its words."""


@contextlib.contextmanager
def refusals_as_out_of_memory():
    """Inside: an accelerator compiler's out-of-memory refusal (it checks its memory at compile
    time) is raised as OutOfMemory, naming what the program needs; other errors pass."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" in str(error):
            raise OutOfMemory(str(error).split("RESOURCE_EXHAUSTED: ")[-1].splitlines()[0].rstrip(".")) from None
        raise


def device_memory_bytes(device) -> int | None:
    """Bytes one device can hold: the accelerator's limit (None where it reports none), or for
    a CPU device its share of the host's memory (the process's CPU devices share it)."""
    if device.platform == "cpu":
        return host_memory_bytes() // jax.local_device_count()
    return device_memory_limit(device)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """The memories a run on `mesh` uses, in bytes (None: not reported, so never exceeded)."""

    mesh: object
    host: int
    device: int | None  # None on a CPU: its devices are the host's cores, one memory

    @classmethod
    def of(cls, mesh) -> Capacity:
        device = mesh.devices.flat[0]
        return cls(mesh, host_memory_bytes(), None if device.platform == "cpu" else device_memory_limit(device))

    def excess(self, run: RunConfig, state: tuple[int, int]) -> tuple[str, int] | None:
        """(the memory `run` overflows, bytes it needs there), or None where it fits; `state`
        is its state_bytes."""
        fp = footprint(run, self.mesh, state)
        on_cpu = self.mesh.devices.flat[0].platform == "cpu"
        demands = {"host": fp.device + fp.host} if on_cpu else {"device": fp.device, "host": fp.host}
        for memory, need in demands.items():
            have = getattr(self, memory)
            if have is not None and need > have:
                return memory, need
        return None


def check_fits(run: RunConfig, mesh, layout) -> None:
    """Refuse, with one UserError line, a run whose footprint exceeds a memory it uses; the
    line gives the estimate and the largest batch_size (or else block_size) that fits. `layout`:
    the run's state on `mesh` (mesh_step.state_layout)."""
    mappable = check_address_space()
    capacity, state = Capacity.of(mesh), state_bytes(layout)
    if (overflow := capacity.excess(run, state)) is None:
        return
    memory, need = overflow
    have = getattr(capacity, memory)
    what = f"train.batch_size={run.train.batch_size} with model.block_size={run.model.block_size}"
    estimate = f"needs at least {need / GiB:,.1f} GiB of {memory} memory, more than its {have / GiB:,.1f} GiB"
    if memory == "host" and mappable is not None and have < mappable:
        estimate += (
            f" (the {mappable / GiB:,.1f} GiB `ulimit -v` allows this process, less about "
            f"{RUNTIME_ADDRESS_SPACE / GiB:.1f} GiB JAX and XLA map for themselves: raise it with ulimit -v)"
        )
    raise UserError(f"{what} {estimate}; " + _what_fits(run, capacity, state, position_table_bytes(layout), memory))


def _what_fits(run: RunConfig, capacity: Capacity, state, table, memory: str) -> str:
    """The end of check_fits' line for a run that overflows `memory`: the largest batch_size
    that fits; or, when not even the smallest batch does, the largest block_size at that batch;
    or, when not even one token per row does, what to change in the model."""
    mesh = capacity.mesh
    unit = max(run.train.microbatches, 1) * sharding.data_parallel_size(mesh)  # batches must be multiples
    small = with_train(run, batch_size=unit)
    if capacity.excess(small, state) is None:
        fits = lambda n: capacity.excess(with_train(run, batch_size=n * unit), state) is None  # noqa: E731
        hint = " (or keep it and raise train.microbatches)" if memory == "device" else ""
        return (
            f"the largest batch_size that fits is {largest(fits, math.ceil(run.train.batch_size / unit)) * unit}{hint}"
        )

    def fits_block(block: int) -> bool:  # learned positions: the table's rows go with the block
        rows = block / run.model.block_size
        candidate_state = tuple(whole - part + round(part * rows) for whole, part in zip(state, table, strict=True))
        candidate = dataclasses.replace(small, model=small.model.replace(block_size=block))
        return capacity.excess(candidate, candidate_state) is None

    if fits_block(1):
        return (
            f"even batch_size={unit} does not fit, and the largest block_size that fits at that batch is "
            f"{largest(fits_block, run.model.block_size)}"
        )
    return (
        f"it does not fit even as one token per row: the model's parameters, gradients and optimizer state need "
        f"{sum(state) / GiB:,.1f} GiB per device; make the model smaller (d_model, n_layer, vocab_size)"
        + (" or shard it (--config.mesh.fsdp=-1)" if mesh.size > 1 else "")
    )


def largest(fits, above: int) -> int:
    """The largest n in [1, above) with fits(n), given fits(1) and not fits(above), for a
    `fits` that holds up to some n and fails beyond (a footprint grows with its sizes)."""
    low, high = 1, above
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
