"""Pruning that saves (jaxgpt/lab/pruning.py, `evaluate --prune F --out DIR`): heads cut out of
the weights compute what the masked model computes, in a smaller model train.py fine-tunes."""

import json

import jax
import numpy as np
import pytest
from conftest import small_run_config

from jaxgpt.commands import evaluate
from jaxgpt.config_files import resolve
from jaxgpt.lab import pruning
from jaxgpt.model.transformer import count_params, init_params

TEXT = np.random.default_rng(0).integers(0, 50, size=2000).astype(np.uint16)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="plain"),
        pytest.param({"attention_gate": "elementwise", "qk_norm": True, "scan_layers": True}, id="gated-scanned"),
        pytest.param({"attention_gate": "headwise", "bias": False, "position": "learned"}, id="headwise-no-bias"),
    ],
)
def test_cut_heads_compute_what_the_masked_model_computes(changes):
    """Random weights (so no head is already silent), two of four heads cut from each of three
    layers, different ones in each: the smaller model's parameters have exactly the shapes its
    own initialiser gives, and its loss is the masked model's. Removing a head drops its terms
    from the output projection's sum, which zeroing adds as exact zeros: the sums differ in
    order alone, float32 rounding over ~100 terms, so 1e-5 relative."""
    config = small_run_config()
    config.model.update(n_layer=3, n_head=4, **changes)
    model = resolve(config, vocab_size=50).model
    params = init_params(model, jax.random.key(1))
    removed = [(0, 0), (0, 3), (1, 1), (1, 2), (2, 3), (2, 1)]
    smaller, cut = pruning.pruned_params(model, jax.device_get(params), removed)
    assert (smaller.n_head, smaller.n_kv_head, smaller.head_dim) == (2, 2, model.head_dim)
    shapes = jax.tree.map(lambda a: a.shape, init_params(smaller, jax.random.key(0)))
    assert jax.tree.map(lambda a: a.shape, cut) == shapes
    per_head = 3 * model.d_model * model.head_dim + model.head_dim * model.d_model  # q, k, v and out, a head
    per_head += (3 * model.head_dim) * model.bias
    if model.attention_gate != "none":
        width = model.head_dim if model.attention_gate == "elementwise" else 1
        per_head += (model.d_model + model.bias) * width  # its kernel, and its bias where biases are on
    assert count_params(params) - count_params(cut) == 6 * per_head
    masked = evaluate.without_heads(model, params, TEXT, 256, removed)
    assert evaluate.without_heads(smaller, cut, TEXT, 256, []) == pytest.approx(masked, rel=1e-5)
    unmasked = evaluate.without_heads(model, params, TEXT, 256, [])
    assert abs(unmasked - masked) > 5 * 1e-5 * masked  # the heads cut matter beyond that tolerance: it can fail


def test_the_pruned_run_is_written_fine_tuned_and_never_resumed(trained_small_run, tmp_path, capsys):
    """--prune 0.5 --out on the shared run (2 layers x 2 heads): one head a layer goes, the
    folder reads back as a run of 1-head layers whose loss is the one printed, train.py starts
    a fine-tune from it, and training into the folder itself is refused, nothing moved."""
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.job.trainer import train_and_evaluate

    out = tmp_path / "pruned"
    evaluate.main(["--workdir", str(trained_small_run), "--prune", "0.5", "--out", str(out), "--tokens", "256"])
    printed = capsys.readouterr().out.splitlines()
    assert " (1 a layer): " in printed[0]
    assert "2 -> 1 heads a layer" in printed[2] and printed[3].startswith(f"wrote {out} (weights alone")
    masked = float(printed[1].split("-> ")[1].split()[0])
    run, params, _, step = load_latest(out)
    source, _, _, source_step = load_latest(trained_small_run)
    assert (run.model.n_head, run.model.head_dim, step) == (1, source.model.head_dim, source_step)
    val = evaluate.load_run(out, None)[3]
    assert evaluate.without_heads(run.model, params, val, 256, []) == pytest.approx(masked, abs=1e-4)
    saved = json.loads((out / "config.json").read_text())
    assert saved["model"]["n_head"] == 1

    tuned = tmp_path / "tuned"
    last = train_and_evaluate(small_run_config(steps=2, eval_every=2, init_from=str(out)), tuned, progress=False)
    assert json.loads((tuned / "config.json").read_text())["model"]["n_head"] == 1 and last["step"] == 2

    listing = sorted(p.name for p in (out / "checkpoints").iterdir())
    with pytest.raises(Exception, match="holds weights alone, with no optimizer state") as refused:
        train_and_evaluate(small_run_config(steps=2), out, progress=False)
    assert type(refused.value).__name__ == "UserError"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == listing

    with pytest.raises(SystemExit) as exit:  # the folder is taken now
        evaluate.main(["--workdir", str(trained_small_run), "--prune", "0.5", "--out", str(out), "--tokens", "256"])
    assert exit.value.code == 2 and "already exists and is not an empty folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"n_kv_head": 2}, "share 2 key/value heads, so a query head cannot leave alone"),
        ({"position": "alibi"}, "ALiBi's slopes are a function of the number of heads"),
    ],
)
def test_what_cannot_be_cut_is_refused_in_one_line(changes, message):
    config = small_run_config()
    config.model.update(n_head=4, **changes)
    assert message in pruning.refusal(resolve(config, vocab_size=50).model)


def test_a_share_that_leaves_no_layer_changed_or_none_left_is_refused(trained_small_run, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        evaluate.main(["--workdir", str(trained_small_run), "--prune", "0.2", "--out", str(tmp_path / "x")])
    assert exit.value.code == 2 and "--prune 0.2 of 2 heads a layer removes 0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
