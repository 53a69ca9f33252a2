"""The batch contract (jaxgpt/training/batch.py): segments keep attention within a sequence, positions
restart with each, loss weights decide what is scored, and a weighted batch's gradient does not
depend on how it is split over microbatches and cores."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxgpt import data
from jaxgpt.config import ModelConfig
from jaxgpt.hardware.core_parallel import core_gradients, whole_batch_weight
from jaxgpt.model.transformer import GPT, init_params
from jaxgpt.training.batch import as_batch, segment_positions, windows_batch
from jaxgpt.training.train_step import eval_step, scored, token_losses

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

MODEL = ModelConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32)
LENGTHS = (5, 7, 4)  # three sequences packed into one row of 16


def packed_row(seed=0):
    """One row holding three sequences back to back: tokens, segments and positions (1, 16)."""
    tokens = np.random.default_rng(seed).integers(0, 32, (1, sum(LENGTHS))).astype(np.int32)
    segments = np.repeat(np.arange(len(LENGTHS)), LENGTHS)[None].astype(np.int32)
    return tokens, segments, segment_positions(segments)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="learned"),
        pytest.param({"position": "rope"}, id="rope", marks=pytest.mark.slow),
        pytest.param({"position": "alibi"}, id="alibi"),
        pytest.param({"position": "sinusoidal", "attention_window": 3}, id="sinusoidal-window", marks=pytest.mark.slow),
        pytest.param({"position": "rope", "attention": "dot_product"}, id="rope-dot_product"),
        pytest.param({"position": "rope", "causal": False}, id="rope-bidirectional"),
        pytest.param(
            {"position": "rope", "scan_layers": True, "remat": "full"}, id="rope-scanned", marks=pytest.mark.slow
        ),
    ],
)
def test_packed_sequences_compute_what_each_computes_alone(changes):
    """A row of three sequences with their segments and positions gives, at every position, the
    logits of its sequence run alone from position 0: no token sees another sequence, and every
    position scheme restarts. Float32 sums of different lengths: agreement to ~1e-6 of logits
    of order 1, asserted at 2e-5. Learned and ALiBi positions, the other kernel and an encoder
    in the quick set; RoPE alone, sinusoidal with a window and scanned layers in the slow set
    (each about 3 s of compiles)."""
    config = MODEL.replace(**changes)
    params = init_params(config, jax.random.key(0))
    tokens, segments, positions = packed_row()
    apply = jax.jit(GPT(config).apply)
    packed = np.asarray(apply({"params": params}, tokens, segments=segments, positions=positions))
    starts = np.cumsum((0,) + LENGTHS)
    alone = [
        np.asarray(apply({"params": params}, tokens[:, a:b])) for a, b in zip(starts[:-1], starts[1:], strict=True)
    ]
    np.testing.assert_allclose(packed, np.concatenate(alone, axis=1), atol=2e-5, rtol=2e-5)
    # and without segments the later sequences do see the earlier ones
    unpacked = np.asarray(apply({"params": params}, tokens))
    assert np.abs(unpacked[:, LENGTHS[0] :] - packed[:, LENGTHS[0] :]).max() > 1e-3


def test_segment_positions_restart_at_each_segment():
    segments = np.array([[3, 3, 5, 5, 5, 0], [1, 1, 1, 1, 1, 1]])
    assert segment_positions(segments).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]


def test_windows_carry_their_documents_when_asked():
    """Tokens 0..29 in documents starting at 0, 4, 11 and 20, windows of 6 at offsets 2 and 9:
    worked by hand. A document begun before the window counts its positions from the window's
    first token, as any window's positions do."""
    tokens = np.arange(30, dtype=np.int32)
    batch = data.batches.windows_at(tokens, np.array([2, 9]), 6, np.array([0, 4, 11, 20]))
    assert batch["inputs"].tolist() == [[2, 3, 4, 5, 6, 7], [9, 10, 11, 12, 13, 14]]
    assert batch["targets"].tolist() == [[3, 4, 5, 6, 7, 8], [10, 11, 12, 13, 14, 15]]
    assert batch["segments"].tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 2, 2, 2, 2]]
    assert batch["positions"].tolist() == [[0, 1, 0, 1, 2, 3], [0, 1, 0, 1, 2, 3]]
    plain = data.batches.windows_at(tokens, np.array([2, 9]), 6, None)
    assert sorted(plain) == ["inputs", "targets"]


def test_the_validation_split_begins_inside_a_document():
    class Split:
        train = np.zeros(10)
        documents = np.array([0, 4, 13, 16])

    class Run:
        class data:
            attend_within_documents = True

    assert data.validation_documents(Split, Run).tolist() == [0, 3, 6]
    Split.documents = np.array([0, 4, 10, 16])
    assert data.validation_documents(Split, Run).tolist() == [0, 6]


def weighted_batch(rows=8, seed=3):
    """Windows with a weight of 0 or 1 per target, each row scoring a different number."""
    rng = np.random.default_rng(seed)
    batch = windows_batch(rng.integers(0, 32, (rows, 17)).astype(np.int32))
    weights = (rng.random((rows, 16)) < np.linspace(0.2, 0.9, rows)[:, None]).astype(np.float32)
    return {name: jnp.asarray(x) for name, x in batch.items()} | {"weights": jnp.asarray(weights)}


