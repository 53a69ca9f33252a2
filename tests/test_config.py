"""Configuration: derived defaults, one clear error per inconsistency, and the adjustments a
shortened run gets."""

import pytest

from jaxgpt.config import ConfigError, ModelConfig, RopeScaling, TrainConfig
from jaxgpt.config_files import base_config, resolve


def test_defaults_resolve_to_the_numbers_the_model_uses():
    c = ModelConfig(d_model=128, n_head=4)
    assert c.n_kv_head == 4  # None means multi-head attention
    assert c.mlp_hidden == 512  # 4 * d_model
    assert c.head_dim == 32 and c.group_size == 1


@pytest.mark.parametrize(
    "d_model, expected",
    [
        (128, 384),  # 2/3 * 512 = 341.3 -> next multiple of 64
        (96, 256),  # 2/3 * 384 = 256 exactly
        (4096, 10944),  # 2/3 * 16384 = 10922.7 -> 171 * 64
    ],
)
def test_swiglu_hidden_follows_the_llama_rule(d_model, expected):
    assert ModelConfig(d_model=d_model, n_head=4, activation="swiglu").mlp_hidden == expected


def test_explicit_mlp_hidden_is_kept():
    assert ModelConfig(activation="swiglu", mlp_hidden=100).mlp_hidden == 100


