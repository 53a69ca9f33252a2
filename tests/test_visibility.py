"""What a run shows: TensorBoard events, loss plots, attention maps, pre-flight checks, and the
Colab notebook executing top to bottom."""

import importlib.util
import json
import math
import os
import re
import struct
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import ROOT, run_script, small_run_config

from jaxgpt.commands import plot
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


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch, to show it unloaded")
def test_the_tensorboard_log_leaves_pytorch_unloaded_and_importable(tmp_path):
    """tensorboardX imports PyTorch where it is installed (1.8 s of every run's start,
    docs/benchmarks.md "Start-up"); a run's metrics log opens its event file without loading it,
    and the process can still import torch afterwards."""
    code = (
        "import sys; from pathlib import Path; from jaxgpt.job.metrics import MetricsLog; "
        f"log = MetricsLog(Path({str(tmp_path)!r})); log.write({{'step': 1, 'train_loss': 2.5}}); log.close(); "
        "print('torch' in sys.modules); import torch; print(torch.ones(1).item())"
    )
    result = run_script("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "1.0"]
    assert tensorboard_scalars(tmp_path / "tensorboard")["loss/train"] == {1: 2.5}


def test_plot_draws_several_runs_at_the_documented_size(trained, tmp_path):
    out = tmp_path / "loss.png"
    result = run_script("jaxgpt", "plot", *map(str, trained), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert png_size(out) == (1100, 400) and out.stat().st_size > 10_000
    speed = tmp_path / "speed.png"
    result = run_script("jaxgpt", "plot", str(trained[0]), "--metric", "tokens_per_sec", "--out", str(speed))
    assert result.returncode == 0 and png_size(speed) == (1100, 400), result.stderr


def test_a_run_evaluated_once_shows_its_validation_point(tmp_path):
    """A line through one point draws nothing: the evaluations must be marked to be seen."""
    (tmp_path / "config.json").write_text('{"train": {"batch_size": 8}, "model": {"block_size": 32}}')
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 5, "train_loss": 4.0}\n{"step": 10, "train_loss": 3.5, "val_loss": 3.6}\n'
    )
    figure = plot.draw_runs([tmp_path], "loss")
    lines = [line for axes in figure.axes for line in axes.get_lines()]
    single = [line for line in lines if len(line.get_xdata()) == 1]
    assert len(single) == 2 and all(line.get_marker() not in ("None", "", None) for line in single)
    assert all(line.get_label().endswith("val") for line in single)


def test_a_run_learning_from_rewards_is_drawn_against_the_tokens_its_rows_hold(tmp_path):
    """rl_reward by its name on the axis; tokens seen are batch x train.rl.length where set."""
    config = {"train": {"batch_size": 32, "rl": {"length": 40}}, "model": {"block_size": 128}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "metrics.jsonl").write_text('{"step": 10, "rl_reward": 0.5}\n{"step": 20, "rl_reward": 0.75}\n')
    figure = plot.draw_runs([tmp_path], "rl_reward")
    by_step, by_tokens = figure.axes
    assert list(by_tokens.get_lines()[0].get_xdata()) == [10 * 32 * 40, 20 * 32 * 40]
    assert by_step.get_ylabel() == "mean reward of the sampled answers"


def test_each_logged_training_loss_is_drawn_at_the_middle_of_the_steps_it_averages(tmp_path):
    """Logged every 10 steps with an evaluation at 25 (an interval cut short): the mean over
    steps 21-25 is drawn at 23 and the one over 26-30 at 28, not at 25 and 30, so the shorter
    interval's mean (over later, lower losses) does not read as a dip. Val points stay at their
    steps."""
    (tmp_path / "config.json").write_text('{"train": {"batch_size": 8}, "model": {"block_size": 32}}')
    records = [(10, 4.0), (20, 3.0), (25, 2.6, 2.7), (30, 2.4)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": r[0], "train_loss": r[1]} | ({"val_loss": r[2]} if len(r) > 2 else {})) + "\n"
                for r in records)
    )  # fmt: skip
    train, val = plot.curves(plot.read_metrics(tmp_path), "loss").values()
    assert train == ([5.5, 15.5, 23.0, 28.0], [4.0, 3.0, 2.6, 2.4]) and val == ([25], [2.7])


