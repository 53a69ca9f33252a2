"""Settings the machine chooses, so that no shipped config is tuned by hand for one computer.

`train.microbatches = 0` (the default) asks the run for the fewest microbatches whose compiled
train step keeps its temporary buffers within a budget:
  - on a CPU, the last-level cache the OS reports. A small model's step is bound by memory
    traffic, not arithmetic: once its temporaries spill out of the cache, every elementwise
    op runs at DRAM speed (docs/benchmarks.md measures the jump). Splitting the batch into
    microbatches shrinks the activations each pass keeps while the gradient, accumulated over
    the pieces inside the step, is the same up to float32 summation order;
  - on an accelerator, the device's memory less what the state already holds: microbatches
    there are for fitting at all, not for speed.
The temporaries come from XLA's own memory analysis of the compiled step, not a formula. The
first candidate compiled is one microbatch; when that is over budget the largest split is
compiled too, and the rest are interpolated: temporaries are a fixed part (gradients, their
accumulator) plus activations that shrink as 1/microbatches. An accelerator's compiler may
refuse the first outright (out of memory), which leaves nothing to interpolate from: then the
counts in between are bisected, one compile each.

Where the candidates are only measured (the CPU's per-core plan: each core then compiles the
program it runs, jaxgpt/hardware/core_parallel.py), they are compiled without LLVM's
optimisations, a quarter to a third faster: XLA assigns every buffer before LLVM sees the
program, so the temporaries are the optimised step's to the byte (tests/test_autotune.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from jaxgpt import sharding
from jaxgpt.config import RunConfig, with_train
from jaxgpt.hardware import memory, peak_flops
from jaxgpt.hardware.mesh_step import batch_layout, jit_train_step, state_layout

FALLBACK_CPU_CACHE = 8 * 2**20  # when the OS reports no cache sizes (some VMs)
ACCELERATOR_HEADROOM = 0.9  # leave XLA's allocator a tenth of the device's memory
MEASURE_ONLY = {"xla_backend_optimization_level": 0}  # LLVM's level: buffers are assigned before it


def microbatch_choices(batch_size: int, data_parallel: int) -> list[int]:
    """Microbatch counts that give every data-parallel device the same whole number of rows."""
    return [m for m in range(1, batch_size + 1) if batch_size % m == 0 and (batch_size // m) % data_parallel == 0]


def compile_step(run: RunConfig, mesh, measure_only: bool = False, layout=None):
    """The train step of `run`, compiled ahead of time for its state and batch layouts; raises
    memory.OutOfMemory where the compiler refuses it. `measure_only`: for its memory analysis,
    never to run (a CPU program compiled without LLVM's optimisations)."""
    layout = layout if layout is not None else state_layout(run, mesh)[0]
    with memory.refusals_as_out_of_memory():
        lowered = jit_train_step(run, mesh, layout).lower(layout, batch_layout(run, mesh))
        return lowered.compile(MEASURE_ONLY if measure_only else None)


def temp_bytes(compiled) -> int:
    """Temporary bytes per device of a compiled step, from XLA's memory analysis."""
    analysis = compiled.memory_analysis()
    return int(analysis.temp_size_in_bytes) if analysis is not None else 0


def step_temp_bytes(run: RunConfig, mesh, microbatches: int, measure_only: bool = False) -> int:
    return temp_bytes(compile_step(with_train(run, microbatches=microbatches), mesh, measure_only))


def memory_budget(run: RunConfig, mesh, device_bytes: int | None = None, layout=None) -> tuple[int, str]:
    """(bytes the step's temporaries should stay within, where that figure comes from).
    `device_bytes`: an accelerator's memory where its devices cannot report it (compile-only)."""
    device = mesh.devices.flat[0]
    if device.platform == "cpu":
        for level in (3, 2):
            if size := peak_flops.cpu_cache_bytes(level):
                return size, f"the CPU's {size // 2**20} MiB L{level} cache"
        return FALLBACK_CPU_CACHE, "an assumed 8 MiB cache (the OS reports none)"
    limit = device_bytes or memory.device_memory_limit(device)
    if not limit:
        return 2**62, "no memory limit reported"
    state, _ = memory.state_bytes(run, mesh, layout)
    return int(limit * ACCELERATOR_HEADROOM) - state, f"{limit / 2**30:.0f} GiB of device memory less the state"


def choose_microbatches(choices: list[int], budget: int, temp_bytes) -> tuple[int, dict[int, int]]:
    """The fewest microbatches whose temporaries fit `budget`, and the temporaries measured
    ({microbatches: bytes}). `temp_bytes(m)` compiles; it is called for the first choice and,
    if that does not fit, for the last; the others are interpolated as fixed + activations / m,
    or bisected where the first gave no figure (inf: the compiler refused it). With nothing
    fitting, the most microbatches (the least memory)."""
    measured = {choices[0]: temp_bytes(choices[0])}
    if measured[choices[0]] <= budget or len(choices) == 1:
        return choices[0], measured
    first, last = choices[0], choices[-1]
    measured[last] = temp_bytes(last)
    if measured[last] > budget:
        return last, measured
    if math.isinf(measured[first]):
        too_few, enough = 0, len(choices) - 1  # fitting is monotone in the count: bisect
        while enough - too_few > 1:
            middle = (too_few + enough) // 2
            measured[choices[middle]] = temp_bytes(choices[middle])
            too_few, enough = (too_few, middle) if measured[choices[middle]] <= budget else (middle, enough)
        return choices[enough], measured
    # temp(m) = fixed + activations / m through the two measured points
    activations = (measured[first] - measured[last]) / (1 / first - 1 / last)
    fixed = measured[first] - activations / first
    for m in choices[1:-1]:
        if fixed + activations / m <= budget:
            return m, measured
    return last, measured


class Tuned(NamedTuple):
    run: RunConfig  # with train.microbatches filled in
    note: str | None  # what was chosen and why; None when the config chose
    compiled: object | None  # the chosen step, when choosing compiled it: no need to compile it again
    why: str | None = None  # the measurements and budget behind the choice, when the machine chose


def fill_microbatches(
    run: RunConfig, mesh, device_bytes: int | None = None, measure_only: bool = False, layout=None
) -> Tuned:
    """`run` with train.microbatches chosen when it is 0 (`device_bytes` as memory_budget's).
    `measure_only`: the caller compiles the step it runs itself (none is returned). `layout`:
    the state's, where the caller has it; the same for every microbatch count."""
    if run.train.microbatches:
        return Tuned(run, None, None)
    choices = microbatch_choices(run.train.batch_size, sharding.data_parallel_size(mesh))
    if len(choices) <= 1:  # one way to split (or none: check_batch_fits_mesh then says why)
        return Tuned(with_train(run, microbatches=choices[0] if choices else 1), None, None)
    layout = layout if layout is not None else state_layout(run, mesh)[0]
    budget, source = memory_budget(run, mesh, device_bytes, layout)
    compiled: dict[int, object] = {}

    def measure(m: int) -> float:
        try:
            compiled[m] = compile_step(with_train(run, microbatches=m), mesh, measure_only, layout)
        except memory.OutOfMemory:
            return math.inf
        return temp_bytes(compiled[m])

    chosen, measured = choose_microbatches(choices, budget, measure)
    sizes = {m: f"{b / 2**20:.0f} MiB" if b < math.inf else "out of memory" for m, b in sorted(measured.items())}
    seen = ", ".join(f"{m}: {size}" for m, size in sizes.items())
    why = f"step temporaries by microbatches {seen}; budget {source}; set train.microbatches to override"
    return Tuned(
        with_train(run, microbatches=chosen),
        f"train.microbatches=0 -> {chosen} ({why})",
        None if measure_only else compiled.get(chosen),
        why,
    )
