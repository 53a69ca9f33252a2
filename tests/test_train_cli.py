"""train.py as a user runs it: bad input is one line on stderr, exit status 2, nothing written."""

import ast
import json
from pathlib import Path

import pytest
from conftest import run_script

from jaxgpt.commands.dispatch import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
FAST = [
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.train.steps=4",
    "--config.train.warmup_steps=1",
    "--config.train.batch_size=8",
    "--config.train.microbatches=1",
    "--config.train.eval_batches=1",
    "--quiet",
]


def train(*args):
    return run_script("train.py", *args)


def the_error(result) -> str:
    """The one error line, which must close stderr (progress bars may come before it)."""
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    return errors[0]


def test_a_short_run_from_the_command_line(tmp_path):
    """Its output goes to pipes, as to a log file: no progress bar redrawn with carriage returns
    into one endless line, but a line for every logged step."""
    logged_twice = [*FAST[:-1], "--config.train.log_every=2"]  # FAST without --quiet
    result = train("--config", "configs/tiny.py", f"--workdir={tmp_path / 'run'}", *logged_twice)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr + result.stdout
    assert [line.split(":")[0] for line in result.stdout.splitlines() if "/4: loss" in line] == ["step 2/4", "step 4/4"]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 4 and "val_loss" in metrics[-1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "configs/missing.py"], "config file configs/missing.py not found"),
        (
            ["--config", "configs/tiny.py", "--config.model.n_layr=2"],
            "unknown config key model.n_layr; did you mean model.n_layer?",
        ),
        (
            ["--config", "configs/tiny.py", "--config.train.steps=9", "--config.train.qqq=2"],
            "unknown config key train.qqq; check its spelling",  # no key close enough to suggest
        ),
        (["--config", "configs/tiny.py", "--config.workdir=runs/x"], "--workdir is a flag of its own"),
        (["--config", "configs/tiny.py", "--config.train.steps=many"], "--config.train.steps=many"),
        (["--config", "configs/tiny.py", "--config.data.tokenizer=wordpiece"], "unknown tokenizer 'wordpiece'"),
        (["--config", "configs/tiny.py", "--config.data.source=s3:bucket"], "unknown data.source 's3:bucket'"),
        (["--config", "configs/tiny.py", "--config.data.source=text:/no/such.txt"], "no such file"),
        (["--config", "configs/tiny.py", "--config.model.n_head=3"], "d_model=128 is not divisible by n_head=3"),
        (
            ["--config", "configs/tiny.py", "--config.train.microbatches=5"],
            "train.microbatches=5 does not divide train.batch_size=12",
        ),
        (
            ["--config", "configs/tiny.py", "--config.model.attention=flash_tpu"],
            "is a TPU kernel and this run is on cpu",
        ),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    result = train(*args, f"--workdir={tmp_path / 'run'}")
    assert result.returncode == 2 and message in the_error(result)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content, message", [("", "holds no text"), ("tiny", "fewer than model.block_size + 1")])
def test_unusable_corpus_is_one_clear_line(tmp_path, content, message):
    (tmp_path / "corpus.txt").write_text(content)
    result = train(
        "--config",
        "configs/tiny.py",
        f"--config.data.source=text:{tmp_path / 'corpus.txt'}",
        f"--workdir={tmp_path / 'run'}",
    )
    assert result.returncode == 2 and message in the_error(result)
    assert not (tmp_path / "run").exists()


def test_workdir_that_is_a_file_is_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("precious")
    result = train("--config", "configs/tiny.py", f"--workdir={tmp_path / 'notes.txt'}")
    assert result.returncode == 2 and "is a file" in the_error(result)
    assert (tmp_path / "notes.txt").read_text() == "precious"


@pytest.mark.slow
def test_a_workdir_alone_resumes_and_extends_its_run(tmp_path):
    """--workdir alone uses the run's saved config; an override extends it. Extending past the
    end of the cosine is announced with the way to keep the finished decay."""
    workdir = tmp_path / "run"
    first = train("--config", "configs/tiny.py", f"--workdir={workdir}", *FAST)
    assert first.returncode == 0, first.stderr
    again = train(f"--workdir={workdir}")
    assert again.returncode == 0 and "already trained to step 4" in again.stdout + again.stderr
    longer = train(f"--workdir={workdir}", "--config.train.steps=6")
    assert longer.returncode == 0, longer.stderr
    assert "--config.train.decay_steps=4" in longer.stdout
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6
    from_json = train("--config", str(workdir / "config.json"), "--config.train.steps=7", "--quiet")
    assert from_json.returncode == 0, from_json.stderr
    assert json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 7


def test_help_answers_without_importing_jax():
    """-X importtime lists every module the process imports, on stderr."""
    commands = ((["train.py"], "--workdir"), (["sample.py"], "--workdir"), (["jaxgpt", "check"], "--overfit_steps"))
    for command, a_flag in commands:
        result = run_script("-X", "importtime", *command, "--help")
        assert result.returncode == 0 and "Examples:" in result.stdout and a_flag in result.stdout
        imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line]
        assert "flax" not in imported and not [m for m in imported if m == "jax" or m.startswith("jax.")]


def test_the_names_commands_had_before_the_entry_point_are_retired():
    """`python -m jaxgpt.check` (as commands were started before `jaxgpt COMMAND`) finds no
    module: nothing serves a command under a name a reader cannot find in the package."""
    earlier = run_script("jaxgpt.check", "--help")
    assert earlier.returncode == 1 and "No module named jaxgpt.check" in earlier.stderr, earlier.stderr[-2000:]


