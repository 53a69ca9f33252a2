"""The pure training pieces: the step, gradient accumulation, the optimizer's schedule and mask."""

import functools
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxgpt.config import MixtureOfExperts, ModelConfig, TrainConfig
from jaxgpt.model.transformer import GPT, init_params
from jaxgpt.training.optimizer import learning_rate_schedule, make_optimizer, weight_decay_mask
from jaxgpt.training.program import training_program
from jaxgpt.training.train_step import create_train_state, scored, token_losses, train_step

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

MODEL = ModelConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=32)


def windows(batch=8, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 32, (batch, 17)), jnp.int32)


def run_steps(microbatches, steps=3, model=MODEL):
    train = TrainConfig(steps=10, warmup_steps=2, microbatches=microbatches, batch_size=8)
    optimizer = make_optimizer(train)
    state = jax.jit(partial(create_train_state, model, optimizer, 0))()
    step = jax.jit(partial(train_step, model=GPT(model), optimizer=optimizer, microbatches=microbatches))
    losses = []
    for i in range(steps):
        state, metrics = step(state, windows(seed=i))
        losses.append(float(metrics["loss"]))
    return state, losses


def test_gradient_accumulation_equals_the_whole_batch():
    whole, losses = run_steps(1)
    split, losses_split = run_steps(4)
    # Mean of 4 means of 2 equals the mean of 8 up to float32 summation order (~1e-7 relative);
    # three Adam steps of size ~lr = 1e-3 keep parameter differences near that scale.
    np.testing.assert_allclose(losses_split, losses, rtol=1e-5)
    jax.tree.map(partial(np.testing.assert_allclose, atol=1e-6), split.params, whole.params)
    assert int(split.step) == 3


def test_dropout_randomness_differs_per_step_but_not_per_run():
    model = MODEL.replace(dropout=0.1)
    _, first = run_steps(1, model=model)
    _, second = run_steps(1, model=model)
    assert first == second  # the step's key is fold_in(rng, step): reproducible


def test_schedule_warms_up_linearly_then_decays_to_min_lr():
    train = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    schedule = learning_rate_schedule(train)
    assert float(schedule(0)) == 0.0
    assert float(schedule(5)) == pytest.approx(5e-4)  # halfway up the warmup
    assert float(schedule(10)) == pytest.approx(1e-3)
    # Cosine: halfway through the decay the rate is the mean of lr and min_lr.
    assert float(schedule(55)) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi * 0.5)))
    assert float(schedule(100)) == pytest.approx(1e-4)


def test_cooldown_schedule_holds_lr_then_falls_in_a_straight_line():
    train = TrainConfig(steps=100, warmup_steps=10, cooldown_steps=40, lr=1e-3, min_lr=1e-4)
    schedule = learning_rate_schedule(train)
    assert float(schedule(5)) == pytest.approx(5e-4)  # the warmup as with the cosine
    for step in (10, 35, 60):  # held at lr from the warmup's end to the cooldown's start (100 - 40)
        assert float(schedule(step)) == pytest.approx(1e-3)
    assert float(schedule(70)) == pytest.approx(1e-3 - 0.25 * (1e-3 - 1e-4))  # a quarter of the way down
    assert float(schedule(80)) == pytest.approx(0.5 * (1e-3 + 1e-4))
    assert float(schedule(100)) == pytest.approx(1e-4)
    assert float(schedule(150)) == pytest.approx(1e-4)  # held at min_lr past the end, as the cosine is


def test_cooldown_must_fit_between_warmup_and_decay_end():
    with pytest.raises(ValueError, match="cooldown_steps.*between 0 .* and 90"):
        TrainConfig(steps=100, warmup_steps=10, cooldown_steps=91)
    with pytest.raises(ValueError, match="cooldown_steps.*between 0 .* and 40"):
        TrainConfig(steps=100, warmup_steps=10, decay_steps=50, cooldown_steps=41)
    TrainConfig(steps=100, warmup_steps=10, cooldown_steps=90)  # the whole way: warmup then straight down


