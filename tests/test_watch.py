"""The lab inside the training loop (train.lab, jaxgpt/lab/watch.py): each measure against the
lab's own one-command tools on the same probe (capture's attention weights, residuals and logit
lens, in numpy; patching's direct logit attribution), the run logging them at every evaluation
and a resumed run continuing them to the bit, and the runs it cannot measure refused in one line."""

import json

import jax
import numpy as np
import pytest
from conftest import small_run_config

from jaxgpt.config import ModelConfig
from jaxgpt.config.problems import ConfigError
from jaxgpt.config_files import resolve
from jaxgpt.errors import UserError
from jaxgpt.job.metrics import lab_images, lab_scalars
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.lab import capture as C
from jaxgpt.lab import patching as P
from jaxgpt.lab import watch as W
from jaxgpt.model.sites import CACHE
from jaxgpt.model.transformer import GPT, init_params

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

# float32 sums of a few hundred O(1) products in another order: ~1e-6
CLOSE = dict(rtol=1e-5, atol=1e-5)


def model(**changes):
    base = dict(vocab_size=24, n_layer=2, n_head=4, d_model=32, block_size=16, init_std=0.3, position="rope")
    config = ModelConfig(**(base | changes))
    return config, init_params(config, jax.random.key(2))


def validation_text(config, n=200, seed=5):
    return np.random.default_rng(seed).integers(0, config.vocab_size, n).astype(np.int32)


@pytest.mark.parametrize("changes", [{}, {"norm": "rmsnorm", "activation": "swiglu", "n_kv_head": 2}])
def test_each_measure_is_what_the_lab_computes_from_one_capture(changes):
    config, params = model(**changes)
    watch = W.Watch(config, "all", seed=3, validation_tokens=validation_text(config))
    got = {k.removeprefix("lab_"): np.asarray(v) for k, v in watch.measure(params).items()}
    assert set(got) == {*W.LAB_MEASURES, "pattern", "pattern_tokens"}  # probe: its own test below
    repeated = C.capture(config, params, watch.repeats)
    np.testing.assert_allclose(got["induction"], C.induction_scores(repeated.weights), **CLOSE)
    t = watch.repeats.shape[1]
    previous = np.mean([repeated.weights[:, :, :, i, i - 1] for i in range(1, t)], axis=(0, 2))
    np.testing.assert_allclose(got["previous_token"], previous, **CLOSE)
    text = C.capture(config, params, watch.text)
    k = W.PATTERN_TOKENS
    np.testing.assert_allclose(got["pattern"], np.round(text.weights[:, 0, :, :k, :k], 4), atol=1e-4)
    np.testing.assert_array_equal(got["pattern_tokens"], watch.text[0, :k])
    p = text.weights.astype(np.float64)
    entropy = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(-1).mean(axis=(1, 3))
    np.testing.assert_allclose(got["entropy"], entropy, **CLOSE)
    lens = C.lens_log_probabilities(text.logit_lens)  # (L + 1, b, t, vocab)
    picked = np.take_along_axis(lens, watch.targets[None, ..., None], -1)[..., 0]
    np.testing.assert_allclose(got["logit_lens"], -picked.mean(axis=(1, 2)), **CLOSE)
    np.testing.assert_allclose(got["norms"], np.linalg.norm(text.residual, axis=-1).mean(axis=(1, 2)), **CLOSE)
    # the final layer's lens is the model's own loss on the probe
    final = np.take_along_axis(C.lens_log_probabilities(text.logits[None]), watch.targets[None, ..., None], -1)
    assert got["logit_lens"][-1] == pytest.approx(-final.mean(), rel=1e-5)


def test_the_direct_logit_attribution_is_patchings_averaged_over_the_wrong_tokens():
    """What a head writes onto the next token's logit against the mean token's is, by linearity,
    patching's attribution of the next token against each wrong token, averaged over them all:
    on one repeated sequence, at both positions of its second copy that have a next token."""
    config, params = model(vocab_size=8, norm="rmsnorm")
    repeats = np.asarray([[5, 2, 7, 5, 2, 7]], np.int32)
    _, state = GPT(config).apply({"params": params}, repeats, mutable=[CACHE])
    ours = np.asarray(W.direct_logit_attribution(config, params, state[CACHE], repeats))
    by_patching = [
        P.direct_logit_attribution(config, params, repeats, q, int(repeats[0, q + 1]), wrong).heads
        for q in (3, 4)
        for wrong in range(8)
    ]
    np.testing.assert_allclose(ours, np.mean(by_patching, axis=0), rtol=1e-4, atol=1e-5)
    assert np.abs(ours).max() > 1e-3


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """A run measured at every evaluation, and the same run stopped at step 10 and resumed."""
    tmp_path = tmp_path_factory.mktemp("watched")
    config = lambda: small_run_config(  # noqa: E731
        steps=20, eval_every=5, checkpoint_every=5, lab="induction,entropy,norms", checkpoint_schedule="log"
    )
    train_and_evaluate(config(), tmp_path / "straight", progress=False)
    train_and_evaluate(config(), tmp_path / "resumed", progress=False, stop_at=10)
    train_and_evaluate(config(), tmp_path / "resumed", progress=False)
    return tmp_path


