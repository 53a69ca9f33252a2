"""Compile a run for a TPU you do not have: XLA's real TPU compiler, on this CPU.

With libtpu installed, `jax.experimental.topologies` describes a TPU slice's chips as
compile-only devices. A step jitted with shardings over them lowers and compiles exactly as it
would on the slice (Mosaic kernels included), and the compiled program reports its memory and
FLOPs per device. Nothing runs, so a config can be sized before a TPU is rented.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from functools import partial

import jax
import jax.numpy as jnp

from jaxgpt import sharding
from jaxgpt.config import RunConfig, with_train
from jaxgpt.errors import UserError
from jaxgpt.hardware import memory
from jaxgpt.model import products

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """A TPU slice as Cloud TPU names it. Memory and peak are per JAX device (a chip, or a
    TensorCore on v2/v3, which show each core as a device), from Google's datasheets."""

    name: str
    topology: str  # libtpu's topology name
    chip_config: str  # "megacore": a chip's two TensorCores are one device (v4, v5p)
    host_bounds: tuple[int, int, int]  # chips per host along each dimension
    hbm_bytes: int
    peak_bf16_flops: float

    @property
    def accelerator_type(self) -> str:
        return self.name.removeprefix("tpu-").replace("v5e", "v5litepod")


TARGETS = {
    t.name: t
    for t in [
        TpuTarget("tpu-v2-8", "v2:2x2", "default", (2, 2, 1), 8 * GiB, 22.5e12),  # Colab's classic TPU
        TpuTarget("tpu-v3-8", "v3:2x2", "default", (2, 2, 1), 16 * GiB, 61.5e12),
        TpuTarget("tpu-v4-8", "v4:2x2x1", "megacore", (2, 2, 1), 32 * GiB, 275e12),
        TpuTarget("tpu-v5e-1", "v5e:1x1", "default", (1, 1, 1), 16 * GiB, 197e12),
        TpuTarget("tpu-v5e-8", "v5e:2x4", "default", (2, 2, 1), 16 * GiB, 197e12),
        TpuTarget("tpu-v5p-8", "v5p:2x2x1", "megacore", (2, 2, 1), 95 * GiB, 459e12),
        TpuTarget("tpu-v6e-1", "v6e:1x1", "default", (1, 1, 1), 32 * GiB, 918e12),
        TpuTarget("tpu-v6e-8", "v6e:2x4", "default", (2, 2, 1), 32 * GiB, 918e12),
    ]
}
INSTALL = "pip install -r requirements-tpu.txt (libtpu, the version jax[tpu] pins for this jax)"


def target(name: str) -> TpuTarget:
    if name not in TARGETS:
        raise UserError(f"--target={name!r} is not a TPU this check knows; choose one of {', '.join(TARGETS)}")
    return TARGETS[name]


def compile_only_devices(tpu: TpuTarget) -> list:
    """The slice's devices, for compiling only. libtpu reads its environment when it loads:
    naming the accelerator and a local worker spares the errors it prints without them."""
    if importlib.util.find_spec("libtpu") is None:
        raise UserError(f"compiling for {tpu.name} needs libtpu, which is not installed: {INSTALL}")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", tpu.accelerator_type)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    # libtpu locks /tmp/libtpu_lockfile so that one process owns the chips; compiling touches
    # none, and two checks (or a test and the check it starts) may run at once.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    description = topologies.get_topology_desc(
        platform="tpu",
        topology_name=tpu.topology,
        chip_config_name=tpu.chip_config,
        chips_per_host_bounds=tpu.host_bounds,
        num_slices=1,
        wrap=(False, False, False),
    )
    return list(description.devices)


@dataclasses.dataclass(frozen=True)
class StepOnTpu:
    """What one compiled train step needs of each device."""

    mesh: dict[str, int]
    microbatches: int  # as training on the slice would choose them (train.microbatches=0)
    params_bytes: int
    optimizer_bytes: int
    inputs_bytes: int  # the argument buffers XLA counts: state + batch (+ any layout padding)
    temporaries_bytes: int
    xla_flops: float  # per device, from XLA's cost analysis
    model_flops: float  # per device: flops_per_token x tokens per step / devices
    program_text: str = dataclasses.field(repr=False, compare=False, default="")  # the compiled HLO

    @property
    def total_bytes(self) -> int:
        return self.inputs_bytes + self.temporaries_bytes

    def fits(self, tpu: TpuTarget) -> bool:
        return self.total_bytes <= tpu.hbm_bytes

    def seconds_at(self, tpu: TpuTarget, mfu: float) -> float:
        """The step time the datasheet peak implies if the step reaches `mfu` of it."""
        return self.model_flops / (tpu.peak_bf16_flops * mfu)


