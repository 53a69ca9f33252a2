"""What a run shows: TensorBoard events, loss plots, attention maps, pre-flight checks, and the
Colab notebook executing top to bottom."""

import json
import math
import os
import struct
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import ROOT, run_script, small_run_config

from jaxgpt.commands.attention_maps import attention_maps
from jaxgpt.errors import UserError
from jaxgpt.job.checkpoint import load_latest
from jaxgpt.job.trainer import train_and_evaluate


@pytest.fixture(scope="module")
def trained(tmp_path_factory, trained_small_run):
    """Two short runs of different sizes: (workdir, workdir)."""
    config = small_run_config(steps=20)
    config.model.update(n_layer=3, d_model=48, n_head=4)
    wider = tmp_path_factory.mktemp("wider")
    assert train_and_evaluate(config, wider, progress=False)["step"] == 20
    return trained_small_run, wider


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk that every PNG starts with."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value}, read from the TFRecord event files without TensorFlow: each record
    is a length (u64), its CRC (u32), an Event protobuf, and the protobuf's CRC (u32)."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def test_tensorboard_events_carry_what_metrics_jsonl_logs(trained):
    workdir = trained[0]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    scalars = tensorboard_scalars(workdir / "tensorboard")
    logged = {r["step"]: r["train_loss"] for r in records}
    assert scalars["loss/train"] == pytest.approx(logged, rel=1e-6)  # event files store float32
    assert set(scalars["loss/val"]) == {r["step"] for r in records if "val_loss" in r}


def test_plot_draws_several_runs_at_the_documented_size(trained, tmp_path):
    out = tmp_path / "loss.png"
    result = run_script("jaxgpt.plot", *map(str, trained), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert png_size(out) == (1100, 400) and out.stat().st_size > 10_000
    speed = tmp_path / "speed.png"
    result = run_script("jaxgpt.plot", str(trained[0]), "--metric", "tokens_per_sec", "--out", str(speed))
    assert result.returncode == 0 and png_size(speed) == (1100, 400), result.stderr


def test_plot_rejects_a_metric_the_run_never_logged(trained, tmp_path):
    result = run_script("jaxgpt.plot", str(trained[0]), "--metric", "perplexity", "--out", str(tmp_path / "x.png"))
    assert result.returncode == 2 and result.stderr.strip().startswith("error: no 'perplexity' values")
    assert not (tmp_path / "x.png").exists()


def test_attention_maps_are_causal_distributions(trained):
    run, params, tokenizer, _ = load_latest(trained[1])
    ids = np.asarray(tokenizer.encode("def f(x): return x"))
    maps = attention_maps(run.model, params, ids)
    t = len(ids)
    assert maps.shape == (run.model.n_layer, run.model.n_head, t, t)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)  # float32 softmax rows
    assert np.all(maps[:, :, np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] == 0.0)
    assert np.all(maps[:, :, 0, 0] == 1.0)  # the first token can only attend to itself


def test_attention_maps_match_a_hand_computed_first_layer(trained):
    """Layer 0 from the weights with numpy: LayerNorm, the QKV projection, softmax(q k^T/sqrt(d))
    under the causal mask. The model has learned positions, so no rotation is involved."""
    run, params, tokenizer, _ = load_latest(trained[0])
    c = run.model
    ids = np.asarray(tokenizer.encode("import os"))
    p = jax.tree.map(np.asarray, params)
    x = p["wte"]["embedding"][ids] + p["wpe"]["embedding"][: len(ids)]
    norm = p["block_0"]["norm_1"]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + c.norm_eps) * norm["scale"] + norm["bias"]
    qkv = np.einsum("td,dkge->tkge", x, p["block_0"]["attn"]["qkv"]["kernel"]) + p["block_0"]["attn"]["qkv"]["bias"]
    q, k = qkv[:, :, 0], qkv[:, :, 1]  # one query per kv head (n_kv_head = n_head): group 1
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(c.head_dim)
    scores = np.where(np.tril(np.ones((len(ids), len(ids)), bool)), scores, -np.inf)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(attention_maps(c, params, ids)[0], expected, atol=1e-5)


