"""Resuming: exact after a stop, SIGTERM or kill -9; safe against damaged checkpoints and
configs from another run. "Exact" means bit-identical parameters and metrics."""

import json
import shutil
import signal
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import run_script, small_run_config

from jaxgpt.errors import UserError
from jaxgpt.job.checkpoint import Checkpoints, load_latest
from jaxgpt.job.trainer import train_and_evaluate

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

ROOT = Path(__file__).resolve().parents[1]
# Wall-clock figures differ from run to run.
TIMING_KEYS = {"tokens_per_sec", "tokens_per_sec_per_device", "mfu", "elapsed_sec"}


def metrics(workdir):
    lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


def assert_same_run(a, b):
    assert metrics(a) == metrics(b)
    _, params_a, _, step_a = load_latest(a)
    _, params_b, _, step_b = load_latest(b)
    assert step_a == step_b
    jax.tree.map(np.testing.assert_array_equal, params_a, params_b)


@pytest.fixture
def straight(trained_small_run):
    """The reference: small_run_config(steps=20) without interruption (trained once, shared)."""
    return trained_small_run


def test_stop_then_resume_equals_the_straight_run(straight, tmp_path):
    # Step 7 is neither a logging nor a checkpoint step: its interval's losses must travel.
    stopped = train_and_evaluate(small_run_config(steps=20), tmp_path, progress=False, stop_at=7)
    assert stopped["stopped"] and stopped["step"] == 7
    train_and_evaluate(small_run_config(steps=20), tmp_path, progress=False)
    assert_same_run(tmp_path, straight)


def test_rerunning_a_finished_run_changes_nothing(straight, capsys):
    before = (straight / "metrics.jsonl").read_text()
    train_and_evaluate(small_run_config(steps=20), straight, progress=True)
    assert "already trained to step 20" in capsys.readouterr().out
    assert (straight / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("kind", ["huggingface", "bpe"])
def test_a_run_keeps_its_tokenizer_when_the_folder_it_came_from_changes_or_goes(kind, tmp_path, capsys):
    """A run tokenized by a folder's tokenizer.json (a Hugging Face one, a BPE `jaxgpt tokenizer`
    trained) stopped at step 2, the folder then trained again on other text: the resume says so
    in one line and continues with the run's own copy, to the losses of the straight run (the
    corpus is not tokenized anew with the other vocabulary); with the folder gone, sampling reads
    the run's copy too."""
    from test_tokenizers import hugging_face_folder

    from jaxgpt.tokenizers import make_tokenizer, train_bpe

    def tokenizer_folder(text: str):
        if kind == "huggingface":
            return hugging_face_folder(tmp_path / "tok", text, 300)
        (tmp_path / "tok").mkdir(exist_ok=True)
        (tmp_path / "tok" / "tokenizer.json").write_text(train_bpe([text], 300).tokenizer_json())
        return tmp_path / "tok"

    folder = tokenizer_folder(Path(__file__).read_text())
    config = small_run_config(steps=4, eval_every=2, checkpoint_every=2, log_every=1)
    config.data.tokenizer = str(folder)
    train_and_evaluate(config, tmp_path / "straight", progress=False)
    train_and_evaluate(config, tmp_path / "resumed", progress=False, stop_at=2)
    _, _, before, _ = load_latest(tmp_path / "resumed")
    tokenizer_folder("some other text, another vocabulary entirely " * 50)
    text = "def test_resume(tmp_path):"
    assert make_tokenizer(str(folder)).encode(text) != before.encode(text)  # the folder now tokenizes otherwise
    capsys.readouterr()
    train_and_evaluate(config, tmp_path / "resumed", progress=False)
    said = f"warning: {folder / 'tokenizer.json'} has changed since this run was made"
    assert capsys.readouterr().err.count(said) == 1
    assert_same_run(tmp_path / "resumed", tmp_path / "straight")
    shutil.rmtree(folder)
    _, _, after, _ = load_latest(tmp_path / "resumed")
    assert after.encode(text) == before.encode(text)


def test_cadence_fields_may_change_on_resume(tmp_path):
    train_and_evaluate(small_run_config(steps=10), tmp_path, progress=False)
    train_and_evaluate(
        small_run_config(steps=20, log_every=2, eval_every=4, checkpoint_every=4), tmp_path, progress=False
    )
    steps = [m["step"] for m in metrics(tmp_path)]
    assert steps == [5, 10, 12, 14, 16, 18, 20] and len(set(steps)) == len(steps)


def test_another_model_is_refused_and_nothing_is_touched(straight):
    listing = sorted((p.name, p.stat().st_mtime_ns) for p in (straight / "checkpoints").iterdir())
    config_json = (straight / "config.json").read_text()
    other = small_run_config(steps=20)
    other.model.n_layer = 3
    with pytest.raises(UserError, match=r"cannot resume .*model\.n_layer: 2 -> 3.*--fresh"):
        train_and_evaluate(other, straight, progress=False)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (straight / "checkpoints").iterdir()) == listing
    assert (straight / "config.json").read_text() == config_json


