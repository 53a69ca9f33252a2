"""jaxgpt.lab.capture: one forward pass that keeps every layer's scores, weights and residual
stream, and the logit lens and induction score computed from them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import USERS_COMPILER_OPTIONS
from test_model import random_tokens, tiny

from jaxgpt.lab.capture import capture, induction_scores, repeated_random_tokens
from jaxgpt.model.transformer import GPT, init_params, stack_blocks


@pytest.fixture(scope="module")
def captured():
    config = tiny(n_kv_head=2)
    params = init_params(config, jax.random.key(0))
    params = jax.tree.map(lambda a: 10 * a, params)  # weights far from init: patterns far from uniform
    tokens = random_tokens(config, (2, 9))
    return config, params, tokens, capture(config, params, tokens)


def test_the_capture_is_the_forward_pass(captured):
    config, params, tokens, c = captured
    np.testing.assert_array_equal(c.logits, jax.jit(GPT(config).apply)({"params": params}, tokens))
    assert c.scores.shape == c.weights.shape == (config.n_layer, 2, config.n_head, 9, 9)
    assert c.residual.shape == (config.n_layer + 1, 2, 9, config.d_model)


def test_the_weights_are_the_softmax_of_the_scores_and_the_future_scores_minus_infinity(captured):
    *_, c = captured
    future = np.triu(np.ones((9, 9), bool), 1)
    assert np.all(c.scores[..., future] == -np.inf) and np.all(np.isfinite(c.scores[..., ~future]))
    np.testing.assert_allclose(c.weights, jax.nn.softmax(c.scores, axis=-1), rtol=1e-6, atol=1e-7)
    assert c.weights.max() > 0.5  # not near uniform: the test above means something


def test_the_residual_stream_starts_as_the_embeddings(captured):
    config, params, tokens, c = captured
    wte, wpe = np.asarray(params["wte"]["embedding"]), np.asarray(params["wpe"]["embedding"])
    np.testing.assert_allclose(c.residual[0], wte[np.asarray(tokens)] + wpe[:9], rtol=1e-6, atol=1e-6)


def test_the_logit_lens_of_the_last_layer_is_the_logits_and_of_the_first_is_the_embeddings_read_out(captured):
    """After the last block the lens is the model's own readout; before the first it is the
    final LayerNorm and the tied head applied to the embeddings, written out in NumPy."""
    config, params, tokens, c = captured
    np.testing.assert_array_equal(c.logit_lens[-1], c.logits)
    x = c.residual[0].astype(np.float64)
    norm = params["norm_f"]
    normed = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + config.norm_eps)
    normed = normed * np.asarray(norm["scale"]) + np.asarray(norm["bias"])
    want = normed @ np.asarray(params["wte"]["embedding"], np.float64).T
    np.testing.assert_allclose(c.logit_lens[0], want, rtol=1e-4, atol=1e-4)


def test_a_scanned_model_captures_the_same():
    config = tiny()
    params = init_params(config, jax.random.key(0))
    tokens = random_tokens(config, (1, 7))
    plain = capture(config, params, tokens)
    scanned = capture(config.replace(scan_layers=True), stack_blocks(params, config.n_layer), tokens)
    for a, b in zip(plain, scanned, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_the_induction_score_reads_the_attention_to_the_token_after_the_earlier_copy():
    """Hand-made attention on a sequence of 2 x 4 tokens: a head that attends from position
    4 + i to i + 1 scores exactly 1; a previous-token head (from 4 + i to 3 + i, never i + 1)
    scores 0; uniform attention over the visible keys scores the mean of 1 / (5 + i), i = 0..3."""
    half, t = 4, 8
    induction = np.zeros((t, t))
    previous = np.zeros((t, t))
    for q in range(t):
        previous[q, max(q - 1, 0)] = 1
    for i in range(half):
        induction[half + i, i + 1] = 1
    uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    weights = np.stack([induction, previous, uniform])[None, None]  # (1 layer, 1 batch, 3 heads, t, t)
    scores = induction_scores(weights)
    assert scores.shape == (1, 3)
    assert scores[0, 0] == 1.0 and scores[0, 1] == 0.0
    assert scores[0, 2] == pytest.approx(np.mean([1 / (5 + i) for i in range(half)]))


def test_repeated_random_tokens_repeat():
    tokens = repeated_random_tokens(50, 6, 3)
    assert tokens.shape == (3, 12) and tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens[:, :6], tokens[:, 6:])
    assert len(np.unique(tokens)) > 6 and jnp.asarray(tokens).max() < 50


def test_the_lens_table_rows_give_the_readouts_loss_norm_and_guesses():
    """Two layers over a 3-token prompt and a 4-token vocabulary: layer 0's readout is uniform
    (loss ln 4 at each of the two scored positions), layer 1's puts logit 10 on the right next
    token (loss -log softmax = log(1 + 3e-10))."""
    from jaxgpt.commands.logit_lens import lens_caption, lens_rows, table

    ids = np.array([0, 2, 3])
    lens = np.zeros((2, 3, 4))
    lens[1, [0, 1], ids[1:]] = 10.0
    residual = np.zeros((2, 3, 2))
    residual[1, :, 0] = 3.0
    rows = lens_rows(lens, residual, ids)
    assert rows[0]["loss"] == pytest.approx(np.log(4)) and rows[0]["norm"] == 0.0
    assert rows[1]["loss"] == pytest.approx(np.log(1 + 3 * np.exp(-10))) and rows[1]["norm"] == 3.0
    assert list(rows[1]["top"][:2]) == [2, 3]
    lines = table(rows, ids, lambda t: "abcd"[t[0]], positions=2)
    assert lines[0].split()[-4:] == ["c", "d", "<-", "input"]  # the last two positions
    assert lines[2].split()[0:2] == ["block", "0"] and lines[2].split()[-2:] == ["d", "a"]
    assert lines[-1].split() == ["d", "?", "<-", "next"]
    assert lens_caption(tokens=3, positions=2).endswith("at each of the last 2 positions (--positions)")
    assert lens_caption(tokens=3, positions=3).endswith("at each position")  # nothing cut, nothing said


def test_the_lens_command_prints_a_row_per_layer(trained_small_run, capsys):
    from jaxgpt.commands import logit_lens

    logit_lens.main(["--workdir", str(trained_small_run), "--prompt", "import os", "--positions", "4"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("logit lens (step 20, 9 tokens)")
    assert printed[0].endswith("at each of the last 4 positions (--positions)")  # 9 tokens, 4 shown: said
    assert [line.split()[0] for line in printed[2:5]] == ["embed", "block", "block"]  # 2 layers
    losses = [float(line[17:23]) for line in printed[2:5]]  # the loss column (guesses may be blanks)
    assert all(0 < x < 10 for x in losses)


def test_the_lens_command_refuses_an_encoder_in_one_line(tmp_path, capsys):
    """An encoder predicts hidden tokens from both sides: its layers have no next-token guesses,
    and the lens says so (as sample and evaluate do) rather than printing a table of them. The
    workdir holds what --init reads: the run's config.json and tokenizer.json."""
    import json

    from jaxgpt.commands import logit_lens
    from jaxgpt.config_files import resolve
    from jaxgpt.tokenizers import make_tokenizer, save_tokenizer

    encoder = {"causal": False, "objective": "masked", "vocab_size": 40, "n_layer": 1, "block_size": 16}
    (tmp_path / "config.json").write_text(json.dumps(resolve({"model": encoder}).to_dict()))
    save_tokenizer(make_tokenizer("char", "abcdef"), tmp_path / "tokenizer.json")
    with pytest.raises(SystemExit) as exit_status:
        logit_lens.main(["--workdir", str(tmp_path), "--init", "--prompt", "abc"])
    error = capsys.readouterr().err.strip()
    assert exit_status.value.code == 2 and "\n" not in error
    assert f"{tmp_path} is an encoder (model.objective=masked)" in error and "jaxgpt fill" in error


