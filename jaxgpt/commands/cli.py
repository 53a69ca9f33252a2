"""What the command-line scripts share: flag parsing and one-line errors.

Bad input (a UserError, or a flag ml_collections rejects) prints one line naming the problem
and the fix, and exits with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from absl import flags

from jaxgpt.errors import UserError

USAGE_ERROR = 2
BROKEN_PIPE = 128 + 13  # SIGPIPE's status, as `yes | head` leaves it


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


def command_flags(argv: list[str]) -> tuple[list[str], flags.FlagValues]:
    """(argv with its program name first, an empty set of flags) for one run of a command:
    `argv` as given to its main() (without the program name), or sys.argv's. Each run defines
    its flags afresh, in its own set rather than absl's process-wide one, so commands run one
    after another in one process (a notebook, the tests) neither collide on a shared name such
    as --workdir nor inherit each other's values."""
    return [sys.argv[0], *(sys.argv[1:] if argv is None else argv)], flags.FlagValues()


def parse_flags(
    argv: list[str], usage: str = "", flag_values: flags.FlagValues = flags.FLAGS, takes_words: bool = False
) -> list[str]:
    """Parse argv into `flag_values`, turning every rejection into one clear line. `--help`
    (or -h) prints `usage` (the command's docstring: what it does, example commands) and its
    flags with their defaults, and exits 0. Words that are not flags are refused, unless the
    command takes them (`takes_words`, as plot takes the runs to draw): then they are returned."""
    if any(arg in ("--help", "-h", "--helpfull") for arg in argv[1:]):
        print_help(usage, flag_values)
        sys.exit(0)
    config_file = _flag_value(argv, "--config")
    if config_file:
        config_file = shipped_config(config_file)
        argv = [argv[0], f"--config={config_file}", *_without_flag(argv[1:], "--config")]
        check_config_file(config_file)
    try:
        words = flag_values(argv)[1:]
    except (AttributeError, KeyError) as error:  # ml_collections: an override names no key
        fail(_unknown_key_message(argv, str(error), flag_values))
    except flags.UnrecognizedFlagError as error:
        given = error.flagvalue.partition("=")[2] or _flag_value(argv, error.flagvalue) or "VALUE"
        hint = _config_key_for(error.flagname, given) if "config" in flag_values else None
        fail(f"unknown flag --{error.flagname}" + (f"; did you mean {hint}?" if hint else " (see --help)"))
    except flags.Error as error:
        fail(f"{str(error).strip().splitlines()[-1]} (see --help)")
    except Exception as error:  # the config file itself failed to run
        fail(f"config file {config_file} failed to load: {str(error).strip().splitlines()[-1]}")
    if takes_words:
        return words
    for word in words:  # the command takes flags only
        looks_like_config = word.endswith(".py") or word in shipped_config_names()
        if looks_like_config and "config" in flag_values and config_file is None:
            fail(f"{word} is a word, not a flag; did you mean --config {word}?")
        fail(f"unexpected argument {word!r}; every argument is a flag (see --help)")
    return words


@contextlib.contextmanager
def writing(out: Path, what: str = "a path"):
    """Around a command's writing of `out`: its folder made first, and a path that cannot be
    written (a read-only workdir, a full disk) one line offering --out, not a traceback; what
    the command printed before it stands."""
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        yield Path(out)
    except OSError as error:
        raise UserError(f"cannot write {out} ({error.strerror}); pass --out {what} you can write to") from None


def require(flag_values: flags.FlagValues, *names: str, what: str = "") -> None:
    """Fail with one line unless exactly one of the flags `names` was given (or, for one name,
    unless it was): the rule argparse's required groups kept, with a line that says the fix."""
    given = [name for name in names if flag_values[name].present]
    listed = " or ".join(f"--{name}" for name in names)
    if not given:
        fail(f"no {listed} given{'; ' + what if what else ''} (see --help)")
    if len(given) > 1:
        fail(f"{' and '.join(f'--{name}' for name in given)} were both given; pass one of {listed}")


