"""Data parallelism over CPU cores without collectives: the same update as one device, and no
program with anything to wait in."""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt import sharding
from jaxgpt.config import DataConfig, MeshConfig, ModelConfig, RunConfig, TrainConfig
from jaxgpt.errors import UserError
from jaxgpt.hardware import core_parallel, runtime, step_choice
from jaxgpt.hardware.core_parallel import CoreParallelStep
from jaxgpt.hardware.mesh_step import MeshStep, state_layout
from jaxgpt.model.transformer import GPT
from jaxgpt.training.batch import batch_layout, windows_batch
from jaxgpt.training.optimizer import make_optimizer
from jaxgpt.training.program import training_program
from jaxgpt.training.train_step import create_train_state, eval_step, train_step

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
MODEL = ModelConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=32)


def make_run(microbatches=1, batch_size=8, model=MODEL, one_program=False) -> RunConfig:
    train = TrainConfig(
        steps=10, warmup_steps=2, batch_size=batch_size, microbatches=microbatches, lr=3e-3,
        one_program_for_cores=one_program,
    )  # fmt: skip
    return RunConfig(model=model, data=DataConfig(), train=train)


def batches(count, batch_size=8):
    rng = np.random.default_rng(0)
    return [rng.integers(0, 32, (batch_size, 17)).astype(np.int32) for _ in range(count)]


def one_device_run(run: RunConfig, windows: list):
    optimizer = make_optimizer(run.train)
    state = jax.jit(partial(create_train_state, run.model, optimizer, 0))()
    step = jax.jit(partial(train_step, model=GPT(run.model), optimizer=optimizer, microbatches=run.train.microbatches))
    losses = []
    for w in windows:
        state, metrics = step(state, jnp.asarray(w))
        losses.append((float(metrics["loss"]), float(metrics["grad_norm"])))
    return state, losses


def core_parallel_run(run: RunConfig, windows: list, cores: int, steps_metrics: list | None = None):
    """(final state, each step's (loss, grad norm), the step); each step's metrics appended to
    `steps_metrics` when given."""
    devices = jax.devices()[:cores]
    state = jax.device_put(jax.jit(partial(create_train_state, run.model, make_optimizer(run.train), 0))(), devices[0])
    step = CoreParallelStep(training_program(run), devices, state)
    losses = []
    for w in windows:
        batch = jax.device_put(windows_batch(w), sharding.batch_sharding(step.batch_mesh))
        state, metrics = step(state, batch)
        losses.append((float(metrics["loss"]), float(metrics["grad_norm"])))
        if steps_metrics is not None:
            steps_metrics.append(metrics)
    return state, losses, step


@pytest.mark.parametrize(
    "cores, microbatches, one_program",
    # the quick set keeps every value of every axis once: (2, 2, False) and (4, 1, True)
    [
        pytest.param(2, 1, False, marks=pytest.mark.slow),
        pytest.param(4, 1, False, marks=pytest.mark.slow),
        (2, 2, False),
        pytest.param(2, 2, True, marks=pytest.mark.slow),
        (4, 1, True),
    ],
)
def test_core_parallel_steps_equal_the_one_device_step(cores, microbatches, one_program, monkeypatch):
    """The mean of per-core mean gradients over equal shares is the batch mean: losses and
    gradient norms differ by float32 summation order only (~1e-7 relative). Adam divides each
    gradient by its own running scale, so where a gradient is near zero that noise can be
    amplified toward the step size: after five steps of lr <= 3e-3 the largest parameter
    difference measured was 2.5e-6; the bound is 1e-5, a three-hundredth of one step. A wrong
    weighting of the shares (a sum instead of a mean, a share left out) moves the loss by
    percent and the parameters by ~lr. Both ways of computing the cores' shares (a program per
    core, one program over them) are held to it. The cores exchange the parameters and gradients
    packed: this model's matrices are all below the size that travels alone, so the threshold is
    lowered to have both kinds of leaf cross (core_parallel.Packing)."""
    monkeypatch.setattr(core_parallel, "TRAVELS_ALONE", 2**10)  # 32 x 96 and wider alone, the rest raveled
    run = make_run(microbatches, one_program=one_program)
    windows = batches(5)
    want, want_losses = one_device_run(make_run(1), windows)
    got, got_losses, _ = core_parallel_run(run, windows, cores)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    params, want_params = jax.device_get((got.params, want.params))
    jax.tree.map(partial(np.testing.assert_allclose, atol=1e-5), params, want_params)
    assert int(got.step) == 5
    devices = {next(iter(leaf.devices())) for leaf in jax.tree.leaves(got)}
    assert devices == {jax.devices()[0]}  # the state stays on the first core, as in a one-device run


