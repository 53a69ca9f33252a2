"""Bad input and accidents, as a careless, busy user makes them: each is one line on stderr
naming the problem, exit status 2, and the workdir exactly as it was. The table grows with
every probe; each row is a command a user ran."""

import importlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import run_script

from jaxgpt.job import workdir as run_dir

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


def run_in_process(capsys, script: str, *args: str) -> SimpleNamespace:
    """A refusal as `run_script` sees it (exit status, stderr), from the command's main in this
    process: the same code from argv on, without a fresh Python and JAX to start (2 s a case).
    For refusals that come before training; ones that need a process of their own (a lock held
    by this one, a crash) use run_script."""
    module = {"train.py": "jaxgpt.commands.train", "sample.py": "jaxgpt.commands.sample"}.get(script)
    if module is None:  # another command: as a user runs it
        return run_script(script, *args)
    capsys.readouterr()
    try:
        importlib.import_module(module).main(list(args))
        code = 0
    except SystemExit as exit_status:
        code = exit_status.code
    printed = capsys.readouterr()
    return SimpleNamespace(returncode=code, stderr=printed.err, stdout=printed.out)


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
    (
        "compare naming a value twice",  # the second variant would resume the first's run
        "jaxgpt",
        ["compare", "--config=tiny", "--vary=model.n_head=2,2", "--out={tmp}/compared"],
        {},
        "--vary 'model.n_head=2,2' names 2 twice; give each value once",
    ),
    (
        "compare naming a key twice",
        "jaxgpt",
        ["compare", "--config=tiny", "--vary=model.n_head=2", "--vary=model.n_head=4", "--out={tmp}/compared"],
        {},
        "--vary names model.n_head twice; give all its values in one --vary model.n_head=v1,v2",
    ),
    # Sizes no machine holds: refused from shapes alone, before a workdir, a state or a batch
    # exists (tests/test_memory.py tests the arithmetic)
    (
        "a billion rows per batch",
        "train.py",
        ["--config.train.batch_size=1000000000"],
        {},
        "train.batch_size=1000000000 with model.block_size=128 needs at least",
    ),
    (
        "a million-wide model",
        "train.py",
        ["--config.model.d_model=1000000", "--config.model.n_head=1", "--config.train.batch_size=8"],
        {},
        "does not fit even as one token per row: the model's parameters, gradients and optimizer state need",
    ),
]


@pytest.mark.parametrize("name, script, args, files, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_nothing_changes(tmp_path, capsys, name, script, args, files, message):
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
    result = run_in_process(capsys, script, *args)
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
    from jaxgpt.job.metrics import json_safe

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


# ----------------------------------------------------------------------------- damaged derived files

# A corpus that prepares in well under a second: ~230 KB of text, a 460 KB token file (char
# tokenizer, uint16), small enough that every start hashes it.
CORPUS = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(4000))


def _zero_middle(folder: Path) -> None:
    path = folder / "tokens-00000.bin"
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle - 25_000 : middle + 25_000] = bytes(50_000)
    path.write_bytes(bytes(raw))


def _move_a_start(path: Path) -> None:
    """A start nudged by one token, still between its neighbours: only the checksum can tell."""
    starts = np.fromfile(path, np.int64)
    starts[len(starts) // 2] += 1
    starts.tofile(path)


def _edit_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps(meta | changes))


# (name, what is done to the prepared folder, what the warning names)
CACHE_FAULTS = [
    ("token file truncated", lambda f: os.truncate(f / "tokens-00000.bin", 1000), "tokens-00000.bin has 1,000 bytes"),
    ("token file zeroed in the middle", _zero_middle, "tokens-00000.bin's SHA-256 differs"),
    ("token file missing", lambda f: (f / "tokens-00000.bin").unlink(), "tokens-00000.bin is missing"),
    ("token count edited", lambda f: _edit_meta(f, tokens=12), "meta.json says 12 tokens but its token files hold"),
    ("metadata not JSON", lambda f: (f / "meta.json").write_text("{garbage"), "meta.json cannot be read"),
    ("metadata missing", lambda f: (f / "meta.json").unlink(), "meta.json cannot be read"),
    ("document starts missing", lambda f: (f / "documents.bin").unlink(), "documents.bin is missing"),
    (
        "document starts garbage of the same size",
        lambda f: (f / "documents.bin").write_bytes(os.urandom((f / "documents.bin").stat().st_size)),
        "documents.bin does not hold document starts",
    ),
    ("one document start moved", lambda f: _move_a_start(f / "documents.bin"), "documents.bin's SHA-256 differs"),
    ("tokenizer garbage", lambda f: (f / "tokenizer.json").write_text("\0\0"), "tokenizer.json cannot be read"),
]


