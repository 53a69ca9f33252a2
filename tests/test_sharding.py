"""Sharding over the 8 fake CPU devices: every layout trains like one device, parameters sit
where the rules put them, and checkpoints move between layouts."""

import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import layout_run_config, run_script, train_losses, trained

from jaxgpt import sharding
from jaxgpt.config import ConfigError, MeshConfig
from jaxgpt.config_files import resolve
from jaxgpt.errors import UserError
from jaxgpt.hardware import memory
from jaxgpt.hardware.mesh_step import state_layout
from jaxgpt.job.trainer import Trainer, train_and_evaluate
from jaxgpt.training.program import training_program

LAYOUTS = {"data=8": dict(data=8), "fsdp=8": dict(data=1, fsdp=8), "2x2x2": dict(data=2, fsdp=2, tensor=2)}


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("one_device"), layout_run_config(dict(data=1)))


# 2x2x2 holds every axis, so it is the quick set's; the whole-axis layouts are the slow set's.
@pytest.mark.parametrize(
    "layout", [pytest.param(name, marks=() if name == "2x2x2" else pytest.mark.slow) for name in LAYOUTS]
)
def test_every_layout_trains_like_one_device(layout, one_device, tmp_path):
    train_and_evaluate(layout_run_config(LAYOUTS[layout]), tmp_path, progress=False)
    # The same float32 math with sums split across devices and re-associated: ~1e-7 relative
    # per reduction. Adam divides each update by the gradient's own scale, so such differences
    # stay at that relative size through 10 steps instead of growing: 1e-5 leaves a wide margin
    # while a wrong sharding (a missed all-reduce, a mis-split head) moves losses by > 1e-2.
    np.testing.assert_allclose(train_losses(tmp_path), train_losses(one_device), rtol=1e-5)


@pytest.mark.slow
def test_the_cpu_speed_settings_train_like_the_plain_step(one_device, tmp_path):
    """The opt-in two-device CPU layout (JAX_NUM_CPU_DEVICES=2) with dots rematerialisation and
    microbatches split across the data axis reorders float32 sums and changes nothing else: the
    same tolerance as above."""
    c = layout_run_config(dict(data=2), microbatches=2)
    c.model.remat = "dots"
    train_and_evaluate(c, tmp_path, progress=False)
    np.testing.assert_allclose(train_losses(tmp_path), train_losses(one_device), rtol=1e-5)


def trainer_for(mesh: dict) -> Trainer:
    from jaxgpt.job import setup

    workdir, say = Path(tempfile.mkdtemp()), lambda message: None
    resolved = setup.resolve_run(layout_run_config(mesh), workdir, progress=False, verify_data=False)
    trainer = Trainer.on_this_machine(resolved, workdir, say)
    trainer.close()  # its evaluation's warm-up done: no program of the mesh left running beside the test's
    return trainer


def test_parameters_are_placed_by_the_rules():
    state = trainer_for(dict(data=2, fsdp=2, tensor=2)).state
    block = state.params["block_0"]
    P = jax.sharding.PartitionSpec
    assert block["attn"]["qkv"]["kernel"].sharding.spec == P("fsdp", "tensor", None, None)  # heads split
    assert block["attn"]["out"]["kernel"].sharding.spec == P("tensor", None, None, "fsdp")
    assert block["mlp"]["up"]["kernel"].sharding.spec == P("fsdp", "tensor")  # hidden split
    assert block["mlp"]["down"]["kernel"].sharding.spec == P("tensor", "fsdp")
    assert block["norm_1"]["scale"].sharding.spec == P()  # small: replicated
    adam_mu = state.opt_state[1][0].mu  # the moments follow their parameters
    assert adam_mu["block_0"]["mlp"]["up"]["kernel"].sharding.spec == P("fsdp", "tensor")
    assert state.step.sharding.spec == P()