def test_every_core_runs_one_tracing_of_the_gradient_program(monkeypatch):
    """The cores' programs differ only in their device, so the gradient function is traced once
    for all of them, with the state laid out as train.py lays it out (on the first core's
    one-device mesh): each tracing costs as much as compiling from the cache (docs/benchmarks.md,
    "Start-up"), and a second one came from the first core's inputs keeping that mesh's sharding.
    The function's Python body runs once per tracing. What crosses between the cores is few
    arrays each way (core_parallel's docstring says why): a core's program reads the parameters'
    matrices as they are and the rest raveled into one array, and its gradient leaves it the same way."""
    traced, original = [], core_parallel.core_gradients

    def counted(*args, **kwargs):
        traced.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(core_parallel, "core_gradients", counted)  # before the step jits it
    run = make_run(model=MODEL.replace(d_model=64))  # 64 wide: the MLP's and qkv's matrices travel alone
    program = training_program(run)
    devices = jax.devices()[:2]
    layout, create = state_layout(program, core_parallel.data_mesh(devices[:1]))
    step = CoreParallelStep(program, devices, layout)
    step.trace(create(), jax.device_put(windows_batch(batches(1)[0]), sharding.batch_sharding(step.batch_mesh)))
    assert len(step._lowered[0]) == 2 and len(traced) == 1
    leaves = jax.tree.leaves(layout.params)
    matrices = [x.shape for x in leaves if x.size >= core_parallel.TRAVELS_ALONE]
    rest = sum(x.size for x in leaves if x.size < core_parallel.TRAVELS_ALONE)
    assert 0 < len(matrices) < len(leaves) and rest > 0  # both ways are taken by this model
    for share in step._lowered[0]:
        (alone, raveled), *_ = share.args_info[0]  # (packed params, key data, step, rows, core, weight)
        assert [a.shape for a in alone] == matrices and raveled.shape == (rest,)
        alone, raveled = share.out_info[1]  # (measured, packed gradient), each with the core axis
        assert [a.shape for a in alone] == [(1, *m) for m in matrices] and raveled.shape == (1, rest)


def test_packing_between_the_cores_gives_back_the_tree():
    """A Packing of a layout unpacks what it packs, for any tree of that layout, frozen leaves
    (None) and all: every leaf comes back bit for bit, in its place."""
    tree = {
        "big": jnp.arange(core_parallel.TRAVELS_ALONE, dtype=jnp.float32).reshape(64, -1),
        "small": {"bias": jnp.linspace(-1, 1, 7), "scale": jnp.ones((3, 2))},
        "frozen": None,
        "bigger": -jnp.arange(2 * core_parallel.TRAVELS_ALONE, dtype=jnp.float32),
    }
    packing = core_parallel.Packing(jax.eval_shape(lambda: tree))
    alone, raveled = packing.pack(tree)
    assert len(alone) == 2 and raveled.shape == (7 + 6,)
    back = packing.unpack((alone, raveled))
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    jax.tree.map(np.testing.assert_array_equal, back, tree)


def test_one_program_over_the_cores_is_compiled_once_and_gives_the_per_core_steps():
    """train.one_program_for_cores: one gradient program for all the cores, its shares each
    core's own (no all-reduce inside: the gradient of parameters every core holds alike is not
    summed over the cores), the update after it. Its steps equal the per-core programs' up to
    float32 rounding (the same arithmetic, compiled as another program: XLA may fuse it
    otherwise), and, as they do, its runs repeat bit for bit with dropout, each core drawing
    its own masks."""
    run = make_run(2, model=MODEL.replace(dropout=0.2), one_program=True)
    windows = batches(3)
    first, first_losses, step = core_parallel_run(run, windows, 2)
    second, second_losses, _ = core_parallel_run(run, windows, 2)
    assert first_losses == second_losses
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(first.params), jax.device_get(second.params))
    per_core, per_core_losses, _ = core_parallel_run(make_run(2, model=MODEL.replace(dropout=0.2)), windows, 2)
    np.testing.assert_allclose(first_losses, per_core_losses, rtol=1e-5)
    jax.tree.map(partial(np.testing.assert_allclose, atol=1e-5), *jax.device_get((first.params, per_core.params)))
    batch = jax.device_put(windows_batch(windows[0]), sharding.batch_sharding(step.batch_mesh))
    texts = step.program_texts(first, batch)
    assert len(texts) == 2 and "one gradient program" in step.what  # the cores' program and the update
    for text in texts:
        assert not [op for op in COLLECTIVES if op in text]


