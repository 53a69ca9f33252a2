"""Which compiled training step a run uses on the devices it has, and with how many
microbatches: chosen in one place. The trainer, `jaxgpt check`'s pre-flight checks, the
benchmarks and the TPU compile (`check --target`, jaxgpt/hardware/tpu.py) all call
`choose_step`, so what they compile, measure and time is the program training runs. Both steps
apply `train_step.gradients` then `train_step.apply_gradients`, and have one interface (`Step`):

  - MeshStep (jaxgpt/hardware/mesh_step.py): `train_step` jitted over the run's device mesh,
    one SPMD program; on accelerators, several processes, or CPU devices asked for as a mesh.
  - CoreParallelStep (jaxgpt/hardware/core_parallel.py): one single-device program per CPU core on its
    share of the batch, joined on the first core; the CPU default when the batch splits (`plan`).

Microbatches: `train.microbatches = 0` (the default) asks for the fewest microbatches whose
compiled train step keeps its temporary buffers within a budget:
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
accumulator) plus activations that shrink as 1/microbatches. The count this predicts to fit is
compiled to confirm it (the run keeps that program), and the next taken where it does not fit.
An accelerator's compiler may refuse the first outright (out of memory), which leaves nothing to
interpolate from: then the counts in between are bisected, one compile each.

What is measured is what runs: over a mesh, the step itself; on the CPU's cores (`plan`), the
first core's program of the step (jaxgpt/hardware/core_parallel.py), which holds all of a core's
temporaries (the update after it runs alone, on memory the cores' programs are done with).
Either way the chosen count's program is kept, and compiling the step compiles only the rest: a
fresh start compiles nothing twice. The per-core choice is also remembered beside the compiled
programs (`choice_file`): a second run of the same config on the same machine, code and JAX
skips the measuring where it measured more than the count it chose.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import NamedTuple, Protocol

import jax
import jaxlib.version

from jaxgpt import sharding
from jaxgpt.config import RunConfig
from jaxgpt.errors import UserError
from jaxgpt.hardware import machine, memory, peak_flops, runtime
from jaxgpt.hardware.core_parallel import CoreParallelStep
from jaxgpt.hardware.mesh_step import MeshStep, jit_train_step
from jaxgpt.training.batch import batch_layout
from jaxgpt.training.program import TrainingProgram
from jaxgpt.training.train_step import TrainState


class Step(Protocol):
    """What every caller (the trainer, check, the benchmarks, the TPU compile) uses of a step,
    whichever runs. The analyses are per device: one core's program, or the SPMD program's
    share on each device of the mesh."""

    batch_mesh: jax.sharding.Mesh  # what training and evaluation batches are sharded over
    devices: list  # the devices it computes on
    what: str  # what runs, in words: for the line that says it compiled

    def __call__(self, state: TrainState, windows: jax.Array) -> tuple[TrainState, dict]: ...
    def trace(self, state: TrainState, windows: jax.Array) -> Step: ...
    def compile(self, state: TrainState, windows: jax.Array) -> Step: ...
    def eval_losses(self, params, make_batch, count: int) -> list[dict[str, jax.Array]]: ...
    def memory_analysis(self): ...
    def cost_analysis(self) -> dict: ...
    def program_texts(self, state: TrainState, windows: jax.Array) -> list[str]: ...


class ChosenStep(NamedTuple):
    program: TrainingProgram  # its train.microbatches filled in
    step: Step
    note: str | None  # what was chosen and why, for the start-up lines


def choose_step(program: TrainingProgram, mesh, layout, device_bytes: int | None = None) -> ChosenStep:
    """The step for `program` on `mesh`, its state laid out as `layout` (mesh_step.state_layout):
    one program per CPU core when the mesh is the CPU default and the batch splits over several
    cores, else the mesh's own jitted step. `device_bytes` is each accelerator's memory where
    the devices cannot say (compile-only TPU devices)."""
    cores = cores_for(mesh)
    if len(cores) > 1:
        chosen = plan(program, cores, mesh, layout)
        if len(chosen.devices) > 1:
            step = chosen.step or CoreParallelStep(chosen.program, chosen.devices, layout)
            return ChosenStep(chosen.program, step, chosen.note)
    tuned = fill_microbatches(program, mesh, layout, device_bytes)
    check_batch_fits_mesh(tuned.program.run, mesh)
    return ChosenStep(tuned.program, MeshStep(tuned.program, mesh, layout, tuned.compiled), tuned.note)


# The CPU's cores


def cores_for(mesh) -> list:
    """The CPU devices, one per core, a run on `mesh` can split its batch over: those
    `runtime.configure` made, when the mesh is the first of them alone (the CPU default) and
    this is the only process; else the mesh's first device alone (no split)."""
    cores = runtime.core_devices()
    if mesh.size == 1 and mesh.devices.flat[0] == cores[0] and jax.process_count() == 1:
        return cores
    return [mesh.devices.flat[0]]