def test_maps_at_initialisation_are_of_the_parameters_training_starts_from(trained, tmp_path, capsys):
    """--init rebuilds step 0 from config.json's seed: the parameters create_train_state gives
    the run, bit for bit; near-uniform attention at a 0.02 init."""
    import argparse

    from jaxgpt.commands import attention_maps as command
    from jaxgpt.commands import inspected
    from jaxgpt.config import run_config_from_dict
    from jaxgpt.optimizer import make_optimizer
    from jaxgpt.train_step import create_train_state

    workdir = trained[0]
    config, params, _, source = inspected.load_model(argparse.Namespace(init_from=None, init=True, workdir=workdir))
    run = run_config_from_dict(json.loads((workdir / "config.json").read_text()))
    start = jax.jit(lambda: create_train_state(run.model, make_optimizer(run.train), run.train.seed))()
    jax.tree.map(np.testing.assert_array_equal, params, start.params)
    assert source == "initialisation (step 0)"
    command.main(["--workdir", str(workdir), "--prompt", "x = 1", "--init", "--out", str(tmp_path / "init.png")])
    assert "(initialisation (step 0), 5 tokens, 2 layer(s) x 2 heads)" in capsys.readouterr().out
    maps = attention_maps(config, params, np.arange(5))
    np.testing.assert_allclose(maps[:, :, 4], 0.2, atol=0.01)  # the last row of five keys: each about 1/5


def test_maps_of_a_kept_step_and_of_the_scores(trained, tmp_path, capsys):
    from jaxgpt.commands import attention_maps as command

    run, params, tokenizer, _ = load_latest(trained[0], step=10)
    ids = np.asarray(tokenizer.encode("x = 1"))
    scores = attention_maps(run.model, params, ids, scores=True)
    weights = attention_maps(run.model, params, ids)
    np.testing.assert_allclose(jax.nn.softmax(scores, axis=-1), weights, rtol=1e-6, atol=1e-7)
    out = tmp_path / "scores.png"
    command.main(["--workdir", str(trained[0]), "--prompt", "x = 1", "--step", "10", "--scores", "--out", str(out)])
    assert "(step 10, 5 tokens" in capsys.readouterr().out and png_size(out) == (2 * 200, 2 * 200)


def test_attention_map_command_draws_one_panel_per_head(trained, tmp_path):
    out = tmp_path / "maps.png"
    result = run_script(
        "jaxgpt.attention_maps",
        "--workdir",
        str(trained[1]),
        "--prompt",
        "x = 1",
        "--layer",
        "2",
        "--out",
        str(out),
        devices=1,  # the run was saved from 8 devices: loading must not need them
    )
    assert result.returncode == 0, result.stderr
    assert png_size(out) == (4 * 200, 200)  # 4 heads of 2 x 2 inches at 100 dpi
    bad = run_script("jaxgpt.attention_maps", "--workdir", str(trained[1]), "--prompt", "x", "--layer", "3")
    assert bad.returncode == 2 and "--layer 3 is out of range" in bad.stderr


CHECK_FAST = ["--config", "configs/tiny.py", "--config.model.n_layer=2", "--overfit_steps=60"]


@pytest.mark.slow
def test_check_passes_a_healthy_config():
    result = run_script("jaxgpt.check", *CHECK_FAST, devices=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[1]: line.split()[0] for line in result.stdout.splitlines() if line[:4] in ("PASS", "INFO")}
    assert rows == {
        "initial": "PASS",
        "gradients": "PASS",
        "overfit": "PASS",
        "size": "INFO",
        "memory": "PASS",
        "kv": "INFO",
        "why": "INFO",
    }


def test_the_checks_pass_a_healthy_init_and_fail_a_too_large_one_in_its_row():
    """The checks behind `jaxgpt.check`, called in-process (the command's own output and exit
    status: the two slow tests beside this one)."""
    from jaxgpt.commands.preflight import run_checks

    healthy = {row.name: row.passed for row in run_checks(small_run_config(), overfit_steps=5)}
    assert healthy["initial loss"] is True and healthy["gradients"] is True and healthy["memory"] is True
    assert healthy["kv cache"] is None and healthy["why sqrt(d_k)"] is None  # information only
    config = small_run_config()
    config.model.init_std = 1.0  # logits of std ~ sqrt(d_model): the loss starts far above ln V
    failing = {row.name: row.passed for row in run_checks(config, overfit_steps=5)}
    assert failing["initial loss"] is False


