"""Multi-token prediction (model.mtp_weight; jaxgpt/model/transformer.py TokenAfterNext and
jaxgpt/training/objectives.py token_after_next_term): a second guess, at the token after next,
that reads nothing it predicts, is scored as the objective scores that token, is added to the
training loss times its weight, and leaves the model's own next-token predictions alone.
Trained, evaluated and resumed with the engine's settings in tests/test_composition.py."""

import jax
import numpy as np
import pytest

from jaxgpt.config import ModelConfig
from jaxgpt.model.transformer import GPT, init_params
from jaxgpt.training.batch import segment_positions
from jaxgpt.training.train_step import scored

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

MODEL = ModelConfig(vocab_size=32, block_size=12, n_layer=2, n_head=4, d_model=32, mtp_weight=0.5)


def windows(seed: int = 0, rows: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, MODEL.vocab_size, (rows, MODEL.block_size + 1)).astype(np.int32)


def ahead_features(params, tokens, **inputs) -> np.ndarray:
    _, sown = GPT(MODEL).apply({"params": params}, tokens, mutable=["ahead"], **inputs)
    return np.asarray(sown["ahead"]["features"][0], np.float64)


def tied_log_probs(params, features: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of the tied head (the token embedding) reading `features`."""
    logits = features @ np.asarray(params["wte"]["embedding"], np.float64).T
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_the_guess_at_position_t_reads_the_tokens_up_to_t_plus_1_and_no_further():
    """Changing token t + 2 (what position t predicts) or any later one leaves its features as
    they were, to the bit; changing token t + 1 changes them (the module reads the next
    token's embedding: the guess is DeepSeek-V3's sequential one, not a parallel head)."""
    params = init_params(MODEL, jax.random.key(0))
    tokens = windows()[:, :-1]
    t = 5
    later = tokens.copy()
    later[:, t + 2 :] = (later[:, t + 2 :] + 1) % MODEL.vocab_size
    following = tokens.copy()
    following[:, t + 1] = (following[:, t + 1] + 1) % MODEL.vocab_size
    base = ahead_features(params, tokens)
    np.testing.assert_array_equal(ahead_features(params, later)[:, : t + 1], base[:, : t + 1])
    assert np.abs(ahead_features(params, following)[:, t] - base[:, t]).max() > 1e-3


def test_the_ahead_loss_is_the_cross_entropy_of_the_token_after_next_over_the_batch_weight():
    """Against a float64 reference from the module's features: the tied head's logits, the
    log-softmax, each position t < T - 1 scored on window token t + 2, summed and divided by
    the batch's weight (rows x T, the next-token loss's), and the value differentiated is the
    next-token loss plus mtp_weight times it. float32 logits over 32 tokens: within 1e-5."""
    params = init_params(MODEL, jax.random.key(1))
    w = windows(1)
    value, measured = scored(GPT(MODEL), params, w, jax.random.key(0))
    features = ahead_features(params, w[:, :-1])
    log_probs = tied_log_probs(params, features)
    rows, length = w.shape[0], MODEL.block_size
    picked = np.take_along_axis(log_probs[:, :-1], w[:, 2:, None], -1)[..., 0]  # position t: token t + 2
    want = -picked.sum() / (rows * length)
    np.testing.assert_allclose(float(measured["ahead_loss"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(value), float(measured["loss"]) + 0.5 * want, rtol=1e-5)


def test_the_ahead_loss_weighs_each_guess_as_the_objective_weighs_the_token_it_guesses():
    """In a packed row with weights (two examples, each scoring its answer): position t's guess
    counts with the weight of token t + 2 when tokens t and t + 1 are in one sequence, and not
    at all across a boundary: the same as the reference sum over exactly those positions."""
    params = init_params(MODEL, jax.random.key(2))
    w = windows(2, rows=1)
    inputs, targets = w[:, :-1], w[:, 1:]
    segments = np.array([[0] * 6 + [1] * 6], np.int32)
    weights = np.array([[0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0]], np.float32)  # what the next-token loss scores
    batch = {"inputs": inputs, "targets": targets, "weights": weights, "segments": segments}
    batch["positions"] = segment_positions(segments)
    _, measured = scored(GPT(MODEL), params, batch, jax.random.key(0))
    features = ahead_features(params, inputs, segments=segments, positions=batch["positions"])
    log_probs = tied_log_probs(params, features)
    counted = [t for t in range(11) if weights[0, t + 1] and segments[0, t] == segments[0, t + 1]]
    assert counted == [2, 3, 8, 9]  # 5's guess (token 7, weighed 1) straddles the boundary between 5 and 6
    want = -sum(log_probs[0, t, targets[0, t + 1]] for t in counted) / weights.sum()
    np.testing.assert_allclose(float(measured["ahead_loss"]), want, rtol=1e-5)


def test_the_module_leaves_the_next_token_predictions_as_they_are():
    """The logits and next-token loss of a model with the module are those of the same weights
    without it (mtp_weight=0 builds no module), to the bit: generation, which never runs the
    module, reads the model training improved."""
    params = init_params(MODEL, jax.random.key(3))
    plain = MODEL.replace(mtp_weight=0.0)
    without = {name: value for name, value in params.items() if name != "mtp"}
    assert set(params) - set(without) == {"mtp"} and set(without) == set(init_params(plain, jax.random.key(3)))
    w = windows(3)
    with_module = scored(GPT(MODEL), params, w, jax.random.key(0))[1]["loss"]
    np.testing.assert_array_equal(with_module, scored(GPT(plain), without, w, jax.random.key(0))[1]["loss"])
    np.testing.assert_array_equal(
        GPT(MODEL).apply({"params": params}, w[:, :-1]), GPT(plain).apply({"params": without}, w[:, :-1])
    )