@pytest.mark.slow
def test_an_induction_head_forms_in_a_model_trained_on_repeated_text_and_not_before():
    """Two layers trained on random token segments repeated to fill the window (a period of 4
    to 16 tokens, so no fixed offset does the job): predicting a token after the first period
    means finding the earlier copy of the current token and reading what followed it, which is
    what an induction head does. Untrained, every head spreads its attention (score about
    ln 2 / 16 = 0.04 on 16 + 16 tokens); after 1500 steps a head of the second layer puts most
    of its weight on the token to copy (measured: 0.89 and 0.89 for two heads of layer 1,
    at most 0.02 in layer 0; the loss on the repeated tokens 0.15), and the loss on the
    repeated tokens falls from ln 32 = 3.5 towards 0."""
    import optax

    from jaxgpt.config import ModelConfig
    from jaxgpt.lab.capture import model_induction_scores

    config = ModelConfig(vocab_size=32, block_size=32, n_layer=2, n_head=4, d_model=64, position="rope")
    params = init_params(config, jax.random.key(0))
    untrained = model_induction_scores(config, params)
    optimizer = optax.adam(1e-3)

    def batch(seed, rows=32):
        rng = np.random.default_rng(seed)
        periods = rng.integers(4, 17, rows)
        windows = np.stack([np.resize(rng.integers(0, 32, p), 33) for p in periods]).astype(np.int32)
        after_first_period = (np.arange(32)[None] >= periods[:, None] - 1).astype(np.float32)
        return windows, after_first_period

    def step(params, opt_state, windows, weights):
        def loss(params):
            logits = GPT(config).apply({"params": params}, windows[:, :-1])
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
            return (losses * weights).sum() / weights.sum()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, value

    opt_state, losses = optimizer.init(params), []
    # 1500 steps: the running time outweighs the compile, so it compiles as users' steps do
    step = jax.jit(step).lower(params, opt_state, *batch(1)).compile(USERS_COMPILER_OPTIONS)
    for i in range(1500):
        params, opt_state, value = step(params, opt_state, *batch(i + 1))
        losses.append(float(value))
    trained = model_induction_scores(config, params)
    assert untrained.max() < 0.1
    assert np.mean(losses[-100:]) < 0.5  # the repeats are predicted
    assert trained[1].max() > 0.5 and trained[1].max() > 3 * trained[0].max()  # a second-layer head
