"""python -m jaxgpt evaluate: the loss at each position of windows of each length."""

import jax
import numpy as np
import pytest
from conftest import cross_entropy, small_run_config

from jaxgpt.commands import evaluate
from jaxgpt.config_files import resolve
from jaxgpt.model.transformer import GPT, init_params


def model_and_params(position="rope"):
    config = small_run_config()
    config.model.position = position
    model = resolve(config, vocab_size=50).model
    return model, init_params(model, jax.random.key(0))


TEXT = np.random.default_rng(0).integers(0, 50, size=4000).astype(np.uint16)


def test_the_mean_over_positions_is_the_training_loss_of_the_same_windows(monkeypatch):
    """Seven windows scored three at a time (the last call filled up with a repeated window,
    which must not count) average to the training loss of the seven at once. float32 sums of
    ~200 terms of size ~4 in another order: 1e-5 relative."""
    monkeypatch.setattr(evaluate, "LOGITS_BYTES", 3 * 32 * 50 * 4)
    model, params = model_and_params()
    result = evaluate.losses_by_position(model, params, TEXT, length=32, budget=7 * 32 + 5)
    assert result.windows == 7
    windows = np.stack([TEXT[i * 32 : i * 32 + 33] for i in range(7)]).astype(np.int32)
    expected = float(jax.jit(lambda p, w: cross_entropy(GPT(model), p, w))(params, windows))  # eager: ~20 s
    assert result.mean() == pytest.approx(expected, rel=1e-5)


def test_a_longer_window_does_not_change_the_losses_of_its_first_positions():
    """Causal attention: position p sees tokens 0..p only, so one window of 64 tokens scores
    its first 32 positions as one window of 32 does (RoPE: positions are relative)."""
    model, params = model_and_params()
    short = evaluate.losses_by_position(model, params, TEXT, length=32, budget=32)
    long = evaluate.losses_by_position(model, params, TEXT, length=64, budget=64)
    assert short.windows == long.windows == 1
    np.testing.assert_allclose(long.by_position[:32], short.by_position, rtol=1e-5, atol=1e-6)


