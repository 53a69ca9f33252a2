"""Activation patching, attribution patching and direct logit attribution (jaxgpt/lab/patching.py)
against truths that do not use them: patching an activation the two runs share restores nothing
and patching the only changed token at the first block restores everything, exactly; each table
cell is the single intervention run alone; attribution patching equals patching where the metric
is linear in the activation; the direct logit attribution's parts sum to the logit difference;
and the command prints, draws and refuses as it says."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt.config import ModelConfig
from jaxgpt.lab import activations as A
from jaxgpt.lab import patching as P
from jaxgpt.model.transformer import init_params

CLOSE = dict(rtol=1e-4, atol=1e-4)  # fractions of a logit difference of order 1, float32 sums in another order


def model(**changes):
    base = dict(vocab_size=40, n_layer=2, n_head=4, d_model=32, block_size=16, init_std=0.3)
    config = ModelConfig(**(base | changes))
    return config, init_params(config, jax.random.key(2))


CLEAN = [5, 9, 13, 2, 7, 30, 11, 4]
CORRUPTED = [5, 9, 21, 2, 7, 30, 11, 4]  # one token changed, at position 2


def test_patching_restores_all_at_the_changed_token_and_nothing_where_the_runs_agree():
    config, params = model()
    prompts = P.prompt_pair(CLEAN, CORRUPTED, answer=13, wrong=21)
    table = P.activation_patching(config, params, prompts)
    assert abs(table.clean - table.corrupted) > 0.1  # the change matters
    resid = table.restored["resid_pre"]
    # block 0's input at position 2 is the clean run's whole difference; before position 2 the runs agree
    assert resid[0, 2] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(np.delete(resid[0], 2), 0.0, atol=1e-5)
    for kind in ("resid_pre", "attn_out", "mlp_out"):
        np.testing.assert_allclose(table.restored[kind][:, :2], 0.0, atol=1e-5)
    assert set(table.restored) == {"resid_pre", "attn_out", "mlp_out", "head_out"}
    assert table.restored["head_out"].shape == (2, 4)


def test_each_cell_is_the_single_patch_run_alone():
    """The sweep (one compiled program over every cell) against plain runs of one intervention."""
    config, params = model(n_kv_head=2)
    prompts = P.prompt_pair(CLEAN, CORRUPTED, answer=13, wrong=21)
    table = P.activation_patching(config, params, prompts)
    clean_ids, corrupted_ids = prompts.tokens[:1], prompts.tokens[1:]
    for kind, layer, index in (("attn_out", 1, 5), ("mlp_out", 0, 3), ("head_out", 1, 2), ("resid_pre", 1, 7)):
        site = f"blocks.{layer}.{P.SWEEPS[kind][0]}"
        _, cache = A.run_with_cache(config, params, clean_ids, [site])
        chosen = {"heads": [index]} if kind == "head_out" else {"positions": [index]}
        edit = A.replace(cache[site].shape, site, cache[site], **chosen)
        logits = A.run_with_interventions(config, params, corrupted_ids, {site: edit})
        diff = float(P.logit_difference(logits, [7], 13, 21)[0])
        want = (diff - table.corrupted) / (table.clean - table.corrupted)
        assert table.restored[kind][layer, index] == pytest.approx(want, abs=1e-4), (kind, layer, index)


def test_prompts_of_unequal_length_are_padded_without_changing_either_run():
    config, params = model()
    shorter = CORRUPTED[:6]
    prompts = P.prompt_pair(CLEAN, shorter, answer=13, wrong=21)
    assert prompts.tokens.shape == (2, 8) and list(prompts.last) == [7, 5]
    assert prompts.inputs["segments"].tolist() == [[1] * 8, [1] * 6 + [0, 0]]
    clean, corrupted = P.logit_differences(config, params, prompts)
    for ids, want in ((CLEAN, clean), (shorter, corrupted)):
        alone = A.run_with_interventions(config, params, np.asarray([ids]), {})
        assert float(P.logit_difference(alone, [len(ids) - 1], 13, 21)[0]) == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize(
    "changes, kind", [(dict(norm="none"), "mlp_out"), (dict(norm="none", mlp=False), "head_out")], ids=["mlp", "heads"]
)
def test_attribution_patching_is_exact_where_the_metric_is_linear_in_the_activation(changes, kind):
    """Without a final norm, the last block's MLP output (and, attention-only, each last-layer
    head's output through W_O) reaches the logits linearly: the first-order estimate is the
    patch itself. Earlier layers go through softmaxes and the MLP: only an estimate there."""
    config, params = model(**changes)
    prompts = P.prompt_pair(CLEAN, CORRUPTED, answer=13, wrong=21)
    full = P.activation_patching(config, params, prompts, kinds=[kind])
    estimate = P.attribution_patching(config, params, prompts, kinds=[kind])
    assert (estimate.clean, estimate.corrupted) == (full.clean, full.corrupted)
    np.testing.assert_allclose(estimate.restored[kind][-1], full.restored[kind][-1], **CLOSE)
    assert np.abs(full.restored[kind][-1]).max() > 0.01  # there is something to estimate
    first = np.abs(estimate.restored[kind][0] - full.restored[kind][0]).max()
    assert first > 1e-3  # and a nonlinear layer is where the estimate and the patch part


@pytest.mark.parametrize(
    "changes",
    [{}, dict(norm="rmsnorm", bias=False, n_kv_head=2, tie_embeddings=False), dict(norm="none", position="rope")],
    ids=["layernorm", "rmsnorm-untied-grouped", "no-norm"],
)
def test_the_direct_logit_attribution_parts_sum_to_the_logit_difference(changes):
    """With the final norm's learned scale and bias drawn at random (at their init, 1 and 0, an
    attribution that ignored them summed right all the same)."""
    config, params = model(**changes)
    if "norm_f" in params:
        rng = np.random.default_rng(3)
        params = params | {"norm_f": {k: jnp.asarray(rng.normal(1.0 if k == "scale" else 0.0, 0.5, v.shape), v.dtype)
                                      for k, v in params["norm_f"].items()}}  # fmt: skip
    ids = np.asarray([CLEAN])
    parts = P.direct_logit_attribution(config, params, ids, last=7, answer=13, wrong=21)
    logits = A.run_with_interventions(config, params, ids, {})
    assert parts.total == pytest.approx(float(logits[0, 7, 13] - logits[0, 7, 21]), abs=1e-6)
    summed = parts.embeddings + parts.heads.sum() + parts.attention_bias.sum() + parts.mlp.sum() + parts.constant
    assert summed == pytest.approx(parts.total, abs=1e-4 * max(1.0, abs(parts.total)))
    assert parts.heads.shape == (2, 4) and np.abs(parts.heads).max() > 0


@pytest.mark.parametrize("norm_position", ["post", "sandwich"])
def test_direct_logit_attribution_refuses_a_model_without_a_linear_readout(norm_position):
    config, params = model(norm_position=norm_position)
    refused = rf"a model whose blocks norm what they write \(norm_position='{norm_position}'\) has none"
    with pytest.raises(ValueError, match=refused):
        P.direct_logit_attribution(config, params, np.asarray([CLEAN]), 7, 13, 21)


def test_the_command_prints_the_tables_and_writes_the_heatmaps(trained_small_run, tmp_path, capsys):
    from jaxgpt.commands import patch
    from jaxgpt.lab.views import embedded_data

    out = tmp_path / "patching"
    argv = ["--workdir", str(trained_small_run), "--clean", "a = len(bar); b = len(", "--positions", "6"]
    patch.main([*argv, "--corrupted", "a = len(car); b = len(", "--answer", "b", "--wrong", "c", "--out", str(out)])
    captured = capsys.readouterr()
    printed = captured.out.splitlines()
    # a 20-step model tells the two prompts apart by about 1e-4: said, and on the pictures
    assert "the clean and corrupted runs differ by 0.000 in logit difference, under 1 nat" in captured.err
    assert printed[0].startswith("patching (step 20; 22 and 22 tokens): 'b' against 'c' at the last token")
    assert printed[1].endswith("(the last 6 positions: --positions)")
    assert printed[2] == "resid_pre: the residual stream entering each block"
    assert printed[3].split() == list("=len(") and printed[4].startswith("layer 0")  # "= len(", 2 layers
    assert printed[-3].startswith("attribution patching (one backward pass) estimates the same tables")
    assert printed[-2].startswith("direct logit attribution of the clean difference")
    record = json.loads((out / "patching.json").read_text())
    assert np.asarray(record["restored"]["resid_pre"]).shape == (2, 22)
    # patching the one token that differs restores all of it: 1 up to float32 rounding of the two
    # runs' logit differences (about 1e-6 at this model's logit scale), divided by the difference
    # they differ by, which a 20-step model makes small (1.1e-4 here)
    differences = record["logit_difference"]
    tolerance = 1e-6 / abs(differences["clean"] - differences["corrupted"])
    assert record["restored"]["resid_pre"][0][8] == pytest.approx(1.0, abs=tolerance)  # 'b' -> 'c' is token 8
    page = embedded_data((out / "patching.html").read_text())
    assert [p["name"] for p in page["panels"]] == ["resid_pre", "attn_out", "mlp_out", "head_out"]
    assert "Warning: the clean and corrupted runs differ by 0.000" in (out / "patching.html").read_text()
    assert (out / "patching.png").read_bytes()[:4] == b"\x89PNG"


def test_a_patching_whose_fractions_measure_noise_is_said():
    """The documented example that meant nothing (docs/workbench.md until 2026-12: the clean run
    does not prefer its answer, and the two runs differ by 0.023) gets both lines; the induction
    example of docs/lab.md section 13 (5.672 against 0.618) none."""
    from jaxgpt.commands.patch import doubts

    said = doubts(-2.304, -2.327, "b", "c")
    assert len(said) == 2 and said[0].startswith(
        "the clean prompt does not prefer 'b' to 'c' (logit difference -2.304)"
    )
    assert said[1].startswith("the clean and corrupted runs differ by 0.023 in logit difference, under 1 nat")
    assert doubts(5.672, 0.618, "p", "y") == [] and len(doubts(5.672, 5.0, "p", "y")) == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--answer", "bb"], "--answer 'bb' is 2 tokens; give the text of one token"),
        (["--wrong", "b"], "--answer and --wrong are the same token"),
        (["--corrupted", "ab"], "the clean and corrupted prompts give the same logit difference"),
        (["--clean", "x" * 40], "the prompt is 40 tokens; give 1 to 32"),
    ],
    ids=["long-answer", "same-answers", "same-prompts", "long-prompt"],
)
def test_the_command_refuses_bad_input_in_one_line(trained_small_run, tmp_path, capsys, flags, message):
    from jaxgpt.commands import patch

    given = {"--clean": "ab", "--corrupted": "ac", "--answer": "b", "--wrong": "c"}
    given |= dict(zip(flags[::2], flags[1::2], strict=True))
    argv = ["--workdir", str(trained_small_run), "--out", str(tmp_path / "out")] + [
        x for kv in given.items() for x in kv
    ]
    with pytest.raises(SystemExit) as exit_status:
        patch.main(argv)
    error = capsys.readouterr().err.strip()
    assert exit_status.value.code == 2 and "\n" not in error and message in error, error
    assert not (tmp_path / "out").exists()  # nothing written
