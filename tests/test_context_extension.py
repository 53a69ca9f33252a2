"""A run started from another run's weights (train.init_from=WORKDIR), with a longer
block_size and a RoPE scaling where no parameter changes shape: context extension."""

import json

import jax
import numpy as np
import pytest
from conftest import small_run_config

from jaxgpt.config import RopeScaling
from jaxgpt.config_files import resolve
from jaxgpt.errors import UserError
from jaxgpt.job.checkpoint import load_latest
from jaxgpt.job.pretrained import architecture_mismatches, start_from_pretrained
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.training.program import training_program


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    """A RoPE model trained 10 steps at block_size 32."""
    workdir = tmp_path_factory.mktemp("rope-run")
    config = small_run_config(steps=10, eval_every=10, checkpoint_every=10)
    config.model.position = "rope"
    train_and_evaluate(config, workdir, progress=False)
    return workdir


def extended(source, block_size=64, **model):
    config = small_run_config(steps=2, eval_every=2, checkpoint_every=2, log_every=1)
    config.model.update(position="rope", block_size=block_size, **model)
    config.train.init_from = str(source)
    return config


# A context extension is asked for on purpose (the command line's --config.model.X; from Python,
# train_and_evaluate's overrides): a config's other values are the weights' (tests/test_pretrained.py)
YARN = (
    "model.block_size",
    "model.rope_scaling.kind",
    "model.rope_scaling.factor",
    "model.rope_scaling.original_block_size",
)


def test_the_extended_run_starts_from_the_weights_and_records_where_they_came_from(rope_run, tmp_path, capsys):
    """YaRN at 2x, in a workdir of its own; config.json says where its weights came from."""
    config = extended(rope_run, rope_scaling=dict(kind="yarn", factor=2.0, original_block_size=32))
    workdir = tmp_path / "extended"
    train_and_evaluate(config, workdir, overrides=YARN)
    printed = capsys.readouterr().out
    assert f"initialised from {rope_run} (step 10)" in printed
    assert "extending context: block_size 32 -> 64; rope_scaling None -> yarn x2" in printed
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["train"]["init_from"] == str(rope_run)
    assert saved["model"]["block_size"] == 64 and saved["model"]["rope_scaling"]["kind"] == "yarn"


def test_start_from_pretrained_copies_every_parameter(rope_run):
    from jaxgpt import sharding
    from jaxgpt.config import MeshConfig
    from jaxgpt.hardware.mesh_step import initial_state

    _, source_params, tokenizer, _ = load_latest(rope_run)
    for scan in (False, True):  # the source is unscanned; a scanned new run stacks its blocks
        run = resolve(extended(rope_run, scan_layers=scan), vocab_size=tokenizer.vocab_size)
        mesh = sharding.make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
        state, origin = start_from_pretrained(initial_state(training_program(run), mesh), run, str(rope_run), tokenizer)
        assert origin == f"{rope_run} (step 10)"
        got = state.params
        if scan:
            from jaxgpt.model.transformer import unstack_blocks

            got = unstack_blocks(got)
        jax.tree.map(np.testing.assert_array_equal, got, source_params)


def test_what_may_differ_when_extending():
    base = resolve(small_run_config(), vocab_size=96).model.replace(position="rope")
    longer = base.replace(block_size=128, rope_scaling=RopeScaling("linear", 4.0), rope_theta=500000.0)
    assert architecture_mismatches(longer, base) == []
    learned = base.replace(position="learned")
    assert architecture_mismatches(learned.replace(block_size=128), learned) == [
        "model.block_size=128 but the weights have 32 (learned positions have a row per position)"
    ]
    assert architecture_mismatches(base.replace(d_model=64, n_head=4), base)[0] == (
        "model.n_head=4 but the weights have 2"
    )
    # an encoder–decoder's weights (an encoder, cross-attention) or a bias per token do not fit a decoder alone
    assert architecture_mismatches(base, base.replace(encoder_layers=2, logits_bias=True)) == [
        "model.logits_bias=False but the weights have True",
        "model.encoder_layers=0 but the weights have 2",
    ]


def test_a_learned_position_run_cannot_be_extended(trained_small_run, tmp_path):
    config = small_run_config(steps=2)
    config.model.block_size = 64
    config.train.init_from = str(trained_small_run)
    with pytest.raises(UserError, match=r"block_size=64, but .* have block_size=32 \(learned positions have a row"):
        train_and_evaluate(config, tmp_path / "longer", progress=False, overrides=("model.block_size",))
    assert not (tmp_path / "longer").exists()  # refused before a workdir (or its lock), a state or a compile


def test_resuming_with_a_longer_block_points_to_init_from(rope_run, tmp_path):
    """The source run is not changed: a resume that only lengthens the context is refused,
    naming the way that starts a new run instead."""
    config = small_run_config(steps=10, eval_every=10, checkpoint_every=10)
    config.model.update(position="rope", block_size=64)
    before = {p: p.read_bytes() for p in rope_run.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=f"To extend its context, start a new run from its weights: "
                       f"--config.train.init_from={rope_run} --workdir NEW_DIR"):  # fmt: skip
        train_and_evaluate(config, rope_run, progress=False)
    assert {p: p.read_bytes() for p in rope_run.rglob("*") if p.is_file()} == before