OutOfMemory = memory.OutOfMemory  # the TPU compiler's own verdict that the step does not fit


def compile_train_step(run: RunConfig, devices, tpu: TpuTarget | None = None) -> StepOnTpu:
    """Compile the run's train step for `devices` (compile-only TPU devices, or real ones) with
    the run's own mesh, shardings and batch: the step training would choose there (microbatches
    = 0 filled against `tpu`'s memory, jaxgpt/hardware/step_choice.py), and read its memory and
    FLOPs. Raises OutOfMemory when the compiler finds it cannot fit."""
    from jaxgpt.hardware.mesh_step import state_layout
    from jaxgpt.hardware.step_choice import choose_step
    from jaxgpt.model.transformer import flops_per_token
    from jaxgpt.training.batch import batch_layout
    from jaxgpt.training.program import training_program

    mesh = sharding.make_mesh(run.mesh, devices)
    program = training_program(run)
    # traced as the devices' platform computes (jaxgpt/model/products.py), not as this CPU would
    with memory.refusals_as_out_of_memory(), products.traced_for(devices[0].platform):
        layout, _ = state_layout(program, mesh)
        program, step, _ = choose_step(program, mesh, layout, device_bytes=tpu.hbm_bytes if tpu else None)
        batch = batch_layout(program.run, mesh)
        step.compile(layout, batch)
    run = program.run
    analysis, cost = step.memory_analysis(), step.cost_analysis()
    state_bytes, params_bytes = memory.state_bytes(layout)
    tokens = run.train.batch_size * run.row_length
    return StepOnTpu(
        mesh=dict(mesh.shape),
        microbatches=run.train.microbatches,
        params_bytes=params_bytes,
        optimizer_bytes=state_bytes - params_bytes,
        inputs_bytes=analysis.argument_size_in_bytes,
        temporaries_bytes=analysis.temp_size_in_bytes,
        xla_flops=float(cost.get("flops", 0.0)),
        model_flops=flops_per_token(run.model, shapes=layout.params) * tokens / mesh.size,
        program_text=step.program_texts(layout, batch)[0],
    )


def compile_sampling(run: RunConfig, devices, prompt_len: int, max_new_tokens: int, batch: int = 1, mesh=None):
    """Compile generation (prefill + the decode loop) for `devices`, parameters split over the
    heads as sample.py splits them, or laid out over `mesh` (a MeshConfig) as its train step's
    are (train.rl's rollouts sample with the parameters training holds); returns the compiled
    program."""
    from jaxgpt.config import MeshConfig
    from jaxgpt.model.sampling import SamplingConfig, generate
    from jaxgpt.model.transformer import init_params

    mesh = sharding.make_mesh(mesh or MeshConfig(data=1, fsdp=1, tensor=-1), devices)
    model = run.model.replace(dtype="float32")
    shapes = jax.eval_shape(partial(init_params, model), jax.random.key(0))
    params = sharding.laid_out(shapes, mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    prompt = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32, sharding=replicated)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    lowered = generate.lower(
        model, params, prompt, rng, max_new_tokens=max_new_tokens, sampling=SamplingConfig(), eot_id=None
    )
    with memory.refusals_as_out_of_memory():
        return lowered.compile()