def test_the_loss_is_the_mean_over_the_weighted_positions():
    """The loss with weights is sum(w * loss) / sum(w), computed here in float64 from each
    position's unweighted loss; weights of 2 count a position twice; evaluation reports it and
    the weight it is a mean over."""
    params = init_params(MODEL, jax.random.key(0))
    batch = weighted_batch()
    losses = np.asarray(token_losses(GPT(MODEL), params, batch), np.float64)
    w = np.asarray(batch["weights"], np.float64)
    measured = scored(GPT(MODEL), params, batch, jax.random.key(1))[1]
    np.testing.assert_allclose(measured["loss"], (losses * w).sum() / w.sum(), rtol=1e-5)
    evaluated = eval_step(params, batch, model=GPT(MODEL))
    np.testing.assert_allclose(evaluated["loss"], (losses * w).sum() / w.sum(), rtol=1e-5)
    assert float(evaluated["scored"]) == w.sum()
    doubled = scored(GPT(MODEL), params, batch | {"weights": batch["weights"] * 2}, jax.random.key(1))[1]
    np.testing.assert_allclose(doubled["loss"], measured["loss"], rtol=1e-6)


def test_a_position_of_weight_zero_gets_no_gradient_from_its_target():
    """Changing the target of a position weighted 0 changes nothing: not the loss, not the gradient."""
    params = init_params(MODEL, jax.random.key(0))
    batch = weighted_batch()
    unscored = np.argwhere(np.asarray(batch["weights"]) == 0)[0]
    changed = batch | {
        "targets": batch["targets"].at[tuple(unscored)].set((batch["targets"][tuple(unscored)] + 1) % 32)
    }
    grad = jax.jit(jax.grad(lambda p, b: scored(GPT(MODEL), p, b, jax.random.key(1))[0]))
    jax.tree.map(np.testing.assert_array_equal, grad(params, batch), grad(params, changed))


shares = {}  # (model, microbatches) -> one core's jitted share, compiled once per test run


def split_weighted_gradients(model: ModelConfig, microbatches: int, cores: int):
    """(measured, gradient) of `weighted_batch` computed as `cores` CPU cores compute it, each
    its rows with `microbatches`, told the whole batch's weight, added in core order."""
    params = init_params(model, jax.random.key(0))
    batch, rows = weighted_batch(), 8
    key, step = jax.random.key(7), jnp.int32(4)
    weight = jax.jit(partial(whole_batch_weight, model=GPT(model)))(key, step, batch)
    share = shares.setdefault(
        (model, microbatches),
        jax.jit(partial(core_gradients, model=GPT(model), microbatches=microbatches, batch_rows=rows)),
    )
    n = rows // cores
    parts = [
        share(params, key, step, jax.tree.map(lambda x, c=c: x[c * n : (c + 1) * n], batch), jnp.int32(c), weight)
        for c in range(cores)
    ]
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *parts)


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(MODEL, id="next-token"),
        pytest.param(
            MODEL.replace(causal=False, objective="masked", mask_rate=0.3), id="masked", marks=pytest.mark.slow
        ),
    ],
)
def test_a_loss_masked_batch_trains_alike_however_it_is_split(model):
    """Rows scoring different numbers of positions: 4 microbatches on 1 core, or 2 on each of 2
    cores, give the whole batch's loss and gradient, up to float32 summation order (rtol 1e-5
    on the loss; gradient entries are sums with cancellation, so 1e-4 relative above an
    absolute 1e-7). The masked objective's blanks with weights too (slow: 13 s of compiles; its
    split without weights is tests/test_train_step.py's quick test)."""
    whole, grads = split_weighted_gradients(model, 1, 1)
    for microbatches, cores in [(4, 1), (2, 2)]:
        measured, split = split_weighted_gradients(model, microbatches, cores)
        np.testing.assert_allclose(measured["loss"], whole["loss"], rtol=1e-5)
        jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-7), split, grads)


def test_a_window_array_stands_for_its_inputs_and_targets():
    windows = np.arange(12).reshape(2, 6)
    batch = as_batch(windows)
    assert batch["inputs"].tolist() == [[0, 1, 2, 3, 4], [6, 7, 8, 9, 10]]
    assert batch["targets"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11]]
    with pytest.raises(ValueError, match="segments"):
        as_batch({"inputs": windows, "targets": windows, "segment": windows})


def test_the_cross_entropy_of_a_weighted_batch_is_optax_s_over_the_scored_positions():
    params = init_params(MODEL, jax.random.key(0))
    batch = weighted_batch(rows=2)
    logits = GPT(MODEL).apply({"params": params}, batch["inputs"])
    per_position = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    chosen = np.asarray(batch["weights"]) > 0
    want = np.asarray(per_position)[chosen].mean()
    np.testing.assert_allclose(eval_step(params, batch, model=GPT(MODEL))["loss"], want, rtol=1e-5)
