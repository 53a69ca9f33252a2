"""The GPT-2 124M recipe (docs/gpt2_124m.md), rehearsed on a CPU: local parquet shards shaped
like FineWeb-edu's, prepared by the recipe's command and killed part way, prepared to the end
by the same command again, a few steps of configs/gpt2_124m.py's model (shrunk) trained on
them with document-aware batches and scored on multiple-choice questions during training and
after it."""

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, run_script

from jaxgpt import data
from jaxgpt.config_files import resolve

pytestmark = pytest.mark.slow
QUESTIONS = ROOT / "tests" / "data" / "hellaswag_sample.jsonl"


def write_fineweb_like(folder, shards: int = 3) -> None:
    """Parquet shards with FineWeb-edu's columns, a document per paragraph of the Python
    reference shipped with CPython (short documents, as web pages are)."""
    from pydoc_data.topics import topics

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [p.strip() for name in sorted(topics) for p in topics[name].split("\n\n") if len(p.strip()) > 40]
    folder.mkdir()
    for shard in range(shards):
        part = texts[shard::shards]
        n = len(part)
        columns = {"text": part, "id": [f"<urn:uuid:{shard}-{i}>" for i in range(n)], "dump": ["CC-MAIN-2024-10"] * n}
        columns |= {"url": [f"https://example.org/{shard}/{i}" for i in range(n)], "score": [3.0] * n}
        columns |= {"int_score": [3] * n, "token_count": [len(text) // 4 for text in part]}
        pq.write_table(pa.table(columns), folder / f"{shard:03d}_00000.parquet")


def test_the_recipe_from_parquet_shards_to_a_multiple_choice_score(tmp_path, gpt2_bpe):
    corpus, cache, workdir = tmp_path / "sample-10BT", tmp_path / "cache", tmp_path / "run"
    write_fineweb_like(corpus)
    recipe = ["--config", "configs/gpt2_124m.py", f"--config.data.source=text:{corpus}"]
    recipe += [f"--config.data.cache_dir={cache}", "--config.data.max_tokens=0", "--config.data.shard_tokens=20000"]
    env = os.environ | {"PYTHONPATH": str(ROOT), data.WORKERS_ENV: "2"}  # workers, even on 2 cores

    # Prepare, killed (with its tokenizing workers) once two shards are whole, then again to the end.
    command = [sys.executable, "-m", "jaxgpt", "prepare", *recipe]
    killed = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    (staging,) = _wait_for(lambda: list((cache / "data").glob(".preparing-*")), killed)
    _wait_for(lambda: (staging / "record-00001.json").exists(), killed)
    os.killpg(killed.pid, signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL, "the preparation ended before it could be killed"
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr
    assert re.search(r"from shard [2-9]", finished.stderr), finished.stderr  # it continued, not started over
    assert "tokens" in finished.stdout and "token files" in finished.stdout, finished.stdout

    # Exactly the tokens an uninterrupted preparation writes.
    config = resolve(_config(corpus, tmp_path / "uninterrupted")).data
    whole, resumed = data.prepare(config, progress=False), data.prepare(resolve(_config(corpus, cache)).data, False)
    for a, b in ((whole.train, resumed.train), (whole.val, resumed.val), (whole.documents, resumed.documents)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert isinstance(resumed.train, data.TokenShards) and len(resumed.documents) > 1000

    # A few steps of the recipe's model, shrunk to a CPU, with document-aware batches and the yardstick.
    shrink = ["--config.model.n_layer=2", "--config.model.d_model=64", "--config.model.n_head=2"]
    shrink += ["--config.model.block_size=128", "--config.train.dtype=float32", "--config.train.batch_size=8"]
    shrink += ["--config.train.steps=6", "--config.train.warmup_steps=2", "--config.train.eval_every=6"]
    shrink += ["--config.train.eval_batches=2", "--config.train.log_every=2", "--config.train.checkpoint_every=6"]
    shrink += ["--config.data.align_to_documents=true", f"--config.train.multiple_choice={QUESTIONS}"]
    shrink += ["--config.train.multiple_choice_every=3", "--quiet"]
    trained = run_script("train.py", *recipe, *shrink, "--workdir", str(workdir), timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    scored = [r for r in records if "multiple_choice_accuracy" in r]
    assert [r["step"] for r in scored] == [3, 6]
    assert all(0 <= r["multiple_choice_accuracy_norm"] <= 1 for r in scored)
    assert np.isfinite([r["val_loss"] for r in records if "val_loss" in r]).all()
    score = run_script("jaxgpt", "hellaswag", "--workdir", str(workdir), "--questions", str(QUESTIONS))
    assert score.returncode == 0, score.stderr
    assert "3 questions" in score.stdout and f"{scored[-1]['multiple_choice_accuracy_norm']:.4f}" in score.stdout


def _config(corpus, cache):
    config = importlib.import_module("configs.gpt2_124m").get_config()
    config.data.update(source=f"text:{corpus}", cache_dir=str(cache), max_tokens=0, shard_tokens=20000)
    return config


def _wait_for(found, process, seconds: float = 300):
    deadline = time.monotonic() + seconds
    while not (result := found()):
        assert process.poll() is None, "the preparation ended before it could be killed"
        assert time.monotonic() < deadline, "the preparation made no progress"
        time.sleep(0.002)
    return result
