"""Shared test setup: eight fake CPU devices, a private data cache, the shared tiktoken cache.

XLA reads XLA_FLAGS once, when jax is first imported, so this must run before any test
module imports jax; pytest imports conftest.py first.
"""

import fcntl
import importlib.util
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# On a GPU (JAX_PLATFORMS=cuda,cpu: bench/gpu_session.py runs the tests marked `gpu` so), the tests
# check the same float32 arithmetic they check on a CPU. JAX's default on a GPU rounds float32
# matmul inputs to TF32 (10 mantissa bits, about 5e-4 relative), a speed choice the tolerances
# derived from float32 rounding are not meant to absorb; and XLA's GPU reductions run in an order
# that can change from run to run, where the tests compare runs bit for bit. Measured on an H200
# (docs/benchmarks.md): at full precision the four families' losses on the GPU match the CPU's
# within 8e-8 over 30 steps; with deterministic ops a stopped and resumed run matches the straight
# one exactly, where without them two runs differ from the 7th digit.
ON_GPU = any(name in os.environ["JAX_PLATFORMS"] for name in ("cuda", "gpu"))
if ON_GPU:
    os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    os.environ["XLA_FLAGS"] += " --xla_gpu_deterministic_ops=true"

# Prepared token files and compiled programs go to a test run's own cache, never the user's ~/.cache.
# The first pytest process makes it, and pytest-xdist's workers (and the scripts they start)
# inherit it, so a corpus prepared or a step compiled by one test is found by the others; the
# process that made it removes it at the end (pytest_unconfigure). Two processes filling it at
# once is a case both caches handle: a corpus is prepared in a temporary folder and renamed into
# place, and the compilation cache, bounded by jaxgpt.hardware.runtime, is read and written under a lock.
_MADE_CACHE = "JAXGPT_TEST_CACHE" not in os.environ
if _MADE_CACHE:
    os.environ["JAXGPT_TEST_CACHE"] = tempfile.mkdtemp(prefix="jaxgpt-test-cache-")
    # Compiled programs alone outlive a local test run (CI's, which sets the variable above,
    # starts empty): XLA's cache is keyed by the program, jaxlib's version, the flags and the
    # compile options, so a changed model compiles afresh and an unchanged one loads. A second
    # run of test_trainer.py + test_sampling.py: 62 s against 151 s. In .pytest_cache/, which git
    # ignores; JAXGPT_COMPILATION_CACHE chooses another place, or "off".
    if "JAXGPT_COMPILATION_CACHE" not in os.environ:
        _kept = Path(__file__).resolve().parents[1] / ".pytest_cache" / "jaxgpt-xla"
        _kept.mkdir(parents=True, exist_ok=True)
        os.environ["JAXGPT_COMPILATION_CACHE"] = str(_kept)
os.environ["JAXGPT_CACHE"] = os.environ["JAXGPT_TEST_CACHE"]
os.environ["HF_DATASETS_CACHE"] = os.path.join(os.environ["JAXGPT_CACHE"], "hf-datasets")


# The tests compile with XLA's backend optimisations off. Their programs are tiny and run for a
# few steps, so compiling is most of their time, and LLVM's optimisation passes most of compiling:
# measured on a 2-vCPU AMD EPYC (Zen 4) from an empty cache, the quick set took 526 s at XLA's
# default level and 365 s at level 0 (test time 1,003 s against 684 s), level 1 in between. The
# math is the same HLO; only the machine code is less tuned. On a CPU they also take XLA:CPU's
# older loop emitters over its MLIR fusion emitters, which cost about twice as much to compile a
# small program (105 single operations run eagerly: 2.7 s of compiling against 1.3 s): measured
# on the same Zen 4 from an empty cache (c65bf71), a test time of 1,237 s against 908 s (10 min
# 44 s against 7 min 56 s of wall time), every test passing under both. The slow set does the
# same (a Zen 3, 2026-12-03: the composition matrix's masked row 72 s against 43 s of test time):
# a libtpu compile ignores both flags (the same memory and time either way), and the commands
# that print what the docs quote run in a fresh process with the user's flags (`users_environment`).
# What users compile with stays for the few tests whose training runs long enough that running
# the unoptimised code costs more than compiling it saves (the slow set's induction head, run
# alone: 33 s against 82 s): a fresh process with `users_environment()`, or
# `USERS_COMPILER_OPTIONS` for a test's own jitted step.
UNOPTIMISED_BACKEND = "--xla_backend_optimization_level=0" + ("" if ON_GPU else " --xla_cpu_use_fusion_emitters=false")
USERS_COMPILER_OPTIONS = {"xla_backend_optimization_level": 3}
if not ON_GPU:
    USERS_COMPILER_OPTIONS["xla_cpu_use_fusion_emitters"] = True


def users_environment(**more: str) -> dict:
    """The environment a user's command sees: the tests' own XLA flags (their eight devices,
    their unoptimised backend) left out, the repository importable, `more` on top."""
    return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"PYTHONPATH": str(ROOT)} | more


def is_slow_set(config) -> bool:
    markexpr = config.option.markexpr or ""
    return "slow" in markexpr and "not slow" not in markexpr