def compile_rollout(run: RunConfig, devices):
    """Compile train.rl's sampling for `devices` as a rollout runs it (jaxgpt/data/rollouts.py):
    `generate_rows` on every row a step draws, (train.rl.draws or prompts) x samples, each row's
    prompt as long as leaves room for train.rl.max_tokens, its KV cache a row's length (the
    model `for_decoding` train.rl.length's positions), the parameters laid out on the run's mesh
    as its train step holds them, the rows split over the mesh's batch axes as a rollout splits
    them (sharding.rows_sharding: each device decodes its share). The other half of a step of
    learning from rewards (compile_train_step compiles the update); returns the compiled program."""
    from jaxgpt.model.sampling import SamplingConfig, for_decoding, generate_rows
    from jaxgpt.model.transformer import init_params

    rl = run.train.rl
    rows, prompt_len = (rl.draws or rl.prompts) * rl.samples, run.row_length - rl.max_tokens
    mesh = sharding.make_mesh(run.mesh, devices)
    model = for_decoding(run.model.replace(dtype="float32"), run.row_length)
    params = sharding.laid_out(jax.eval_shape(partial(init_params, model), jax.random.key(0)), mesh)
    split = sharding.rows_sharding(mesh, rows)
    prompts = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32, sharding=split)
    lengths = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=split)
    keys = jax.ShapeDtypeStruct((rows,), jax.random.key(0).dtype, sharding=split)
    sampling = SamplingConfig(temperature=rl.temperature, top_p=rl.top_p)
    lowered = generate_rows.lower(model, params, prompts, lengths, keys, max_new_tokens=rl.max_tokens,
                                  sampling=sampling)  # fmt: skip
    with memory.refusals_as_out_of_memory():
        return lowered.compile()


def rollout_bytes(step: StepOnTpu, compiled) -> int:
    """What train.rl's sampling (compile_rollout's program) needs of a device while the
    training state stays in memory beside it: the state, the prompts, the temporaries (the KV
    cache among them) and the answers."""
    analysis = compiled.memory_analysis()
    prompts = analysis.argument_size_in_bytes - step.params_bytes  # its other arguments: the parameters
    return (
        step.params_bytes
        + step.optimizer_bytes
        + max(prompts, 0)
        + analysis.temp_size_in_bytes
        + (analysis.output_size_in_bytes)
    )


def rollout_line(run: RunConfig, tpu: TpuTarget, compiled, needed: int) -> str:
    rl, analysis = run.train.rl, compiled.memory_analysis()
    return (
        f"train.rl's sampling ({rl.draws or rl.prompts} prompts x {rl.samples} answers of up to {rl.max_tokens} "
        f"tokens after {run.row_length - rl.max_tokens}-token prompts): temporaries "
        f"{analysis.temp_size_in_bytes / 2**20:,.1f} MiB a device (the KV cache among them), with the training "
        f"state beside them {needed / GiB:.2f} GiB of "
        f"{tpu.hbm_bytes / GiB:.0f} GiB ({needed / tpu.hbm_bytes:.0%})"
    )


