"""The encoder: BERT's masked-token corruption and loss (jaxgpt/training/masked.py), the run's vocabulary
with its mask token, and `fill`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxgpt.commands.fill import BLANK, blank_probabilities, filled, prompt_with_blanks
from jaxgpt.config import ConfigError, ModelConfig
from jaxgpt.config_files import resolve, with_tokenizer_vocab
from jaxgpt.model.transformer import GPT, init_params
from jaxgpt.tokenizers import make_tokenizer
from jaxgpt.training.masked import example_keys, mask_examples, mask_token, mask_tokens
from jaxgpt.training.train_step import scored

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py


def encoder(**changes) -> ModelConfig:
    base = dict(vocab_size=65, block_size=64, n_layer=2, n_head=4, d_model=32, position="rope", causal=False)
    return ModelConfig(**base | dict(objective="masked") | changes)


def test_corruption_follows_berts_rates():
    """Over 2,000 x 512 positions: 15% chosen; of those 80% become the mask token, 10% a random
    token and 10% stay; nothing unchosen changes. The bounds are about 5 binomial standard
    deviations (the 15%: sd 0.00035 over 1.0M positions, bound 0.002; the 80/10/10 split over
    the ~154k chosen: sd 0.001 for the 80%, 0.0008 for the 10%s, bounds 0.005 and 0.004)."""
    config = encoder()
    tokens = jax.random.randint(jax.random.key(1), (2000, 512), 0, mask_token(config))
    corrupted, chosen = jax.jit(mask_tokens, static_argnums=2)(tokens, jax.random.key(2), config)
    tokens, corrupted, chosen = map(np.asarray, (tokens, corrupted, chosen))
    assert abs(chosen.mean() - 0.15) < 5 * 0.0004
    np.testing.assert_array_equal(corrupted[~chosen], tokens[~chosen])
    masked = corrupted[chosen] == mask_token(config)
    same = corrupted[chosen] == tokens[chosen]
    # a random replacement equals the original 1 time in 64: 10% x (1 - 1/64) differ, 10% + 10%/64 same
    assert abs(masked.mean() - 0.8) < 0.005
    assert abs(same.mean() - (0.1 + 0.1 / 64)) < 0.004
    assert abs((~masked & ~same).mean() - 0.1 * 63 / 64) < 0.004
    assert corrupted.max() == mask_token(config)  # the mask token only where masked: no random draw is it
    assert not np.any((corrupted == mask_token(config)) & ~chosen)


def test_a_mask_token_inside_the_vocabulary_is_never_a_random_replacement():
    """An imported BERT's [MASK] sits among the other ids (model.mask_token). With 3 ids, the
    mask token 1 and every token 0: of the chosen positions 80% become 1, and the 10% random
    replacements are drawn from {0, 2} alone, so 5% become 2 and 10% + 5% stay 0. Drawn from
    all three, 1 would take 83%. (Bounds: 5 sd of 150k binomial draws, 0.005.)"""
    config = encoder(vocab_size=3, mask_token=1)
    tokens = jnp.zeros((2000, 512), jnp.int32)
    corrupted, chosen = mask_tokens(tokens, jax.random.key(5), config)
    picked = np.asarray(corrupted)[np.asarray(chosen)]
    assert abs((picked == 1).mean() - 0.8) < 0.005
    assert abs((picked == 2).mean() - 0.05) < 0.005 and abs((picked == 0).mean() - 0.15) < 0.005
    assert mask_token(config) == 1 and mask_token(encoder()) == 64


def test_the_loss_counts_the_hidden_positions_alone():
    """The loss is the mean cross-entropy over the chosen positions of the model's logits on
    the corrupted input (recomputed here in numpy from those logits), and the accuracy the
    share of them whose argmax is the original token."""
    config = encoder(mask_rate=0.3)
    params = init_params(config, jax.random.key(0))
    windows = jax.random.randint(jax.random.key(3), (4, config.block_size + 1), 0, 64)
    rng = jax.random.key(4)
    _, measured = scored(GPT(config), params, windows, rng)
    inputs, chosen = mask_examples(windows[:, :-1], example_keys(rng, jnp.arange(4)), config)
    logits = np.asarray(GPT(config).apply({"params": params}, inputs), np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    targets = np.asarray(windows[:, :-1])
    picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    chosen = np.asarray(chosen)
    assert 0.2 < chosen.mean() < 0.4
    np.testing.assert_allclose(float(measured["loss"]), -picked[chosen].mean(), rtol=1e-5)  # float32 sums of ~80 terms
    right = logits.argmax(-1) == targets
    np.testing.assert_allclose(float(measured["accuracy"]), right[chosen].mean(), rtol=1e-6)


@pytest.mark.slow  # 400 steps (10-15 s); the quick set's learning check is check's overfit below
def test_the_masked_objective_trains_an_encoder_that_reads_both_sides():
    """On windows that repeat a random 8-token string, each hidden token is the one 8 positions
    before or after it, and nothing else predicts it (the tokens are uniform over 64: chance
    is 1/64). One bidirectional layer learns to read it: 0.76 of held-out hidden tokens right
    after 400 steps (measured; 0.53 at 200), so above half means the objective's gradient
    reaches the hidden positions through the corrupted inputs."""
    config = encoder(n_layer=1)
    params = init_params(config, jax.random.key(0))
    optimizer = optax.adam(3e-3)
    state = optimizer.init(params)

    def windows(seed):
        strings = jax.random.randint(jax.random.key(seed), (16, 8), 0, 64)
        return jnp.tile(strings, (1, 9))[:, : config.block_size + 1]

    @jax.jit
    def step(params, state, windows, rng):
        (_, measured), grads = jax.value_and_grad(scored, argnums=1, has_aux=True)(
            GPT(config), params, windows, rng, dropout_rng=rng
        )
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(params, updates), state, measured

    for i in range(400):
        params, state, measured = step(params, state, windows(i), jax.random.key(1000 + i))
    _, held_out = scored(GPT(config), params, windows(10_000), jax.random.key(0))
    assert float(held_out["accuracy"]) > 0.5


def test_a_run_gets_one_more_token_than_the_tokenizer_for_the_mask():
    run = resolve({"model": {"causal": False, "objective": "masked"}}, vocab_size=40)
    assert run.model.vocab_size == 41 and mask_token(run.model) == 40
    decoder = resolve({}, vocab_size=40)
    assert decoder.model.vocab_size == 40  # a decoder's vocabulary is the tokenizer's, as before
    too_small = resolve({"model": {"causal": False, "objective": "masked", "vocab_size": 40}})
    with pytest.raises(ConfigError, match="smaller than the tokenizer's 40 tokens and the mask token"):
        with_tokenizer_vocab(too_small, 40)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(causal=True), "model.objective='masked' predicts hidden tokens from both sides"),
        (dict(mask_rate=0.0), "model.mask_rate=0.0 must be between 0 and 1"),
        (dict(objective="denoise"), "model.objective='denoise' is not one of"),
    ],
)
def test_an_encoder_config_that_cannot_train_is_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        encoder(**changes)


def test_a_mask_rate_that_hides_nothing_in_a_batch_is_refused():
    """model.mask_rate=0.0001 over a 12 x 128 batch hides 0.15 tokens on average: most batches
    would score no token, and the run would report a loss of 0 over nothing at every step."""
    masked = {"causal": False, "objective": "masked", "vocab_size": 40, "block_size": 128}
    with pytest.raises(ConfigError, match=r"mask_rate=0.0001 hides 0.15 of a batch's 1,536 tokens .* at least 0.00065"):
        resolve({"model": masked | {"mask_rate": 0.0001}, "train": {"batch_size": 12}})
    assert resolve({"model": masked | {"mask_rate": 0.001}, "train": {"batch_size": 12}})  # 1.5 a batch: trains


def test_blanks_become_the_mask_token_one_token_each():
    config = encoder(vocab_size=300)
    tokenizer = make_tokenizer("byte")
    ids, blanks = prompt_with_blanks(tokenizer, f"ab{BLANK}d{BLANK}{BLANK}", config)
    m = mask_token(config)
    assert ids.tolist() == [*tokenizer.encode("ab"), m, *tokenizer.encode("d"), m, m]
    assert blanks.tolist() == [2, 4, 5]
    assert filled(f"ab{BLANK}d{BLANK}{BLANK}", ["c", "e", "f"]) == "abcdef"


def test_blank_probabilities_are_the_models_softmax_without_the_mask_token():
    """The mask token gets 0 and the rest is the model's softmax renormalised: the ratio of any
    two candidates is the ratio of their exponentiated logits."""
    config = encoder()
    params = init_params(config, jax.random.key(0))
    ids = np.array([3, mask_token(config), 5, 7, mask_token(config)], np.int32)
    p = blank_probabilities(config, params, ids, np.array([1, 4]))
    logits = np.asarray(GPT(config).apply({"params": params}, jnp.asarray(ids)[None])[0], np.float64)
    assert p.shape == (2, 65) and np.all(p[:, mask_token(config)] == 0)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
    for row, position in zip(p, (1, 4), strict=True):
        np.testing.assert_allclose(row[10] / row[20], np.exp(logits[position, 10] - logits[position, 20]), rtol=1e-5)


def test_sample_and_evaluate_send_an_encoder_to_fill(tmp_path, capsys, trained_small_run):
    """An encoder has no next token to write or score: both commands exit 2 with one line
    naming fill, and fill on a decoder says it never saw a blank."""
    from jaxgpt.commands import evaluate, fill, sample
    from jaxgpt.job.trainer import train_and_evaluate

    config = {
        "model": dict(n_layer=1, n_head=2, d_model=16, block_size=16, causal=False, objective="masked"),
        "train": dict(steps=2, batch_size=8, eval_every=2, eval_batches=1, checkpoint_every=2, warmup_steps=0),
    }
    record = train_and_evaluate(config, tmp_path / "encoder", progress=False)
    assert 0 <= record["val_accuracy"] <= 1 and "val_bpb" not in record
    for command, argv in (
        (sample, ["--workdir", str(tmp_path / "encoder"), "--prompt", "x"]),
        (evaluate, ["--workdir", str(tmp_path / "encoder"), "--lengths", "16"]),
    ):
        with pytest.raises(SystemExit) as stop:
            command.main(argv)
        assert stop.value.code == 2
        assert "python -m jaxgpt fill" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # a decoder's run
        fill.main(["--workdir", str(trained_small_run), "--prompt", f"a{BLANK}"])
    assert stop.value.code == 2 and "fill needs a run trained with model.objective=masked" in capsys.readouterr().err


def test_the_checks_judge_an_encoder_by_its_own_loss_and_overfit_it_on_fixed_blanks():
    """check's initial loss is the masked objective's (ln V at init, V the tokenizer's
    vocabulary and the mask token), and its overfit run hides the same tokens every step, so
    one batch is learnt: 40 steps take the masked loss below half (measured: 4.57 to 0.005 in
    100 steps on configs/encoder_tiny.py; with fresh blanks each step only to 2.92)."""
    from conftest import small_run_config

    from jaxgpt.commands.preflight import run_checks

    config = small_run_config()
    config.model.update(causal=False, objective="masked")
    rows = {row.name: row for row in run_checks(config, overfit_steps=40)}
    assert rows["initial loss"].passed and rows["gradients"].passed
    assert rows["overfit one batch"].passed, rows["overfit one batch"].detail
    assert "the same tokens hidden each step" in rows["overfit one batch"].detail


def test_the_validation_loss_is_the_mean_over_every_hidden_token_not_over_the_batches():
    """Two batches hiding 1 and 3 tokens, with mean losses 1 and 3 there: (1 + 3 x 3) / 4."""
    from jaxgpt.job.trainer import mean_losses

    batches = [{"loss": 1.0, "accuracy": 0.0, "scored": 1.0}, {"loss": 3.0, "accuracy": 1.0, "scored": 3.0}]
    assert mean_losses(batches) == {"loss": 2.5, "accuracy": 0.75}
    assert mean_losses([{"loss": 1.0}, {"loss": 3.0}]) == {"loss": 2.0}  # next-token: equal batches
    # a mixture of experts' router statistics, per layer, averaged the same way leaf by leaf (this
    # crashed every evaluation of a masked, pairs or chat run with experts: a dict times a float)
    router = [{"aux_loss": np.array([1.0, 2.0]), "load": {"0": np.array(0.25)}}, {"aux_loss": np.array([3.0, 6.0]),
              "load": {"0": np.array(0.75)}}]  # fmt: skip
    nested = mean_losses([b | {"router": r} for b, r in zip(batches, router, strict=True)])
    np.testing.assert_array_equal(nested["router"]["aux_loss"], [2.5, 5.0])
    assert nested["router"]["load"]["0"] == 0.625 and nested["loss"] == 2.5