def test_a_state_compiled_ahead_is_the_state_created_on_demand():
    """The trainer's initialisation compiles in the background while the step is chosen and
    compiled (`compile_in_background`): the state it creates is the on-demand one, bit for bit,
    laid out alike."""
    run = resolve(layout_run_config(dict(data=2, fsdp=2, tensor=2)), vocab_size=96)
    program = training_program(run)
    mesh = sharding.make_mesh(run.mesh, jax.devices()[:8])
    layout, create = state_layout(program, mesh)
    ahead_layout, ahead = state_layout(program, mesh)
    ahead.compile_in_background()
    assert ahead_layout == layout
    on_demand, compiled_ahead = create(), ahead()
    for x, y in zip(jax.tree.leaves(on_demand), jax.tree.leaves(compiled_ahead), strict=True):
        assert x.sharding == y.sharding
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_value_embeddings_are_split_as_the_values_heads():
    """Each block's value table (vocab, kv heads x head_dim) has its vocabulary split over fsdp and
    its width over tensor, as the heads it feeds are; a scanned table's layer axis stays whole."""
    from jaxgpt.sharding import make_mesh, partition_spec

    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    path = [jax.tree_util.DictKey(k) for k in ("blocks", "value_embed", "embedding")]
    assert partition_spec(path, (3, 64, 16), mesh) == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert partition_spec(path[1:], (63, 16), mesh) == jax.sharding.PartitionSpec(None, "tensor")  # 2 divides no 63


@pytest.mark.slow  # two small trainings: 10-13 s
def test_value_embeddings_train_on_a_mesh_like_one_device(tmp_path):
    """Trained 2x2x2 for 4 steps, a model with value embeddings gives the one-device losses, within
    the re-association tolerance of test_every_layout_trains_like_one_device."""
    losses = []
    for name, layout in (("mesh", dict(data=2, fsdp=2, tensor=2)), ("alone", dict(data=1))):
        config = layout_run_config(layout, steps=4)
        config.model.value_embeddings = True
        train_and_evaluate(config, tmp_path / name, progress=False)
        losses.append(train_losses(tmp_path / name))
    np.testing.assert_allclose(*losses, rtol=1e-5)


def test_fsdp_divides_per_device_parameter_bytes():
    replicated = trainer_for(dict(data=8)).state.params
    sharded = trainer_for(dict(data=1, fsdp=8)).state.params
    for path, leaf in jax.tree_util.tree_flatten_with_path(sharded)[0]:
        whole = leaf.size * leaf.dtype.itemsize
        mine = memory.bytes_per_device({"x": leaf})
        if path[-1].key in ("kernel", "embedding"):  # every weight matrix here has a dimension divisible by 8
            assert mine == whole // 8, path
        else:
            assert mine == whole, path  # biases and norm scales stay whole
    ratio = memory.bytes_per_device(replicated) / memory.bytes_per_device(sharded)
    # Exactly 8 for the matrices; the whole biases and norm scales of this 32-wide model hold
    # the total near 6.6 (at GPT-2 width they are ~0.1% of the bytes and the ratio nears 8).
    assert 6 < ratio < 8


@pytest.mark.parametrize(
    "mesh, message",
    [(dict(data=3), "does not divide the 8 devices"), (dict(data=-1, fsdp=-1), "at most one -1")],
)
def test_a_mesh_that_cannot_be_built_is_a_clear_error(mesh, message):
    with pytest.raises(ConfigError, match=message):
        MeshConfig(**mesh).shape(8)


def test_a_batch_the_mesh_cannot_split_is_a_clear_error_proposing_what_would(tmp_path):
    """12 rows over 8 devices: 8 or 16 rows split, and so do 12 rows over 4 devices (the largest
    divisor of 8 that divides 12)."""
    with pytest.raises(
        UserError, match="train.batch_size=12 .* does not split over the 8 data-parallel devices"
    ) as refused:
        train_and_evaluate(layout_run_config(dict(data=8), batch_size=12), tmp_path, progress=False)
    assert str(refused.value).endswith("(--config.train.batch_size=8 or 16) or --config.mesh.data=4")