def test_a_run_that_attends_within_documents_is_scored_within_them():
    """Documents beginning at 0 and 20: one window of 32 scores its positions 20..31 as a
    window of the second document alone scores its first 12 (learned positions, which restart
    at the document), and its first 20 as the first document's window does."""
    model, params = model_and_params("learned")
    text = evaluate.ValidationText(TEXT, np.array([0, 20]))
    packed = evaluate.losses_by_position(model, params, text, length=32, budget=32)
    second = evaluate.losses_by_position(model, params, TEXT[20:], length=12, budget=12)
    first = evaluate.losses_by_position(model, params, TEXT, length=20, budget=20)
    np.testing.assert_allclose(packed.by_position[20:], second.by_position, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(packed.by_position[:20], first.by_position, rtol=1e-5, atol=1e-6)
    plain = evaluate.losses_by_position(model, params, TEXT, length=32, budget=32)
    assert np.abs(plain.by_position[20:] - packed.by_position[20:]).max() > 1e-3


def test_lengths_learned_positions_cannot_reach_are_refused_with_the_reason():
    learned, _ = model_and_params("learned")
    rope, _ = model_and_params("rope")
    assert evaluate.refusal(learned, 32, 1000) is None
    assert "learned position embeddings have no row past block_size=32" in evaluate.refusal(learned, 33, 1000)
    assert evaluate.refusal(rope, 512, 1000) is None
    assert evaluate.refusal(rope, 1000, 1000) == "the validation split has 1000 tokens, fewer than a window of 1000 + 1"


def test_the_command_prints_a_row_per_length_and_draws(trained_small_run, tmp_path, capsys):
    out = tmp_path / "by_position.png"
    evaluate.main(["--workdir", str(trained_small_run), "--lengths", "64,16,32", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert "length 64 skipped: learned position embeddings have no row past block_size=32" in printed[0]
    header, *rows, wrote = printed[1:]
    assert header.split() == ["run", "step", "length", "windows", "loss", "<=", "block", ">", "block"]
    assert [row.split()[2] for row in rows] == ["16", "32"]
    assert all(row.split()[-1] == "-" for row in rows)  # nothing beyond block_size was scored
    assert wrote == f"wrote {out}" and out.stat().st_size > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--step", "7"], "--step 7: {workdir}/checkpoints keeps no checkpoint of step 7; it keeps"),
        (["--lengths", "16,x"], "'16,x' is not a comma-separated list of whole numbers"),
    ],
)
def test_bad_arguments_are_one_line(trained_small_run, capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        evaluate.main(["--workdir", str(trained_small_run), *args])
    assert exit.value.code == 2
    assert message.format(workdir=trained_small_run) in capsys.readouterr().err


def test_scores_use_the_run_in_float32(trained_small_run):
    """bfloat16 runs are scored in float32, as sampling does: the table's digits do not
    depend on the compute dtype the run trained with."""
    from jaxgpt.job.checkpoint import load_latest

    run, params, _, _ = load_latest(trained_small_run)
    bf16 = run.model.replace(dtype="bfloat16")
    a = evaluate.losses_by_position(run.model, params, TEXT % run.model.vocab_size, 16, 64)
    b = evaluate.losses_by_position(bf16, params, TEXT % run.model.vocab_size, 16, 64)
    np.testing.assert_array_equal(a.by_position, b.by_position)


def test_removing_each_head_in_turn_moves_the_loss_only_for_the_head_that_writes():
    """Every attention output projection zeroed except head 1 of layer 0's rows: removing any
    other head subtracts an exact zero from the residual stream (the loss is bit-identical),
    removing that one changes it."""
    model, params = model_and_params()
    params = jax.tree.map(np.array, params)
    for layer in range(model.n_layer):
        out = params[f"block_{layer}"]["attn"]["out"]["kernel"]  # (kv heads, group, head_dim, d_model)
        keep = out[1, 0].copy()
        out[...] = 0
        if layer == 0:
            out[1, 0] = 10 * keep  # well above init, so the head's share is visible in the loss
    full, losses = evaluate.without_each_head(model, params, TEXT, budget=4 * model.block_size)
    changed = losses != full
    assert changed[0, 1] and changed.sum() == 1
    lines = evaluate.head_table("run", full, losses)
    assert lines[1].split() == ["layer", "head", "0", "head", "1"] and len(lines) == 2 + model.n_layer


def test_asking_for_more_tokens_than_the_split_holds_says_so(trained_small_run, capsys):
    import json

    from jaxgpt import data
    from jaxgpt.config import run_config_from_dict

    run = run_config_from_dict(json.loads((trained_small_run / "config.json").read_text()))
    held = len(data.prepare(run.data, progress=False).val)
    evaluate.main(["--workdir", str(trained_small_run), "--lengths", "16", "--tokens", "100000000"])
    printed = capsys.readouterr().out.splitlines()
    said = f"the validation split has {held:,} tokens, fewer than --tokens 100,000,000; all are scored"
    assert printed[0] == f"{trained_small_run}: {said}"
    assert printed[2].split()[3] == str((held - 1) // 16)  # the windows column: every whole window of the split


def test_the_command_prints_the_loss_with_each_head_removed(trained_small_run, capsys):
    evaluate.main(["--workdir", str(trained_small_run), "--mask_heads", "--tokens", "256"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{trained_small_run.name}: loss ") and printed[0].endswith("one head removed:")
    assert [line.split()[0] for line in printed[2:]] == ["0", "1"]  # small_run_config: 2 layers of 2 heads
    assert all(float(x) > -1 for line in printed[2:] for x in line.split()[1:])


def test_runs_are_named_by_as_much_of_their_path_as_tells_them_apart():
    from pathlib import Path

    runs = [Path("out/position=rope/seed0"), Path("out/position=alibi/seed0")]
    assert evaluate.run_names(runs) == ["position=rope/seed0", "position=alibi/seed0"]
    assert evaluate.run_names([Path("runs/tiny"), Path("runs/llama_tiny")]) == ["tiny", "llama_tiny"]
    assert evaluate.run_names([Path("a/x"), Path("a/x")]) == ["a/x", "a/x"]  # the same run twice


def test_pruning_greedily_removes_first_the_head_whose_removal_costs_least(trained_small_run, capsys):
    """The first head pruned is the argmin of --mask_heads' single-head losses (computed
    head by head, not as a set), with the same loss; a removed set's loss is the one printed."""
    from jaxgpt.job.checkpoint import load_latest

    run, params, _, _ = load_latest(trained_small_run)
    tokens = TEXT % run.model.vocab_size
    budget = 4 * run.model.block_size
    full, single = evaluate.without_each_head(run.model, params, tokens, budget)
    pruned = evaluate.prune_greedily(run.model, params, tokens, budget, 0.5)  # 2 of the 4 heads
    first = np.unravel_index(np.argmin(single), single.shape)
    assert len(pruned) == 2 and pruned[0][0] == tuple(int(i) for i in first)
    assert pruned[0][1] == pytest.approx(single[first], rel=1e-6)
    both = [head for head, _ in pruned]
    assert pruned[1][1] == pytest.approx(evaluate.without_heads(run.model, params, tokens, budget, both), rel=1e-6)
    evaluate.main(["--workdir", str(trained_small_run), "--prune", "0.5", "--tokens", "256"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{trained_small_run.name}: pruned 2 of 4 heads, the least useful first: ")
    assert printed[1].startswith(f"{trained_small_run.name}: loss ") and " without them (" in printed[1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--remove_heads", "2.0"], "--remove_heads 2.0: the model has layers 0-1 of heads 0-1"),
        (["--remove_heads", "x"], "--remove_heads 'x' is not LAYER.HEAD"),
        (["--prune", "1.5"], "--prune 1.5 is not a share of the heads; give one between 0 and 1"),
    ],
)
def test_a_bad_head_set_is_one_line(trained_small_run, capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        evaluate.main(["--workdir", str(trained_small_run), "--tokens", "256", *args])
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_the_command_prints_each_heads_induction_score(trained_small_run, capsys):
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab.capture import model_induction_scores

    run, params, _, _ = load_latest(trained_small_run)
    scores = model_induction_scores(run.model, params)
    evaluate.main(["--workdir", str(trained_small_run), "--induction"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{trained_small_run.name}: induction score per head on 16 random tokens repeated")
    table = np.array([[float(x) for x in line.split()[1:]] for line in printed[2:4]])
    np.testing.assert_allclose(table, scores, atol=5e-4)  # printed to 3 decimals
    layer, head = np.unravel_index(np.argmax(scores), scores.shape)
    assert printed[4] == f"strongest: layer {layer} head {head}, {scores[layer, head]:.3f}"
