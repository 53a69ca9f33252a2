"""Every shipped config compiled ahead of time for two TPU generations (libtpu's compile-only
devices). Apart from tests/test_tpu.py so that the slow set's two workers share the TPU
compiles: pytest-xdist hands out whole files (--dist loadfile), and these alone take about
half an hour of one worker's time."""

import importlib
from functools import partial

import jax
import pytest
from conftest import ROOT, needs_libtpu

from jaxgpt.config_files import resolve
from jaxgpt.hardware import tpu
from jaxgpt.model import count_params, init_params

SHIPPED = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__")


@needs_libtpu
@pytest.mark.parametrize("name", ["tpu-v5e-8", "tpu-v6e-8"])
@pytest.mark.parametrize("config_name", SHIPPED)
def test_every_shipped_config_compiles_for_two_tpu_generations(config_name, name, gpt2_bpe):
    """Each config as shipped, on 8 chips of v5e and of v6e: the report, and whether it fits.
    Configs whose batch does not split 8 ways use the largest mesh it does split over."""
    config = importlib.import_module(f"configs.{config_name}").get_config()
    if config.data.source.startswith("hf:") and not config.model.get("vocab_size"):
        config.model.vocab_size = 65  # tiny_shakespeare's characters; its data needs the Hub
    target = tpu.target(name)
    devices = tpu.compile_only_devices(target)
    config.mesh.data = max(d for d in (1, 2, 4, 8) if config.train.batch_size % d == 0)
    run = resolve(config, vocab_size=tpu.vocab_size_for(config))
    step = tpu.compile_train_step(run, devices, target)
    assert step.fits(target), (config_name, step.total_bytes)
    n = count_params(jax.eval_shape(partial(init_params, run.model), jax.random.key(0)))
    assert step.params_bytes >= 4 * n // 8
    assert tpu.report_lines(run, target, step, 0.4)[1].startswith("per device: parameters")
