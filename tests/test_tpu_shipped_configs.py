"""Every shipped config compiled ahead of time for a TPU slice (libtpu's compile-only devices),
each on one generation (GENERATIONS), so that each generation compiles several kinds of model.
GPT-2 124M, the config people rent TPUs for, is compiled for a v5e-8, the tighter memory, by the
`jaxgpt check` command of docs/devices.md that tests/test_readme.py runs and reads "fits" from
(the same program: compiling it here too only repeated it, 76 s of slow-set time). The other TPU
paths (flash kernels, remat policies) are tests/test_tpu.py's. Apart from that file so that the
slow set's two workers share the TPU compiles: pytest-xdist hands out whole files (--dist
loadfile), and these are the longest compiles in the suite.

A config whose blocks are unrolled (scan_layers off) compiles one copy of the same block per
layer, so compile time grows with depth while nothing new is lowered: those are compiled with two
of their layers (LAYERS_COMPILED), every other field as shipped. shakespeare_char's six layers with
dropout took 198 s of a Zen 4 core (dropout's threefry bits most of it), finetune_gpt2's twelve
86 s. Dropout's bits also make libtpu's compile grow with the tensors: shakespeare_char is compiled
with one row a chip (ROWS_PER_CHIP), the same program at another batch size (one layer on a Zen 3:
128.8 s at its eight rows a chip, 12.5 s at one). Their memory is no question at two layers or at
all of them, nor at shakespeare_char's batch (GPT-2 small's float32 weights, gradients and Adam
moments come to 2 GB of a v5e chip's 16, beside one 1,024-token sequence a chip); the memory that
decides a config's fit, GPT-2 124M's on a v5e-8, is compiled in full by the guide's command."""

import importlib
from functools import partial

import jax
import pytest
from conftest import ROOT, needs_libtpu
from test_readme import SHORTENED

from jaxgpt import data
from jaxgpt.config_files import resolve
from jaxgpt.hardware import tpu
from jaxgpt.model.transformer import count_params, init_params

SHIPPED = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__")
V5E, V6E = "tpu-v5e-8", "tpu-v6e-8"
# Where each shipped config is compiled here. A new config must be added (the test below says so).
GENERATIONS = {
    "arithmetic": (V6E,),
    "brackets": (V5E,),  # a classifier: each packed string scored at one position
    "vit_digits": (V5E,),  # a Vision Transformer: the pixels a batch field beside the tokens
    "encoder_tiny": (V5E,),  # the masked objective's program
    "dates": (V5E,),  # packed text pairs: a batch with loss weights, segments and positions
    "deep": (),  # tiny's program at other sizes (12 narrower blocks), which tiny's compile covers
    "finetune_gpt2": (V5E,),
    "gpt2_124m": (),  # on a v5e-8 by the guide's command below, which must print that it fits
    "induction": (V6E,),
    "llama_tiny": (V6E,),
    "moe_tiny": (V5E,),  # experts replicated on every chip, tokens split over the data axis
    "nanogpt_speedrun": (V5E,),  # Muon over stacked layers: one batched Newton-Schulz per kind of matrix
    "seq2seq_reverse": (V6E,),  # an encoder–decoder: cross-attention over packed pairs
    "seq2seq_sort": (V5E,),
    "rl_arithmetic": (V5E,),  # learning from rewards: the update and the sampling, two programs
    "rl_arithmetic_3": (),  # rl_arithmetic's programs on another builtin source, answers 8 tokens longer
    "sft_arithmetic": (V5E,),  # conversations: the assistant's turns weighted, packed in segments
    "sft_arithmetic_3": (),  # sft_arithmetic's program on another builtin source: nothing new to compile
    "shakespeare_char": (V5E,),
    "tiny": (V6E,),
    "tiny_speedrun": (V6E,),
}
README_CHECK = "python -m jaxgpt check --config configs/gpt2_124m.py --target tpu-v5e-8"
# Unrolled configs compiled with two layers: the same block, lowered once, in a third of the time.
LAYERS_COMPILED = {"shakespeare_char": 2, "finetune_gpt2": 2}
# Configs with dropout compiled for a smaller batch: one row on each of the slice's 8 chips.
ROWS_PER_CHIP = {"shakespeare_char": 1}


def test_every_shipped_config_is_compiled_and_both_generations_are_compiled_for():
    assert set(GENERATIONS) == set(SHIPPED), "give each new config in configs/ its TPU generation here"
    assert set(LAYERS_COMPILED) <= set(SHIPPED) and set(ROWS_PER_CHIP) <= set(SHIPPED)
    assert {g for names in GENERATIONS.values() for g in names} == {V5E, V6E}
    assert README_CHECK.endswith(V5E) and "gpt2_124m" in README_CHECK
    assert README_CHECK in SHORTENED  # tests/test_readme.py runs it and reads "fits tpu-v5e-8"


@needs_libtpu
@pytest.mark.parametrize("config_name, name", [(c, g) for c in SHIPPED for g in GENERATIONS.get(c, ())])
def test_every_shipped_config_compiles_for_a_tpu_slice(config_name, name, gpt2_bpe):
    """Each config as shipped, on 8 chips of its generation: the report, and whether it fits.
    Configs whose batch (over the microbatches a config sets) does not split 8 ways use the largest
    mesh it does split over."""
    config = importlib.import_module(f"configs.{config_name}").get_config()
    if config.data.source.startswith("hf:") and not config.model.get("vocab_size"):
        config.model.vocab_size = 65  # tiny_shakespeare's characters; its data needs the Hub
    if config_name in LAYERS_COMPILED:
        assert not config.model.scan_layers and config.model.n_layer > LAYERS_COMPILED[config_name]
        config.model.n_layer = LAYERS_COMPILED[config_name]
    if config_name in ROWS_PER_CHIP:
        assert config.model.dropout > 0 and not config.train.microbatches
        config.train.batch_size = 8 * ROWS_PER_CHIP[config_name]
    target = tpu.target(name)
    devices = tpu.compile_only_devices(target)
    rows = config.train.batch_size // (config.train.microbatches or 1)
    config.mesh.data = max(d for d in (1, 2, 4, 8) if rows % d == 0)
    run = resolve(config, vocab_size=data.vocab_size_for(config))
    step = tpu.compile_train_step(run, devices, target)
    assert step.fits(target), (config_name, step.total_bytes)
    if run.train.rl:  # a step of learning from rewards is two programs: the sampling too
        sampling = tpu.compile_rollout(run, devices)
        assert sampling.memory_analysis().temp_size_in_bytes > 0
        assert step.params_bytes + step.optimizer_bytes < tpu.rollout_bytes(step, sampling) <= target.hbm_bytes
    n = count_params(jax.eval_shape(partial(init_params, run.model), jax.random.key(0)))
    assert step.params_bytes >= 4 * n // 8
    assert tpu.report_lines(run, target, step, 0.4)[1].startswith("per device: parameters")
