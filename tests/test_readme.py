"""The guide's commands as a user copies them: every shell command in the ```bash blocks of the
README and of the docs pages it leads to (GUIDE) runs offline on this CPU (shortened, or in full
in tests/test_readme_runs.py) or is excused below with the reason; the numbers they quote from
the tiny config's run and its pre-flight check are the numbers those commands print."""

import ast
import itertools
import math
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, UNOPTIMISED_BACKEND, users_environment

# The README, then the pages whose commands read the runs the README's commands write, in the
# order a reader meets them (a sampling or plotting command comes after the run it reads).
GUIDE_PAGES = ["README.md"] + [f"docs/{p}.md" for p in ("training", "configuration", "devices", "workbench", "model")]
README = (ROOT / "README.md").read_text()
GUIDE = "\n".join((ROOT / page).read_text() for page in GUIDE_PAGES)

# Commands an offline 2-core CPU cannot run, and why. Every other command is run.
EXCUSED = {
    r"^pip install": "installs packages: CI's own setup (.ci/run) does this",
    r"^python3\.11 -m venv |^\. \.venv(-lens)?/bin/activate$": "makes a virtual environment: CI's own setup does this",
    r"pytest": "the test suite itself",
    r"^gcloud ": "needs a TPU slice",
    r"train\.py .*gpt2_124m\.py": "trains GPT-2 small on FineWeb-edu: a Hub download and days of an accelerator",
    r"finetune_gpt2|--init_from gpt2": "downloads GPT-2's weights from the Hub (tests/test_hf.py covers a local copy)",
    r"jaxgpt serve|^curl ": "a server runs until Ctrl-C, and a client needs it: tests/test_serve.py runs both",
}

# A one-layer model: the same code path at a third of the compile (15 s -> 10 s a command, Zen 5).
# It goes right after --config, before the command's own flags, so a command that sets n_layer
# keeps its value.
SMALLER_MODEL = ["--config.model.n_layer=1"]
SHORT_TRAINING = [
    "--config.train.steps=3",
    "--config.train.eval_every=3",
    "--config.train.eval_batches=1",
    "--config.train.checkpoint_every=3",
]
COMMANDS = {  # how each entry point is started without installing the package
    "python train.py": [sys.executable, str(ROOT / "train.py")],
    "python sample.py": [sys.executable, str(ROOT / "sample.py")],
    "jaxgpt ": [sys.executable, "-m", "jaxgpt"],  # the installed console script is the same dispatcher
    "python -m": [sys.executable, "-m"],
    "echo ": ["bash", "-c"],  # writes a file a later command reads
}


def command_name(args: list[str]) -> str:
    """train, sample, check, ... whichever spelling the guide starts it with: python train.py,
    jaxgpt train or python -m jaxgpt train."""
    if args[:1] == ["python"] and args[1] in ("train.py", "sample.py"):
        return args[1].removesuffix(".py")
    if args[0] == "jaxgpt":
        return args[1].replace("_", "-")
    if args[:3] == ["python", "-m", "jaxgpt"]:
        return args[3].replace("_", "-")
    if args[:2] == ["python", "-m"]:
        return args[2].removeprefix("jaxgpt.").replace("_", "-")
    return args[0]