def test_fresh_moves_the_old_run_aside(tmp_path):
    run = tmp_path / "run"
    train_and_evaluate(small_run_config(steps=10), run, progress=False)
    other = small_run_config(steps=5, warmup_steps=1)
    other.model.n_layer = 1
    train_and_evaluate(other, run, progress=False, fresh=True)
    assert [m["step"] for m in metrics(run)] == [5]
    assert (tmp_path / "run.previous-1" / "checkpoints" / "10").is_dir()  # kept, not deleted


def damage(checkpoint: Path) -> None:
    """Truncate every array file of the checkpoint to half: which file holds which shard
    depends on the device layout, so damaging only one might miss what restore reads."""
    for path in (checkpoint / "state").rglob("*"):
        if path.is_file() and path.stat().st_size > 0:
            with open(path, "r+b") as f:
                f.truncate(path.stat().st_size // 2)


def test_an_unreadable_latest_checkpoint_falls_back_to_the_previous(tmp_path, capsys):
    train_and_evaluate(small_run_config(steps=20, checkpoint_every=5), tmp_path, progress=False)
    damage(tmp_path / "checkpoints" / "20")
    last = train_and_evaluate(small_run_config(steps=25, checkpoint_every=5), tmp_path, progress=False)
    assert "checkpoint 20 cannot be read" in capsys.readouterr().err
    assert (tmp_path / "checkpoints" / "20.unreadable").is_dir()  # moved aside, not deleted
    assert last["step"] == 25
    assert [m["step"] for m in metrics(tmp_path)] == [5, 10, 15, 20, 25]


def test_no_readable_checkpoint_is_an_error_and_nothing_is_changed(tmp_path):
    train_and_evaluate(small_run_config(steps=20, checkpoint_every=10), tmp_path, progress=False)
    for step in ("10", "20"):
        damage(tmp_path / "checkpoints" / step)
    listing = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(UserError, match="none of the 2 checkpoints .* can be read .*nothing was changed"):
        train_and_evaluate(small_run_config(steps=20, checkpoint_every=10), tmp_path, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == listing


# ---------------------------------------------------------------------------- real processes

CLI_RUN = dict(steps=300, log_every=1, eval_every=150, checkpoint_every=10)


def cli_args(workdir, **train):
    overrides = [f"--config.model.{k}={v}" for k, v in dict(n_layer=2, n_head=2, d_model=32, block_size=32).items()]
    train = dict(batch_size=8, microbatches=1, lr=3e-3, warmup_steps=5, eval_batches=2) | train
    overrides += [f"--config.train.{k}={v}" for k, v in train.items()]
    return ["--config", "configs/tiny.py", f"--workdir={workdir}", "--quiet", *overrides]


def start(workdir, **train):
    # One device: these tests are about crashes, not layouts (test_sharding covers those), and
    # a save per step of state split over 8 fake devices is slow.
    return run_script("train.py", *cli_args(workdir, **train), devices=1, background=True)


def wait_for_step(workdir, step, process, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = Path(workdir) / "metrics.jsonl"
        if path.exists() and any(json.loads(line)["step"] >= step for line in path.read_text().splitlines() if line):
            return
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.01)
    raise TimeoutError(f"step {step} not reached")


def uninterrupted(tmp_path_factory, **run):
    """The same command, never interrupted."""
    workdir = tmp_path_factory.mktemp("reference")
    assert start(workdir, **run).wait(timeout=300) == 0
    return workdir


@pytest.fixture(scope="module")
def cli_reference(tmp_path_factory):
    return uninterrupted(tmp_path_factory, **CLI_RUN)


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_zero_then_resumes_exactly(cli_reference, tmp_path):
    process = start(tmp_path, **CLI_RUN)
    wait_for_step(tmp_path, 15, process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    stopped_at = max(json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert stopped_at < CLI_RUN["steps"]
    assert max(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) >= stopped_at
    assert start(tmp_path, **CLI_RUN).wait(timeout=300) == 0
    assert_same_run(tmp_path, cli_reference)


@pytest.mark.slow
def test_kill_9_at_any_moment_loses_nothing(tmp_path_factory, tmp_path):
    # A checkpoint every step keeps an asynchronous save in flight almost all the time, so
    # each kill lands in or between saves.
    run = CLI_RUN | {"steps": 50, "eval_every": 25, "checkpoint_every": 1}
    reference = uninterrupted(tmp_path_factory, **run | {"checkpoint_every": 10})  # cadence: same math
    for kill_after in (7, 25):
        process = start(tmp_path, **run)
        wait_for_step(tmp_path, kill_after, process)
        process.kill()
        process.wait()
    assert start(tmp_path, **run).wait(timeout=300) == 0
    assert not [p.name for p in (tmp_path / "checkpoints").iterdir() if "tmp" in p.name]
    assert_same_run(tmp_path, reference)


# ---------------------------------------------------------------------------- accidents


@pytest.mark.slow
def test_a_divergence_keeps_only_finite_checkpoints_and_a_lower_lr_continues(tmp_path):
    run = dict(steps=20, checkpoint_every=1, log_every=1, keep_checkpoints=20)
    with pytest.raises(UserError, match=r"training diverged at step \d+: .*--config\.train\.lr=1000") as error:
        train_and_evaluate(small_run_config(lr=1e4, **run), tmp_path, progress=False)
    assert "(step None)" not in str(error.value)
    kept = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert kept[0] == 1 and f"--from_step {kept[0]}" in str(error.value)
    _, params, _, _ = load_latest(tmp_path)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
    # The advice works: back to step 1 (it ran at the warmup's lr of 0, so it is healthy) with a
    # lower learning rate; the later checkpoints are moved aside, not deleted.
    last = train_and_evaluate(small_run_config(lr=1e-3, **run), tmp_path, progress=False, from_step=1)
    assert last["step"] == 20 and np.isfinite(last["train_loss"])
    assert (tmp_path / "checkpoints" / f"{kept[-1]}.abandoned").is_dir()


def test_restarting_a_run_whose_checkpoints_are_gone_keeps_its_metrics(tmp_path, capsys):
    train_and_evaluate(small_run_config(steps=10), tmp_path, progress=False)
    logged = (tmp_path / "metrics.jsonl").read_text()
    for checkpoint in (tmp_path / "checkpoints").iterdir():
        shutil.rmtree(checkpoint)
    train_and_evaluate(small_run_config(steps=10), tmp_path, progress=False)
    assert "has metrics but no checkpoint to resume from" in capsys.readouterr().err
    assert (tmp_path / "history.before-restart-1" / "metrics.jsonl").read_text() == logged


def test_the_same_step_found_unreadable_twice_is_moved_aside_twice(tmp_path, capsys):
    run = dict(steps=20, checkpoint_every=5)
    train_and_evaluate(small_run_config(**run), tmp_path, progress=False)
    damage(tmp_path / "checkpoints" / "20")
    train_and_evaluate(small_run_config(**run), tmp_path, progress=False)  # moves 20 aside, writes 20 again
    damage(tmp_path / "checkpoints" / "20")
    last = train_and_evaluate(small_run_config(**run), tmp_path, progress=False)
    assert last["step"] == 20
    assert {"20.unreadable", "20.unreadable-2"} <= {p.name for p in (tmp_path / "checkpoints").iterdir()}


def test_reading_a_run_never_touches_a_save_in_progress(tmp_path, capsys):
    """sample.py beside a trainer: the trainer's unfinished save must survive the reader, and
    an unreadable newest checkpoint is skipped (not moved) with a warning."""
    train_and_evaluate(small_run_config(steps=20, checkpoint_every=10), tmp_path, progress=False)
    in_progress = tmp_path / "checkpoints" / "30.orbax-checkpoint-tmp-1234"
    in_progress.mkdir()
    damage(tmp_path / "checkpoints" / "20")
    before = snapshot_names(tmp_path / "checkpoints")
    said = []
    _, _, _, step = load_latest(tmp_path, warn=said.append)
    assert step == 10 and "checkpoint 20 cannot be read" in said[0] and "using step 10" in said[0]
    assert in_progress.is_dir() and snapshot_names(tmp_path / "checkpoints") == before


def test_a_failed_save_stops_the_run_at_once_with_one_line(tmp_path, monkeypatch):
    """A full disk: orbax's background save fails; the loop notices at its next logging step,
    not at the next save, and says so in one line. Earlier checkpoints stay."""
    train_and_evaluate(small_run_config(steps=10, checkpoint_every=10), tmp_path, progress=False)
    saves = []

    def failing_save(self, step, state, record, val_loss=None):
        saves.append(step)
        self._manager.check_for_errors = lambda: (_ for _ in ()).throw(OSError(28, "No space left on device"))

    monkeypatch.setattr(Checkpoints, "save", failing_save)
    with pytest.raises(UserError, match=r"writing a checkpoint .* failed \(OSError: .*No space left.*earlier"):
        train_and_evaluate(small_run_config(steps=40, checkpoint_every=10, log_every=5), tmp_path, progress=False)
    assert saves == [20]  # stopped at the first logging step after the failed save, long before step 30
    assert (tmp_path / "checkpoints" / "10").is_dir()


def snapshot_names(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns) for p in folder.rglob("*"))


def test_a_full_disk_stops_before_a_save_it_cannot_hold(tmp_path, monkeypatch):
    train_and_evaluate(small_run_config(steps=10, checkpoint_every=10), tmp_path, progress=False)
    import jaxgpt.job.checkpoint

    full = shutil.disk_usage(tmp_path)._replace(free=2**20)  # less than one checkpoint of this model
    monkeypatch.setattr(jaxgpt.job.checkpoint.shutil, "disk_usage", lambda path: full)
    with pytest.raises(UserError, match=r"has 1\.0 MiB free and a checkpoint needs .* earlier checkpoints are kept"):
        train_and_evaluate(small_run_config(steps=20, checkpoint_every=10), tmp_path, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["10"]


def test_the_best_checkpoint_by_validation_loss_outlives_pruning_and_a_reopening(tmp_path):
    """Beside the newest `keep`, the checkpoint with the lowest validation loss of those saved at
    an evaluation is kept, also once the folder is opened again by a resumed run (orbax keeps
    each save's loss beside it); saves between evaluations have none and are pruned by age."""
    import jax.numpy as jnp

    saved = [(1, 3.0), (2, 1.0), (3, None), (4, 4.0), (5, 5.0), (6, None), (7, 7.0)]
    checkpoints = Checkpoints(tmp_path, keep=2)
    for step, val_loss in saved:
        checkpoints.save(step, {"w": jnp.full(3, step)}, {"step": step}, val_loss=val_loss)
        checkpoints.wait()
    assert checkpoints.steps() == [2, 6, 7] and checkpoints.best() == (2, 1.0)
    checkpoints.close()
    reopened = Checkpoints(tmp_path, keep=2)
    reopened.save(8, {"w": jnp.full(3, 8)}, {"step": 8}, val_loss=9.0)
    reopened.wait()
    assert reopened.steps() == [2, 7, 8] and reopened.best() == (2, 1.0)
    reopened.close()


def test_extending_a_run_is_announced_only_where_the_rate_moves():
    """A cosine run extended at its end, or a run with a cooldown extended after its cooldown
    began, would continue at another rate: announced. A run with a cooldown extended while its
    rate is still held continues at that rate: nothing to say (why warmup-stable-decay runs are
    the ones to extend)."""
    from jaxgpt.config import DataConfig, ModelConfig, RunConfig, TrainConfig
    from jaxgpt.training.optimizer import schedule_change_note

    def train(**fields):
        return TrainConfig(warmup_steps=10, lr=1e-3, min_lr=1e-4, **fields)

    def saved_train(**fields):  # as a checkpoint's record holds it
        return RunConfig(ModelConfig(), DataConfig(), train(**fields)).to_dict()["train"]

    saved = saved_train(steps=100, cooldown_steps=40)
    assert schedule_change_note(saved, train(steps=200, cooldown_steps=40), step=50) is None  # held at lr
    note = schedule_change_note(saved, train(steps=200, cooldown_steps=40), step=80)  # half-way down
    assert note and "now 0.001 (the run was at 0.00055)" in note and "decay_steps=100" in note
    cosine = saved_train(steps=100)
    assert "decay_steps=100" in schedule_change_note(cosine, train(steps=200), step=100)
    assert schedule_change_note(cosine, train(steps=200, decay_steps=100), step=100) is None  # kept at min_lr
    assert "now 0.001" in schedule_change_note(cosine, train(steps=100, cooldown_steps=40), step=50)  # cosine -> held
