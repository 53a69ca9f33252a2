"""Process-wide settings: one CPU device per core, meshes of one CPU device (no in-process
collectives), and the compilation cache."""

import json
import os

import pytest
from conftest import requires_libtpu, run_script

from jaxgpt.hardware import runtime

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

# What train.py builds on a CPU with no device settings in the environment: the mesh, the cores
# it splits each batch over, and the compiled programs of configs/tiny.py's step, with one block
# of its four (where the step runs and what it calls between devices do not depend on depth; a
# third of the compile time).
DEFAULT_PATH = """
import json, runpy
from jaxgpt.hardware import runtime
runtime.configure()
import jax
from jaxgpt.hardware import step_choice
from jaxgpt import sharding
from jaxgpt.config_files import resolve
from jaxgpt.hardware.mesh_step import state_layout
from jaxgpt.training.program import training_program
config = runpy.run_path("configs/tiny.py")["get_config"]()
config.model.n_layer = 1
run = resolve(config, vocab_size=96)
mesh = sharding.make_mesh(run.mesh, runtime.mesh_devices())  # as the trainer builds it
program = training_program(run)
layout, create = state_layout(program, mesh)
program, step, _ = step_choice.choose_step(program, mesh, layout)  # as the trainer chooses
windows = jax.numpy.zeros((12, 129), "int32")
batch = jax.device_put({"inputs": windows[:, :-1], "targets": windows[:, 1:]}, sharding.batch_sharding(step.batch_mesh))
texts = step.program_texts(create(), batch)
used = len(step.devices)
print(json.dumps({"mesh": mesh.size, "cores": len(step_choice.cores_for(mesh)), "used": used, "texts": texts}))
"""


def default_environment() -> dict:
    """The environment without the tests' fake devices: what a user's shell has."""
    return {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}


@pytest.mark.slow
def test_the_default_cpu_path_has_no_collective_to_abort_in():
    """The mechanism behind XLA's CPU aborts (SIGABRT, "Expected 2 threads to join the
    rendezvous") is a cross-device collective inside one process. The default CPU path must
    have none: a one-device mesh, one program per core (as many cores as the process may use
    and the batch of 12 divides), and no collective op in any compiled program."""
    env = default_environment() | {"JAXGPT_COMPILATION_CACHE": "off"}
    env.pop(runtime.CORES_ENV, None)
    result = run_script("-c", DEFAULT_PATH, env=env, replace_env=True)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    available = len(os.sched_getaffinity(0))
    assert out["mesh"] == 1
    assert out["cores"] == available
    assert out["used"] == max(n for n in range(1, available + 1) if 12 % n == 0)
    assert len(out["texts"]) == (out["used"] + 1 if out["used"] > 1 else 1)
    for text in out["texts"]:
        assert not [op for op in COLLECTIVES if op in text]


@pytest.mark.slow
def test_one_core_when_told(tmp_path):
    env = default_environment() | {"JAXGPT_COMPILATION_CACHE": "off", runtime.CORES_ENV: "1"}
    result = run_script("-c", DEFAULT_PATH, env=env, replace_env=True)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert (out["mesh"], out["cores"], out["used"], len(out["texts"])) == (1, 1, 1, 1)


@pytest.mark.parametrize(
    "xla_flags, num_devices, expected",
    [("", "", None), ("--xla_force_host_platform_device_count=4", "", 4), ("", "2", 2), ("--xla_dump_to=/x", "", None)],
)
def test_device_counts_asked_for_in_the_environment_are_read(monkeypatch, xla_flags, num_devices, expected):
    monkeypatch.setenv("XLA_FLAGS", xla_flags)
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", num_devices)
    assert runtime.requested_cpu_devices() == expected


def test_jax_tries_a_tpu_only_where_there_is_one():
    assert runtime.platforms_without_a_tpu(libtpu_installed=True, tpu_chips=0, nvidia_gpu=False) == "cpu"
    assert runtime.platforms_without_a_tpu(libtpu_installed=True, tpu_chips=4, nvidia_gpu=False) is None  # a TPU VM
    assert runtime.platforms_without_a_tpu(libtpu_installed=False, tpu_chips=0, nvidia_gpu=False) is None
    assert runtime.platforms_without_a_tpu(libtpu_installed=True, tpu_chips=0, nvidia_gpu=True) is None  # JAX's choice


STARTS = "import jax; print(jax.default_backend())"


@requires_libtpu
def test_with_libtpu_and_no_tpu_a_configured_start_says_nothing_of_tpus():
    """libtpu installed on this TPU-less machine: a bare JAX start prints libtpu's complaints
    (the premise: without them this test would show nothing); after `configure` there are none,
    and the backend is the CPU. A TPU compiled ahead of time still works: tests/test_tpu.py."""
    env = {k: v for k, v in default_environment().items() if k != "JAX_PLATFORMS"} | {runtime.CACHE_ENV: "off"}
    bare = run_script("-c", STARTS, env=env, replace_env=True)
    assert bare.returncode == 0 and "TPU" in bare.stderr, bare.stderr
    configured = run_script("-c", "from jaxgpt.hardware import runtime; runtime.configure(); " + STARTS, env=env,
                            replace_env=True)  # fmt: skip
    assert configured.returncode == 0, configured.stderr
    assert (configured.stdout.strip(), configured.stderr) == ("cpu", ""), configured.stderr


def test_several_cpu_devices_asked_for_get_a_warning(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    monkeypatch.setenv(runtime.CACHE_ENV, "off")
    said = []
    runtime.configure(warn=said.append)
    assert len(said) == 1 and "2 CPU devices" in said[0] and "SIGABRT" in said[0]
    said.clear()
    runtime.configure(single_process=False, warn=said.append)  # one device per process: no warning
    assert said == []


def test_the_compilation_cache_lives_beside_the_data_cache_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv(runtime.CACHE_ENV, raising=False)
    monkeypatch.setenv("JAXGPT_CACHE", str(tmp_path))
    assert runtime.compilation_cache_dir() == tmp_path / "xla"
    monkeypatch.setenv(runtime.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert runtime.compilation_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.setenv(runtime.CACHE_ENV, "off")
    assert runtime.compilation_cache_dir() is None


@pytest.mark.slow
def test_train_py_fills_the_compilation_cache_and_reuses_it(tmp_path):
    cache = tmp_path / "xla"
    args = ["--config", "configs/tiny.py", "--config.model.n_layer=1", "--config.model.d_model=32"]
    args += ["--config.model.n_head=2", "--config.train.steps=2", "--config.train.warmup_steps=1"]
    args += ["--config.train.eval_batches=1"]
    args += ["--config.train.batch_size=8", "--config.train.microbatches=1", "--quiet"]
    env_cache = {"JAXGPT_COMPILATION_CACHE": str(cache)}
    first = run_script("train.py", *args, f"--workdir={tmp_path / 'a'}", env=env_cache)
    assert first.returncode == 0, first.stderr

    def train_steps():
        return {p.name for p in cache.iterdir() if p.name.startswith("jit_train_step")}

    written = train_steps()
    assert written, sorted(p.name for p in cache.iterdir())
    assert (cache / ".lockfile").exists()  # bounded, so reads and writes are locked: safe to share
    second = run_script("train.py", *args, f"--workdir={tmp_path / 'b'}", env=env_cache)
    assert second.returncode == 0, second.stderr
    assert train_steps() == written  # the second run found its step in the cache (a miss adds an entry)
