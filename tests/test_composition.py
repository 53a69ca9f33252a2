"""Every objective the engine trains with every setting it offers, as a matrix: each cell trains
a few steps with evaluations, and the run continued from its checkpoint half way (as after a
crash, `--from_step 2`) ends at the same losses, gradient norms and evaluations, bit for bit,
and the same weights. A cell that cannot be is refused in one line when the config is read
(REFUSED).

The objectives: next-token prediction on a text, masked-token prediction (an encoder), an
encoder–decoder on text pairs, a decoder on text pairs, conversations, classification of
labelled texts, and of images (a Vision Transformer), and learning from rewards (a chat model's
sampled answers, scored). The settings: plain, a
mixture of experts, low-rank adapters, 2 microbatches, the batch split over 2 CPU cores (one
program per core, as train.py runs on a 2-core machine), scanned layers, a chunked loss, full
rematerialisation, multi-token prediction. The next-token row is in the quick set (26 s on a
2-vCPU Zen 5, before the multi-token column's 5 s); the other rows are slow (336 s together
on a 2-vCPU Zen 3 before the images row, which added 70 s there with other work beside it, and
the rewards row, 81 s on a Zen 4 beside a training run),
each cell's continued run loading the programs its straight run compiled from the compilation cache.
"""

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import small_run_config

from jaxgpt.config.problems import ConfigError
from jaxgpt.job.checkpoint import load_latest
from jaxgpt.job.trainer import train_and_evaluate

TIMING = {"tokens_per_sec", "tokens_per_sec_per_device", "mfu", "elapsed_sec"}
TIMING |= {"rl_sampled_tokens_per_sec", "rl_sampling_sec"}  # a rollout's speed

OBJECTIVES = {
    "next-token": {},
    "masked": {"model.causal": False, "model.objective": "masked"},
    "encoder-decoder": {"model.encoder_layers": 1, "data.source": "builtin:reverse"},
    "decoder-on-pairs": {"data.source": "builtin:reverse"},
    "conversations": {"data.source": "builtin:arithmetic-chat", "data.tokenizer": "byte"},
    "classification": {"model.objective": "classification", "data.source": "builtin:brackets"},
    "images": {
        "model.objective": "classification",
        "data.source": "builtin:digits",
        "model.causal": False,
        "model.patch_size": 4,
        "model.block_size": 17,
        "model.position": "learned",
    },
    "rewards": {  # learning from rewards: each step's batch is answers the model samples, scored
        "data.source": "builtin:arithmetic-chat",
        "data.tokenizer": "byte",
        "model.block_size": 48,
        "train.rl.samples": 4,
        "train.rl.prompts": 2,
        "train.rl.max_tokens": 8,
        "train.rl.reward": "number",  # any number within 100 times the answer's size: a signal from the start
        "train.rl.tolerance": 100.0,
    },
}
SETTINGS = {
    "plain": {},
    "moe": {"model.moe.experts": 4, "model.moe.top_k": 2},
    "lora": {"model.lora_rank": 2},
    "2-microbatches": {"train.microbatches": 2},
    "2-cpu-cores": {},  # the cores: `two_cores` below
    "scanned": {"model.scan_layers": True},
    "chunked-loss": {"model.loss_chunk": 8},
    "remat-full": {"model.remat": "full"},
    "multi-token": {"model.mtp_weight": 0.5},
}
# Cells that cannot be, refused when the config is read, and the line that says why: multi-token
# prediction guesses the token after next from the ones before, which an encoder (both sides), an
# encoder–decoder and a classifier do not; a chunked loss chunks a vocabulary's logits, and a
# classifier has a few.
NOT_NEXT_TOKENS = "model.mtp_weight=0.5 .*needs a causal next-token decoder"
REFUSED = {
    ("masked", "multi-token"): NOT_NEXT_TOKENS,
    ("encoder-decoder", "multi-token"): NOT_NEXT_TOKENS,
    ("classification", "multi-token"): NOT_NEXT_TOKENS,
    ("classification", "chunked-loss"): "model.loss_chunk=8 chunks the vocabulary's logits, and a classifier has a few",
    ("images", "multi-token"): NOT_NEXT_TOKENS,
    ("images", "chunked-loss"): "model.loss_chunk=8 chunks the vocabulary's logits, and a classifier has a few",
}


def cell_config(objective: str, setting: str):
    config = small_run_config(steps=4, warmup_steps=1, eval_every=2, eval_batches=1, checkpoint_every=2, log_every=1)
    config.update_from_flattened_dict(OBJECTIVES[objective] | SETTINGS[setting])
    config.mesh.data = 1  # one device, as train.py gives a run (not the test session's eight)
    return config


@pytest.fixture
def two_cores(monkeypatch):
    """Two of the test session's CPU devices standing for cores, as runtime.configure makes
    them on a 2-core machine: the batch split over them, one program each."""
    from jaxgpt.hardware import runtime

    monkeypatch.setattr(runtime, "_cpu_devices_are_cores", True)
    monkeypatch.setattr(runtime, "core_devices", lambda: jax.devices("cpu")[:2])


def metrics(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def trains_and_resumes_exactly(objective: str, setting: str, tmp_path, request, changes: dict | None = None):
    """The cell's run, straight and continued from step 2, alike to the bit; `changes` on top of
    the cell's config (an architecture's switches, tests/test_mixers.py)."""
    if setting == "2-cpu-cores":
        request.getfixturevalue("two_cores")
    config = cell_config(objective, setting)
    config.update_from_flattened_dict(changes or {})
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    if (objective, setting) in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[objective, setting]):
            train_and_evaluate(config, straight, progress=False)
        assert not straight.exists() or not any(straight.iterdir())  # refused before anything is written
        return
    train_and_evaluate(config, straight, progress=False)
    shutil.copytree(straight, stopped)  # the run as it stood: then continued from its checkpoint of step 2
    train_and_evaluate(config, stopped, progress=False, from_step=2)
    records = metrics(straight)
    assert [r["step"] for r in records if "val_loss" in r] == [2, 4]
    assert all(np.isfinite(r["val_loss"]) for r in records if "val_loss" in r)
    if objective == "rewards":  # the answers' rewards differed: a gradient, not a run of zeros
        assert any(r["grad_norm"] > 0 for r in records)
    assert metrics(stopped) == records
    _, a, _, step_a = load_latest(straight)
    _, b, _, step_b = load_latest(stopped)
    assert step_a == step_b == 4
    jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_next_token_prediction_composes_with_every_setting(setting, tmp_path, request):
    trains_and_resumes_exactly("next-token", setting, tmp_path, request)


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("objective", [o for o in OBJECTIVES if o != "next-token"])
def test_every_other_objective_composes_with_every_setting(objective, setting, tmp_path, request):
    trains_and_resumes_exactly(objective, setting, tmp_path, request)