def test_the_scale_keeps_unit_variance_scores_from_saturating_the_softmax():
    """The seeds' argument in sampled numbers. q.k of two N(0, s^2) vectors of d entries has
    variance d s^4: 64 at unit variance and d = 64, estimated from 256 x 512 dots, each a sum
    of 64 products of kurtosis 9 (the estimate's relative error ~ sqrt(2.1 / 131072) = 0.4%,
    so 5% is >10 sigma). Scaled, the scores have unit variance and the softmax spreads out;
    unscaled (std 8) it puts most of the weight on one key. At a 0.02 init (q entries of std
    sqrt(128) x 0.02 = 0.23) both stay within 2% of uniform's entropy."""
    from jaxgpt.commands.preflight import score_statistics

    unit = score_statistics(head_dim=64, std=1.0, keys=512)
    assert unit["variance"] == pytest.approx(64, rel=0.05)
    assert unit["unscaled"]["max_weight"] > 0.5 > 0.1 > unit["scaled"]["max_weight"]
    assert unit["unscaled"]["entropy"] < 1.5 < 0.8 * math.log(512) < unit["scaled"]["entropy"]
    init = score_statistics(head_dim=64, std=math.sqrt(128) * 0.02, keys=512)
    assert init["variance"] == pytest.approx(64 * (128 * 0.02**2) ** 2, rel=0.05)
    for scaling in ("scaled", "unscaled"):
        assert init[scaling]["entropy"] > 0.98 * math.log(512)


@pytest.mark.slow
def test_check_fails_a_too_large_init_and_names_the_row():
    result = run_script("jaxgpt.check", *CHECK_FAST, "--config.model.init_std=1.0", devices=2)
    assert result.returncode == 1
    failing = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert any("initial loss" in line for line in failing), result.stdout
    assert "failed: initial loss" in result.stderr


@pytest.mark.slow
def test_colab_notebook_executes_top_to_bottom(tmp_path):
    """Opened where it lies (notebooks/), as from a clone, with the install cell run twice:
    rerunning it must find the same checkout, not step into jaxgpt/jaxgpt."""
    import copy

    import nbclient
    import nbformat

    notebook = nbformat.read(ROOT / "notebooks" / "colab_tpu.ipynb", as_version=4)
    install = next(i for i, cell in enumerate(notebook.cells) if "checkout_root()" in cell.source)
    notebook.cells.insert(install + 1, copy.deepcopy(notebook.cells[install]))
    env = {"JAXGPT_NOTEBOOK_QUICK": "1", "JAXGPT_NOTEBOOK_WORKDIR": str(tmp_path / "runs")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        nbclient.NotebookClient(
            notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": ROOT / "notebooks"}}
        ).execute()
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    for cell in notebook.cells[install : install + 2]:
        assert [out["text"] for out in cell.outputs if out.get("name") == "stdout"] == [f"working in {ROOT}\n"]
    assert (tmp_path / "runs" / "loss.png").stat().st_size > 10_000
    assert (tmp_path / "runs" / "resume" / "metrics.jsonl").exists()


def test_on_colab_an_empty_repo_url_stops_the_first_cell_with_one_sentence(monkeypatch, capsys):
    """The first cell as IPython runs it, with google.colab imported and no clone yet: one
    line naming the edit, no traceback; with REPO_URL set the cell runs through."""
    import types

    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    cells = nbformat.read(ROOT / "notebooks" / "colab_tpu.ipynb", as_version=4).cells
    first = next(cell for cell in cells if cell.cell_type == "code")
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    shell = InteractiveShell.instance()
    try:
        result = shell.run_cell(first.source)
        shown = capsys.readouterr().out.strip().splitlines()
        assert type(result.error_in_exec).__name__ == "SetupNeeded"
        assert shown == [
            "Set REPO_URL in this cell to the git URL of your copy of jaxgpt "
            "(e.g. https://github.com/<you>/jaxgpt), then run this cell again."
        ]
        set_url = first.source.replace('REPO_URL = ""', 'REPO_URL = "https://example.org/jaxgpt.git"')
        assert shell.run_cell(set_url).success
    finally:
        InteractiveShell.clear_instance()


class FakeWandb:
    """Stands in for the wandb package (not installed here, and it would need the network):
    records what jaxgpt hands it."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], False

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, scalars, step):
        self.logged.append((step, scalars))

    def finish(self):
        self.finished = True


def test_wandb_receives_every_logged_record(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    train_and_evaluate(small_run_config(steps=10, wandb_project="jaxgpt-tests"), tmp_path, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert fake.inits[0]["project"] == "jaxgpt-tests" and fake.inits[0]["config"]["train"]["steps"] == 10
    assert [step for step, _ in fake.logged] == [r["step"] for r in records]
    assert [s["loss/train"] for _, s in fake.logged] == [r["train_loss"] for r in records]
    assert fake.finished


def test_wandb_asked_for_but_missing_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(UserError, match="needs wandb; pip install wandb"):
        train_and_evaluate(small_run_config(steps=10, wandb_project="p"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # refused before anything was written