def alternatives(run: RunConfig, n_devices: int) -> list[tuple[str, RunConfig]]:
    """Changes that lower memory, the least disruptive first: sharding parameters and optimizer
    state over every device (the same training), recomputing activations (slower, same
    numbers), smaller microbatches (same update), then a smaller batch (a different run)."""
    model, train = run.model, run.train
    with_model = lambda **c: dataclasses.replace(run, model=model.replace(**c))  # noqa: E731
    out = []
    if run.mesh.fsdp != -1 and n_devices > 1:
        fsdp = dataclasses.replace(run, mesh=dataclasses.replace(run.mesh, data=1, fsdp=-1))
        out.append(("--config.mesh.data=1 --config.mesh.fsdp=-1", fsdp))
    less_kept = {"none": ["dots", "full"], "dots_no_batch": ["dots", "full"], "dots": ["full"], "full": []}
    out += [(f"--config.model.remat={policy}", with_model(remat=policy)) for policy in less_kept[model.remat]]
    micro = max(train.microbatches, 1)
    for more in (2 * micro, 4 * micro, 8 * micro):
        if train.batch_size % more == 0 and (train.batch_size // more) % n_devices == 0:
            out.append((f"--config.train.microbatches={more}", with_train(run, microbatches=more)))
    for smaller in (train.batch_size // 2, train.batch_size // 4):
        if smaller >= n_devices and smaller % (n_devices * micro) == 0:
            out.append((f"--config.train.batch_size={smaller}", with_train(run, batch_size=smaller)))
    return out


def smallest_change_that_fits(run: RunConfig, devices, tpu: TpuTarget) -> str | None:
    """The first of `alternatives` whose compiled step fits the chip, or None."""
    for flag, changed in alternatives(run, len(devices)):
        try:
            if compile_train_step(changed, devices, tpu).fits(tpu):
                return flag
        except OutOfMemory:
            continue
    return None


def flops(count: float) -> str:
    """A FLOP count in the unit that gives it four significant figures: 7.007 T, 1.21 G, 540.1 M
    (tiny's step read 0.001 T in trillions)."""
    unit, scale = next(((u, s) for u, s in (("T", 1e12), ("G", 1e9), ("M", 1e6)) if count >= s), ("", 1))
    return f"{count / scale:.4g} {unit}".rstrip()


def report_lines(run: RunConfig, tpu: TpuTarget, step: StepOnTpu, mfu: float) -> list[str]:
    mib = lambda n: f"{n / 2**20:,.1f} MiB"  # noqa: E731
    others = step.inputs_bytes - step.params_bytes - step.optimizer_bytes
    ratio = step.xla_flops / step.model_flops if step.model_flops else float("nan")
    return [
        f"{tpu.name}: mesh {step.mesh}, {step.microbatches} microbatch{'es' * (step.microbatches > 1)}, "
        f"{tpu.hbm_bytes / GiB:.0f} GiB HBM and {tpu.peak_bf16_flops / 1e12:.1f} TFLOP/s bf16 peak per device "
        "(datasheet)",
        f"per device: parameters {mib(step.params_bytes)} + optimizer {mib(step.optimizer_bytes)} + batch and the "
        f"rest {mib(others)} + step temporaries {mib(step.temporaries_bytes)} = {step.total_bytes / GiB:.2f} GiB "
        f"of {tpu.hbm_bytes / GiB:.0f} GiB ({step.total_bytes / tpu.hbm_bytes:.0%})",
        f"FLOPs per step per device: {flops(step.model_flops)} by 6N + 12LdT; {flops(step.xla_flops)} by "
        f"XLA's cost analysis (x{ratio:.2f}; "
        + (
            "it counts a scanned loop's body once, not once per layer)"
            if run.model.scan_layers
            else "it also counts rematerialised and elementwise work)"
        ),
        f"step time at {mfu:.0%} MFU: {step.seconds_at(tpu, mfu) * 1e3:,.3g} ms "
        f"({run.train.batch_size * run.row_length / step.seconds_at(tpu, mfu):,.0f} tokens/s)",
    ]


def check(config, target_name: str, mfu: float, vocab_size: int | None = None, say=print) -> str | None:
    """`python -m jaxgpt check --target`: compile the config's train step for a TPU slice and
    report what it needs of each device. None when it fits; otherwise the one line to fail
    with, naming the smallest change that fits (found by compiling the alternatives).
    `vocab_size` is the data's, where the config leaves it to the data
    (jaxgpt.data.vocab_size_for)."""
    from jaxgpt.config_files import resolve

    tpu = target(target_name)
    run = resolve(config, vocab_size=vocab_size)
    devices = compile_only_devices(tpu)
    say(f"compiling the train step for {tpu.name} ({len(devices)} compile-only device{'s' * (len(devices) > 1)})...")
    try:
        step = compile_train_step(run, devices, tpu)
    except OutOfMemory as error:
        verdict = f"does not fit {tpu.name}: the TPU compiler says {error}"
    else:
        for line in report_lines(run, tpu, step, mfu):
            say(line)
        needed = step.total_bytes
        if run.train.rl:  # a step of learning from rewards is two programs: the sampling too
            say(f"compiling train.rl's sampling for {tpu.name}...")
            try:
                sampling = compile_rollout(run, devices)
            except OutOfMemory as error:  # what would shrink it is the rollout's size, not the step's
                return (
                    f"does not fit {tpu.name}: train.rl's sampling: the TPU compiler says {error}; answer fewer rows "
                    "at once (train.rl.draws or prompts, samples), or shorter ones (train.rl.length)"
                )
            say(rollout_line(run, tpu, sampling, rollout_bytes(step, sampling)))
            needed = max(needed, rollout_bytes(step, sampling))
        if needed <= tpu.hbm_bytes:
            say(f"fits {tpu.name}")
            return None
        verdict = f"does not fit {tpu.name}: {needed / GiB:.2f} GiB per device"
    say(f"{verdict}; compiling alternatives to find the smallest change that fits...")
    fix = smallest_change_that_fits(run, devices, tpu)
    advice = f"the smallest change that fits: {fix}" if fix else "nothing tried fits: use a larger slice"
    return f"{verdict}; {advice}"
