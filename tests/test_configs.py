"""Every shipped config file loads and describes a valid run."""

import importlib
from pathlib import Path

import pytest

from jaxgpt.config_files import resolve

CONFIGS = sorted(p.stem for p in (Path(__file__).parents[1] / "configs").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", CONFIGS)
def test_config_resolves(name):
    run = resolve(importlib.import_module(f"configs.{name}").get_config(), vocab_size=256)
    assert run.train.steps > 0


def test_the_four_documented_configs_exist():
    assert {"tiny", "shakespeare_char", "gpt2_124m", "llama_tiny"} <= set(CONFIGS)


def test_llama_tiny_is_the_llama_recipe():
    model = resolve(importlib.import_module("configs.llama_tiny").get_config(), vocab_size=100).model
    assert (model.n_head, model.n_kv_head, model.position, model.norm, model.activation) == (
        4,
        2,
        "rope",
        "rmsnorm",
        "swiglu",
    )
    assert not model.bias and not model.tie_embeddings


def test_gpt2_124m_has_124m_parameters():
    import jax

    from jaxgpt.model.transformer import count_params, init_params

    model = resolve(importlib.import_module("configs.gpt2_124m").get_config(), vocab_size=50257).model
    n = count_params(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
    # GPT-2 small: 124,439,808 with its 50,257-token vocabulary; padding to 50,304 adds 47 * 768.
    assert n == 124_439_808 + 47 * 768


def test_the_speedrun_is_tiny_with_only_the_documented_changes():
    """docs/speedrun.md compares the two: any other difference would make the comparison wrong."""
    import dataclasses

    tiny, fast = (
        resolve(importlib.import_module(f"configs.{n}").get_config(), vocab_size=100) for n in ("tiny", "tiny_speedrun")
    )
    model_changes = {k: v for k, v in dataclasses.asdict(fast.model).items() if dataclasses.asdict(tiny.model)[k] != v}
    train_changes = {k: v for k, v in dataclasses.asdict(fast.train).items() if dataclasses.asdict(tiny.train)[k] != v}
    assert model_changes == {"position": "rope", "qk_norm": True, "activation": "relu2"}
    # evaluation and checkpoint cadence do not change what is trained
    assert train_changes == {"optimizer": "muon", "lr": 4e-3, "steps": 400, "eval_every": 100, "checkpoint_every": 200}
    assert (fast.data, fast.mesh) == (tiny.data, tiny.mesh)