def test_commands_run_one_after_another_in_one_process_without_sharing_flags(capsys):
    """Each run parses into its own set of flags: train and check both define --config (absl's
    process-wide set would refuse the second definition), and an override given to one run is
    not seen by the next."""
    from jaxgpt.commands import check, train

    for main, argv, message in (
        (train.main, ["--config", "tiny", "--config.model.n_layr=1"], "unknown config key model.n_layr"),
        (check.main, ["--config", "tiny", "--config.model.n_layr=1"], "unknown config key model.n_layr"),
        (train.main, ["--config", "tiny", "--overfit_steps=3"], "unknown flag --overfit_steps"),
        (check.main, ["--config", "tiny", "--fresh"], "unknown flag --fresh"),
        (check.main, [], "no config given"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and capsys.readouterr().err.startswith(f"error: {message}")


def test_an_inspecting_command_names_what_is_missing_or_doubled(tmp_path, capsys):
    from jaxgpt.commands import logit_lens

    for argv, message in (
        (["--prompt", "x"], "no --workdir or --init_from given; the model to look at"),
        (["--workdir", str(tmp_path), "--init_from", "gpt2", "--prompt", "x"], "--workdir and --init_from were both"),
        (["--workdir", str(tmp_path)], "no --prompt given; the text to run the model on"),
        (["--workdir", str(tmp_path), "--prompt", "x", "--step", "3", "--init"], "--step and --init both choose"),
    ):
        with pytest.raises(SystemExit) as exit_:
            logit_lens.main(argv)
        assert exit_.value.code == 2 and capsys.readouterr().err.startswith(f"error: {message}"), argv


def test_output_into_a_closed_pipe_ends_quietly():
    """`jaxgpt plot --help | head -1`: the reader is gone before the command writes. No
    BrokenPipeError traceback; SIGPIPE's status, 141, as `yes | head` leaves."""
    import subprocess
    import sys

    from conftest import ROOT

    process = subprocess.Popen(
        [sys.executable, "-m", "jaxgpt", "plot", "--help"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # before the interpreter has even started: every write meets a closed pipe
    _, err = process.communicate(timeout=60)
    assert process.returncode == 141 and err == b"", err.decode()[-2000:]


A_COMMAND_AS_THE_PROCESS = """
import atexit, sys, threading, time
from pathlib import Path
from jaxgpt.commands.cli import run_as_the_process

atexit.register(lambda: Path(sys.argv[1]).write_text("exit handlers ran"))

def main():
    sys.stdout.write("written, not yet flushed")  # a pipe's stdout is buffered until the exit flushes it
    if sys.argv[2] == "with a thread":
        threading.Thread(target=time.sleep, args=(0.5,)).start()

run_as_the_process(main)
print(" and returned")
"""


def test_a_command_run_as_the_process_ends_with_its_output_flushed_and_exit_handlers_run(tmp_path):
    """run_as_the_process (train.py, sample.py, `jaxgpt`) skips the interpreter's teardown, not
    what an exit does for the files: the output flushed, the libraries' exit handlers run. With a
    thread still running that Python's exit would wait for, it returns and leaves the exit to Python."""
    import subprocess
    import sys

    from conftest import ROOT

    for case, after in (("alone", ""), ("with a thread", " and returned\n")):
        marker = tmp_path / case.replace(" ", "_")
        command = [sys.executable, "-c", A_COMMAND_AS_THE_PROCESS, str(marker), case]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and result.stdout == "written, not yet flushed" + after, result.stderr[-2000:]
        assert marker.read_text() == "exit handlers ran"


def test_one_entry_point_lists_every_command_and_names_the_nearest_to_a_typo():
    listed = run_script("jaxgpt")
    assert listed.returncode == 2 and all(f"  {name} " in listed.stdout for name in COMMANDS), listed.stdout
    typo = run_script("jaxgpt", "trian", "--config", "configs/tiny.py")
    assert typo.returncode == 2
    assert typo.stderr.strip() == f"error: unknown command 'trian'; did you mean train? commands: {', '.join(COMMANDS)}"


QUICK_HELP = {"train", "attention-maps", "plot"}  # absl and argparse flags, a hyphenated name


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK_HELP else pytest.mark.slow) for n in COMMANDS])
def test_every_command_answers_help_through_the_one_entry_point(name):
    """`python -m jaxgpt NAME --help` is that command's own help, in one style whichever flag
    library parses it: what it does, its example command lines, and the flags with defaults."""
    source = (ROOT / "jaxgpt" / "commands" / f"{COMMANDS[name][0]}.py").read_text()  # not imported: absl's
    result = run_script("jaxgpt", name, "--help")  # flags are process-wide, and the commands share names
    assert result.returncode == 0, result.stderr[-2000:]
    doc = ast.get_docstring(ast.parse(source))
    examples = [line.strip() for line in doc.splitlines() if line.strip().startswith("python ")]
    shown = " ".join(result.stdout.split())
    assert doc.split(":")[0] in shown and examples and all(" ".join(e.split()) in shown for e in examples), shown[:800]
    if not COMMANDS[name][1].startswith("retired"):  # a retired command has no flags left to show
        assert "(default: " in result.stdout, result.stdout[-1500:]
