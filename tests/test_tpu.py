"""TPU paths compiled ahead of time on this CPU (libtpu's compile-only devices; requirements-tpu.txt):
the flash kernel sharded over every mesh layout, the memory and FLOPs the check reports, and
the check command itself. The sharded kernel's numbers are checked on CPU devices in Pallas's
TPU interpret mode."""

import dataclasses
import importlib.util
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, attend, needs_libtpu, run_script

from jaxgpt import sharding
from jaxgpt.config_files import base_config, resolve
from jaxgpt.errors import UserError
from jaxgpt.hardware import step_choice, tpu
from jaxgpt.model.transformer import count_params, init_params


def small_run(**model):
    config = base_config()
    config.model.update(dict(n_layer=2, n_head=4, d_model=128, block_size=128) | model)
    config.train.update(batch_size=16, microbatches=1)
    return config


def run_on(config, data=-1, fsdp=1, tensor=1, expert=1):
    config.mesh.update(data=data, fsdp=fsdp, tensor=tensor, expert=expert)
    return resolve(config, vocab_size=256)


@pytest.fixture(scope="module")
def v5e_8():
    return tpu.compile_only_devices(tpu.target("tpu-v5e-8"))


MOSAIC = "tpu_custom_call"  # how a Pallas TPU kernel appears in the compiled program


@needs_libtpu
@pytest.mark.parametrize(
    "mesh, n_kv_head",
    [
        ((2, 2, 2), 2),
        ((8, 1, 1), 4),
        ((1, 8, 1), 4),
        ((1, 4, 2), 4),
        ((8, 1, 1), 2),
        ((1, 8, 1), 2),
        ((1, 4, 2), 2),
        ((2, 2, 2), 4),
    ],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else ("MHA" if v == 4 else "GQA"),
)
def test_flash_kernel_compiles_sharded_for_a_v5e_8(v5e_8, mesh, n_kv_head):
    """Without shard_map this fails to compile: XLA cannot partition a Mosaic kernel itself."""
    run = run_on(small_run(attention="flash_tpu", n_kv_head=n_kv_head), *mesh)
    step = tpu.compile_train_step(run, v5e_8)
    assert step.mesh == dict(zip(("data", "fsdp", "tensor"), mesh, strict=True)) | {"expert": 1}
    assert MOSAIC in step.program_text  # the kernel itself, not a fallback


@needs_libtpu
@pytest.mark.parametrize("kernel", ["xla", "dot_product"])
def test_the_other_kernels_compile_sharded_for_a_v5e_8(v5e_8, kernel):
    step = tpu.compile_train_step(run_on(small_run(attention=kernel, n_kv_head=2), 2, 2, 2), v5e_8)
    assert MOSAIC not in step.program_text and step.temporaries_bytes > 0


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["one-sequence", "packed"])
def test_the_sharded_flash_kernel_computes_the_readable_kernels_attention(packed):
    """On 8 CPU devices (data 2 x fsdp 2 x tensor 2) in TPU interpret mode: the kernel under
    shard_map, each device on its rows and heads, against the XLA kernel unsharded; packed, with
    each row's segments split with its rows (slow: 10 s more of interpreted kernel). Both are
    float32; the flash kernel's running max and rescaled sums reorder additions: 1e-5."""
    from jax.experimental.pallas import tpu as pltpu

    mesh = sharding.make_mesh(run_on(small_run(), 2, 2, 2).mesh)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((4, 128, 2, 3, 16)), jnp.float32)  # 2 kv heads x 3 queries
    k, v = (jnp.asarray(rng.standard_normal((4, 128, 2, 16)), jnp.float32) for _ in range(2))
    rows_and_heads = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor"))
    q, k, v = (jax.device_put(x, rows_and_heads) for x in (q, k, v))
    segments = jnp.asarray(np.repeat([[1, 2], [1, 0], [3, 3], [5, 6]], [70, 58], axis=1)) if packed else None
    flash = sharding.traced_on(mesh, partial(attend, kernel="flash_tpu", segments=segments))
    with pltpu.force_tpu_interpret_mode():
        got = jax.jit(flash)(q, k, v)
        assert "shard_map" in str(jax.make_jaxpr(flash)(q, k, v))
    np.testing.assert_allclose(got, attend(q, k, v, kernel="xla", segments=segments), atol=1e-5)