def shell_commands(markdown: str) -> list[str]:
    """The commands of the ```bash blocks: continuation lines joined, comments dropped,
    `a && b` as two commands."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                # && outside quotes: an even number of quotes follows it
                commands += [part.strip() for part in re.split(r'&&(?=(?:[^"]*"[^"]*")*[^"]*$)', line)]
    return commands


# The Python files the guide asks a user to write, each a ```python block whose first line names
# it ("# my_rewards.py, in the folder you run train.py in"): the commands that name them run on them.
YOUR_FILES = re.findall(r"```python\n# (\w+\.py), in the folder you run .*?\n(.*?)```", GUIDE, flags=re.S)


def excuse(command: str) -> str | None:
    return next((why for pattern, why in EXCUSED.items() if re.search(pattern, command)), None)


# Commands tests/test_readme_runs.py runs as written and to their end (where the README quotes
# what they print), so a shortened run of them here would only repeat their start. Nothing later
# in the README reads what they write.
RUN_IN_FULL = {
    "speedrun": r"^python train\.py --config configs/tiny_speedrun\.py ",
    "pre-flight": r"^jaxgpt check --config tiny$",
}

RUNNABLE = [c for c in shell_commands(GUIDE) if excuse(c) is None]
SHORTENED = [c for c in RUNNABLE if not any(re.search(pattern, c) for pattern in RUN_IN_FULL.values())]


def readme_command(name: str) -> str:
    """The one runnable guide command RUN_IN_FULL[name] picks out."""
    (command,) = [c for c in RUNNABLE if re.search(RUN_IN_FULL[name], c)]
    return command


def test_the_readme_commands_are_found_and_each_is_run_or_excused():
    commands = shell_commands(GUIDE)
    assert len(commands) >= 20  # the parser found the blocks
    for command in RUNNABLE:
        assert any(command.startswith(prefix) for prefix in COMMANDS), f"no way to run: {command}"
    assert "python train.py --config configs/tiny.py" in SHORTENED  # the first run is run, not excused
    assert len(SHORTENED) == len(RUNNABLE) - len(RUN_IN_FULL)  # each name picks out exactly one
    assert all(readme_command(name) for name in RUN_IN_FULL)
    named = {m.split(":")[0] + ".py" for m in re.findall(r"reward=(\w+:\w+)", GUIDE)}
    assert named and named <= {name for name, _ in YOUR_FILES}  # each module a command imports is shown


def smaller_model(args: list[str]) -> list[str]:
    at = (
        args.index("--config") + 2
        if "--config" in args
        else next(i for i, a in enumerate(args) if a.startswith("--config=")) + 1
    )
    return args[:at] + SMALLER_MODEL + args[at:]


def spelled(command: str) -> tuple[str, ...]:
    """A command as (its name, its arguments), whichever way it is started: `jaxgpt check ...`
    and `python -m jaxgpt check ...` run the same program."""
    args = shlex.split(command)
    name = command_name(args)
    skip = 2 if args[0] == "jaxgpt" or args[1].endswith(".py") else 4 if args[2] == "jaxgpt" else 3
    return (name, *args[skip:])


def help_examples(module: str) -> list[str]:
    """The command lines under "Examples:" in a command's docstring (which is its --help)."""
    doc = ast.get_docstring(ast.parse((ROOT / "jaxgpt" / "commands" / f"{module}.py").read_text()))
    block = doc.split("Examples:\n", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    return [line.split("  #", 1)[0].strip() for line in block.splitlines()]


def test_every_commands_help_shows_an_example_that_a_test_runs_as_written():
    """Not shortened: the guide's commands that test_readme_command_runs leaves as they are, the
    ones tests/test_readme_runs.py runs in full, compare's first try (tests/test_compare.py) and
    the server's (tests/test_serve.py)."""
    from test_compare import HELP_EXAMPLE
    from test_serve import HELP_EXAMPLE as SERVE_EXAMPLE  # a server runs until stopped: its test stops it

    from jaxgpt.commands.dispatch import COMMANDS as NAMES

    unshortened = [c for c in RUNNABLE if argv_for(c, ROOT) == argv_for(c, ROOT, shortened=False)]
    in_full = [readme_command(name) for name in RUN_IN_FULL] + ["python train.py --config configs/tiny.py"]
    as_written = {spelled(c) for c in unshortened + in_full + [HELP_EXAMPLE, SERVE_EXAMPLE]}
    for name, (module, what) in NAMES.items():
        if what.startswith("retired"):  # says in one line what replaced it (tests/test_encoder_decoder.py)
            continue
        examples = help_examples(module)
        assert examples and all(spelled(e)[0] == name for e in examples), (name, examples)
        assert {spelled(e) for e in examples} & as_written, f"no example of {name} --help is run as written"


def test_the_readme_is_a_short_guide_whose_links_lead_to_every_docs_page():
    assert len(README.splitlines()) <= 250
    linked = re.findall(r"\]\((docs/[\w/.-]+?)(?:#[\w-]+)?\)", README)
    assert linked and all((ROOT / link).is_file() for link in linked), linked
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    index = (ROOT / "docs" / "README.md").read_text()
    assert [page for page in pages if f"]({page})" not in index] == []
    assert "docs/README.md" in linked


def argv_for(command: str, home, shortened: bool = True) -> list[str]:
    prefix = next(p for p in COMMANDS if command.startswith(p))
    args = [a.replace("~", str(home), 1) if a.startswith("~") else a for a in shlex.split(command[len(prefix) :])]
    if prefix == "echo ":
        return COMMANDS[prefix] + [command]
    if not shortened:
        return COMMANDS[prefix] + args
    name = command_name(shlex.split(command))
    if name == "train":
        args = smaller_model(args) + SHORT_TRAINING
    elif name == "compare":
        args = smaller_model(args) + [
            "--steps=3",
            "--config.train.eval_every=3",
            "--config.train.eval_batches=1",
            "--quiet",  # one line per run; the table is still printed
        ]
    return COMMANDS[prefix] + args


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A directory to run the commands in, holding the files they name (a book, a corpus,
    docs/images/, the multiple-choice fixture), with HOME inside it."""
    home = tmp_path_factory.mktemp("readme")
    (home / "path" / "to").mkdir(parents=True)
    (home / "path" / "to" / "book.txt").write_text("It was the best of times, it was the worst of times. " * 400)
    (home / "corpus").mkdir()
    (home / "corpus" / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 400)
    (home / "docs" / "images").mkdir(parents=True)
    (home / "tests" / "data").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "hellaswag_sample.jsonl", home / "tests" / "data")
    for name, code in YOUR_FILES:  # as the guide shows them, for the commands that name them
        (home / name).write_text(code)
    return home


CHAT_TURNS = "What is 37 + 45?\nAnd 12 + 9?\n"


@pytest.mark.slow
@pytest.mark.parametrize("command", SHORTENED)
def test_readme_command_runs(command, sandbox, request):
    """In the guide's order: the sampling and plotting commands read the runs the training ones wrote."""
    # The user's default device count, not the test session's eight; compiled as the tests
    # compile (three steps: the compile is most of a command's time, and a user's flags would
    # show nothing here that tests/test_readme_runs.py's full runs do not).
    env = users_environment(HOME=str(sandbox), XLA_FLAGS=UNOPTIMISED_BACKEND)
    if "tokenizer=gpt2" in command:
        env["TIKTOKEN_CACHE_DIR"] = str(request.getfixturevalue("gpt2_bpe"))
    typed = CHAT_TURNS if command_name(shlex.split(command)) == "chat" else None  # what a user types into a chat
    result = subprocess.run(
        argv_for(command, sandbox), cwd=sandbox, env=env, capture_output=True, text=True, input=typed
    )
    assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
    if typed:  # an answer a line, a line a turn (a line break the model writes is escaped)
        assert result.stdout.count("\n") == typed.count("\n"), result.stdout
    assert_prints_what_it_should(command, result.stdout + result.stderr, sandbox)


def assert_prints_what_it_should(command: str, printed: str, home) -> None:
    """What each kind of command says when it has done its work, read from the command itself:
    a training run its last step (3, shortened), a sample its prompt, a check the slice it fits,
    a table its rows, a drawing the file it wrote."""
    args = shlex.split(command)
    name = command_name(args)
    value = {a: b for a, b in itertools.pairwise(args) if a.startswith("--")}
    if name == "echo":
        assert (home / args[-1]).read_text() == args[1] + "\n"
    elif name == "train":
        assert re.search(r"done: step 3, val loss [\d.]+|already trained to step 3", printed), printed[-2000:]
    elif name == "sample":
        prompt = (home / value["--prompt_file"]).read_text() if "--prompt_file" in value else value.get("--prompt", "")
        samples = re.split(r"^--- sample \d+\n", printed, flags=re.M)[1:] or [printed]
        assert len(samples) == int(value.get("--num_samples", 1)), printed
        shown = [prompt, f"<|user|>{prompt}<|end|><|assistant|>"]  # a chat run shows the template it read
        assert all(any(s.startswith(p) and len(s) > len(p) for p in shown) for s in samples), printed
    elif name == "check" and "--target" in value:
        assert f"\nfits {value['--target']}\n" in printed and "\nper device: parameters " in printed, printed
    elif name == "prepare":
        assert re.search(r"[\d,]+ tokens \([\d,]+ train, [\d,]+ validation\)", printed), printed
    elif name == "hellaswag":
        assert re.search(r"\d+ questions, accuracy [\d.]+", printed), printed
    elif name == "evaluate" and "--lengths" not in value:  # a run trained on text pairs: its answers scored
        answers = r"[\d,]+ held-out (pairs|conversations): answer loss [\d.]+, .* exactly right"
        assert re.search(answers, printed), printed
    elif name == "evaluate":
        # a row per run and length, or the length named as skipped for that run (with the reason)
        runs = [Path(b).name for a, b in itertools.pairwise(args) if a == "--workdir"]
        asked = set(itertools.product(runs, value["--lengths"].split(",")))
        scored = set(re.findall(r"^(\S+) +\d+ +(\d+) +\d+ ", printed, flags=re.M))
        skipped = re.findall(r"^(\S+): lengths ([\d, ]+) skipped: ", printed, flags=re.M)
        skipped = {(Path(run).name, n) for run, lengths in skipped for n in lengths.split(", ")}
        assert scored | skipped == asked and not scored & skipped, printed
    elif name == "fill":
        blanks = value["--prompt"].count("[MASK]")
        assert printed.startswith("filled (") and len(re.findall(r"^blank \d+ ", printed, flags=re.M)) == blanks, (
            printed
        )
    elif name == "compare":
        varied = [b.split("=", 1)[1].split(",") for a, b in itertools.pairwise(args) if a == "--vary"]
        rows = [line for line in printed.splitlines() if line.startswith("| ") and "=" in line.split("|")[1]]
        assert len(rows) == math.prod(map(len, varied)), printed
        assert all(line.split("|")[2].strip() == value["--seeds"] for line in rows), printed
    out = value.get("--out")
    if out and name == "compare":
        assert (home / out / "results.md").exists()
    elif name == "tokenizer":
        assert printed.startswith("trained a byte-level BPE of ") and "  this BPE (" in printed, printed
        assert f"wrote {value['--out']}/tokenizer.json" in printed, printed
    elif name == "activations" and "--names" not in value:  # the list of sites
        assert re.match(r"\d+ sites \(", printed) and "  blocks.0.hook_resid_pre " in printed, printed
    elif name == "patch":  # its tables, and a directory of drawings
        assert "fraction of the difference restored by patching each activation" in printed, printed
        assert f"wrote {value.get('--out', value['--workdir'] + '/patching')}/patching.png" in printed, printed
    elif out and name == "export":  # a Hugging Face folder
        assert printed.startswith(f"wrote {out}: ") and (home / out / "model.safetensors").exists(), printed
    elif out:  # a drawing
        assert f"wrote {out}" in printed and (home / out).read_bytes()[:4] == b"\x89PNG", printed


def quoted_block(after: str) -> str:
    """The first plain ``` block after the text `after`."""
    return re.search(r"```\n(.*?)```", GUIDE[GUIDE.index(after) :], flags=re.S).group(1)


def numbers(text: str) -> list[str]:
    return re.findall(r"(?<![\w.])\d[\d,]*\.?\d*", text)


def agree(printed: str, quoted: str) -> bool:
    """The same numbers, each within one unit of the README's last printed digit: printing
    rounds each side by half a unit, and another machine, choosing another microbatch count,
    sums in another order (losses differ by about 1e-5: docs/benchmarks.md), far below a unit."""
    ours, theirs = numbers(printed), numbers(quoted)
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs, strict=True):
        unit = 10.0 ** -len(b.split(".")[1]) if "." in b else 1.0
        if abs(float(a.replace(",", "")) - float(b.replace(",", ""))) > unit:
            return False
    return True