def test_a_share_left_out_would_be_caught():
    """The comparison above can fail: one core's rows alone give a different update."""
    windows = batches(3)
    want, want_losses = one_device_run(make_run(1), windows)
    half, half_losses = one_device_run(make_run(1, batch_size=4), [w[:4] for w in windows])
    assert not np.allclose(half_losses, want_losses, rtol=1e-5)


def test_the_host_waits_for_the_cores_every_wait_every_steps(monkeypatch):
    """Left to run ahead the host spins in the runtime's copies (core_parallel.WAIT_EVERY): it
    sleeps until the step is done once every WAIT_EVERY steps instead (here 3, so after steps 3
    and 6 of 7), on that step's own results, which are those of the same steps run without waiting."""
    run, windows = make_run(), batches(7)
    _, unpaced, _ = core_parallel_run(run, windows, 2)
    waited, original = [], jax.block_until_ready
    monkeypatch.setattr(core_parallel, "WAIT_EVERY", 3)
    monkeypatch.setattr(jax, "block_until_ready", lambda tree: original(waited.append(tree) or tree))
    steps_metrics = []
    _, paced, _ = core_parallel_run(run, windows, 2, steps_metrics)
    assert len(waited) == 2 and waited[0] is steps_metrics[2] and waited[1] is steps_metrics[5]
    assert paced == unpaced


@pytest.mark.slow  # quick: test_trainer's repeat of a run on the per-core default, bit for bit
def test_core_parallel_runs_repeat_bit_for_bit_with_dropout():
    run = make_run(model=MODEL.replace(dropout=0.2))
    windows = batches(3)
    first, first_losses, _ = core_parallel_run(run, windows, 2)
    second, second_losses, _ = core_parallel_run(run, windows, 2)
    assert first_losses == second_losses
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(first.params), jax.device_get(second.params))
    _, one_device_losses = one_device_run(run, windows)
    assert first_losses != one_device_losses  # each core draws its own dropout masks