@pytest.mark.parametrize("scan", [False, True])
def test_weight_decay_touches_kernels_only(scan):
    params = jax.eval_shape(
        lambda: create_train_state(MODEL.replace(scan_layers=scan), make_optimizer(TrainConfig()), 0).params
    )
    mask = weight_decay_mask(params)
    for path, decays in jax.tree_util.tree_flatten_with_path(mask)[0]:
        assert decays == (path[-1].key == "kernel"), path
    embeddings = weight_decay_mask(params, decay_embeddings=True)
    assert embeddings["wte"]["embedding"] and embeddings["wpe"]["embedding"]


def counting_windows(batch, seed):
    """Learnable windows: each row counts from a random start in steps of 1 to 3 (mod 32)."""
    rng = np.random.default_rng(seed)
    start, stride = rng.integers(0, 32, (batch, 1)), rng.integers(1, 4, (batch, 1))
    return jnp.asarray((start + stride * np.arange(17)) % 32, jnp.int32)


def training_losses(dtype: str, steps: int = 60) -> np.ndarray:
    model = MODEL.replace(dtype=dtype)
    optimizer = make_optimizer(TrainConfig(steps=steps, warmup_steps=5, lr=3e-3, batch_size=16))
    state = jax.jit(partial(create_train_state, model, optimizer, 0))()
    step = jax.jit(partial(train_step, model=GPT(model), optimizer=optimizer))
    losses = []
    for i in range(steps):
        state, metrics = step(state, counting_windows(16, i))
        losses.append(float(metrics["loss"]))
    return np.asarray(losses)


def test_bfloat16_training_follows_float32():
    """bfloat16 compute (float32 parameters, Adam, softmax and loss) against float32 from the
    same initialisation and batches, 60 steps in which the loss halves. bfloat16 keeps 8
    significant bits: each rounding is within 2^-9 relative. A loss is a float32 mean over
    256 tokens of logits rounded a few dozen times on the way, so per-token errors mostly
    cancel; a systematic one could reach a few units of 2^-9. Allowed: 2^-8 relative per step."""
    full, half = training_losses("float32"), training_losses("bfloat16")
    assert half[-1] < 0.6 * half[0]  # it learned
    np.testing.assert_allclose(half, full, rtol=2**-8)
    assert np.abs(half - full).max() > 0  # bfloat16 really computed


def test_one_compiled_initialisation_serves_every_seed():
    """The seed is the initialisation program's argument, not a constant folded into it: two
    seeds lower to the same program, which gives the parameters and dropout key that
    create_train_state gives for the seed, bit for bit (the key's bits are the same bits)."""
    from jaxgpt.config import DataConfig, MeshConfig, RunConfig
    from jaxgpt.hardware.mesh_step import state_layout
    from jaxgpt.sharding import make_mesh

    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    runs = {seed: RunConfig(MODEL, DataConfig(), TrainConfig(seed=seed, batch_size=8)) for seed in (0, 7)}
    creates = {seed: state_layout(training_program(run), mesh)[1] for seed, run in runs.items()}
    programs = {seed: create.lower().as_text() for seed, create in creates.items()}
    assert programs[0] == programs[7]
    expected = jax.jit(partial(create_train_state, MODEL, make_optimizer(runs[7].train), 7))()
    for got, want in zip(jax.tree.leaves(creates[7]()), jax.tree.leaves(expected), strict=True):
        if jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_array_equal(got, want)


ENCODER = MODEL.replace(causal=False, objective="masked", mask_rate=0.3)


core_shares = {}  # (model, microbatches, batch) -> one core's jitted share: compiled once per test run


@functools.cache
def initial_params(model: ModelConfig):
    return jax.jit(
        partial(create_train_state, model, make_optimizer(TrainConfig(steps=10, warmup_steps=1)), 0)
    )().params