@needs_libtpu
def test_memory_figures_are_the_sharded_parameter_counts(v5e_8):
    """Replicated (data = 8), each device holds every parameter: 4 bytes x the count. Sharded
    (fsdp = 8), every matrix is split 8 ways and the vectors stay whole: per layer the two
    norms' scales and biases (4 d), the qkv bias (3 d), the MLP's biases (4 d + d) and the
    attention output's (d), and the final norm (2 d). Adam's two moments are twice the
    parameters, plus its step count."""
    config = small_run()
    replicated = tpu.compile_train_step(run_on(config, 8), v5e_8)
    run = run_on(config, 1, 8)
    sharded = tpu.compile_train_step(run, v5e_8)
    n = count_params(jax.eval_shape(partial(init_params, run.model), jax.random.key(0)))
    d, layers = run.model.d_model, run.model.n_layer
    whole = 13 * d * layers + 2 * d
    assert replicated.params_bytes == 4 * n
    assert sharded.params_bytes == 4 * ((n - whole) // 8 + whole)
    assert (n - whole) % 8 == 0
    for step in (replicated, sharded):
        batch = 4 * run.train.batch_size * (run.model.block_size + 1) // 8
        assert step.optimizer_bytes in range(2 * step.params_bytes, 2 * step.params_bytes + 64)  # + Adam's counters
        # XLA's argument buffers: the state and the batch, at least; TPU layouts pad small arrays to tiles.
        assert (
            step.params_bytes + step.optimizer_bytes + batch
            <= step.inputs_bytes
            <= 1.1 * (step.params_bytes + step.optimizer_bytes + batch) + 2**20
        )
        assert 0 < step.temporaries_bytes < tpu.target("tpu-v5e-8").hbm_bytes


@needs_libtpu
def test_experts_split_over_the_expert_axis_of_a_v5e_8(v5e_8):
    """A mixture of 8 experts on 8 chips of the expert axis: each chip holds one expert's
    matrices and every other parameter whole; the tokens travel to their experts and back by
    all-to-all."""
    config = small_run()
    config.model.moe.update(experts=8, top_k=2, capacity_factor=1.25)
    run = run_on(config, 1, expert=8)
    step = tpu.compile_train_step(run, v5e_8)
    params = jax.eval_shape(partial(init_params, run.model), jax.random.key(0))
    n = count_params(params)
    experts = sum(
        int(leaf.size) for path, leaf in jax.tree_util.tree_leaves_with_path(params) if "experts_" in path[-1].key
    )
    assert step.mesh == {"data": 1, "fsdp": 1, "expert": 8, "tensor": 1}
    assert step.params_bytes == 4 * (n - experts + experts // 8)
    assert "all-to-all" in step.program_text and step.fits(tpu.target("tpu-v5e-8"))


@needs_libtpu
def test_microbatches_left_to_the_machine_are_chosen_against_the_slices_memory(v5e_8):
    """`check --target` compiles the step training would choose on the slice. With
    train.microbatches=0 on a chip too small for one microbatch (a v5e with its memory cut to
    the state and half of one microbatch's temporaries), more microbatches are chosen against
    the chip's memory and the compiled step fits it. 512-token windows, 32 rows per chip: the
    activations are most of the temporaries (372 MB at one microbatch, 6 MB at eight; at 8 rows a
    chip, since the softmax's division moved after its einsum, one microbatch needs 5.6 MB and
    more microbatches cannot shrink it)."""
    config = small_run(block_size=512)
    config.train.update(batch_size=256, microbatches=0)
    one = tpu.compile_train_step(run_on(config, 8), v5e_8, tpu.target("tpu-v5e-8"))
    assert one.microbatches == 1 and one.fits(tpu.target("tpu-v5e-8"))  # the whole chip: one is enough
    cut = (one.inputs_bytes + one.temporaries_bytes / 2) / step_choice.ACCELERATOR_HEADROOM
    small_chip = dataclasses.replace(tpu.target("tpu-v5e-8"), hbm_bytes=int(cut))
    chosen = tpu.compile_train_step(run_on(config, 8), v5e_8, small_chip)
    assert chosen.microbatches > 1 and chosen.fits(small_chip) and not one.fits(small_chip)


@needs_libtpu
def test_xla_counts_the_flops_the_6n_formula_predicts(v5e_8):
    """Unscanned and without remat, the compiled step's FLOPs are the matmuls 6N + 12LdT counts
    plus the elementwise work it leaves out (softmax, norms, GELU, Adam: a few percent at this
    width), so the ratio sits just above 1."""
    step = tpu.compile_train_step(run_on(small_run(), 8), v5e_8)
    assert 0.98 < step.xla_flops / step.model_flops < 1.25


@needs_libtpu
@pytest.mark.parametrize("remat", ["none", "dots", "dots_no_batch", "full"])
def test_scanned_bfloat16_flash_steps_compile_for_a_v6e_with_each_remat_policy(remat):
    devices = tpu.compile_only_devices(tpu.target("tpu-v6e-1"))
    config = small_run(scan_layers=True, remat=remat, attention="flash_tpu")
    config.train.dtype = "bfloat16"
    step = tpu.compile_train_step(run_on(config), devices)
    assert MOSAIC in step.program_text


@needs_libtpu
@pytest.mark.parametrize("name", ["tpu-v5e-8", "tpu-v6e-1"])
def test_sampling_compiles_prefill_and_the_decode_loop(name):
    devices = tpu.compile_only_devices(tpu.target(name))
    run = run_on(small_run(position="rope", n_kv_head=2))
    compiled = tpu.compile_sampling(run, devices, prompt_len=16, max_new_tokens=200, batch=2)
    assert "while" in compiled.as_text()  # the 200 decode steps are one compiled loop


@needs_libtpu
def test_a_run_that_does_not_split_over_the_slice_is_one_clear_error(v5e_8):
    config = small_run()
    config.train.batch_size = 12
    with pytest.raises(UserError, match="batch_size=12 .* does not split over the 8 data-parallel devices"):
        tpu.compile_train_step(run_on(config), v5e_8)


def test_flop_counts_are_printed_in_the_unit_that_keeps_their_digits():
    assert [tpu.flops(n) for n in (7.007e12, 1.21e9, 5.401e8, 12.5e12)] == ["7.007 T", "1.21 G", "540.1 M", "12.5 T"]


def test_unknown_target_and_missing_libtpu_are_one_line(monkeypatch):
    with pytest.raises(UserError, match="--target='tpu-v9' is not a TPU this check knows; choose one of tpu-v2-8"):
        tpu.target("tpu-v9")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="needs libtpu, which is not installed: pip install -r requirements-tpu.txt"):
        tpu.compile_only_devices(tpu.target("tpu-v5e-8"))


@needs_libtpu
def test_check_target_prints_memory_and_fits():
    result = run_script("jaxgpt", "check", "--config", "configs/tiny.py", "--target", "tpu-v6e-1")
    assert result.returncode == 0, result.stderr
    assert "fits tpu-v6e-1" in result.stdout
    assert "per device: parameters 3.1 MiB + optimizer 6.3 MiB" in result.stdout  # 823k float32 (+ 2 moments)


@needs_libtpu
def test_a_rollout_that_does_not_fit_is_one_line_naming_what_to_shrink(monkeypatch):
    """The update fits and the sampling does not: the verdict names the rollout's size, not the
    step's alternatives (which would not shrink it), in one line instead of a traceback."""
    import runpy

    from jaxgpt import data

    config = runpy.run_path(str(ROOT / "configs/rl_arithmetic.py"))["get_config"]()
    config.train.init_from = ""
    config.model.n_layer = 1

    def refused(run, devices):
        raise tpu.OutOfMemory("the HLO temporaries (20.0G) exceed the available HBM (15.75G)")

    monkeypatch.setattr(tpu, "compile_rollout", refused)
    verdict = tpu.check(config, "tpu-v5e-8", 0.4, vocab_size=data.vocab_size_for(config), say=lambda line: None)
    assert verdict == (
        "does not fit tpu-v5e-8: train.rl's sampling: the TPU compiler says the HLO temporaries (20.0G) exceed the "
        "available HBM (15.75G); answer fewer rows at once (train.rl.draws or prompts, samples), or shorter ones "
        "(train.rl.length)"
    )


@needs_libtpu
def test_check_target_names_the_smallest_change_that_fits():
    """GPT-2 small with XLA's attention over scanned layers and no rematerialisation needs 15.76 GB
    of temporaries per v5e chip, which has 15.75 GB: the compiler refuses it, and keeping the
    matmul outputs (remat=dots) fits. (As shipped, unrolled, it needs 9.81 GiB with no remat.)"""
    scanned = ["--config.model.attention=xla", "--config.model.scan_layers=true", "--config.model.remat=none"]
    result = run_script("jaxgpt", "check", "--config", "configs/gpt2_124m.py", *scanned, "--target", "tpu-v5e-8")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].endswith("the smallest change that fits: --config.model.remat=dots")
