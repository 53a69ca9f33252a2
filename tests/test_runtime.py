"""Process-wide settings: how many CPU devices train.py asks for, and the compilation cache."""

import pytest
from conftest import run_script

from jaxgpt import runtime


@pytest.mark.parametrize(
    "rows, cores, expected",
    [(12, 2, 2), (12, 8, 6), (12, 16, 12), (7, 2, 1), (1, 4, 1), (16, 6, 4)],
)
def test_cpu_devices_are_the_most_that_split_the_rows_evenly(rows, cores, expected):
    assert runtime.cpu_devices_for(rows, cores) == expected


def test_the_compilation_cache_lives_beside_the_data_cache_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv(runtime.CACHE_ENV, raising=False)
    monkeypatch.setenv("JAXGPT_CACHE", str(tmp_path))
    assert runtime.compilation_cache_dir() == tmp_path / "xla"
    monkeypatch.setenv(runtime.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert runtime.compilation_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.setenv(runtime.CACHE_ENV, "off")
    assert runtime.compilation_cache_dir() is None


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
    second = run_script("train.py", *args, f"--workdir={tmp_path / 'b'}", env=env_cache)
    assert second.returncode == 0, second.stderr
    assert train_steps() == written  # the second run found its step in the cache (a miss adds an entry)


def test_too_late_to_add_devices_is_a_warning_not_a_crash(monkeypatch):
    """JAX is running in this test process: the device count can no longer change."""
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.setenv(runtime.CACHE_ENV, "off")
    import jax

    jax.devices()
    with pytest.warns(UserWarning, match="JAX has already started"):
        runtime.configure(rows_per_microbatch=12)