def test_no_example_of_a_commands_help_runs_two_lines_into_one():
    """A docstring's line continuation written as one backslash is Python's, not the shell's:
    the two lines of an example joined with a run of spaces in --help. Two backslashes keep it."""
    for path in sorted((ROOT / "jaxgpt" / "commands").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        examples = doc.split("Examples:\n", 1)[1].split("\n\n", 1)[0] if "Examples:\n" in doc else ""
        joined = [line for line in examples.splitlines() if re.search(r"\S {4,}--", line)]
        assert joined == [], (path.name, joined)


def test_a_figure_quoted_on_two_pages_is_the_one_its_benchmark_recorded():
    """GPT-2 124M's memory a v5e chip: docs/devices.md said 12.14 GiB (remat=dots, as shipped
    before 2026-11-27) where docs/gpt2_124m.md said 9.81 for the same command. Both now quote
    bench/results/tpu_compile.json, which bench/tpu_compile.py writes from the TPU compiler."""
    import json

    rows = json.loads((ROOT / "bench" / "results" / "tpu_compile.json").read_text())["rows"]
    (row,) = [r for r in rows if (r["config"], r["target"]) == ("gpt2_124m", "tpu-v5e-8")]
    recorded = f"{row['total_gib']:.2f} GiB"
    pages = {
        "docs/devices.md": r"`configs/gpt2_124m.py`: ([\d.]+ GiB) of a v5e chip's 16",
        "docs/gpt2_124m.md": r"reports ([\d.]+ GiB) of a chip's 16",
    }
    for page, pattern in pages.items():
        quoted = re.findall(pattern, " ".join((ROOT / page).read_text().split()))
        assert quoted == [recorded], (page, quoted, recorded)


def test_the_spreads_the_docs_quote_for_long_runs_are_the_ones_measured():
    """docs/configuration.md and docs/training.md quote the long runs' figures as the spread
    bench/doc_figures.py measured over seeds and step layouts (bench/results/doc_figures.json):
    each bound as the page rounds it."""
    import json

    figures = json.loads((ROOT / "bench" / "results" / "doc_figures.json").read_text())["figures"]
    pages = " ".join(
        " ".join((ROOT / "docs" / page).read_text().split()) for page in ("configuration.md", "training.md")
    )

    def percent(x):
        return f"{100 * x:.1f}%"

    dates, base, chat = figures["dates"]["spread"], figures["arithmetic"]["spread"], figures["sft_arithmetic"]["spread"]
    expected = [
        f"lay between {dates['val_loss']['min']:.4f} and {dates['val_loss']['max']:.4f}",
        f"found {percent(dates['evaluate_exact']['min'])[:-1]}% to {percent(dates['evaluate_exact']['max'])}",
        f"val loss {base['val_loss']['min']:.4f} to {base['val_loss']['max']:.4f}",
        f"{percent(chat['val_exact_match']['min'])} to {percent(chat['val_exact_match']['max'])} of the 2,037",
        f"wrote {percent(chat['val_exact_match']['min'])} to {percent(chat['val_exact_match']['max'])} of its held-out",
    ]
    assert [phrase for phrase in expected if phrase not in pages] == []
    tiny = [f"{r['val_loss']:.7f}" for r in figures["tiny"]["runs"] if r["seed"] == 0]
    assert f"val {tiny[0]}, {tiny[1]} and {tiny[2]} under this machine's split" in pages
