"""The package as a user installs it: console scripts and shipped configs that work from any
directory, without the repository on the path."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, users_environment

TINY = [
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.model.block_size=32",
    "--config.train.batch_size=4",
    "--config.train.steps=2",
    "--config.train.eval_batches=1",
    "--quiet",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`pip install .` of a copy of the sources into a private directory (no dependencies: the
    test environment has them), returning that directory."""
    source, target = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("site")
    for name in ("pyproject.toml", "README.md", "requirements.txt"):
        shutil.copy(ROOT / name, source / name)
    for name in ("jaxgpt", "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )
    return target


def run_installed(installed, cwd, command, *args):
    """The installed console script `jaxgpt COMMAND ARGS`."""
    env = users_environment(PYTHONPATH=str(installed))  # the installed copy only, not the checkout
    return subprocess.run(
        [sys.executable, str(installed / "bin" / "jaxgpt"), command, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def test_the_console_script_answers_help_from_any_directory(installed, tmp_path):
    for command, a_flag in (
        ("train", "--workdir"),
        ("sample", "--prompt"),
        ("check", "--config"),
        ("compare", "--vary"),
        ("prepare", "--verify"),
        ("attention-maps", "--layer"),
    ):
        result = run_installed(installed, tmp_path, command, "--help")
        assert result.returncode == 0, result.stderr
        assert "Examples:" in result.stdout and a_flag in result.stdout


@pytest.mark.slow
def test_installed_train_finds_a_shipped_config_and_sample_reads_its_run(installed, tmp_path):
    """`--config configs/tiny.py` outside the repository: no such file here, so the shipped
    config of that name; then sampling from the run it wrote."""
    trained = run_installed(installed, tmp_path, "train", "--config", "configs/tiny.py", "--workdir=run", *TINY)
    assert trained.returncode == 0, trained.stderr
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["data"]["source"] == "builtin:python-docs" and saved["model"]["n_layer"] == 1
    sampled = run_installed(installed, tmp_path, "sample", "--workdir=run", "--max_new_tokens=5", "--prompt=a")
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("a") and len(sampled.stdout) > len("a\n")  # the prompt and new text


def test_an_unknown_config_name_lists_the_shipped_ones(installed, tmp_path):
    result = run_installed(installed, tmp_path, "train", "--config", "tinny")
    assert result.returncode == 2 and not (tmp_path / "runs").exists()
    assert result.stderr.count("\n") == 1 and "tiny" in result.stderr and "config file tinny not found" in result.stderr


def test_a_missing_path_is_not_replaced_by_a_shipped_config_of_the_same_name(installed, tmp_path):
    result = run_installed(installed, tmp_path, "train", "--config", "mine/tiny.py")
    assert result.returncode == 2 and "config file mine/tiny.py not found" in result.stderr


def test_installed_package_carries_its_configs(installed):
    code = "from jaxgpt.configs import tiny; print(tiny.get_config().model.n_layer)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=installed.parent,
        env=os.environ | {"PYTHONPATH": str(installed)},
        text=True,
        capture_output=True,
    )
    assert result.returncode == 0 and result.stdout.strip() == "4", result.stderr


def test_installed_package_carries_every_module_the_chat_page_and_the_digits(installed):
    """Every package under jaxgpt/ is in pyproject.toml's list (a new one left out would install
    without its modules), and the server's page and the pinned digits travel as package data
    (builtin:digits read from the installed copy, its sha256 checked)."""
    packages = sorted(str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "jaxgpt").rglob("__init__.py"))
    code = (
        "import importlib, importlib.resources as r, sys; "
        f"[importlib.import_module(name) for name in {packages!r}]; "
        "print(len(r.files('jaxgpt.serve').joinpath('page.html').read_text())); "
        "from jaxgpt.data.images import read_images; print(len(read_images('builtin:digits')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=installed.parent, env=os.environ | {"PYTHONPATH": str(installed)},
        text=True, capture_output=True,
    )  # fmt: skip
    page, digits = result.stdout.split() if result.returncode == 0 else ("0", "0")
    assert int(page) > 1000 and int(digits) == 4000, result.stderr
