"""bench/gpu_session.py, the plan for a short GPU lease, rehearsed on the CPU at toy sizes: a
script that first runs on a rented GPU must not fail there on a typo. Each stage runs in its own
process and records what it found in gpu_session.json. The stages that train or serve (tiny,
objectives, serve, gpt2, determinism: dozens of train.py processes and a server, minutes of the
slow set's CI time) are rehearsed by hand before a lease (`JAX_PLATFORMS=cpu python
bench/gpu_session.py --out DIR --dry-run`, a few minutes), not in CI; their commands are
train.py's and bench/train_throughput.py's, which the suite tests, and bench/serve.py's."""

import importlib.util
import json
import re
from pathlib import Path

import pytest
from conftest import run_script


def dry_run(out: Path, *stages: str) -> dict:
    args = ["--out", str(out), "--dry-run"] + (["--only", ",".join(stages)] if stages else [])
    # one CPU device, as on a machine with one accelerator
    done = run_script("bench/gpu_session.py", *args, devices=1, env={"JAX_PLATFORMS": "cpu"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| stage | status |" in done.stdout  # the table the lease's reply shows
    return json.loads((out / "gpu_session.json").read_text())["stages"]


@pytest.mark.slow  # 31 s of six fresh processes; the script changes rarely, the quick set runs often
def test_the_quick_stages_run_and_report(tmp_path):
    stages = dry_run(tmp_path, "versions", "attention", "loss", "experts", "tests", "imports")
    assert {name: record["status"] for name, record in stages.items()} == dict.fromkeys(stages, "ok")
    versions = stages["versions"]["result"]
    assert versions["backend"] == "cpu" and versions["smoke_grad_finite"]
    assert versions["installed"]["flax"] == versions["pinned"]["flax"]  # this machine installs the pins
    for case in stages["attention"]["result"]["cases"].values():
        for kernel in ("xla", "dot_product"):
            # bfloat16 inputs against the float32 kernel: a few 2**-8 roundings, never exact, never wild
            assert 1e-4 < case[kernel]["out"] < 2e-2 and not case[kernel]["cudnn"]
    for implementation in stages["loss"]["result"]["results"].values():
        # bfloat16's rounding of the head's inputs against float32: the same few 2**-8, both ways
        assert 1e-4 < implementation["d_features"] < 2e-2 and 0 <= implementation["loss"] < 1e-3
    ways = {row["way"]: row for row in stages["experts"]["result"]["rows"]}  # checked against float64 first
    assert len(ways) == 3 and ways["grouped (jax.lax.ragged_dot)"]["rows_computed"] == 512
    assert "tests collected" in stages["tests"]["result"]["summary"]  # the `gpu` marker selects some
    if importlib.util.find_spec("transformers"):  # Qwen3's and Gemma 3's cases (without it the file skips)
        assert re.match(r"[1-9]\d*/\d+ tests collected", stages["imports"]["result"]["summary"])
