"""The benchmark script the others build on runs as written: bench/train_throughput.py builds the
step train.py runs, feeds it the batch contract's dicts and reports one JSON line. bench/moe_cost.py,
bench/step_profile.py, bench/suite.py and bench/gpu_session.py's GPT-2 stage all call it; it
once handed the step a bare array after the batch contract changed, and every one of them failed
without a test noticing."""

import json

import numpy as np
import pytest
from conftest import run_script


@pytest.mark.slow  # one fresh process compiling a one-layer step: 6-11 s
def test_train_throughput_times_the_step_train_py_runs():
    # two CPU devices, one per core as train.py makes them on a 2-core machine (the per-core step)
    done = run_script(
        "bench/train_throughput.py", "--config", "configs/tiny.py", "--config.model.n_layer=1",
        "--steps", "2", "--repeats", "2", devices=2, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    tokens = 12 * 128  # configs/tiny.py: batch_size 12, block_size 128
    assert result["tokens_per_sec"] * result["step_ms"] / 1000 == pytest.approx(tokens, rel=1e-9)
    assert result["cores"] == 2 and result["microbatches"] >= 1 and 0 < result["mfu"] < 1  # the per-core step
    assert 0 < result["host_cpu_ms"] <= result["step_ms"]  # one thread's CPU time, within the wall time


def test_nanogpt_data_writes_the_split_train_py_trains_on(tmp_path):
    """bench/nanogpt_data.py hands nanoGPT's train.py the very tokens train.py reads: the prepared
    train and validation split as uint16 files, and the vocabulary its meta.pkl must give."""
    import pickle

    import numpy as np

    from jaxgpt import data
    from jaxgpt.config import DataConfig

    (tmp_path / "train.py").write_text("")  # a nanoGPT checkout, as far as the script can tell
    done = run_script("bench/nanogpt_data.py", str(tmp_path), "--name", "corpus", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    folder, dataset = tmp_path / "data" / "corpus", data.prepare(DataConfig(), progress=False)
    np.testing.assert_array_equal(np.fromfile(folder / "train.bin", np.uint16), dataset.train)
    np.testing.assert_array_equal(np.fromfile(folder / "val.bin", np.uint16), dataset.val)
    assert pickle.loads((folder / "meta.pkl").read_bytes()) == {"vocab_size": dataset.tokenizer.vocab_size}
    assert "--dataset=corpus" in done.stdout
    refused = run_script("bench/nanogpt_data.py", str(tmp_path / "data"), timeout=120)
    assert refused.returncode != 0 and "has no train.py" in refused.stderr


@pytest.mark.slow  # one train.py process of a one-layer tiny: 8-12 s
def test_first_steps_records_a_config_and_names_the_first_field_a_change_moves(tmp_path):
    """bench/first_steps.py, the check that a change of the engine leaves the shipped configs'
    losses alone: it records tiny's logged steps without their timings, finds a run equal to
    itself, and names the step and field where a copy with one loss moved in its last bit
    differs."""
    import importlib.util

    from conftest import ROOT

    out = tmp_path / "steps.json"
    done = run_script("bench/first_steps.py", "--configs", "tiny", "--steps", "2", "--eval_every", "2",
                      "--out", str(out), devices=1, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    records = json.loads(out.read_text())["tiny"]
    assert isinstance(records, list), records  # else the end of its error output
    assert [r["step"] for r in records] == [1, 2] and "val_loss" in records[-1] and "mfu" not in records[-1]
    spec = importlib.util.spec_from_file_location("first_steps", ROOT / "bench" / "first_steps.py")
    first_steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(first_steps)
    assert first_steps.first_difference(records, records) == "identical (2 records)"
    moved = json.loads(json.dumps(records))
    moved[1]["train_loss"] = float(np.nextafter(moved[1]["train_loss"], np.inf))
    assert first_steps.first_difference(records, moved).startswith("differs at step 2: train_loss")