def test_a_run_logs_the_measures_at_every_evaluation_and_a_resume_continues_them(watched):
    tmp_path = watched

    def lab_records(workdir):
        records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: {k: v for k, v in r.items() if k.startswith("lab_")} for r in records if "val_loss" in r}

    straight = lab_records(tmp_path / "straight")
    assert sorted(straight) == [5, 10, 15, 20]
    measured = {"lab_induction", "lab_entropy", "lab_norms", "lab_pattern", "lab_pattern_tokens"}
    assert all(set(r) == measured for r in straight.values())
    assert np.asarray(straight[20]["lab_induction"]).shape == (2, 2) and len(straight[20]["lab_norms"]) == 3
    assert straight[5] != straight[20]  # the measures follow the training
    assert lab_records(tmp_path / "resumed") == straight  # the same probes, the same values, to the bit


def test_the_measures_reach_tensorboard_a_scalar_a_head_and_an_image_a_measure():
    record = {"step": 5, "lab_induction": [[0.1, 0.3], [0.2, 0.9]], "lab_norms": [1.0, 2.0, 3.0],
              "lab_pattern": [[[[1.0]]]], "lab_pattern_tokens": [7]}  # fmt: skip
    scalars = lab_scalars(record)
    assert scalars["lab/induction/block_1/head_1"] == 0.9 and scalars["lab/norms/embed"] == 1.0
    assert scalars["lab/norms/block_1"] == 3.0 and len(scalars) == 7
    image = lab_images(record)["lab/induction/heads"]
    np.testing.assert_allclose(image, [[0.0, 0.25], [0.125, 1.0]])


def test_a_run_the_measures_cannot_read_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="train.lab='induction,attention' names attention; choose from induction"):
        resolve(small_run_config(lab="induction,attention"))
    post = small_run_config(steps=2, lab="dla")
    post.model.norm_position = "post"
    with pytest.raises(UserError, match="train.lab asks for dla, and direct logit attribution needs a linear readout"):
        train_and_evaluate(post, tmp_path / "post", progress=False)
    pairs = small_run_config(steps=2, lab="entropy")
    pairs.data.source = "builtin:reverse"
    with pytest.raises(UserError, match="reads a causal next-token decoder's attention on plain text"):
        train_and_evaluate(pairs, tmp_path / "pairs", progress=False)
    assert not (tmp_path / "post").exists() and not (tmp_path / "pairs").exists()


def test_the_timeline_page_embeds_the_runs_curves_and_patterns(watched, capsys):
    """jaxgpt timeline: the page's data are the records' (each head's curve, each step's patterns,
    the probe's tokens as the run's tokenizer writes them), beside a PNG; a run without the
    measures is one line."""
    from jaxgpt.commands import timeline
    from jaxgpt.job.metrics import read_metrics
    from jaxgpt.lab.views import embedded_data
    from jaxgpt.tokenizers import load_tokenizer

    run = watched / "straight"
    timeline.main(["--workdir", str(run)])
    assert "wrote" in capsys.readouterr().out and (run / "timeline.png").stat().st_size > 10_000
    data = embedded_data((run / "timeline.html").read_text())
    records = [r for r in read_metrics(run) if "lab_pattern" in r]
    assert data["steps"] == [5, 10, 15, 20] and data["patterns"] == [r["lab_pattern"] for r in records]
    induction = next(m for m in data["measures"] if m["name"] == "induction")
    assert induction["labels"][3] == "block 1 head 1"
    np.testing.assert_allclose(induction["values"][3], [r["lab_induction"][1][1] for r in records], atol=0.5e-4)
    norms = next(m for m in data["measures"] if m["name"] == "norms")
    assert norms["labels"] == ["embeddings", "after block 0", "after block 1"]
    tokenizer = load_tokenizer(run / "tokenizer.json")
    assert data["tokens"] == [tokenizer.decode([i]) for i in records[-1]["lab_pattern_tokens"]]
    assert [v for _, v in data["loss"]["val"]] == [r["val_loss"] for r in read_metrics(run) if "val_loss" in r]
    plain = watched / "plain"
    train_and_evaluate(small_run_config(steps=2), plain, progress=False)
    with pytest.raises(SystemExit) as exited:
        timeline.main(["--workdir", str(plain)])
    assert exited.value.code == 2 and "holds no train.lab measures" in capsys.readouterr().err