@pytest.mark.parametrize(
    "first, second", [(dict(data=1), dict(data=1, fsdp=8)), (dict(data=2, fsdp=2, tensor=2), dict(data=1))]
)
def test_a_checkpoint_restores_onto_another_layout(first, second, one_device, tmp_path):
    train_and_evaluate(layout_run_config(first), tmp_path, progress=False, stop_at=5)
    train_and_evaluate(layout_run_config(second), tmp_path, progress=False)
    # Steps 6-10 ran on another layout: the same reduction-order tolerance as above.
    np.testing.assert_allclose(train_losses(tmp_path), train_losses(one_device), rtol=1e-5)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_of_four_devices_train_like_one_process_of_eight(tmp_path):
    overrides = [
        "--config.model.n_layer=2",
        "--config.model.n_head=2",
        "--config.model.d_model=32",
        "--config.model.block_size=32",
        "--config.train.steps=10",
        "--config.train.batch_size=8",
        "--config.train.warmup_steps=2",
        "--config.train.log_every=1",
        "--config.train.eval_batches=2",
        "--config.train.microbatches=1",
    ]

    def train(workdir, devices, extra=()):
        args = ["--config", "configs/tiny.py", f"--workdir={workdir}", "--quiet", *overrides, *extra]
        return run_script("train.py", *args, devices=devices, background=True)

    assert train(tmp_path / "one", 8).wait(timeout=300) == 0
    port = free_port()
    pair = [
        train(
            tmp_path / "two", 4, [f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"]
        )
        for i in range(2)
    ]
    for process in pair:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    # data=8 both ways; the all-reduce crosses processes through gloo instead of shared memory,
    # which may re-associate the sums: the reduction-order tolerance of the layouts above.
    np.testing.assert_allclose(train_losses(tmp_path / "two"), train_losses(tmp_path / "one"), rtol=1e-5)
    assert len(train_losses(tmp_path / "two")) == 10  # one writer: no line doubled by process 1


def test_every_large_parameter_of_every_switch_has_a_sharding_rule():
    """A model with every switch that makes parameters on (experts, an encoder with
    cross-attention, adapters, value embeddings, the x0 mix, BERT's head, an untied head,
    biases, QK-norm, the attention gate), SwiGLU, multi-token prediction's module, a Vision Transformer's patch
    projection and the convolution in attention's place: each of its parameters has a
    rule in jaxgpt/sharding.py, or is small enough to replicate by design (a norm's scale, a
    bias of d_model, a router, a few scalars: at most max(vocab, experts x d_model) numbers).
    A new weight matrix left without a rule would be replicated on every device; it fails here."""
    from jaxgpt.config import MixtureOfExperts, ModelConfig
    from jaxgpt.model.transformer import init_params
    from jaxgpt.sharding import EXPERT_RULES, EXPERT_SWIGLU_UP, RULES, SWIGLU_UP

    everything = ModelConfig(
        vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32, activation="gelu",
        encoder_layers=1, lora_rank=2, lora_targets="qkv,out,q,kv", value_embeddings=True, x0_mix=True,
        head_transform=True, embedding_norm=True, tie_embeddings=False, qk_norm=True, qkv_bias=True,
        attention_gate="elementwise",
    )  # fmt: skip
    convolution = ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, d_model=32, token_mixer="convolution")
    with_experts = ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, d_model=32, activation="swiglu",
                               moe=MixtureOfExperts(experts=4, top_k=2, shared_experts=1))  # fmt: skip
    ahead = ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, d_model=32, mtp_weight=0.5)
    vision = ModelConfig(vocab_size=2, block_size=17, n_layer=2, n_head=4, d_model=32, patch_size=8, channels=3,
                         objective="classification", classes=10, causal=False)  # fmt: skip
    small = max(64, 4 * 32)
    for config in (everything, with_experts, ahead, convolution, vision):
        shapes = jax.eval_shape(lambda c=config: init_params(c, jax.random.key(0)))
        for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
            names = ["", *(k.key for k in path)]
            module, name = names[-2], names[-1]
            experts = module == "moe" and (name in EXPERT_RULES or name in EXPERT_SWIGLU_UP)
            ruled = (module, name) in RULES or (module == "up" and name in SWIGLU_UP) or experts
            assert ruled or leaf.size <= small, (jax.tree_util.keystr(path), leaf.shape)