def test_no_program_holds_a_collective():
    run = make_run(2)
    devices = jax.devices()[:2]
    state = jax.device_put(jax.jit(partial(create_train_state, run.model, make_optimizer(run.train), 0))(), devices[0])
    step = CoreParallelStep(training_program(run), devices, state)
    batch = jax.device_put(windows_batch(batches(1)[0]), sharding.batch_sharding(step.batch_mesh))
    texts = step.program_texts(state, batch)
    assert len(texts) == 3  # two cores' gradient programs and the update
    for text in texts:
        assert not [op for op in COLLECTIVES if op in text]
    # The baseline it replaces: one SPMD program over the same two devices has an all-reduce.
    mesh = sharding.make_mesh(MeshConfig(data=2), devices)
    spmd = jax.jit(partial(train_step, model=GPT(run.model), optimizer=make_optimizer(run.train), microbatches=2))
    replicated = jax.device_put(state, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    text = (
        spmd.lower(replicated, jax.device_put(windows_batch(batches(1)[0]), sharding.batch_sharding(mesh)))
        .compile()
        .as_text()
    )
    assert "all-reduce" in text


@pytest.mark.parametrize("one_program", [False, True])
def test_evaluation_on_cores_gives_the_one_device_losses(one_program):
    """Five batches over two cores: the last round of one program over them repeats its batch
    on the second core and drops that loss."""
    run = make_run(one_program=one_program)
    _, _, step = core_parallel_run(run, batches(1), 2)
    params = jax.jit(partial(create_train_state, run.model, make_optimizer(run.train), 1))().params
    windows = batches(5)
    losses = step.eval_losses(
        params, lambda i, mesh: jax.device_put(windows_batch(windows[i]), sharding.batch_sharding(mesh)), 5
    )
    if not one_program:  # each evaluated on its own core
        assert [next(iter(loss["loss"].devices())) for loss in losses] == [jax.devices()[i % 2] for i in range(5)]
    reference = jax.jit(partial(eval_step, model=GPT(run.model)))
    want = [float(reference(params, jnp.asarray(w))["loss"]) for w in windows]
    assert [float(x["loss"]) for x in losses] == want  # the same program on another core: the same bits


@pytest.mark.parametrize(
    "batch_size, microbatches, cores, expected",
    [(12, 0, 2, 2), (12, 0, 8, 6), (12, 0, 5, 4), (7, 0, 4, 1), (12, 4, 2, 1), (12, 4, 8, 3), (16, 2, 16, 8)],
)
def test_the_cores_sharing_the_batch_share_it_evenly(batch_size, microbatches, cores, expected):
    run = RunConfig(MODEL, DataConfig(), TrainConfig(batch_size=batch_size, microbatches=microbatches))
    assert step_choice.cores_sharing_the_batch(run, cores) == expected


@pytest.mark.parametrize("source", ["builtin:python-docs", "builtin:dates"])  # windows; packed, weighted examples
def test_plan_picks_microbatches_per_core_and_says_so(source, monkeypatch):
    """Each count is measured by compiling the first core's program (for the batch's shapes before
    any batch exists, its weights too); the chosen one's is kept in the step (the figure the note
    gives is its temporaries), so compiling the step compiles only the other cores' programs and
    the update."""
    monkeypatch.setattr(step_choice, "choices_dir", lambda: None)  # measured here, not remembered
    run = make_run(microbatches=0, batch_size=8)
    run = dataclasses.replace(run, data=dataclasses.replace(run.data, source=source))
    mesh = sharding.make_mesh(MeshConfig(1, 1, 1))
    layout, create = state_layout(training_program(run), mesh)
    plan = step_choice.plan(training_program(run), jax.devices()[:2], mesh, layout)
    chosen = plan.program.run.train.microbatches
    assert len(plan.devices) == 2 and chosen >= 1 and (8 // 2) % chosen == 0
    assert "2 CPU cores" in plan.note and "no collectives" in plan.note
    kept = plan.step.memory_analysis().temp_size_in_bytes
    assert f"{chosen}: {kept / 2**20:.0f} MiB" in plan.note
    first = plan.step._first_share
    shapes = batch_layout(plan.program.run, plan.step.batch_mesh)
    batch = {name: jax.device_put(np.zeros(s.shape, s.dtype), s.sharding) for name, s in shapes.items()}
    assert plan.step.compile(create(), batch).shares.compiled[0] is first
    assert (
        step_choice.plan(training_program(make_run(batch_size=7)), jax.devices()[:2], mesh, layout).devices
        == jax.devices()[:1]
    )


def test_the_step_is_chosen_once_per_core_or_over_the_mesh(monkeypatch):
    """choose_step (what the trainer, jaxgpt.commands.check and the benchmarks call): a batch that splits
    over the cores gets one program per core; one that does not (7 rows, 2 cores) the mesh's
    own step, its microbatches filled in all the same (0 is not a count a step can take)."""
    mesh = sharding.make_mesh(MeshConfig(1, 1, 1))
    layout, _ = state_layout(training_program(make_run()), mesh)  # the same for any batch
    monkeypatch.setattr(step_choice, "cores_for", lambda m: jax.devices()[:2])
    eight_rows = training_program(make_run(microbatches=0, batch_size=8))
    program, step, note = step_choice.choose_step(eight_rows, mesh, layout)
    assert isinstance(step, CoreParallelStep) and step.devices == jax.devices()[:2] and "2 CPU cores" in note
    assert program.run.train.microbatches >= 1 and step.batch_mesh.size == 2
    program, step, _ = step_choice.choose_step(training_program(make_run(microbatches=0, batch_size=7)), mesh, layout)
    assert isinstance(step, MeshStep) and step.batch_mesh is mesh and program.run.train.microbatches in (1, 7)


def test_core_count_comes_from_the_environment_or_the_affinity_mask(monkeypatch):
    monkeypatch.setenv(runtime.CORES_ENV, "3")
    assert runtime.cpu_cores() == 3
    monkeypatch.delenv(runtime.CORES_ENV)
    assert runtime.cpu_cores() == len(__import__("os").sched_getaffinity(0))
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(runtime.CORES_ENV, bad)
        with pytest.raises(UserError, match="JAXGPT_CPU_CORES"):
            runtime.cpu_cores()