def cores_sharing_the_batch(run: RunConfig, cores: int) -> int:
    """How many of `cores` can take an equal share of the batch: the largest count, at most
    `cores`, dividing batch_size (and batch_size / microbatches when those are set)."""
    rows = run.train.batch_size // (run.train.microbatches or 1)
    return max(n for n in range(1, cores + 1) if rows % n == 0)


@dataclasses.dataclass(frozen=True)
class CorePlan:
    program: TrainingProgram  # train.microbatches filled in: per core, passes over its rows
    devices: list  # the cores' CPU devices; one means the plain one-device step
    note: str | None  # what was chosen, for the start-up lines
    step: CoreParallelStep | None = None  # the step, when choosing compiled its first core's program


def plan(program: TrainingProgram, devices: list, mesh, layout) -> CorePlan:
    """How a one-device CPU run on `mesh` (the first of `devices`, its state laid out as
    `layout`) uses `devices`, one per core: as many cores as share the batch evenly, each with
    the fewest microbatches whose program fits the CPU's cache (fill_microbatches: each count
    measured by compiling the first core's program of the step, which the step then keeps)."""
    run = program.run
    n = cores_sharing_the_batch(run, len(devices))
    if n == 1:
        return CorePlan(program, devices[:1], None)

    per_core = program.with_train(batch_size=run.train.batch_size // n)

    def first_core_compiled(m: int) -> CoreParallelStep:
        candidate = program.with_train(microbatches=m)
        step = CoreParallelStep(candidate, devices[:n], layout)
        return step.compile_first_share(layout, batch_layout(candidate.run, step.batch_mesh))

    started = time.perf_counter()
    tuned = fill_microbatches(per_core, mesh, layout, candidate=first_core_compiled)
    microbatches = tuned.program.run.train.microbatches
    note = (
        f"{n} CPU cores, each running the step on {run.train.batch_size // n} of the {run.train.batch_size} rows "
        f"({microbatches} microbatch{'es' if microbatches > 1 else ''}); no collectives "
        f"(JAXGPT_CPU_CORES=1 for one device)"
    )
    if tuned.why:
        note += f"; microbatches per core {microbatches} ({tuned.why}) [{time.perf_counter() - started:.1f} s]"
    return CorePlan(program.with_train(microbatches=microbatches), devices[:n], note, tuned.compiled)


# Microbatches

FALLBACK_CPU_CACHE = 8 * 2**20  # when the OS reports no cache sizes (some VMs)
ACCELERATOR_HEADROOM = 0.9  # leave XLA's allocator a tenth of the device's memory


def microbatch_choices(batch_size: int, data_parallel: int) -> list[int]:
    """Microbatch counts that give every data-parallel device the same whole number of rows."""
    return [m for m in range(1, batch_size + 1) if batch_size % m == 0 and (batch_size // m) % data_parallel == 0]


def compile_step(program: TrainingProgram, mesh, layout):
    """The program's train step, compiled ahead of time for its state (`layout`) and batch;
    raises memory.OutOfMemory where the compiler refuses it."""
    with memory.refusals_as_out_of_memory():
        return jit_train_step(program, mesh, layout).lower(layout, batch_layout(program.run, mesh)).compile()


def temp_bytes(compiled) -> int:
    """Temporary bytes per device of a compiled step, from XLA's memory analysis."""
    analysis = compiled.memory_analysis()
    return int(analysis.temp_size_in_bytes) if analysis is not None else 0


def step_temp_bytes(program: TrainingProgram, mesh, layout, microbatches: int) -> int:
    return temp_bytes(compile_step(program.with_train(microbatches=microbatches), mesh, layout))


def memory_budget(mesh, layout, device_bytes: int | None = None) -> tuple[int, str]:
    """(bytes the step's temporaries should stay within, where that figure comes from).
    `device_bytes`: an accelerator's memory where its devices cannot report it (compile-only)."""
    device = mesh.devices.flat[0]
    if device.platform == "cpu":
        for level in (3, 2):
            if size := peak_flops.cpu_cache_bytes(level):
                # as the OS reports it: a virtual machine may report its host's whole cache (480 MiB
                # on a 2-vCPU Xeon), so the line says where the figure comes from, not that it is so
                return size, f"the {size // 2**20} MiB L{level} cache the OS reports"
        return FALLBACK_CPU_CACHE, "an assumed 8 MiB cache (the OS reports none)"
    limit = device_bytes or memory.device_memory_limit(device)
    if not limit:
        return 2**62, "no memory limit reported"
    state, _ = memory.state_bytes(layout)
    return int(limit * ACCELERATOR_HEADROOM) - state, f"{limit / 2**30:.0f} GiB of device memory less the state"


def choose_microbatches(choices: list[int], budget: int, temp_bytes) -> tuple[int, dict[int, int]]:
    """The fewest microbatches whose temporaries fit `budget`, and the temporaries measured
    ({microbatches: bytes}). `temp_bytes(m)` compiles; it is called for the first choice and,
    if that does not fit, for the last; the others are interpolated as fixed + activations / m
    (and the count chosen so is measured too), or bisected where the first gave no figure (inf:
    the compiler refused it). With nothing fitting, the most microbatches (the least memory)."""
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
    # temp(m) = fixed + activations / m through the two measured points; a count predicted to fit
    # is compiled (the run keeps it) and taken only if it does: the model is close, not exact
    # (moe_tiny's 2 microbatches a core predicted 30.2 MiB against a 32 MiB cache, measured 32.8)
    activations = (measured[first] - measured[last]) / (1 / first - 1 / last)
    fixed = measured[first] - activations / first
    for m in choices[1:-1]:
        if fixed + activations / m <= budget:
            measured[m] = temp_bytes(m)
            if measured[m] <= budget:
                return m, measured
    return last, measured


class Tuned(NamedTuple):
    program: TrainingProgram  # with train.microbatches filled in
    note: str | None  # what was chosen and why; None when the config chose
    compiled: object | None  # the chosen candidate as choosing compiled it: no need to compile it again
    why: str | None = None  # the measurements and budget behind the choice, when the machine chose


def fill_microbatches(program: TrainingProgram, mesh, layout, device_bytes: int | None = None, candidate=None) -> Tuned:
    """`program` with train.microbatches chosen when it is 0 (`device_bytes` as memory_budget's).
    `layout`: the state's on `mesh`, the same for every microbatch count. Each count is measured
    by compiling the step over `mesh` (`compile_step`), or by `candidate(m)` where the caller runs
    another step (the per-core plan): anything compiled with a `memory_analysis`. The chosen
    count's is returned to be run; a caller's choice (a `candidate`) is also remembered."""
    if program.run.train.microbatches:
        return Tuned(program, None, None)
    choices = microbatch_choices(program.run.train.batch_size, sharding.data_parallel_size(mesh))
    if len(choices) <= 1:  # one way to split (or none: check_batch_fits_mesh then says why)
        return Tuned(program.with_train(microbatches=choices[0] if choices else 1), None, None)
    budget, source = memory_budget(mesh, layout, device_bytes)
    memo = choice_file(repr(program.run), mesh, budget) if candidate else None
    if memo is not None and (known := recall(memo, choices)):
        chosen, why = known
        why += "; remembered from an earlier run's measuring"
        return Tuned(program.with_train(microbatches=chosen), f"train.microbatches=0 -> {chosen} ({why})", None, why)
    compiled: dict[int, object] = {}

    def measure(m: int) -> float:
        try:
            compiled[m] = candidate(m) if candidate else compile_step(program.with_train(microbatches=m), mesh, layout)
        except memory.OutOfMemory:
            return math.inf
        return temp_bytes(compiled[m])

    chosen, measured = choose_microbatches(choices, budget, measure)
    sizes = {m: f"{b / 2**20:.0f} MiB" if b < math.inf else "out of memory" for m, b in sorted(measured.items())}
    seen = ", ".join(f"{m}: {size}" for m, size in sizes.items())
    why = f"step temporaries by microbatches {seen}; budget {source}; set train.microbatches to override"
    if memo is not None:  # for the next run (whole or not at all)
        machine.keep(memo, json.dumps({"microbatches": chosen, "why": why}))
    return Tuned(
        program.with_train(microbatches=chosen),
        f"train.microbatches=0 -> {chosen} ({why})",
        compiled.get(chosen),
        why,
    )


@functools.cache
def source_fingerprint() -> str:
    """A digest of jaxgpt's own code: what a step's program is built from."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parents[1].rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def choice_file(run_text: str, mesh, budget: int) -> Path | None:
    """Where a measured choice of microbatches is kept (`choices_dir`; None when the compilation
    cache is off), named by a digest of all it depends on: the whole run config (`run_text`, its repr),
    the devices and budget, JAX, XLA's flags and jaxgpt's code. A config that differs in any field
    (its steps too) is measured anew; remembering too little costs a measuring, never a wrong count."""
    where = choices_dir()
    if where is None:
        return None
    device = mesh.devices.flat[0]
    material = [
        run_text, dict(mesh.shape), device.platform, device.device_kind, budget,
        jax.__version__, jaxlib.version.__version__, os.environ.get("XLA_FLAGS", ""), source_fingerprint(),
    ]  # fmt: skip
    name = hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]
    return where / f"{name}.json"


def choices_dir() -> Path | None:
    """Where measured choices are kept: in the compilation cache's directory; None when it is off
    or not a local directory (JAX also takes a bucket's URL)."""
    cache = jax.config.jax_compilation_cache_dir
    return Path(cache) / "jaxgpt-microbatches" if cache and "://" not in cache else None


def recall(memo: Path, choices: list[int]) -> tuple[int, str] | None:
    """(microbatches, why) as an earlier run measured them, if it did and the file reads as one
    of `choices`; None otherwise (never there, unreadable, another version's)."""
    try:
        known = json.loads(memo.read_text())
        chosen, why = known["microbatches"], known["why"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (chosen, why) if chosen in choices and isinstance(why, str) else None


def check_batch_fits_mesh(run: RunConfig, mesh) -> None:
    """One line where the batch, over its microbatches, does not split over the mesh's data-parallel
    devices (or its processes), naming the batch sizes and mesh that would."""
    parallel = sharding.data_parallel_size(mesh)
    per_microbatch = run.train.batch_size // run.train.microbatches
    if per_microbatch % parallel or run.train.batch_size % jax.process_count():
        unit = parallel * run.train.microbatches  # the batch sizes that split are its multiples
        sizes = sorted({max(run.train.batch_size // unit, 1) * unit, -(-run.train.batch_size // unit) * unit})
        fewer = max(d for d in range(1, parallel + 1) if parallel % d == 0 and per_microbatch % d == 0)
        mesh_fix = f" or --config.mesh.data={fewer}" if mesh.shape.get("fsdp", 1) == 1 and fewer > 1 else ""
        raise UserError(
            f"train.batch_size={run.train.batch_size} (over {run.train.microbatches} microbatches) does not split "
            f"over the {parallel} data-parallel devices of mesh {dict(mesh.shape)}; make batch_size / microbatches "
            f"a multiple of {parallel} (--config.train.batch_size={' or '.join(map(str, sizes))}){mesh_fix}"
        )
