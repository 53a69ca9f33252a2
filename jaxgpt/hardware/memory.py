"""Whether a run can fit in memory, decided from shapes before anything is allocated.

`footprint` is a lower bound on what one training step holds per device and on the host:
parts whose size follows from the shapes alone, however XLA schedules the step. Parameters and
optimizer state are exact (from `jax.eval_shape`); on top of them one gradient per parameter;
for one microbatch the float32 logits and what the backward pass needs of each layer (below);
on the host the batch in use and the one prepared ahead, and the validation windows' offsets.
Anything the estimate leaves out only adds, so a run it refuses cannot fit; one it passes may
still not (`python -m jaxgpt check` prints the compiled program's own figure).

Both `train.py` and `jaxgpt.check` call `check_fits` before preparing a batch or a state, so an
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


def state_bytes(run: RunConfig, mesh, layout=None) -> tuple[int, int]:
    """(parameters with optimizer state, parameters alone), per device, from shapes only (the
    state's `layout`, from mesh_step.state_layout, where the caller has it)."""
    from jaxgpt.hardware.mesh_step import state_layout

    layout = layout if layout is not None else state_layout(run, mesh)[0]
    params = sharding.shard_bytes(layout.params)
    return params + sharding.shard_bytes(layout.opt_state), params


def footprint(run: RunConfig, mesh, state: tuple[int, int] | None = None) -> Footprint:
    """The lower bound described above; `state` is `state_bytes(run, mesh)` when known."""
    model, train = run.model, run.train
    state_total, params = state if state is not None else state_bytes(run, mesh)
    batch_devices = mesh.shape["data"] * mesh.shape["fsdp"]
    # microbatches=0 lets the CPU autotuner choose: it may choose rows of one
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


def check_fits(run: RunConfig, mesh, layout=None) -> None:
    """Refuse, with one UserError line, a run whose footprint exceeds a memory it uses; the
    line gives the estimate and the largest batch_size (or else block_size) that fits."""
    mappable = check_address_space()
    device = mesh.devices.flat[0]
    on_cpu = device.platform == "cpu"  # the devices are the host's cores: one memory
    capacity = {"host": host_memory_bytes(), "device": None if on_cpu else device_memory_limit(device)}
    state = state_bytes(run, mesh, layout)

    def excess(candidate: RunConfig, candidate_state=state) -> tuple[str, int] | None:
        """(the memory it overflows, bytes it needs there), or None where it fits."""
        fp = footprint(candidate, mesh, candidate_state)
        demands = {"host": fp.device + fp.host} if on_cpu else {"device": fp.device, "host": fp.host}
        for memory, need in demands.items():
            if capacity[memory] is not None and need > capacity[memory]:
                return memory, need
        return None

    if (overflow := excess(run)) is None:
        return
    memory, need = overflow
    have = capacity[memory]
    t = run.train
    what = f"train.batch_size={t.batch_size} with model.block_size={run.model.block_size}"
    estimate = f"needs at least {need / GiB:,.1f} GiB of {memory} memory, more than its {have / GiB:,.1f} GiB"
    if memory == "host" and mappable is not None and have < mappable:
        estimate += (
            f" (the {mappable / GiB:,.1f} GiB `ulimit -v` allows this process, less about "
            f"{RUNTIME_ADDRESS_SPACE / GiB:.1f} GiB JAX and XLA map for themselves: raise it with ulimit -v)"
        )
    unit = max(t.microbatches, 1) * mesh.shape["data"] * mesh.shape["fsdp"]  # batches must be multiples
    small = with_train(run, batch_size=unit)
    if excess(small) is None:
        fits = largest(lambda n: excess(with_train(run, batch_size=n * unit)) is None, math.ceil(t.batch_size / unit))
        hint = " (or keep it and raise train.microbatches)" if memory == "device" else ""
        raise UserError(f"{what} {estimate}; the largest batch_size that fits is {fits * unit}{hint}")

    def fits_block(block: int) -> bool:
        candidate = dataclasses.replace(small, model=small.model.replace(block_size=block))
        learned = run.model.position == "learned"  # the only parameters that grow with the block
        return excess(candidate, state_bytes(candidate, mesh) if learned else state) is None

    if fits_block(1):
        largest_block = largest(fits_block, run.model.block_size)
        raise UserError(
            f"{what} {estimate}; even batch_size={unit} does not fit, and the largest block_size that fits "
            f"at that batch is {largest_block}"
        )
    raise UserError(
        f"{what} does not fit even as one token per row: the model's parameters, gradients and optimizer "
        f"state need {sum(state) / GiB:,.1f} GiB per device of the {have / GiB:,.1f} GiB; make the model "
        "smaller (d_model, n_layer, vocab_size)" + (" or shard it (--config.mesh.fsdp=-1)" if mesh.size > 1 else "")
    )


def largest(fits, above: int) -> int:
    """The largest n in [1, above) with fits(n), given fits(1) and not fits(above), for a
    `fits` that holds up to some n and fails beyond (a footprint grows with its sizes)."""
    low, high = 1, above
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