def split_gradients(model: ModelConfig, microbatches: int, cores: int, batch=8, seed=3):
    """(measured, gradient) of one batch computed as `cores` CPU cores would (each its rows, in
    order, with its microbatches) and added as the per-core step adds them."""
    from jaxgpt.hardware.core_parallel import core_gradients

    params = initial_params(model)
    rows = windows(batch, seed)
    key, step = jax.random.key(7), jnp.int32(4)
    share = core_shares.setdefault(
        (model, microbatches, batch),
        jax.jit(partial(core_gradients, model=GPT(model), microbatches=microbatches, batch_rows=batch)),
    )
    n = batch // cores
    parts = [share(params, key, step, rows[c * n : (c + 1) * n], jnp.int32(c)) for c in range(cores)]
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *parts)


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(ENCODER, id="masked"),
        pytest.param(
            ENCODER.replace(moe=MixtureOfExperts(experts=4, top_k=2)), id="masked-moe", marks=pytest.mark.slow
        ),
    ],
)
def test_a_masked_batch_trains_alike_however_it_is_split(model):
    """Each piece scores a different number of hidden tokens, so averaging the pieces' means
    weighted them wrongly, and each piece drew its own blanks: the split changed the gradient.
    Now each example's blanks come from its own key and every piece adds its share of the
    batch's sums: 1, 2 or 4 microbatches on 1 or 2 cores give one loss, accuracy and gradient,
    up to float32 summation order (a few ulps of sums over ~40 hidden tokens: rtol 1e-5; gradient
    entries are sums with cancellation, so 1e-4 relative above an absolute 1e-7). The
    mixture of experts adds its router losses to the same shares (slow: 25 s of MoE compiles)."""
    whole, grads = split_gradients(model, 1, 1)
    for microbatches, cores in [(4, 1), (2, 2)]:
        measured, split = split_gradients(model, microbatches, cores)
        np.testing.assert_allclose(measured["loss"], whole["loss"], rtol=1e-5)
        np.testing.assert_allclose(measured["accuracy"], whole["accuracy"], rtol=1e-5)
        jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-7), split, grads)


def test_a_masked_loss_is_the_mean_over_every_hidden_token_of_the_batch():
    """The pieces' shares add up to the whole batch's mean over its hidden tokens, not to the
    mean of the pieces' means (which the two rows below tell apart)."""
    from jaxgpt.training.masked import example_keys, mask_examples

    measured, _ = split_gradients(ENCODER, 2, 2)
    params = initial_params(ENCODER)
    rows = windows(8, 3)
    step_key = jax.random.fold_in(jax.random.key(7), 4)
    inputs, hidden = mask_examples(rows[:, :-1], example_keys(step_key, jnp.arange(8)), ENCODER)
    logits = jax.jit(GPT(ENCODER).apply)({"params": params}, inputs)
    losses = np.asarray(optax.softmax_cross_entropy_with_integer_labels(logits, rows[:, :-1]), np.float64)
    hidden = np.asarray(hidden)
    np.testing.assert_allclose(measured["loss"], losses[hidden].mean(), rtol=1e-5)
    per_core = [losses[c * 4 : (c + 1) * 4][hidden[c * 4 : (c + 1) * 4]].mean() for c in range(2)]
    assert abs(np.mean(per_core) - losses[hidden].mean()) > 1e-4  # the old reduction would differ