def test_a_log_schedule_keeps_early_checkpoints_and_their_measures_are_the_ones_training_logged(watched, capsys):
    """train.checkpoint_schedule=log keeps steps 1, 2, 3, 4, 6, 8, 11 and 16 for good beside the
    newest three and the best; `evaluate --over_checkpoints` measures each of them, and where
    training logged the measures (steps 15 and 20) its numbers are those, to the bit."""
    from jaxgpt.commands import evaluate, timeline
    from jaxgpt.job.checkpoint import Checkpoints
    from jaxgpt.job.metrics import read_metrics

    run = watched / "straight"
    steps = Checkpoints(run / "checkpoints", read_only=True).steps()
    assert steps == [1, 2, 3, 4, 6, 8, 11, 15, 16, 20]
    evaluate.main(["--workdir", str(run), "--over_checkpoints", "--lab", "induction,entropy,norms"])
    assert "straight step 1: best induction" in capsys.readouterr().out
    measured = {r["step"]: r for r in map(json.loads, (run / "lab_over_checkpoints.jsonl").read_text().splitlines())}
    assert sorted(measured) == steps
    logged = {r["step"]: r for r in read_metrics(run) if "lab_pattern" in r}
    for step in (15, 20):
        assert {k: v for k, v in measured[step].items() if k != "step"} == {
            k: v for k, v in logged[step].items() if k.startswith("lab_")
        }
    assert measured[1]["lab_induction"] != measured[20]["lab_induction"]
    timeline.main(["--workdir", str(run), "--out", str(watched / "over.html"), "--png", str(watched / "over.png")])
    from jaxgpt.lab.views import embedded_data

    assert embedded_data((watched / "over.html").read_text())["steps"] == [1, 2, 3, 4, 5, 6, 8, 10, 11, 15, 16, 20]


def test_the_linear_probe_is_a_ridge_fit_scored_on_the_rows_it_was_not_fitted_on():
    """The probe's balanced accuracy per layer boundary against numpy: the label (a token seen
    earlier in its window) by brute force, the ridge fit by least squares on the augmented
    system [X; sqrt(ridge) I] (another algorithm than the probe's normal equations)."""
    config, params = model(vocab_size=12)
    watch = W.Watch(config, "probe", seed=0, validation_tokens=validation_text(config, n=16 * 40))
    got = np.asarray(watch.measure(params)["lab_probe"])
    text = watch.probe_text
    seen = np.array([[text[b, i] in text[b, :i] for i in range(text.shape[1])] for b in range(len(text))])
    residual = C.capture(config, params, text).residual.astype(np.float64)  # (L + 1, b, t, d)
    want = []
    for layer in residual:
        x = np.concatenate([layer[:, 1:], np.ones_like(layer[:, 1:, :1])], -1)
        y = np.where(seen[:, 1:], 1.0, -1.0)
        fit, fit_y = x[0::2].reshape(-1, x.shape[-1]), y[0::2].reshape(-1)
        ridge = W.RIDGE * np.trace(fit.T @ fit) / fit.shape[1]
        augmented = np.concatenate([fit, np.sqrt(ridge) * np.eye(fit.shape[1])])
        w = np.linalg.lstsq(augmented, np.concatenate([fit_y, np.zeros(fit.shape[1])]), rcond=None)[0]
        guess, truth = (x[1::2] @ w).reshape(-1) > 0, y[1::2].reshape(-1) > 0
        want.append((np.mean(guess[truth]) + np.mean(~guess[~truth])) / 2)
    assert len(got) == config.n_layer + 1 and 0.2 < seen.mean() < 0.99  # both classes are there
    np.testing.assert_allclose(got, want, atol=2 / seen[1::2, 1:].size)  # a guess or two on a float32 edge


@pytest.mark.parametrize(
    "changes",
    [{"moe": {"experts": 4, "top_k": 2}}, {"lora_rank": 4}, {"norm": "rmsnorm", "n_kv_head": 2}],
    ids=["moe", "lora", "gqa"],
)
def test_scanned_layers_measure_what_unscanned_ones_do_with_experts_adapters_or_grouped_queries(changes):
    """train.lab beside the features users combine it with: a mixture of experts, low-rank
    adapters, grouped queries; with model.scan_layers the measures (read on unstacked blocks)
    are the unscanned model's on the same weights."""
    from jaxgpt.model.transformer import stack_blocks

    config, params = model(**changes)
    text = validation_text(config)
    plain = W.Watch(config, "all", seed=1, validation_tokens=text).measure(params)
    scanned_config = config.replace(scan_layers=True)
    scanned = W.Watch(scanned_config, "all", seed=1, validation_tokens=text).measure(
        stack_blocks(params, config.n_layer)
    )
    assert set(scanned) == set(plain)
    for key in plain:
        np.testing.assert_allclose(np.asarray(scanned[key]), np.asarray(plain[key]), rtol=1e-5, atol=1e-6, err_msg=key)