def _prepared(tmp_path):
    """A fresh cache of CORPUS, as four documents: (config, its folder, the token file's bytes,
    data module)."""
    from jaxgpt.config import DataConfig
    from jaxgpt.data import prepared as data

    (tmp_path / "corpus").mkdir()
    for part in range(4):
        (tmp_path / "corpus" / f"part-{part}.txt").write_text(
            CORPUS[part * len(CORPUS) // 4 : (part + 1) * len(CORPUS) // 4]
        )
    config = DataConfig(source=f"text:{tmp_path / 'corpus'}", cache_dir=str(tmp_path / "cache"))
    data.prepare(config, progress=False)
    (folder,) = (tmp_path / "cache" / "data").iterdir()
    return config, folder, (folder / "tokens-00000.bin").read_bytes(), data


NANOGPT_HABITS = [  # nanoGPT's `train.py config/x.py --batch_size=32`, typed into train.py
    (["configs/tiny.py"], "configs/tiny.py is a word, not a flag; did you mean --config configs/tiny.py?"),
    (["--config=configs/tiny.py", "--batch_size=32"], "did you mean --config.train.batch_size=32?"),
    (["--config=configs/tiny.py", "--learning_rate", "1e-3"], "did you mean --config.train.lr=1e-3?"),
    (["--config=configs/tiny.py", "--out_dir=out"], "did you mean --workdir=out?"),
    (["--config=configs/tiny.py", "--no_such_thing=1"], "unknown flag --no_such_thing (see --help)"),
    (["--config=configs/tiny.py", "stray"], "unexpected argument 'stray'; every argument is a flag"),
]


@pytest.mark.parametrize("args, message", NANOGPT_HABITS, ids=[" ".join(a) for a, _ in NANOGPT_HABITS])
def test_nanogpt_habits_get_the_jaxgpt_spelling_in_one_line(tmp_path, capsys, args, message):
    result = run_in_process(capsys, "train.py", *args, f"--workdir={tmp_path / 'run'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines == [f"error: {lines[-1].removeprefix('error: ')}"], result.stderr[-2000:]
    assert message in lines[-1]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, damage, problem", CACHE_FAULTS, ids=[c[0] for c in CACHE_FAULTS])
def test_a_damaged_token_cache_is_set_aside_and_prepared_again(tmp_path, capsys, name, damage, problem):
    config, folder, original, data = _prepared(tmp_path)
    (tmp_path / "cache" / "data" / "other").mkdir()  # another corpus's cache: must not be touched
    (tmp_path / "cache" / "data" / "other" / "tokens-00000.bin").write_bytes(b"x" * 10)
    damage(folder)
    damaged = snapshot(folder)
    capsys.readouterr()
    dataset = data.prepare(config, progress=False)
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: ") and problem in warning[0], warning
    assert "preparing it again" in warning[0]
    assert (folder / "tokens-00000.bin").read_bytes() == original  # rebuilt exactly
    assert np.array_equal(np.concatenate([dataset.train, dataset.val]), np.frombuffer(original, np.uint16))
    (aside,) = (p for p in folder.parent.iterdir() if ".damaged-" in p.name)
    assert snapshot(aside / folder.name) == damaged  # kept as it was, for whoever wants to look
    assert snapshot(folder.parent / "other") == {"tokens-00000.bin": b"x" * 10}


def test_a_sound_cache_is_reused_without_a_word_and_unchanged(tmp_path, capsys):
    config, folder, original, data = _prepared(tmp_path)
    before = snapshot(folder.parent)
    capsys.readouterr()
    data.prepare(config, progress=False)
    assert capsys.readouterr().err == ""
    assert snapshot(folder.parent) == before


def test_a_large_cache_is_hashed_only_when_asked(tmp_path, monkeypatch, capsys):
    """Above CHECKSUM_ON_START_BYTES a start checks sizes alone; verify=True (train.py
    --verify_data) hashes it too."""
    config, folder, original, data = _prepared(tmp_path)
    monkeypatch.setattr(data, "CHECKSUM_ON_START_BYTES", len(original) - 1)
    _zero_middle(folder)
    capsys.readouterr()
    data.prepare(config, progress=False)
    assert capsys.readouterr().err == ""  # the size is right: not hashed, not noticed
    data.prepare(config, progress=False, verify=True)
    assert "tokens-00000.bin's SHA-256 differs" in capsys.readouterr().err
    assert (folder / "tokens-00000.bin").read_bytes() == original


def test_a_large_cache_is_hashed_in_the_background_when_training_asks(tmp_path, monkeypatch):
    """check_in_background (what training asks for): the start checks sizes alone, a thread
    takes the checksums; a cache just written, or hashed at the start, needs no thread."""
    config, folder, original, data = _prepared(tmp_path)
    monkeypatch.setattr(data, "CHECKSUM_ON_START_BYTES", len(original) - 1)
    assert data.prepare(config, progress=False, check_in_background=True).damage(wait=True) is None  # sound
    _zero_middle(folder)
    damaged = data.prepare(config, progress=False, check_in_background=True)
    assert damaged.damage(wait=True) == "tokens-00000.bin's SHA-256 differs from the one recorded when it was written"
    assert data.prepare(config, progress=False, verify=True, check_in_background=True).checksums is None
    monkeypatch.setattr(data, "CHECKSUM_ON_START_BYTES", len(original))
    assert data.prepare(config, progress=False, check_in_background=True).checksums is None


def test_damage_found_while_training_stops_the_run_and_the_rerun_prepares_again(tmp_path, monkeypatch):
    """A large cache zeroed in its middle: the run stops at its first logged step (5) with one
    line, the folder set aside; the same call then prepares the data again and trains to the end."""
    from conftest import small_run_config

    from jaxgpt.errors import UserError
    from jaxgpt.job.trainer import train_and_evaluate

    config, folder, original, data = _prepared(tmp_path)
    monkeypatch.setattr(data, "CHECKSUM_ON_START_BYTES", 0)  # every cache is large
    run = small_run_config(steps=10)
    run.data.update(source=config.source, cache_dir=config.cache_dir)
    _zero_middle(folder)
    with pytest.raises(UserError) as stopped:
        train_and_evaluate(run, tmp_path / "run", progress=False)
    message = str(stopped.value)
    assert message.startswith(f"the prepared data in {folder} is damaged (tokens-00000.bin's SHA-256 differs")
    assert "Stopped at step 5: rerun the same command to prepare it again" in message
    (aside,) = (p for p in folder.parent.iterdir() if ".damaged-" in p.name)
    assert (aside / folder.name / "tokens-00000.bin").read_bytes() != original
    assert train_and_evaluate(run, tmp_path / "run", progress=False)["step"] == 10
    assert (folder / "tokens-00000.bin").read_bytes() == original


def test_a_damaged_cache_whose_source_is_gone_is_refused_naming_the_folder(tmp_path, monkeypatch):
    from jaxgpt.errors import UserError

    config, folder, original, data = _prepared(tmp_path)
    os.truncate(folder / "tokens-00000.bin", 10)

    def unreachable(*args, **kwargs):
        raise ConnectionError("the Hub cannot be reached")

    monkeypatch.setattr(data, "read_documents", unreachable)
    with pytest.raises(UserError) as refused:
        data.prepare(config, progress=False)
    message = str(refused.value)
    assert f"the prepared data in {folder} was damaged (tokens-00000.bin has 10 bytes" in message
    assert "preparing it again failed (ConnectionError: the Hub cannot be reached)" in message
    assert "rerun, which prepares it afresh" in message


def test_two_processes_preparing_the_same_cache_at_once_both_finish_alike(tmp_path):
    (tmp_path / "corpus.txt").write_text(CORPUS * 5)
    snippet = (
        "import sys, json; from jaxgpt import data; from jaxgpt.config import DataConfig; "
        f"d = data.prepare(DataConfig(source='text:{tmp_path / 'corpus.txt'}', cache_dir='{tmp_path / 'cache'}'), "
        "progress=False); print(len(d.train), int(d.train.sum()), int(d.val.sum()))"
    )
    runs = [run_script("-c", snippet, background=True) for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    assert outputs[0][0] == outputs[1][0] != ""
    assert len(list((tmp_path / "cache" / "data").iterdir())) == 1  # one cache, no leftovers


def _copy_of(run: Path, tmp_path: Path) -> Path:
    workdir = tmp_path / "run"
    shutil.copytree(run, workdir)
    return workdir


def _run_files(workdir: Path) -> dict:
    """snapshot() of a workdir but its lock file, which every trainer's start rewrites with its pid."""
    return {name: content for name, content in snapshot(workdir).items() if name != "train.lock"}


def _replace_line(path: Path, index: int, line: str) -> None:
    lines = path.read_text().splitlines()
    lines[index] = line
    path.write_text("\n".join(lines) + "\n")


def _zero(path: Path) -> None:
    """As a crash of the file system leaves a file: its size, all NUL bytes."""
    path.write_bytes(bytes(path.stat().st_size))


def _log_twice(path: Path) -> None:
    """The lines of the log appended again (a copy gone wrong): 10, 20, 10, 20."""
    path.write_text(path.read_text() * 2)


def _replace_with(path: Path, kind: str) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.mkdir() if kind == "folder" else path.write_text("not a folder")


def _as_is(workdir: Path) -> None:
    pass


# (name, what is done to a finished run's workdir (20 steps), its resume's arguments beside
# --config.train.steps=30, what the one error line says)
WORKDIR_FAULTS = [
    (
        "config.json garbage",
        lambda w: (w / "config.json").write_text("{not json"),
        [],
        "config.json cannot be read (JSONDecodeError",
    ),
    (
        "metrics.jsonl line garbled",
        lambda w: _replace_line(w / "metrics.jsonl", 1, '{"step": 10, "train_loss": 3.1'),
        [],
        "metrics.jsonl line 2 is not a metrics record",
    ),
    (
        "metrics.jsonl binary",
        lambda w: (w / "metrics.jsonl").write_bytes(b"\0\xff\0garbage\n{}\n"),
        [],
        "metrics.jsonl line 1 is not a metrics record",
    ),
    (
        "metrics.jsonl zeroed",
        lambda w: _zero(w / "metrics.jsonl"),
        [],
        "metrics.jsonl line 1 is not a metrics record (ValueError: NUL bytes",
    ),
    (
        "metrics.jsonl lines appended twice",
        lambda w: _log_twice(w / "metrics.jsonl"),
        [],
        "goes back to step 5 after step 20 (lines appended twice?)",
    ),
    (
        "train.lock a folder",
        lambda w: _replace_with(w / "train.lock", "folder"),
        [],
        "train.lock is a folder, where a run keeps its train.lock file; nothing was changed",
    ),
    (
        "tensorboard a file",
        lambda w: _replace_with(w / "tensorboard", "file"),
        [],
        "tensorboard is a file, where a run keeps its tensorboard folder; nothing was changed",
    ),
    ("stop before the resumed step", _as_is, ["--stop_at=5"], "--stop_at 5 is at or before step 20"),
    ("stop before the step gone back to", _as_is, ["--stop_at=5", "--from_step=10"], "is not after --from_step 10"),
]


@pytest.mark.parametrize("name, damage, args, message", WORKDIR_FAULTS, ids=[c[0] for c in WORKDIR_FAULTS])
def test_a_damaged_workdir_file_is_one_line_and_nothing_changes(
    tmp_path, capsys, trained_small_run, name, damage, args, message
):
    workdir = _copy_of(trained_small_run, tmp_path)
    damage(workdir)
    before = _run_files(workdir)
    result = run_in_process(capsys, "train.py", f"--workdir={workdir}", "--config.train.steps=30", *args, "--quiet")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines[-1].startswith("error: ") and message in lines[-1], result.stderr[-3000:]
    assert _run_files(workdir) == before


def test_a_metrics_line_torn_by_a_crash_is_dropped_on_resume(tmp_path, trained_small_run):
    """kill -9 while a line is written leaves it cut short, with no newline: it lies past the
    checkpoint the run resumes from, so it is dropped like any later line, and the run goes on.
    In-process: resuming from the command line is the next test's."""
    from jaxgpt.commands.saved_config import get_config
    from jaxgpt.job.metrics import read_metrics
    from jaxgpt.job.trainer import train_and_evaluate

    workdir = _copy_of(trained_small_run, tmp_path)
    logged = read_metrics(workdir)
    with open(workdir / "metrics.jsonl", "a") as log:
        log.write('{"step": 25, "train_lo')
    assert read_metrics(workdir) == logged  # readers skip it too
    config = get_config(str(workdir))  # what `train.py --workdir` reads
    config.train.steps = 25
    assert train_and_evaluate(config, workdir, progress=False)["step"] == 25
    assert [r["step"] for r in read_metrics(workdir)] == [r["step"] for r in logged] + [25]


def test_a_run_whose_config_json_was_deleted_resumes_with_its_checkpoints_record(tmp_path, trained_small_run):
    """The newest checkpoint records the run's configuration: a resume (with an override, as
    `--workdir` alone) takes it from there, says so once, and writes config.json anew."""
    workdir = _copy_of(trained_small_run, tmp_path)
    saved = json.loads((workdir / "config.json").read_text())
    (workdir / "config.json").unlink()
    result = run_script("train.py", f"--workdir={workdir}", "--config.train.steps=25", "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ") and "config.json" in line]
    assert warnings == [
        f"warning: {workdir} has no config.json; using the configuration its checkpoint of step 20 records"
    ]
    saved["train"]["steps"] = 25
    assert json.loads((workdir / "config.json").read_text()) == saved


def test_plot_of_a_zeroed_metrics_file_names_the_damage(tmp_path, trained_small_run, capsys):
    from jaxgpt.commands import plot

    workdir = _copy_of(trained_small_run, tmp_path)
    _zero(workdir / "metrics.jsonl")
    before = snapshot(workdir)
    with pytest.raises(SystemExit) as exit_:
        plot.main([str(workdir)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: ") and "\n" not in err
    assert "metrics.jsonl line 1 is not a metrics record (ValueError: NUL bytes" in err
    assert snapshot(workdir) == before


def test_a_drawing_that_cannot_be_written_is_one_line_offering_out(trained_small_run, capsys):
    """A read-only place (sysfs refuses even root, as a read-only workdir refuses a user)."""
    from jaxgpt.commands import plot

    with pytest.raises(SystemExit) as exit_:
        plot.main([str(trained_small_run), "--out", "/sys/jaxgpt-loss.png"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: cannot write /sys/jaxgpt-loss.png (")
    assert err.endswith("); pass --out a path you can write to") and "\n" not in err


def test_a_damaged_newest_checkpoint_is_one_warning_line_and_sampling_goes_on(tmp_path, trained_small_run):
    """orbax's reads still in flight when the damage is found finish after its event loop has
    closed: each used to print a traceback (14 for one checkpoint); now the warning is all."""
    workdir = _copy_of(trained_small_run, tmp_path)
    shutil.rmtree(workdir / "checkpoints" / "20" / "state" / "d")
    before = snapshot(workdir)
    result = run_script("sample.py", f"--workdir={workdir}", "--max_new_tokens=4", "--prompt=a")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("warning: checkpoint 20 cannot be read (ValueError: ") and line.endswith(
        "using step 10 instead"
    )
    assert snapshot(workdir) == before  # a reader moves nothing aside


def test_a_failed_read_left_unawaited_logs_nothing_but_other_lost_errors_still_do(caplog):
    """The race behind the test above: a failed read that nobody awaited makes asyncio log
    `... exception was never retrieved` as it is collected: a task of orbax's (its coroutine is
    async_deserialize) or a future of TensorStore's (its error names the tensorstore_spec). Those
    are silenced; any other lost error still shows."""
    import asyncio
    import gc

    import jaxgpt.job.checkpoint  # noqa: F401  (installs the filter)

    async def async_deserialize():
        raise ValueError("NOT_FOUND: a missing chunk")

    async def some_other_work():
        raise ValueError("a real bug")

    def lose(make):
        loop = asyncio.new_event_loop()
        lost = make(loop)
        loop.run_until_complete(asyncio.sleep(0))  # a task runs and fails; nobody awaits it
        loop.close()
        del lost
        gc.collect()

    def failed_future(error):
        def make(loop):
            future = loop.create_future()
            future.set_exception(error)
            return future

        return make

    with caplog.at_level("ERROR", logger="asyncio"):
        lose(lambda loop: loop.create_task(async_deserialize()))
        lose(failed_future(ValueError("NOT_FOUND: Error reading \"params.wte\" [tensorstore_spec='{}']")))
        assert caplog.records == []
        lose(lambda loop: loop.create_task(some_other_work()))
        lose(failed_future(ValueError("another real bug")))
        task, future = (record.getMessage() for record in caplog.records)
        assert task.startswith("Task exception was never retrieved") and "some_other_work" in task
        assert future.startswith("Future exception was never retrieved") and "another real bug" in future


def test_a_reader_beside_a_trainer_that_prunes_reads_the_newer_checkpoint(tmp_path):
    """A reader lists steps 1 and 2; a trainer keeping two checkpoints saves steps 3 and 4 and
    prunes both. The vanished checkpoints are not damage: the reader lists again and reads
    step 4, without a warning (and never advising --fresh)."""
    import jax.numpy as jnp

    from jaxgpt.job.checkpoint import Checkpoints

    state = {"w": jnp.arange(4.0)}
    trainer = Checkpoints(tmp_path / "checkpoints", keep=2)
    for step in (1, 2):
        trainer.save(step, {"w": state["w"] * step}, {"step": step})
        trainer.wait()
    reader = Checkpoints(tmp_path / "checkpoints", read_only=True)
    assert reader.steps() == [1, 2]
    for step in (3, 4):
        trainer.save(step, {"w": state["w"] * step}, {"step": step})
        trainer.wait()
    trainer.close()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "4"]
    warnings = []
    step, restored, record = reader.restore_latest_readable(state, warn=warnings.append)
    reader.close()
    assert (step, record, warnings) == (4, {"step": 4}, [])
    np.testing.assert_array_equal(restored["w"], np.arange(4.0) * 4)


def test_an_error_without_text_is_named_by_its_type():
    from jaxgpt.job.checkpoint import _brief

    class TensorStoreError(Exception):
        def __str__(self):
            return "<bound method pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx.what of ...>"

    assert _brief(TensorStoreError()) == "TensorStoreError"
    assert _brief(ValueError("NOT_FOUND: no such file\nmore")) == "ValueError: NOT_FOUND: no such file"


def test_a_disk_that_fills_while_preparing_is_one_line_and_the_whole_shards_stay(tmp_path, monkeypatch):
    """ENOSPC in the fourth shard: a UserError naming the folder, its size and both ways on;
    the shard cut short is gone, the three whole ones stay, and the same call continues from
    them to the files an uninterrupted preparation writes."""
    import errno

    from jaxgpt.config import DataConfig
    from jaxgpt.data import prepared as data
    from jaxgpt.data.shards import ShardWriter
    from jaxgpt.errors import UserError

    documents = [json.dumps({"text": CORPUS[i * 600 : (i + 1) * 600]}) for i in range(400)]
    (tmp_path / "corpus.jsonl").write_text("\n".join(documents) + "\n")  # 240,000 characters in 400 documents
    config = DataConfig(
        source=f"text:{tmp_path / 'corpus.jsonl'}", cache_dir=str(tmp_path / "cache"), shard_tokens=50_000
    )
    add = ShardWriter.add

    def add_until_full(writer, ids, separator_length):
        if writer.index == 3 and writer.tokens > 20_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        add(writer, ids, separator_length)

    monkeypatch.setattr(ShardWriter, "add", add_until_full)
    with pytest.raises(UserError) as full:
        data.prepare(config, progress=False)
    staging = data.cache_folder(config).parent / f".preparing-{data.cache_folder(config).name}"
    assert str(full.value).startswith(f"the disk filled while preparing {config.source}: 3 whole shard(s), ")
    assert f"are kept in {staging}. Free space" in str(full.value) and "delete that folder" in str(full.value)
    assert not data.cache_folder(config).exists()
    assert sorted(p.name for p in staging.iterdir() if p.name.startswith("tokens")) == [
        f"tokens-0000{i}.bin" for i in range(3)
    ]
    monkeypatch.setattr(ShardWriter, "add", add)
    resumed = data.prepare(config, progress=False)
    whole = data.prepare(DataConfig(source=config.source, cache_dir=str(tmp_path / "whole"), shard_tokens=50_000))
    np.testing.assert_array_equal(np.asarray(resumed.train), np.asarray(whole.train))
    np.testing.assert_array_equal(resumed.documents, whole.documents)


# A damaged Hugging Face folder: each case one line naming the file and what is wrong with it,
# found before any work (the fault probe's seven tracebacks).
def llama_folder(directory: Path) -> Path:
    """A small Llama-family folder as save_pretrained writes it: config.json, model.safetensors."""
    import jax

    from jaxgpt.config import ModelConfig
    from jaxgpt.hf import save_pretrained
    from jaxgpt.model.transformer import init_params

    config = ModelConfig(
        vocab_size=64, block_size=16, n_layer=2, n_head=2, n_kv_head=1, d_model=16, position="rope",
        norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False,
    )  # fmt: skip
    save_pretrained(config, init_params(config, jax.random.key(0)), directory)
    return directory


def edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def shard(folder: Path) -> None:
    """The weights as the index of two shards, the second missing."""
    weights = folder / "model.safetensors"
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    index = {"weight_map": {"model.embed_tokens.weight": first, "lm_head.weight": second}}
    weights.rename(folder / first)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: edit_config(f, lambda c: c.pop("hidden_size")), "config.json has no 'hidden_size', which a llama"),
        (lambda f: (f / "config.json").write_text('{"model_type": "llama", '), "config.json is not JSON"),
        (lambda f: (f / "config.json").unlink(), "has no config.json; a Hugging Face model folder holds config.json"),
        (lambda f: edit_config(f, lambda c: c.update(rms_norm_eps="small")), "a value of the wrong type for a llama"),
        (
            lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:100]),
            "model.safetensors cannot be read as safetensors",
        ),
        (
            lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 8 + (f / "model.safetensors").read_bytes()[8:]),
            "model.safetensors cannot be read as safetensors",
        ),
        (shard, "model.safetensors.index.json names model-00002-of-00002.safetensors, which"),
    ],
    ids=["config-key", "config-not-json", "config-absent", "config-type", "weights-cut", "weights-header", "shard"],
)
def test_a_damaged_hugging_face_folder_is_one_line_naming_the_file(tmp_path, damage, message):
    from jaxgpt.errors import UserError
    from jaxgpt.hf import check_folder, load_pretrained

    folder = llama_folder(tmp_path / "llama")
    damage(folder)
    for read in (check_folder, load_pretrained):  # the early check, and the load itself
        with pytest.raises(UserError) as error:
            read(str(folder))
        assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_weights_of_a_layer_the_config_lacks_are_refused_by_name(tmp_path):
    """config.json saying one layer fewer than the weights hold: the last layer's weights would
    be dropped silently; they are named instead."""
    from jaxgpt.errors import UserError
    from jaxgpt.hf import load_pretrained

    folder = llama_folder(tmp_path / "llama")
    edit_config(folder, lambda c: c.update(num_hidden_layers=1))
    with pytest.raises(UserError, match=r"weights have no place in the llama model .* \(1 layers\): model\.layers\.1"):
        load_pretrained(str(folder))


def test_init_from_a_damaged_folder_is_refused_before_the_workdir_is_made(tmp_path):
    from conftest import small_run_config

    from jaxgpt.errors import UserError
    from jaxgpt.job.trainer import train_and_evaluate

    folder = llama_folder(tmp_path / "llama")
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100])
    config = small_run_config(init_from=str(folder))
    with pytest.raises(UserError, match="model.safetensors cannot be read as safetensors"):
        train_and_evaluate(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
