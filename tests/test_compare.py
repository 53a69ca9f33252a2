"""python -m jaxgpt compare: a 2 x 2 comparison of a tiny model, read back independently."""

import json
import shlex
import subprocess
import sys

import pytest
from conftest import run_script, users_environment

# The first example of `jaxgpt compare --help`, which test_two_short_runs_as_the_help_shows runs
HELP_EXAMPLE = (
    "python -m jaxgpt compare --config tiny --vary model.position=learned,rope --steps 20 --out runs/compare-try"
)

TINY = [
    "--config",
    "configs/tiny.py",
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.model.block_size=32",
    "--config.train.batch_size=4",
    "--config.train.eval_every=5",
    "--config.train.eval_batches=2",
    "--config.train.warmup_steps=2",
    "--steps=10",
    "--quiet",
]
VARY = ["--vary", "model.position=learned,rope", "--vary", "model.activation=gelu,relu"]
NAMES = [
    "position=learned,activation=gelu",
    "position=learned,activation=relu",
    "position=rope,activation=gelu",
    "position=rope,activation=relu",
]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    result = run_script("jaxgpt", "compare", *TINY, *VARY, f"--out={out}", devices=1, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_one_resumable_run_per_combination_and_one_table(compared):
    out, result = compared
    results = json.loads((out / "results.json").read_text())
    assert [r["variant"] for r in results["runs"]] == NAMES
    for row, name in zip(results["runs"], NAMES, strict=True):
        records = [json.loads(line) for line in (out / name / "seed0" / "metrics.jsonl").read_text().splitlines()]
        assert row["val_loss"] == [r for r in records if "val_loss" in r][-1]["val_loss"] and row["step"] == 10
        config = json.loads((out / name / "seed0" / "config.json").read_text())
        want = tuple(part.split("=")[1] for part in name.split(","))
        assert (config["model"]["position"], config["model"]["activation"]) == want
    learned, rope = results["runs"][0]["params"], results["runs"][2]["params"]
    assert learned - rope == 32 * 32  # the learned position table: block_size x d_model
    table = (out / "results.md").read_text()
    assert table in result.stdout and all(f"| {name} | 1 |" in table for name in NAMES)
    assert (out / "loss.png").stat().st_size > 1000


def test_rerunning_skips_finished_runs_and_gives_the_same_table(compared):
    # results.json holds each run's tokens/s and training time: a retrained run (same losses,
    # bit for bit) would still change them, so equal files mean nothing was trained again.
    out, _ = compared
    before = (out / "results.json").read_text()
    again = run_script("jaxgpt", "compare", *TINY, *VARY, f"--out={out}", devices=1, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "results.json").read_text() == before


def test_a_ten_step_comparison_draws_each_variants_training_curve_and_its_evaluations(compared, monkeypatch):
    """--steps=10 with tiny's log_every of 50 would log one training loss; compare logs every
    step instead, and the plot draws all ten per variant, with the evaluations (steps 5, 10)."""
    from jaxgpt.commands import compare, plot

    out, result = compared
    assert "train.log_every 50 -> 1" in result.stdout
    drawn = {}
    monkeypatch.setattr(plot, "save_png", lambda figure, path: drawn.setdefault("figure", figure))
    vary = [("model.position", ["learned", "rope"]), ("model.activation", ["gelu", "relu"])]
    compare.plot({name: [out / name / "seed0"] for name in NAMES}, out / "unused.png", vary)
    title = drawn["figure"].axes[0].get_title()
    assert title == "model.position in {learned, rope} x model.activation in {gelu, relu}: 4 variants"
    lines = drawn["figure"].axes[0].get_lines()
    curves = [list(line.get_xdata()) for line in lines if line.get_linestyle() == "-"]
    dots = [list(line.get_xdata()) for line in lines if line.get_linestyle() == "None"]
    assert curves == [list(range(1, 11))] * len(NAMES) and dots == [[5, 10]] * len(NAMES)


def test_seeds_average_and_spread():
    from jaxgpt.commands.compare import summarise

    rows = [
        {"variant": "a", "params": 5, "val_loss": v, "val_bpb": 2 * v, "tokens_per_sec": 10.0, "elapsed_sec": 1.0}
        | {"scored": "as trained"}
        for v in (1.0, 1.5)
    ]
    (line,) = summarise(rows)
    assert line["val_loss"] == 1.25 and line["val_loss_spread"] == 0.5 and line["val_bpb"] == 2.5


def test_runs_that_answer_show_their_exact_match_with_its_spread():
    """Runs on pairs or conversations log val_exact_match: a column of its mean and half its
    spread over seeds (0.40 and 0.50: 45.0% ± 5.0%); runs without it have no such column."""
    from jaxgpt.commands.compare import markdown, summarise

    row = {"variant": "data.loss_on=all", "params": 5, "val_loss": 1.0, "val_bpb": 2.0, "scored": "as trained"}
    rows = [row | {"tokens_per_sec": 1.0, "elapsed_sec": 1.0, "val_exact_match": m} for m in (0.4, 0.5)]
    table = markdown(summarise(rows))
    assert "| exact match |" in table and "| 45.0% ± 5.0% |" in table and "greedy decoding" in table
    streams = [{k: v for k, v in r.items() if k != "val_exact_match"} for r in rows]
    assert "exact match" not in markdown(summarise(streams))
    # a run that learns from rewards adds its sampled answers' mean reward (0.8 and 0.9: 0.850 ± 0.050)
    rewarded = markdown(summarise([r | {"rl_reward": x} for r, x in zip(rows, (0.8, 0.9), strict=True)]))
    assert "| exact match | sampled reward |" in rewarded and "| 45.0% ± 5.0% | 0.850 ± 0.050 |" in rewarded
    assert "sampled reward" not in table


def test_a_run_without_the_causal_mask_is_judged_by_its_past_only_score():
    from jaxgpt.commands.compare import markdown, scored_key, summarise

    leaky = [{"step": 5, "val_loss": 0.1, "val_loss_past_only": 4.0, "val_bpb_past_only": 5.0}]
    assert scored_key(leaky, "val_loss") == "val_loss_past_only" and scored_key(leaky, "val_bpb") == "val_bpb_past_only"
    assert scored_key([{"step": 5, "val_loss": 2.0}], "val_loss") == "val_loss"
    row = {"params": 5, "val_loss": 4.0, "val_bpb": 5.0, "tokens_per_sec": 1.0, "elapsed_sec": 1.0}
    table = markdown(summarise([{"variant": "causal=False", "scored": "past-only"} | row]))
    assert "| causal=False (past-only) | 1 | 4.0000" in table and "scored here under the mask" in table


@pytest.mark.parametrize(
    "vary, message",
    [
        ("model.position", "is not section.key=v1,v2"),
        ("model.positoin=rope", "no such config key"),
        ("model.n_layer=two", "expected an integer"),
        ("model.position=rope,spiral", "position='spiral' is not one of"),
        ("model.attention=xla,dot_product,flash_tpu", "is a TPU kernel and this run is on cpu"),
        ("model.n_head=2,002", "2 and 002 are the same value (2)"),
        ("train.lr=0.001,1e-3", "0.001 and 1e-3 are the same value (0.001)"),
    ],
)
def test_a_bad_vary_is_one_line_before_any_run(tmp_path, vary, message):
    result = run_script("jaxgpt", "compare", *TINY, "--vary", vary, f"--out={tmp_path / 'out'}")
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_short_runs_as_the_help_shows(tmp_path):
    """compare's --help example, as written, in a fresh directory: two 20-step runs of the
    shipped tiny config (found by name) and a table with a row for each."""
    env = users_environment()  # the user's default device count
    result = subprocess.run(
        [sys.executable, *shlex.split(HELP_EXAMPLE)[1:]], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads((tmp_path / "runs" / "compare-try" / "results.json").read_text())["runs"]
    assert [(r["variant"], r["step"]) for r in runs] == [("position=learned", 20), ("position=rope", 20)]
    assert "| position=rope | 1 |" in result.stdout


def test_a_varied_key_takes_its_declared_type_even_when_unset():
    """model.mlp_hidden defaults to None (derived from d_model): --vary model.mlp_hidden=2048
    is still the integer 2048, not the text '2048' the config would refuse."""
    from jaxgpt.commands.compare import with_values
    from jaxgpt.config_files import base_config

    config = with_values(base_config(), {"model.mlp_hidden": "2048", "model.moe.experts": "8", "model.bias": "false"})
    assert (config.model.mlp_hidden, config.model.moe.experts, config.model.bias) == (2048, 8, False)


@pytest.mark.slow  # two runs in a subprocess: 29 s of test time on a Zen 5 core
def test_encoders_are_compared_by_their_masked_loss_without_bits_per_byte(tmp_path):
    """Two encoders (model.objective=masked) compared: each row marked masked, its loss the
    masked-token loss of its metrics.jsonl, no bits per byte, and the table says why."""
    encoder = ["--config.model.causal=false", "--config.model.objective=masked", "--steps=5"]
    args = [a for a in TINY if a != "--steps=10"] + encoder + ["--vary", "model.mask_rate=0.15,0.3"]
    result = run_script("jaxgpt", "compare", *args, f"--out={tmp_path}", devices=1, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "results.md").read_text()
    for rate in ("0.15", "0.3"):
        records = [json.loads(line) for line in (tmp_path / f"mask_rate={rate}" / "seed0" / "metrics.jsonl").open()]
        loss = [r for r in records if "val_loss" in r][-1]["val_loss"]
        assert f"| mask_rate={rate} (masked) | 1 | {loss:.4f} ± 0.0000 | - |" in table, table
    assert "not comparable with a next-token loss" in table


def test_a_variant_stopped_before_its_first_evaluation_stops_the_comparison_in_one_line(tmp_path, monkeypatch, capsys):
    """Asked to stop (Ctrl-C) in its first variant, before that run's first evaluation: the
    comparison says where it stopped and how to go on, exit 130, no IndexError traceback."""
    import jaxgpt.job.trainer
    from jaxgpt.commands import compare

    monkeypatch.setattr(jaxgpt.job.trainer, "train_and_evaluate", lambda *a, **k: {"step": 3, "stopped": "SIGINT"})
    with pytest.raises(SystemExit) as exited:
        compare.main([*TINY, *VARY, f"--out={tmp_path / 'out'}"])
    assert exited.value.code == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert "seed 0, stopped at step 3; rerun the same command: finished runs are skipped, the others resume" in said