def pytest_configure(config):
    """Every test process keeps its compiled programs in that cache from the start: tests that
    build the same model (most train small_run_config) compile its steps once per test run,
    whichever worker or script gets there first. Programs that compile in under half a second
    are left out: the many single operations a test runs eagerly are cheaper to compile again
    than to hash, lock and write (measured in one process from an empty cache: test_workbench.py
    29 s at 0.5 s, 28 s at 1 s, 42 s keeping every program; test_trainer.py + test_sampling.py
    101 s at 0.5 s, 110 s at 1 s, 112 s keeping every program)."""
    # before jax is imported, which reads XLA_FLAGS once; xdist's workers inherit it already set
    if UNOPTIMISED_BACKEND not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " " + UNOPTIMISED_BACKEND
    import jax

    from jaxgpt.hardware import runtime

    runtime.enable_compilation_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    if not hasattr(config, "workerinput"):
        # The first process measures the CPU's matmul, as a user's first start does, before the
        # workers load the machine; the commands the tests start then find it on record and
        # spend no second measuring it again (jaxgpt.hardware.peak_flops.cpu_peak_flops).
        from jaxgpt.hardware import peak_flops

        peak_flops.cpu_peak_flops()


# Each set's test time (every test's setup, call and teardown, summed) on a slow 2-core machine,
# an Intel Xeon about 1.5 times slower than a Zen 4: with two workers sharing it, the quick set's
# 900 s is about 8 minutes of wall time there, under the 10 the README promises, and the slow
# set's 3,000 s about 26, keeping .ci/run under 40. A faster machine shows less; docs/testing.md
# says how to pay for a new test.
TEST_TIME_BUDGET_S = {"quick": 900, "slow": 3000}


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    """The suite's cost in every log, beside pytest's slowest tests (--durations): the test time
    summed over the tests, which the workers share, against its set's budget. It is what grows
    as tests are added."""
    from jaxgpt.hardware.peak_flops import describe_cpu

    # the tests' own reports: a module skipped as a whole (no torch, no libtpu) reports its collection
    reports = [r for kind in terminalreporter.stats.values() for r in kind if isinstance(r, pytest.TestReport)]
    if reports:
        total = sum(r.duration for r in reports)
        tests = len({r.nodeid for r in reports})
        terminalreporter.write_line(f"test time: {total:.0f} s summed over {tests} tests ({total / 60:.1f} min)")
        kind = "slow" if is_slow_set(config) else "quick"
        budget = TEST_TIME_BUDGET_S[kind]
        verdict = "within" if total <= budget else "OVER"
        terminalreporter.write_line(
            f"{verdict} the {kind} set's budget of {budget:,} s of test time on a slow 2-core machine (an Intel Xeon; "
            f"a faster one should show less: a Zen 4 about 1.5 times less); this machine: {describe_cpu()}; "
            "docs/testing.md says how to pay for a new test"
        )


def pytest_unconfigure(config):
    if _MADE_CACHE:
        shutil.rmtree(os.environ["JAXGPT_TEST_CACHE"], ignore_errors=True)


# tiktoken downloads its GPT-2 BPE file once; these tests must not. They read a cached copy from
# $JAXGPT_TEST_TIKTOKEN_CACHE, else from the shared/ folder CI keeps beside the repository.
SHARED_TIKTOKEN_CACHE = Path(
    os.environ.get("JAXGPT_TEST_TIKTOKEN_CACHE") or Path(__file__).resolve().parents[2] / "shared" / "tiktoken_cache"
)


@pytest.fixture
def gpt2_bpe(tmp_path_factory, monkeypatch):
    """tiktoken's GPT-2 files from ../shared (offline), copied where tiktoken may write."""
    if not SHARED_TIKTOKEN_CACHE.is_dir():
        pytest.skip(
            "needs tiktoken's GPT-2 BPE file without a download: run once with a network "
            "(python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\" with TIKTOKEN_CACHE_DIR=DIR set), "
            f"then set JAXGPT_TEST_TIKTOKEN_CACHE=DIR (looked in {SHARED_TIKTOKEN_CACHE})"
        )
    cache = tmp_path_factory.mktemp("tiktoken_cache")  # not in tmp_path, where a test's corpus may be
    shutil.copytree(SHARED_TIKTOKEN_CACHE, cache, dirs_exist_ok=True)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    return cache


def cross_entropy(model, params, batch, rng=None):
    """A reference for the training loss by the short road: the mean of `token_losses` over
    the positions a batch scores (its weights' average, where it has weights), not through the
    objective, the auxiliary terms or the pieces' shares that `scored` adds up."""
    import jax.numpy as jnp

    from jaxgpt.training.batch import as_batch
    from jaxgpt.training.train_step import token_losses

    batch = as_batch(batch)
    losses = token_losses(model, params, batch, rng)
    if "weights" not in batch:
        return losses.mean()
    return (losses * batch["weights"]).sum() / jnp.maximum(batch["weights"].sum(), 1.0)