# nanoGPT's names for what jaxgpt's config keys are (its configurator takes --name=value)
NANOGPT_KEYS = {
    "n_embd": "model.d_model",
    "learning_rate": "train.lr",
    "max_iters": "train.steps",
    "lr_decay_iters": "train.decay_steps",
    "warmup_iters": "train.warmup_steps",
    "eval_interval": "train.eval_every",
    "eval_iters": "train.eval_batches",
    "log_interval": "train.log_every",
    "gradient_accumulation_steps": "train.microbatches",
    "dataset": "data.source",
}


def _config_key_for(name: str, value: str) -> str | None:
    """The override that sets what --name=value means to set, where a config key (or nanoGPT's
    name for one) is called `name`: --batch_size=32 -> --config.train.batch_size=32."""
    if name == "out_dir":
        return f"--workdir={value}"
    from jaxgpt.config_files import SECTIONS, base_config

    config = base_config()
    key = NANOGPT_KEYS.get(name) or next((f"{s}.{name}" for s in SECTIONS if name in config[s]), None)
    return key and f"--config.{key}={value}"


def print_help(usage: str, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The docstring as written (its examples keep their lines), then each flag with its
    default. A command's own set of flags is listed whole; absl's process-wide set (bench/'s
    scripts) only for the flags the running script defined."""
    print(usage.strip() + "\n\nflags:")
    if flag_values is flags.FLAGS:
        shown = flag_values.flags_by_module_dict().get(sys.argv[0], [])
    else:
        shown = [flag_values[name] for name in flag_values]
    for flag in sorted(shown, key=lambda f: f.name):
        default = "" if flag.default in (None, []) else f" (default: {flag.default})"
        print(f"  --{flag.name}: {flag.help}{default}")


# configs/ beside the package in a checkout (or an editable install); jaxgpt/configs/ in an
# installed wheel, which carries them there (pyproject.toml)
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # jaxgpt/, this file being jaxgpt/commands/cli.py
SHIPPED_CONFIG_DIRS = (PACKAGE_DIR / "configs", PACKAGE_DIR.parent / "configs")


def define_config_flag(flag_values: flags.FlagValues = flags.FLAGS, argv: list[str] | None = None):
    """The --config flag (train, check, compare, prepare), with its --config.<section>.<key>
    overrides, which ml_collections finds in `argv` (default: sys.argv)."""
    from ml_collections import config_flags

    return config_flags.DEFINE_config_file(
        "config", None, "Python config file, e.g. configs/tiny.py.", flag_values=flag_values, sys_argv=argv
    )


def require_config(flag, alternative: str = "") -> None:
    """Fail with one line when no --config was given."""
    if flag.value is None:
        fail(f"no config given; pass --config configs/tiny.py (or another file in configs/){alternative}")


def shipped_config(value: str) -> str:
    """`value` (a --config argument, maybe with ml_collections' :ARGUMENT) where it names a
    file; else the shipped config it names, so `--config configs/tiny.py` and `--config tiny`
    work from any directory. Only a bare name or configs/NAME stands for a shipped config: a
    missing my/dir/tiny.py stays missing rather than silently becoming the shipped tiny.py."""
    path, colon, argument = value.partition(":")
    if Path(path).is_file() or Path(path).parent not in (Path("."), Path("configs")):
        return value
    name = Path(path).name if path.endswith(".py") else f"{Path(path).name}.py"
    for directory in SHIPPED_CONFIG_DIRS:
        if (directory / name).is_file() and name != "__init__.py":
            return f"{directory / name}{colon}{argument}"
    return value


def shipped_config_names() -> list[str]:
    names = {p.stem for d in SHIPPED_CONFIG_DIRS if d.is_dir() for p in d.glob("*.py") if p.stem != "__init__"}
    return sorted(names)


def check_config_file(path: str) -> None:
    """Fail with one line unless `path` is a config file as configs/ has them: a get_config()
    returning the ConfigDict of jaxgpt.config_files.base_config(), with its four sections."""
    import runpy

    import ml_collections

    from jaxgpt.config_files import SECTIONS

    path, _, argument = path.partition(":")  # ml_collections' file.py:ARGUMENT form
    if not Path(path).is_file():
        fail(
            f"config file {path} not found; pass --config a file, or one of the shipped configs by name "
            f"({', '.join(shipped_config_names())})"
        )
    fix = "start it from jaxgpt.config_files.base_config() as configs/tiny.py does"
    try:
        get_config = runpy.run_path(path).get("get_config")
        if not callable(get_config):
            fail(f"config file {path} defines no get_config(); {fix}")
        config = get_config(argument) if argument else get_config()
    except SystemExit:
        raise
    except UserError as error:  # a run's own config.json that cannot be read
        fail(str(error))
    except ImportError as error:
        if error.name == "jaxgpt.config" and "base_config" in str(error):  # where it used to be
            fail(f"config file {path} imports base_config from jaxgpt.config; it is in jaxgpt.config_files now")
        fail(f"config file {path} failed to load: ImportError: {error}")
    except Exception as error:  # the config file itself failed to run
        fail(f"config file {path} failed to load: {type(error).__name__}: {str(error).strip().splitlines()[-1]}")
    if not isinstance(config, ml_collections.ConfigDict):
        fail(f"get_config() in {path} returned a {type(config).__name__}, not a ConfigDict; {fix}")
    missing = [s for s in SECTIONS if s not in config]
    if missing:
        fail(f"config file {path} has no {', '.join(missing)} section(s); {fix}")


SAVED_CONFIG = Path(__file__).with_name("saved_config.py")


def config_from_run(argv: list[str]) -> list[str]:
    """argv with a run's saved configuration as the config file where the user named none
    (`--workdir runs/X` alone: resume it) or named a run's config.json: overrides on the
    command line then apply to the run's own values."""
    config, workdir = _flag_value(argv, "--config"), _flag_value(argv, "--workdir")
    # --config goes first: the --config.<key> overrides exist only once the file is loaded
    if config and config.endswith(".json"):
        program, *rest = _without_flag(argv, "--config")
        if not workdir:
            rest.append(f"--workdir={Path(config).parent}")
        return [program, f"--config={SAVED_CONFIG}:{config}", *rest]
    if config is None and workdir and _a_run(Path(workdir)):
        return [argv[0], f"--config={SAVED_CONFIG}:{workdir}", *argv[1:]]
    return argv


def _a_run(workdir: Path) -> bool:
    """Whether `workdir` holds a run to resume: its config.json, or checkpoints whose records
    say the configuration where config.json was lost."""
    checkpoints = workdir / "checkpoints"
    return (workdir / "config.json").is_file() or (
        checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())
    )


def config_overrides(argv: list[str]) -> tuple[str, ...]:
    """The config keys the command line sets (--config.model.rope_theta=2e6 -> model.rope_theta):
    the values given on purpose, where a run starting from weights takes the rest from them."""
    return tuple(arg.removeprefix("--config.").split("=")[0] for arg in argv if arg.startswith("--config."))


def _without_flag(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def _flag_value(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _unknown_key_message(argv: list[str], text: str, flag_values) -> str:
    # ml_collections names the missing key in quotes, and where one is close adds: Did you mean
    # "n_layer" instead of "n_layr"? Find the override that used the bad name to report the full
    # dotted key.
    match = re.search(r'Did you mean "(\w+)" instead of "(\w+)"', text)
    named = re.search(r"'(\w+)'", text)
    guess, bad = match.groups() if match else (None, named and named.group(1))
    for arg in argv:
        parts = arg.split("=")[0].removeprefix("--config.").split(".")
        if arg.startswith("--config.") and bad in parts:
            at = parts.index(bad)
            key = ".".join(parts[: at + 1])
            if guess:
                return f"unknown config key {key}; did you mean {'.'.join(parts[:at] + [guess])}?"
            if at == 0 and bad in flag_values:  # e.g. --config.workdir for --workdir
                return f"unknown config key {key}: --{bad} is a flag of its own, not a config key (--{bad}=...)"
            return f"unknown config key {key}; check its spelling (the sections and their keys: jaxgpt/config/)"
    if guess:
        return f"unknown config key {bad}; did you mean {guess}?"
    return f"unknown config key in {' '.join(a for a in argv if a.startswith('--config.'))}; check its spelling"


def refuse_unless_served(model, command: str, where, what_it_lacks: str) -> None:
    """One line where `command` needs predictions the model's objective does not make (sample
    given an encoder, fill given a decoder: `Objective.commands`), naming what suits it."""
    from jaxgpt.training.objectives import objective_of

    objective = objective_of(model)
    if command not in objective.commands:
        raise UserError(f"{where} is {objective.described}: {what_it_lacks}; {objective.instead}")


def refuse_an_encoder_decoder(model, where, what_it_lacks: str) -> None:
    """One line where a command that reads a decoder's text alone (logit-lens, hellaswag) is
    given an encoder–decoder, whose decoder answers a source, naming the commands that suit it."""
    if model.encoder_layers:
        raise UserError(
            f"{where} is an encoder–decoder (model.encoder_layers={model.encoder_layers}), whose decoder answers a "
            f"source: {what_it_lacks}; sample.py --prompt SOURCE, attention-maps and activations take it"
        )


def run_as_the_process(main: Callable[[], None]) -> None:
    """Run a command's main() as the whole process (train.py, sample.py, the `jaxgpt` script),
    and when it returns end the process without the interpreter's teardown: freeing every
    module's objects and XLA's client took 0.23-0.33 s of a one-step run's 3.5 s on a 2-core
    Zen 4, and writes nothing. What an exit does for the files is kept: the libraries' exit
    handlers run (JAX's, which also leaves a multi-process run's coordinator cleanly; logging's)
    and the output is flushed. Where a thread that Python's exit would wait for still runs, or a
    Python release has moved atexit's private call, the exit is left to Python. A main() that
    raises (an error, --help) exits as usual; main() called in a notebook or a test returns."""
    main()
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)  # private: what the interpreter calls at exit
    waited_for = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if run_exit_handlers is None or waited_for:
        return
    run_exit_handlers()
    from jaxgpt.commands.interrupt import flush_output

    flush_output()
    os._exit(0)


def command(interrupted: str = "interrupted", starts_jax: bool = True):
    """A command's entry point, `main(argv=None)`, run under `run` below: every command's
    bad input exits 2 with one line, Ctrl-C as `interrupted` says. `@cli.command()` above it."""

    def decorate(body: Callable[[list[str] | None], None]) -> Callable[[list[str] | None], None]:
        @functools.wraps(body)
        def main(argv: list[str] | None = None) -> None:
            run(lambda: body(argv), interrupted, starts_jax)

        return main

    return decorate


def run(main: Callable[[], None], interrupted: str = "interrupted", starts_jax: bool = True) -> None:
    """Run main(), reporting a UserError as one line and exit status 2; Ctrl-C at any moment
    prints `interrupted` and exits 130 (jaxgpt.commands.interrupt says how, and why not as a
    KeyboardInterrupt); output piped into a reader that stops early (`| head`) ends quietly with
    141, as a program killed by SIGPIPE does. JAX's platforms are chosen first, before main can
    start a backend (no TPU backend on a machine without a TPU), after the one check every
    command makes first (runtime.start_up: an address-space limit JAX cannot run under).
    `starts_jax=False` (plot, prepare: numpy and matplotlib alone) skips both."""
    from jaxgpt.commands.interrupt import end_at_once_on_interrupt

    end_at_once_on_interrupt(interrupted)
    try:
        try:
            if starts_jax and not {"-h", "--help", "--helpfull"} & set(sys.argv[1:]):  # help needs no JAX
                from jaxgpt.hardware import runtime

                runtime.start_up()
            main()
        finally:  # `--help` exits through here too: a closed pipe raises now, not at the interpreter's exit
            sys.stdout.flush()
    except UserError as error:
        fail(str(error))
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        sys.exit(BROKEN_PIPE)