def test_plot_rejects_a_metric_the_run_never_logged(trained, tmp_path):
    result = run_script("jaxgpt", "plot", str(trained[0]), "--metric", "perplexity", "--out", str(tmp_path / "x.png"))
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
    from jaxgpt.commands import attention_maps as command
    from jaxgpt.commands import inspected
    from jaxgpt.config import run_config_from_dict
    from jaxgpt.training.optimizer import make_optimizer
    from jaxgpt.training.train_step import create_train_state

    workdir = trained[0]
    config, params, _, source = inspected.load(workdir, init=True)
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
    # two heads of 2 x 2 inches, two layers, and the 0.7-inch colour bar at 100 dpi
    assert "(step 10, 5 tokens" in capsys.readouterr().out and png_size(out) == (2 * 200 + 70, 2 * 200)


def test_attention_map_command_draws_one_panel_per_head(trained, tmp_path):
    out = tmp_path / "maps.png"
    result = run_script(
        "jaxgpt",
        "attention-maps",
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
    assert png_size(out) == (4 * 200 + 70, 200)  # 4 heads of 2 x 2 inches and a 0.7-inch colour bar at 100 dpi
    bad = run_script("jaxgpt", "attention-maps", "--workdir", str(trained[1]), "--prompt", "x", "--layer", "3")
    assert bad.returncode == 2 and "--layer 3 is out of range" in bad.stderr


CHECK_FAST = ["--config", "configs/tiny.py", "--config.model.n_layer=2", "--overfit_steps=60"]


def test_the_checks_pass_a_healthy_init_and_fail_a_too_large_one_in_its_row(tmp_path):
    """The checks behind `jaxgpt check`, called in-process (the command's own output and exit
    status: the slow test below on a 2-device mesh, and the README's table, each row's verdict
    and numbers, in tests/test_readme_runs.py), on a text no run has prepared yet: the check
    prepares it as training would (it once read the config's data section unresolved and failed
    there, on any machine where the data was not yet prepared)."""
    from jaxgpt.commands.preflight import run_checks

    book = tmp_path / "book.txt"
    book.write_text("It was the best of times, it was the worst of times. " * 200)
    config = small_run_config()
    config.data.source = f"text:{book}"
    healthy = {row.name: row.passed for row in run_checks(config, overfit_steps=5)}
    assert healthy["initial loss"] is True and healthy["gradients"] is True and healthy["memory"] is True
    assert healthy["kv cache"] is None and healthy["why sqrt(d_k)"] is None  # information only
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


def test_check_sizes_a_model_too_large_for_this_machine_before_refusing_it():
    """The texts' exercise: a 32-layer, 4096-wide GPT counted on a laptop. Its size row is
    printed (from shapes, nothing allocated), then the memory refusal. By hand, per block: qkv
    and out 4 d^2 + 4 d, the MLP 8 d^2 + 5 d, two LayerNorms 4 d; then the token table (the
    corpus's 103 characters), 128 learned positions and the final norm."""
    d = 4096
    params = 32 * (12 * d * d + 13 * d) + (103 + 128 + 2) * d
    result = run_script("jaxgpt", "check", "--config", "configs/tiny.py", "--config.model.n_layer=32",
                        f"--config.model.d_model={d}", "--config.model.n_head=32", devices=2)  # fmt: skip
    refusal = result.stderr.strip().splitlines()[-1]  # after the fake devices' own warning
    assert result.returncode == 2 and refusal.startswith("error: train.batch_size=12"), result.stderr
    size = next(line for line in result.stdout.splitlines() if line.startswith("INFO  size"))
    assert f"{params:,} parameters" in size and "kv cache" in result.stdout


@pytest.mark.slow
def test_check_fails_a_too_large_init_and_names_the_row():
    result = run_script("jaxgpt", "check", *CHECK_FAST, "--config.model.init_std=1.0", devices=2)
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
    install = next(i for i, cell in enumerate(notebook.cells) if "working in" in cell.source)
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
    tiny = next(cell for cell in notebook.cells if 'show_run(WORKDIR / "tiny")' in cell.source)
    table = "".join(out["text"] for out in tiny.outputs if out.get("name") == "stdout").splitlines()
    assert table[0].split() == ["tiny:", "step", "train", "val", "bits/byte", "tokens/s"]  # a table, not a dict
    assert [int(row.split()[0]) for row in table[1:]] == [10, 20]  # the quick tour's evaluations


def first_cell_on_colab(monkeypatch, tmp_path, uploads: dict, repo_url: str | None = None):
    """The notebook's first cell as IPython runs it on Colab (google.colab importable, files.upload
    answering `uploads`), away from any checkout, fetching into tmp_path/jaxgpt. Returns the
    cell's result, what it printed, and its namespace."""
    import types

    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    cells = nbformat.read(ROOT / "notebooks" / "colab_tpu.ipynb", as_version=4).cells
    source = next(cell for cell in cells if cell.cell_type == "code").source
    if repo_url is not None:
        source = source.replace('REPO_URL = "https://github.com/OWNER/jaxgpt"', f"REPO_URL = {repo_url!r}")
    colab = types.ModuleType("google.colab")
    colab.files = types.SimpleNamespace(upload=lambda: uploads)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setenv("JAXGPT_NOTEBOOK_CHECKOUT", str(tmp_path / "jaxgpt"))
    monkeypatch.chdir(tmp_path)
    shell = InteractiveShell.instance()
    try:
        return shell.run_cell(source), dict(shell.user_ns)
    finally:
        InteractiveShell.clear_instance()


def zipped_checkout(top: str, names=("train.py", "jaxgpt/__init__.py", "requirements.txt")) -> bytes:
    """A .zip of this checkout's files (by default those that mark it as one) under one top
    folder, as GitHub's "Download ZIP" makes it."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in names:
            archive.write(ROOT / name, f"{top}/{name}")
    return buffer.getvalue()


def test_on_colab_without_an_address_the_first_cell_unpacks_an_uploaded_checkout(monkeypatch, tmp_path, capsys):
    result, names = first_cell_on_colab(monkeypatch, tmp_path, {"jaxgpt-main.zip": zipped_checkout("jaxgpt-main")})
    assert result.success, result.error_in_exec
    assert names["checkout_root"]() == tmp_path / "jaxgpt"
    assert (tmp_path / "jaxgpt" / "train.py").read_bytes() == (ROOT / "train.py").read_bytes()
    assert "upload an archive of a jaxgpt checkout" in capsys.readouterr().out


def test_on_colab_nothing_uploaded_or_not_a_checkout_is_one_sentence(monkeypatch, tmp_path, capsys):
    result, _ = first_cell_on_colab(monkeypatch, tmp_path, {})
    assert type(result.error_in_exec).__name__ == "SetupNeeded"
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("Nothing was uploaded: set REPO_URL")
    result, _ = first_cell_on_colab(monkeypatch, tmp_path, {"notes.zip": zipped_checkout("x", ["requirements.txt"])})
    assert type(result.error_in_exec).__name__ == "SetupNeeded"
    assert "is not an archive of a jaxgpt checkout" in capsys.readouterr().out
    assert not (tmp_path / "jaxgpt").exists()


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="clones this checkout, which is not a git repository here")
def test_on_colab_with_an_address_the_first_cell_clones_it(monkeypatch, tmp_path):
    result, names = first_cell_on_colab(monkeypatch, tmp_path, {}, repo_url=str(ROOT))  # a local clone: offline
    assert result.success, result.error_in_exec
    assert names["checkout_root"]() == tmp_path / "jaxgpt" and (tmp_path / "jaxgpt" / ".git").is_dir()


def test_the_colab_links_and_the_clone_name_one_repository_that_one_command_sets(tmp_path):
    """Every Colab link and REPO_URL name the same repository and the notebook that exists;
    set_repository.py changes them all at once (run on a copy of the files it edits)."""
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import set_repository
    finally:
        sys.path.remove(str(ROOT / "notebooks"))
    assert set_repository.repositories() == {"OWNER/jaxgpt"}  # until the publisher runs it
    for place in set_repository.PLACES:
        text = (ROOT / place).read_text()
        for path in re.findall(r"colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/main/([\w/.-]+)", text):
            assert (ROOT / path).is_file(), (place, path)
        (tmp_path / place).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / place).write_text(text)
    (tmp_path / "notebooks" / "set_repository.py").write_bytes((ROOT / "notebooks" / "set_repository.py").read_bytes())
    result = run_script(str(tmp_path / "notebooks" / "set_repository.py"), "alice/jax-gpt")
    assert result.returncode == 0, result.stderr
    assert set_repository.repositories(tmp_path) == {"alice/jax-gpt"}


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


@pytest.mark.parametrize(
    "norms, passed, detail",
    [
        ({"wte": 3.0, "block_0": 4.0, "block_1": 12.0}, True, "global norm 13; smallest wte 3, largest block_1 12"),
        ({"wte": 3.0, "block_0": 0.0, "block_1": 12.0}, False, "zero in block_0; global norm 12.4"),
        ({"wte": 3.0, "block_0": math.nan, "block_1": 12.0}, False, "not finite in block_0; "),
        ({"wte": 60.0, "block_0": 80.0, "block_1": 1.0}, False, "exploding (limit 100); global norm 100"),
    ],
    ids=["healthy", "frozen", "non-finite", "exploding"],
)
def test_the_gradients_row_names_a_frozen_a_non_finite_or_an_exploding_gradient(norms, passed, detail):
    """The global norm is the root of the squares' sum (3-4-12-13 by hand; 60-80-1 gives
    100.005, just past the limit of 100); a layer whose gradient is exactly zero is frozen."""
    from jaxgpt.commands.preflight import gradients_row

    row = gradients_row(norms)
    assert row.passed is passed and row.detail.startswith(detail), row.detail


@pytest.mark.parametrize(
    "runtime, installed",
    [
        ("tpu", ["-r", "requirements.txt", "jax[tpu]==0.10.2"]),
        ("gpu", ["-r", "requirements.txt", "jax[cuda12]==0.10.2"]),
        ("cpu", ["-r", "requirements.txt"]),
    ],
)
def test_on_colab_the_install_cell_installs_jax_for_the_runtimes_accelerator(runtime, installed, monkeypatch, tmp_path):
    """The install cell as Colab runs it, from this checkout, on each kind of runtime: a TPU's
    (COLAB_TPU_ADDR set), a GPU's (nvidia-smi on the PATH), a CPU's; pip asked for the pinned
    requirements and, with an accelerator, JAX's build for it (the CPU jaxlib alone on a GPU
    once: training there ran on the CPU)."""
    import stat
    import subprocess as subprocesses
    import types

    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    cells = nbformat.read(ROOT / "notebooks" / "colab_tpu.ipynb", as_version=4).cells
    code = [cell.source for cell in cells if cell.cell_type == "code"]
    install = next(source for source in code if "working in" in source)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi but the one a GPU runtime gets below
    if runtime == "tpu":
        monkeypatch.setenv("COLAB_TPU_ADDR", "10.0.0.2:8470")
    if runtime == "gpu":
        (tmp_path / "nvidia-smi").write_text("#!/bin/sh\n")
        (tmp_path / "nvidia-smi").chmod(stat.S_IRWXU)
    asked = []
    monkeypatch.setattr(subprocesses, "run", lambda args, **kwargs: asked.append(args[args.index("install") + 2 :]))
    monkeypatch.chdir(ROOT)
    shell = InteractiveShell.instance()
    try:
        for source in (code[0], install):
            result = shell.run_cell(source)
            assert result.success, result.error_in_exec
    finally:
        InteractiveShell.clear_instance()
    assert [argument for command in asked for argument in command] == installed
