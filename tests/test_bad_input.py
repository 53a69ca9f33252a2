"""Bad input and accidents, as a careless, busy user makes them: each is one line on stderr
naming the problem, exit status 2, and the workdir exactly as it was. The table grows with
every probe; each row is a command a user ran."""

import json
import os
from pathlib import Path

import pytest
from conftest import run_script

from jaxgpt import workdir as run_dir

FAST = [
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.train.steps=4",
    "--config.train.batch_size=8",
    "--config.train.eval_batches=1",
    "--quiet",
]
NO_GET_CONFIG = "def something():\n    return 1\n"
PLAIN_DICT = "def get_config():\n    return {'model': {'n_layer': 1}}\n"
MODEL_ONLY = (
    "import ml_collections\n\ndef get_config():\n    return ml_collections.ConfigDict({'model': {'n_layer': 1}})\n"
)


def snapshot(path: Path) -> dict:
    """Every file under path with its bytes: 'unchanged' means byte for byte."""
    if not path.exists():
        return {}
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# (name, script, arguments; {tmp} is the test's folder, {workdir} the run's, files to write first, message)
CASES = [
    ("batch of zero", "train.py", ["--config.train.batch_size=0"], {}, "train.batch_size=0 must be positive"),
    ("negative batch", "train.py", ["--config.train.batch_size=-12"], {}, "train.batch_size=-12 must be positive"),
    (
        "more microbatches than rows",
        "train.py",
        ["--config.train.microbatches=24"],
        {},
        "train.microbatches=24 does not divide train.batch_size=8",
    ),
    (
        "config without get_config",
        "train.py",
        ["--config={tmp}/mine.py"],
        {"mine.py": NO_GET_CONFIG},
        "defines no get_config()",
    ),
    (
        "get_config returns a dict",
        "train.py",
        ["--config={tmp}/mine.py"],
        {"mine.py": PLAIN_DICT},
        "returned a dict, not a ConfigDict",
    ),
    (
        "config without sections",
        "train.py",
        ["--config={tmp}/mine.py", "--config.train.steps=3"],
        {"mine.py": MODEL_ONLY},
        "has no data, train, mesh section(s)",
    ),
    (
        "config importing base_config from its old module",
        "train.py",
        ["--config={tmp}/mine.py"],
        {"mine.py": "from jaxgpt.config import base_config\n\ndef get_config():\n    return base_config()\n"},
        "imports base_config from jaxgpt.config; it is in jaxgpt.config_files now",
    ),
    ("workdir under a file", "train.py", ["--workdir={tmp}/notes.txt/run"], {"notes.txt": "x"}, "which is a file"),
    ("unwritable workdir", "train.py", ["--workdir=/sys/jaxgpt-run"], {}, "cannot write to workdir /sys/jaxgpt-run"),
    (
        "binary file as text",
        "train.py",
        ["--config.data.source=text:{tmp}/photo.jpg"],
        {"photo.jpg": b"\xff\xd8\xff\xe0\0\x10JFIF\0"},
        "photo.jpg is not UTF-8 text",
    ),
    (
        "broken jsonl",
        "train.py",
        ["--config.data.source=text:{tmp}/corpus.jsonl"],
        {"corpus.jsonl": '{"text": "fine"}\n{"text": oops}\n'},
        "corpus.jsonl line 2: Expecting value",
    ),
    ("sample.py without a run", "sample.py", ["--workdir={workdir}"], {}, "no checkpoints in"),
]


@pytest.mark.parametrize("name, script, args, files, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_nothing_changes(tmp_path, name, script, args, files, message):
    for file, content in files.items():
        (tmp_path / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    workdir = tmp_path / "run"
    args = [a.format(tmp=tmp_path, workdir=workdir) for a in args]
    if script == "train.py":
        if not any(a.startswith("--config=") for a in args):
            args = ["--config=configs/tiny.py", *args]
        if not any(a.startswith("--workdir=") for a in args):
            args.append(f"--workdir={workdir}")
        args += FAST if "--config=configs/tiny.py" in args and "batch_size" not in " ".join(args) else ["--quiet"]
    before = snapshot(tmp_path)
    result = run_script(script, *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines[-1].startswith("error: ") and message in lines[-1], result.stderr[-3000:]
    assert [line for line in lines if line.startswith("error")] == [lines[-1]]
    assert snapshot(tmp_path) == before


def test_a_second_trainer_on_a_workdir_in_use_is_refused_at_once(tmp_path):
    workdir = tmp_path / "run"
    run_dir.make(workdir)
    with run_dir.locked(workdir):
        result = run_script("train.py", "--config=configs/tiny.py", f"--workdir={workdir}", *FAST)
    assert result.returncode == 2
    assert f"is in use by a trainer still running (pid {os.getpid()} on " in result.stderr.strip().splitlines()[-1]
    assert not (workdir / "metrics.jsonl").exists()


def test_a_lock_left_by_a_dead_process_does_not_block(tmp_path):
    """The lock is the OS's: a crashed trainer's file remains but holds nothing."""
    workdir = tmp_path / "run"
    run_dir.make(workdir)
    (workdir / run_dir.LOCK_NAME).write_text("pid 999999 on elsewhere\n")
    with run_dir.locked(workdir):
        assert (workdir / run_dir.LOCK_NAME).read_text().startswith(f"pid {os.getpid()} ")


def test_metrics_records_stay_json_when_a_number_is_not_finite():
    from jaxgpt.metrics import json_safe

    record = json_safe({"step": 5, "train_loss": float("nan"), "mfu": float("inf"), "lr": 0.1})
    assert json.loads(json.dumps(record, allow_nan=False)) == {
        "step": 5,
        "train_loss": None,
        "mfu": None,
        "lr": 0.1,
        "nonfinite": "train_loss was nan; mfu was inf",
    }


def test_a_download_that_never_answers_times_out_with_advice(monkeypatch):
    import time

    from jaxgpt import tokenizers
    from jaxgpt.errors import UserError

    monkeypatch.setattr(tokenizers, "_get_encoding", lambda name: time.sleep(30))
    start = time.monotonic()
    with pytest.raises(UserError, match=r"'gpt2' BPE file \(timed out after 1 s\).*TIKTOKEN_CACHE_DIR"):
        tokenizers.TiktokenTokenizer("gpt2", timeout=1.0)
    assert time.monotonic() - start < 5
