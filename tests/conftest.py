"""Shared test setup: eight fake CPU devices, a private data cache, the shared tiktoken cache.

XLA reads XLA_FLAGS once, when jax is first imported, so this must run before any test
module imports jax; pytest imports conftest.py first.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Prepared token files go to a throwaway cache, never the user's ~/.cache.
os.environ["JAXGPT_CACHE"] = tempfile.mkdtemp(prefix="jaxgpt-test-cache-")
os.environ["HF_DATASETS_CACHE"] = os.path.join(os.environ["JAXGPT_CACHE"], "hf-datasets")

SHARED_TIKTOKEN_CACHE = Path(__file__).resolve().parents[2] / "shared" / "tiktoken_cache"


@pytest.fixture
def gpt2_bpe(tmp_path, monkeypatch):
    """tiktoken's GPT-2 files from ../shared (offline), copied where tiktoken may write."""
    if not SHARED_TIKTOKEN_CACHE.is_dir():
        pytest.skip(f"needs the offline tiktoken cache at {SHARED_TIKTOKEN_CACHE} (../shared is absent)")
    cache = tmp_path / "tiktoken_cache"
    shutil.copytree(SHARED_TIKTOKEN_CACHE, cache)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    return cache


def small_run_config(**train):
    """A run that trains in seconds: 2 layers x 32 wide on the built-in corpus."""
    from jaxgpt.config import base_config

    config = base_config()
    config.model.update(n_layer=2, n_head=2, d_model=32, block_size=32)
    defaults = dict(
        steps=30, batch_size=8, lr=3e-3, warmup_steps=5, log_every=5, eval_every=15, eval_batches=2, checkpoint_every=10
    )
    config.train.update(defaults | train)
    return config


ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, devices: int | None = None, background: bool = False, env: dict | None = None):
    """Run one of the repository's scripts (train.py) or modules (jaxgpt.plot) as a user would:
    a fresh Python at the repository root. `devices` sets the number of fake CPU devices;
    `background` returns the Popen; `env` adds environment variables."""
    import subprocess
    import sys

    env = os.environ | {"PYTHONPATH": str(ROOT)} | (env or {})
    if devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    target = ["-m", name] if name.startswith("jaxgpt.") else [str(ROOT / name)]
    command = [sys.executable, *target, *args]
    if background:
        return subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