def test_rope_scaling_accepts_a_plain_dict():
    c = ModelConfig(position="rope", rope_scaling={"kind": "yarn", "factor": 4.0, "original_block_size": 64})
    assert c.rope_scaling == RopeScaling("yarn", 4.0, 64)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_model=100, n_head=3), "d_model=100 is not divisible by n_head=3"),
        (dict(n_head=4, n_kv_head=3), "n_head=4 is not divisible by n_kv_head=3"),
        (dict(d_model=12, n_head=4, position="rope"), "head_dim=3"),
        (dict(d_model=15, n_head=1, position="sinusoidal"), "d_model=15 is odd"),
        (dict(vocab_size=0), "vocab_size=0 must be a positive integer"),
        (dict(n_layer=-1), "n_layer=-1 must be a positive integer"),
        (dict(block_size=2.5), "block_size=2.5 must be a positive integer"),
        (dict(mlp_hidden=0), "mlp_hidden=0"),
        (dict(activation="tanh"), "activation='tanh' is not one of"),
        (dict(norm="batchnorm"), "norm='batchnorm'"),
        (dict(norm_position="middle"), "norm_position='middle'"),
        (dict(position="relative"), "position='relative'"),
        (dict(attention="flash"), "attention='flash'"),
        (dict(remat="some"), "remat='some'"),
        (dict(dtype="float8"), "dtype='float8'"),
        (dict(dropout=1.0), "dropout=1.0 must be in [0, 1)"),
        (dict(rope_theta=0.0), "rope_theta=0.0 must be positive"),
        (dict(init_std=-0.02), "init_std=-0.02 must be positive"),
        (
            dict(position="learned", rope_scaling=RopeScaling("linear", 2.0)),
            "model.position='learned' but rope_scaling is set",
        ),
        (dict(position="rope", rope_scaling=RopeScaling("dynamic", 2.0)), "rope_scaling.kind='dynamic'"),
        (
            dict(position="rope", rope_scaling=RopeScaling("yarn", 4.0)),
            "original_block_size=None must be positive: yarn needs the context length",
        ),
        (
            dict(position="rope", rope_scaling=RopeScaling("llama3", 8.0)),
            "original_block_size=None must be positive: llama3 needs the context length",
        ),
        (
            dict(position="rope", rope_scaling=RopeScaling("llama3", 8.0, 64, low_freq_factor=4, high_freq_factor=1)),
            "llama3 needs 0 < low_freq_factor < high_freq_factor",
        ),
        (  # the default d_model 128 over 4 heads: head_dim 32, so 16 rotary pairs
            dict(
                position="rope",
                rope_scaling=RopeScaling("longrope", 4.0, 64, long_factor=(1.0,) * 15, short_factor=(1.0,) * 16),
            ),
            "rope_scaling.long_factor=(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0) "
            "must be head_dim / 2 = 16 positive factors",
        ),
        (dict(qkv_projections=False, qkv_bias=True), "qkv_bias=True needs the projections it biases"),
        (dict(head_transform=True, activation="swiglu"), "head_transform=True applies an elementwise activation"),
        (dict(mask_token=256), "mask_token=256 must be a token id below vocab_size=256"),
        (dict(block_size=96, loss_chunk=64), "loss_chunk=64 must divide block_size=96; choose a divisor such as 48"),
        (dict(loss_chunk=-1), "loss_chunk=-1 must be a whole number of positions"),
        (dict(global_every=2), "global_every=2 interleaves windowed and global blocks, but attention_window=0"),
        (dict(attention_window=4, global_every=5), "global_every=5 is more than n_layer=4"),
        (dict(attention_window=4, global_every=2, scan_layers=True), "which scan_layers cannot iterate as one"),
        (dict(position="rope", rope_local_theta=100.0), "rope_local_theta=100.0 is the RoPE base of windowed blocks"),
        (dict(attention_scale_dim=0), "attention_scale_dim=0 must be a positive whole number"),
        (dict(head_transform=True, activation="geglu"), "head_transform=True applies an elementwise activation"),
    ],
)
def test_bad_config_names_field_and_value(changes, message):
    with pytest.raises(ConfigError, match="^invalid config: model\\.") as error:
        ModelConfig(**changes)
    assert message in str(error.value)
    assert "\n" not in str(error.value)  # one line, whatever the number of problems


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(muon_momentum_start=1.0), "train.muon_momentum_start=1.0 must be in [0, 1)"),
        (dict(muon_momentum_warmup=-5), "train.muon_momentum_warmup=-5 must"),
    ],
)
def test_a_bad_momentum_warmup_names_its_field(changes, message):
    with pytest.raises(ConfigError, match="^invalid config: train\\.") as error:
        TrainConfig(optimizer="muon", **changes)
    assert message in str(error.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as error:
        ModelConfig(d_model=100, n_head=3, dropout=2.0)
    assert "d_model=100" in str(error.value) and "dropout=2.0" in str(error.value)


def test_a_warmup_as_long_as_a_shortened_run_is_clipped_with_a_note():
    config = base_config()
    config.train.update(steps=50, warmup_steps=100)
    notes = []
    run = resolve(config, vocab_size=96, notes=notes)
    assert run.train.warmup_steps == 5
    assert notes == ["train.warmup_steps=100 is not shorter than train.steps=50; warming up for 5"]
    config.train.update(steps=500)
    notes.clear()
    assert resolve(config, vocab_size=96, notes=notes).train.warmup_steps == 100 and notes == []


def test_a_cooldown_longer_than_a_shortened_run_is_clipped_with_a_note():
    """configs/nanogpt_speedrun.py's 75 steps of cooldown in a run shortened to 50 steps with 10
    of warmup: 40 steps are left after the warmup, and the rate falls over all of them."""
    config = base_config()
    config.train.update(steps=50, warmup_steps=10, cooldown_steps=75)
    notes = []
    assert resolve(config, vocab_size=96, notes=notes).train.cooldown_steps == 40
    assert notes == ["train.cooldown_steps=75 is longer than the 40 steps after the warmup; cooling down over all 40"]
    config.train.update(steps=60, warmup_steps=100, decay_steps=0)  # the warmup clipped first: 6, leaving 54
    notes.clear()
    assert resolve(config, vocab_size=96, notes=notes).train.cooldown_steps == 54 and len(notes) == 2
    config.train.update(steps=200, warmup_steps=10)
    notes.clear()
    assert resolve(config, vocab_size=96, notes=notes).train.cooldown_steps == 75 and notes == []


@pytest.mark.parametrize(
    "batch_size, microbatches, ok", [(16, 0, True), (16, 4, True), (16, 3, False), (12, -1, False)]
)
def test_microbatches_divide_the_batch_or_are_left_to_the_run(batch_size, microbatches, ok):
    config = base_config()
    config.train.update(batch_size=batch_size, microbatches=microbatches)
    if ok:
        assert resolve(config, vocab_size=96).train.microbatches == microbatches
    else:
        with pytest.raises(ConfigError, match="or 0 to let the run choose"):
            resolve(config, vocab_size=96)


def test_every_model_field_has_a_kind_and_every_resumable_field_exists():
    """config/model.py's FIELD_KINDS names each ModelConfig field architecture, workbench or run
    (what init_from takes from the weights, what export refuses, what a run chooses): a new
    switch left out of it fails here, not silently in the code that reads the lists it gives.
    And what a resume may change names fields that exist."""
    import dataclasses

    from jaxgpt.config import DataConfig, MeshConfig, ModelConfig, TrainConfig
    from jaxgpt.config.model import FIELD_KINDS
    from jaxgpt.hf.family import WORKBENCH_FIELDS
    from jaxgpt.job.pretrained import ARCHITECTURE_FIELDS, RUN_CHOICES
    from jaxgpt.job.resume import RESUMABLE_FIELDS

    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    assert sorted(FIELD_KINDS) == sorted(fields) and set(FIELD_KINDS.values()) == {"architecture", "workbench", "run"}
    assert set(ARCHITECTURE_FIELDS) | set(RUN_CHOICES) == set(fields) and not set(ARCHITECTURE_FIELDS) & set(
        RUN_CHOICES
    )
    assert set(WORKBENCH_FIELDS) < set(ARCHITECTURE_FIELDS)
    sections = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "mesh": MeshConfig}
    for key in RESUMABLE_FIELDS:
        section, name = key.split(".")
        assert name in {f.name for f in dataclasses.fields(sections[section])}, key


def test_a_source_is_of_the_kind_its_prefix_or_builtin_name_says():
    from jaxgpt.config import DataConfig, source_kind

    kinds = {
        "pairs:my.tsv": "pairs", "builtin:dates": "pairs", "builtin:reverse": "pairs", "builtin:sort": "pairs",
        "labels:reviews.tsv": "labels", "builtin:brackets": "labels",
        "images:digits/": "images", "builtin:digits": "images",
        "chat:talks.jsonl": "chat", "builtin:arithmetic-chat": "chat",
        "builtin:arithmetic": "stream", "builtin:shakespeare_char": "stream", "text:book.txt": "stream",
        "hf:roneneldan/TinyStories": "stream",
    }  # fmt: skip
    assert {source: source_kind(source) for source in kinds} == kinds
    data = DataConfig(source="builtin:arithmetic-chat")
    assert (data.chat, data.pairs, data.labelled, data.images, data.examples) == (True, False, False, False, True)