def small_run_config(**train):
    """A run that trains in seconds: 2 layers x 32 wide on the built-in corpus."""
    from jaxgpt.config_files import base_config

    config = base_config()
    config.model.update(n_layer=2, n_head=2, d_model=32, block_size=32)
    defaults = dict(
        steps=30, batch_size=8, lr=3e-3, warmup_steps=5, log_every=5, eval_every=15, eval_batches=2, checkpoint_every=10
    )
    config.train.update(defaults | train)
    return config


def layout_run_config(mesh: dict, steps: int = 10, **train):
    """small_run_config on a device mesh, logging every step's loss: for comparing layouts."""
    config = small_run_config(**(dict(steps=steps, log_every=1, eval_every=steps, checkpoint_every=steps) | train))
    config.mesh.update(mesh)
    return config


def trained(workdir: Path, config) -> Path:
    """`workdir` after training `config` in it to its last step, quietly."""
    from jaxgpt.job.trainer import train_and_evaluate

    train_and_evaluate(config, workdir, progress=False)
    return workdir


def train_losses(workdir) -> np.ndarray:
    """Every logged training loss of a run, in order."""
    return np.array([json.loads(line)["train_loss"] for line in (workdir / "metrics.jsonl").read_text().splitlines()])


@pytest.fixture(scope="session")
def trained_small_run():
    """small_run_config(steps=20) trained once per test run for every test that only reads a
    finished run (resuming it must change nothing, so no test may write to it). It lives in the
    run's shared cache: the first xdist worker to ask trains it under a lock, the others wait
    for it (on two cores the wait costs nothing: the training gets both)."""
    from jaxgpt.job.trainer import train_and_evaluate

    workdir = Path(os.environ["JAXGPT_TEST_CACHE"]) / "trained-small-run"
    finished = workdir.with_suffix(".finished")
    with open(workdir.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not finished.exists():
            shutil.rmtree(workdir, ignore_errors=True)  # a worker killed while training it
            train_and_evaluate(small_run_config(steps=20), workdir, progress=False)
            finished.touch()
    return workdir


def matrix(*axes: dict):
    """pytest params for every combination of `axes` (each {id: value}), of which the quick set
    keeps a diagonal holding every value of every axis at least once; the other combinations
    are marked slow, for CI and `python -m pytest -m slow` to run the whole cross."""
    axes = [list(axis.items()) for axis in axes]
    diagonal = {tuple(axis[i % len(axis)][0] for axis in axes) for i in range(max(map(len, axes)))}
    return [
        pytest.param(*(value for _, value in combo), id="-".join(name for name, _ in combo),
                     marks=() if tuple(name for name, _ in combo) in diagonal else pytest.mark.slow)
        for combo in itertools.product(*axes)
    ]  # fmt: skip


ROOT = Path(__file__).resolve().parents[1]


def run_script(
    name: str,
    *args: str,
    devices: int | None = None,
    background: bool = False,
    env: dict | None = None,
    replace_env: bool = False,
    timeout: float = 300,
):
    """Run one of the repository's scripts (train.py), modules (jaxgpt, jaxgpt.commands.plot) or,
    with "-c", a snippet, as a user would: a fresh Python at the repository root. `devices` sets the
    number of fake CPU devices; `background` returns the Popen; `env` adds environment
    variables, or with `replace_env` is the whole environment."""
    import subprocess
    import sys

    env = (env if replace_env else os.environ | (env or {})) | {"PYTHONPATH": str(ROOT)}
    if devices is not None:
        kept = [flag for flag in env.get("XLA_FLAGS", "").split() if "device_count" not in flag]  # the backend level
        env["XLA_FLAGS"] = " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])
    if name == "-X":  # an interpreter option: python -X OPTION SCRIPT ARGS
        option, name, *args = args
        interpreter = ["-X", option]
    else:
        interpreter = []
    module = name == "jaxgpt" or name.startswith("jaxgpt.")
    target = ["-m", name] if module else [name] if name == "-c" else [str(ROOT / name)]
    target = interpreter + target
    command = [sys.executable, *target, *args]
    if background:
        return subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def attend(q, k, v, *, kernel: str, scale: float | None = None, **mask):
    """q over k, v through the kernel model.attention names, under attention.Mask(**mask)."""
    from jaxgpt.model.attention import Mask
    from jaxgpt.model.attention import kernel as named

    return named(kernel)(q, k, v, Mask(**mask), scale)


# Compiling for a TPU needs libtpu's compile-only devices; without it (the README's plain
# install) these tests skip with this sentence, as the Hugging Face tests do without torch.
# They are the slow set's (CI's): each compiles a sharded program for a whole slice.
requires_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="compiling for TPUs needs libtpu: pip install -r requirements-tpu.txt",
)

# The tests share one compilation cache (pytest_configure above), in which a TPU program written by one test
# cannot be loaded back on compile-only devices by the next: JAX says so and compiles again.
# `jaxgpt check --target` keeps no cache, so users never see this.
_cache_cannot_load_tpu_programs = pytest.mark.filterwarnings(
    "ignore:Error reading persistent compilation cache entry:UserWarning"
)


def needs_libtpu(test):
    return pytest.mark.slow(_cache_cannot_load_tpu_programs(requires_libtpu(test)))