@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(tie_embeddings=False, logit_softcap=30.0, n_kv_head=1, position="rope", norm="rmsnorm"),
        dict(objective="masked", causal=False, head_transform=True, scan_layers=True),
    ],
    ids=["gpt2", "untied-softcap", "masked-bert-head"],
)
def test_a_chunked_loss_is_the_whole_loss(changes):
    """model.loss_chunk computes the LM head and the cross-entropy four positions at a time and
    recomputes each chunk's logits in the backward pass: the objective, what it measures and
    every gradient equal the whole-logits step's. The same products and the same sums over the
    vocabulary; only how XLA fuses them differs, so float32 rounding (a few ulps; 1e-6 relative
    on these O(1) values and gradients, with 1e-7 absolute for gradients near zero)."""
    config = ModelConfig(
        vocab_size=64, block_size=16, n_layer=1, n_head=2, d_model=32, **changes
    )  # the head is what varies
    params = init_params(config, jax.random.key(0))
    windows = jnp.asarray(np.random.default_rng(1).integers(0, 64, (4, 17)), jnp.int32)

    def objective_and_gradient(loss_chunk):
        model = GPT(config.replace(loss_chunk=loss_chunk))
        return jax.jit(jax.value_and_grad(lambda p: scored(model, p, windows, jax.random.key(2)), has_aux=True))(params)

    if config.objective == "next_token":  # and evaluation's losses, position by position
        by_position = [token_losses(GPT(config.replace(loss_chunk=c)), params, windows) for c in (0, 4)]
        np.testing.assert_allclose(by_position[1], by_position[0], rtol=1e-6)
    (whole, whole_measured), whole_grads = objective_and_gradient(0)
    (chunked, chunked_measured), chunked_grads = objective_and_gradient(4)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6)
    assert chunked_measured.keys() == whole_measured.keys()
    for name in whole_measured:
        np.testing.assert_allclose(chunked_measured[name], whole_measured[name], rtol=1e-6)
    for got, want in zip(jax.tree.leaves(chunked_grads), jax.tree.leaves(whole_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_chunked_loss_keeps_one_chunk_of_logits():
    """The point of chunking, from XLA's memory analysis of the compiled gradient: with a
    4,096-token vocabulary, 8 rows of 64 positions have 8 MiB of float32 logits (and as much
    again for their gradient); in chunks of 8 positions a step holds one chunk's, 1 MiB. The
    temporaries must fall by more than the whole logits' 8 MiB."""
    config = ModelConfig(vocab_size=4096, block_size=64, n_layer=1, n_head=2, d_model=32)
    params = init_params(config, jax.random.key(0))
    windows = jnp.zeros((8, 65), jnp.int32)
    logits_bytes = 8 * 64 * 4096 * 4

    def temporaries(loss_chunk):
        model = GPT(config.replace(loss_chunk=loss_chunk))
        gradient = jax.grad(lambda p: scored(model, p, windows, jax.random.key(0))[0])
        return jax.jit(gradient).lower(params).compile().memory_analysis().temp_size_in_bytes

    whole, chunked = temporaries(0), temporaries(8)
    assert whole - chunked > logits_bytes, (whole, chunked)


@pytest.mark.parametrize("batch", ["windows", "examples", "masked"])
def test_evaluating_a_model_with_dropout_is_evaluating_it_without(batch):
    """eval_step of a model with dropout 0.5 equals that of the same weights without dropout:
    evaluation is deterministic. Planted, evaluation with dropout on moves every loss by whole
    percents."""
    from jaxgpt.training.train_step import eval_step

    config = MODEL.replace(dropout=0.5)
    if batch == "masked":
        config = config.replace(causal=False, objective="masked")
    params = init_params(config, jax.random.key(0))
    windows = counting_windows(4, 0)
    if batch == "examples":  # answers scored alone: the weighted loss, accuracy and exact matches
        weights = jnp.asarray(np.tile(np.arange(16) >= 8, (4, 1)), jnp.float32)
        segments = jnp.ones((4, 16), jnp.int32)
        windows = {"inputs": windows[:, :-1], "targets": windows[:, 1:], "weights": weights, "segments": segments}
    noisy = eval_step(params, windows, model=GPT(config))
    plain = eval_step(params, windows, model=GPT(config.replace(dropout=0.0)))
    assert set(noisy) == set(plain) and noisy["loss"] > 0
    jax.tree.map(np.testing.assert_array_equal, noisy, plain)
