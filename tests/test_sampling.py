"""Sampling: cached greedy decoding against the uncached model, the filters against
hand-built distributions, seeds, and sample.py end to end."""

from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import matrix, run_script

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.model.kv_cache import cache_bytes
from jaxgpt.model.sampling import SamplingConfig, check_length, filter_logits, generate, generate_stream, sample_token
from jaxgpt.model.transformer import GPT, init_cache, init_params

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

ROOT = Path(__file__).resolve().parents[1]
GREEDY = SamplingConfig(temperature=0.0)


def model(**changes):
    config = ModelConfig(**{**dict(vocab_size=48, block_size=24, n_layer=2, n_head=4, d_model=32), **changes})
    return config, jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))


def greedy_without_cache(config, params, prompt, n):
    """The definition of greedy decoding: run the full model on everything so far, take the argmax.
    Sequences are zero-padded to one length (one compilation); causality makes the padding
    invisible to the position read."""
    forward = jax.jit(lambda p, t: GPT(config).apply({"params": p}, t))
    length = prompt.shape[1]
    tokens = jnp.zeros((prompt.shape[0], length + n), jnp.int32).at[:, :length].set(prompt)
    for t in range(length, length + n):
        tokens = tokens.at[:, t].set(jnp.argmax(forward(params, tokens)[:, t - 1], axis=-1))
    return tokens[:, length:]


@pytest.mark.parametrize(
    "n_kv_head, position", matrix({"MHA": 4, "GQA": 2, "MQA": 1}, {p: p for p in ("rope", "learned")})
)
def test_cached_greedy_equals_argmax_of_the_full_forward(n_kv_head, position):
    config, params = model(n_kv_head=n_kv_head, position=position)
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, 48, (2, 5)), jnp.int32)
    ours = generate(config, params, prompt, jax.random.key(0), max_new_tokens=12, sampling=GREEDY)
    np.testing.assert_array_equal(ours, greedy_without_cache(config, params, prompt, 12))


@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal", "none"])
def test_a_cache_of_the_slots_a_decode_needs_decodes_what_block_sizes_does(position):
    """for_decoding: 17 slots for a 5-token prompt and 12 new tokens, not block_size's 64, give
    the greedy tokens of the full model's argmax (a shorter sum over masked slots); learned
    positions, whose table has block_size rows, keep their size."""
    from jaxgpt.model.sampling import for_decoding

    config, params = model(position=position, block_size=64)
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, 48, (2, 5)), jnp.int32)
    small = for_decoding(config, 17)
    assert small.block_size == 17
    ours = generate(small, params, prompt, jax.random.key(0), max_new_tokens=12, sampling=GREEDY)
    np.testing.assert_array_equal(ours, greedy_without_cache(config, params, prompt, 12))
    assert for_decoding(config.replace(position="learned"), 17).block_size == 64


def decode_one_by_one(config, params, tokens, prefill):
    """Logits for every position of `tokens`, fed to the KV cache as a `prefill`-token prompt
    and then one token per call."""
    step = jax.jit(partial(GPT(config).apply, decode=True, mutable=["cache"]))
    variables = {"params": params, "cache": init_cache(config, tokens.shape[0])}
    logits, state = step(variables, tokens[:, :prefill])
    out = [logits]
    for t in range(prefill, tokens.shape[1]):
        logits, state = step({"params": params, "cache": state["cache"]}, tokens[:, t : t + 1])
        out.append(logits)
    return jnp.concatenate(out, axis=1)


@pytest.mark.parametrize(
    "position, window", [("rope", 0), ("alibi", 0), ("none", 0), ("rope", 5)], ids=["rope", "alibi", "none", "window"]
)
def test_the_rolling_cache_past_block_size_is_sliding_window_attention(position, window):
    """Decoding three contexts' worth of tokens through an 8-slot cache equals the uncached model
    over the whole sequence with a sliding window of block_size (or the model's shorter one):
    every layer's keys come from the last block_size positions. Both use the same absolute
    positions, so only float32 summation order differs (~1e-6 on logits of order 1)."""
    config, params = model(block_size=8, position=position, attention_window=window)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 48, (2, 27)), jnp.int32)
    decoded = decode_one_by_one(config, params, tokens, prefill=3)
    whole = lambda **c: GPT(config.replace(block_size=27, **c)).apply({"params": params}, tokens)  # noqa: E731
    np.testing.assert_allclose(decoded, whole(attention_window=window or 8), atol=2e-5, rtol=1e-5)
    if not window:  # the window is what the cache imposes: past block_size, full attention differs
        assert np.abs(decoded[:, 8:] - whole()[:, 8:]).max() > 1e-2


def test_generation_runs_past_block_size_with_relative_positions():
    config, params = model(block_size=8, position="rope")
    prompt = jnp.asarray(np.random.default_rng(2).integers(0, 48, (2, 3)), jnp.int32)
    check_length(config, 3, 20)  # 23 tokens through an 8-position context: allowed
    ours = generate(config, params, prompt, jax.random.key(0), max_new_tokens=20, sampling=GREEDY)
    windowed = config.replace(block_size=23, attention_window=8)
    np.testing.assert_array_equal(ours, greedy_without_cache(windowed, params, prompt, 20))
    streamed = generate_stream(config, params, prompt, jax.random.key(0), max_new_tokens=20, sampling=GREEDY)
    np.testing.assert_array_equal(jnp.stack(list(streamed), axis=1), ours)


PROBS = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS = jnp.log(jnp.asarray(PROBS, jnp.float32))


def kept(sampling):
    return np.isfinite(np.asarray(filter_logits(LOGITS, sampling)))


@pytest.mark.parametrize(
    "p, expected",
    [
        (0.5, [1, 0, 0, 0]),  # the top token alone has mass 0.5 >= 0.5
        (0.8, [1, 1, 0, 0]),  # 0.5 + 0.3 = 0.8 reaches p exactly
        (0.81, [1, 1, 1, 0]),  # 0.8 falls short: the third token is needed
        (0.1, [1, 0, 0, 0]),  # the most likely token always stays
        (1.0, [1, 1, 1, 1]),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(p, expected):
    assert kept(SamplingConfig(temperature=1.0, top_p=p)).tolist() == [bool(x) for x in expected]


def test_top_p_works_on_unsorted_rows_of_a_batch():
    logits = jnp.log(jnp.asarray([[0.05, 0.5, 0.15, 0.3], [0.3, 0.05, 0.15, 0.5]], jnp.float32))
    keep = np.isfinite(np.asarray(filter_logits(logits, SamplingConfig(temperature=1.0, top_p=0.8))))
    assert keep.tolist() == [[False, True, False, True], [True, False, False, True]]


def test_top_k_never_emits_a_token_outside_the_k_most_likely():
    sampling = SamplingConfig(temperature=1.0, top_k=2)
    draws = jax.vmap(lambda key: sample_token(LOGITS[None], key, sampling))(jax.random.split(jax.random.key(0), 4000))
    counts = np.bincount(np.asarray(draws).ravel(), minlength=4)
    assert counts[2] == counts[3] == 0
    # Renormalised over the top two: 0.5/0.8 = 0.625; 4000 draws give a std of 0.008.
    assert abs(counts[0] / 4000 - 0.625) < 0.04


def test_low_temperature_is_greedy():
    config, params = model()
    prompt = jnp.zeros((3, 2), jnp.int32)
    cold = generate(
        config, params, prompt, jax.random.key(5), max_new_tokens=10, sampling=SamplingConfig(temperature=1e-4)
    )
    np.testing.assert_array_equal(
        cold, generate(config, params, prompt, jax.random.key(5), max_new_tokens=10, sampling=GREEDY)
    )


def test_a_seed_fixes_the_sample_and_another_seed_changes_it():
    config, params = model()
    prompt = jnp.zeros((2, 2), jnp.int32)
    hot = SamplingConfig(temperature=1.5)
    sample = partial(generate, config, params, prompt, max_new_tokens=16, sampling=hot)
    np.testing.assert_array_equal(sample(jax.random.key(1)), sample(jax.random.key(1)))
    assert not np.array_equal(sample(jax.random.key(1)), sample(jax.random.key(2)))


def test_streaming_yields_the_same_tokens_as_the_compiled_loop():
    config, params = model()
    prompt = jnp.ones((2, 3), jnp.int32)
    args = dict(max_new_tokens=10, sampling=SamplingConfig(temperature=1.0, top_k=10, top_p=0.9))
    streamed = np.stack([np.asarray(t) for t in generate_stream(config, params, prompt, jax.random.key(3), **args)], 1)
    np.testing.assert_array_equal(streamed, generate(config, params, prompt, jax.random.key(3), **args))


def test_prompts_of_every_length_answered_together_are_each_answered_as_alone():
    """answer_each pads the prompts on the right into one program (generate_rows): each prompt's
    answers are `generate`'s for that prompt alone with its own key (greedy: the full forward's
    argmax), whatever the other prompts' lengths, however the rows are split into calls and
    whether a call's rows are split over devices (sampled at temperature 1, so a misplaced key or
    a padded key read in attention shows)."""
    from jaxgpt.config import MeshConfig
    from jaxgpt.model.sampling import answer_each
    from jaxgpt.sharding import make_mesh, rows_beside, rows_sharding, shardings_like

    config, params = model(position="rope", block_size=32)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 48, n).astype(np.int32) for n in (3, 7, 5)]
    greedy = answer_each(config, params, prompts, 2, jax.random.key(0), most_rows=6, max_new_tokens=6, sampling=GREEDY)
    for prompt, answers in zip(prompts, greedy, strict=True):
        alone = greedy_without_cache(config, params, jnp.asarray(prompt[None]), 6)[0]
        np.testing.assert_array_equal(answers, np.stack([alone, alone]))
    drawn = SamplingConfig(temperature=1.0)
    together = answer_each(config, params, prompts, 2, jax.random.key(1), most_rows=6, max_new_tokens=6, sampling=drawn)
    split = answer_each(config, params, prompts, 2, jax.random.key(1), most_rows=4, max_new_tokens=6, sampling=drawn,
                        pad_to=12)  # fmt: skip
    other = [prompts[0], rng.integers(0, 48, 10).astype(np.int32), prompts[2]]
    beside = answer_each(config, params, other, 2, jax.random.key(1), most_rows=6, max_new_tokens=6, sampling=drawn)
    four = make_mesh(MeshConfig(data=4), jax.devices()[:4])
    assert rows_sharding(four, 4).shard_shape((4, 12)) == (1, 12)  # a row a device
    assert rows_sharding(four, 6).shard_shape((6, 12)) == (6, 12)  # rows that do not divide: on every device
    assert rows_beside(params, 4) is None  # parameters on no mesh: the rows are not placed either
    placed = jax.device_put(params, shardings_like(params, four))
    assert rows_beside(placed, 4) == rows_sharding(four, 4)  # split over the mesh the parameters are on
    on_four = answer_each(config, params, prompts, 2, jax.random.key(1), most_rows=4, max_new_tokens=6,
                          sampling=drawn, rows_on=rows_sharding(four, 4))  # fmt: skip
    for i in range(3):
        np.testing.assert_array_equal(split[i], together[i])
        np.testing.assert_array_equal(on_four[i], together[i])
    for i in (0, 2):
        np.testing.assert_array_equal(beside[i], together[i])
        for j in range(2):  # sample j of prompt i: generate on that prompt alone, its key fold_in(fold_in(rng, i), j)
            key = jax.random.fold_in(jax.random.fold_in(jax.random.key(1), i), j)
            alone = generate(config, params, jnp.asarray(prompts[i][None]), key, max_new_tokens=6, sampling=drawn)
            np.testing.assert_array_equal(together[i][j], np.asarray(alone)[0])
    assert len({together[i][j].tobytes() for i in range(3) for j in range(2)}) > 3  # the draws differ


def test_rows_stop_at_the_end_token():
    config, params = model()
    prompt = jnp.zeros((2, 2), jnp.int32)
    free = np.asarray(generate(config, params, prompt, jax.random.key(0), max_new_tokens=8, sampling=GREEDY))
    eot = int(free[0, 2])  # pretend the third greedy token of row 0 ends its text
    ended = np.asarray(
        generate(config, params, prompt, jax.random.key(0), max_new_tokens=8, sampling=GREEDY, eot_id=eot)
    )
    first = list(free[0]).index(eot)
    assert list(ended[0, : first + 1]) == list(free[0, : first + 1]) and set(ended[0, first:]) == {eot}


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SamplingConfig(top_k=0), "top_k=0 must be a positive"),
        (lambda: SamplingConfig(top_p=0.0), "top_p=0.0 must be in \\(0, 1\\]"),
        (lambda: SamplingConfig(top_p=1.5), "top_p=1.5"),
        (lambda: SamplingConfig(temperature=-1.0), "temperature=-1.0"),
        (lambda: check_length(model()[0], 20, 5), "max_new_tokens=5 does not fit: .* room for 4 more, and its learned"),
        (lambda: check_length(model()[0], 30, 5), "the prompt is 30 tokens but the model's context .* is 24"),
    ],
)
def test_bad_sampling_requests_are_clear_errors(make, message):
    with pytest.raises(UserError, match=message):
        make()


@pytest.fixture
def workdir(trained_small_run):
    """A finished run with learned positions and block_size 32 (shared: read, never written)."""
    return trained_small_run


def sample_cli(*args):
    return run_script("sample.py", *args)


@pytest.mark.slow
def test_sample_py_writes_from_a_trained_workdir(workdir):
    result = sample_cli(f"--workdir={workdir}", "--prompt=The ", "--max_new_tokens=20", "--num_samples=2", "--seed=4")
    assert result.returncode == 0, result.stderr
    samples = result.stdout.split("--- sample ")[1:]
    assert len(samples) == 2 and all(s.split("\n", 1)[1].startswith("The ") for s in samples)
    again = sample_cli(f"--workdir={workdir}", "--prompt=The ", "--max_new_tokens=20", "--num_samples=2", "--seed=4")
    assert again.stdout == result.stdout
    streamed = sample_cli(f"--workdir={workdir}", "--prompt=The ", "--max_new_tokens=20", "--temperature=0", "--stream")
    greedy = sample_cli(f"--workdir={workdir}", "--prompt=The ", "--max_new_tokens=20", "--temperature=0")
    assert streamed.returncode == 0 and streamed.stdout == greedy.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--top_k=0"], "top_k=0"),
        (["--top_p=1.5"], "top_p=1.5"),
        (["--prompt=\u2603"], "character '\u2603' is not in"),
        (["--max_new_tokens=100"], "room for 31 more, and its learned positions stop there. Ask for at most 31"),
        (["--prompt=" + "a" * 60], "the prompt is 60 tokens but the model's context (block_size) is 32"),
    ],
)
def test_sample_py_bad_input_is_one_line(workdir, args, message):
    result = sample_cli(f"--workdir={workdir}", *args)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert message in result.stderr


def test_sample_py_without_a_checkpoint_is_one_line(tmp_path):
    result = sample_cli(f"--workdir={tmp_path}")
    assert result.returncode == 2 and "no checkpoints in" in result.stderr


def test_sampling_restores_onto_a_tensor_parallel_mesh(workdir):
    from jaxgpt.config import MeshConfig
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.sharding import make_mesh

    # all 8 fake CPU devices on tensor, named: on a one-GPU run of the tests they are not the default
    mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=-1), jax.devices("cpu"))
    run, split, _, _ = load_latest(workdir, mesh)
    _, whole, _, _ = load_latest(workdir)
    up = split["block_0"]["mlp"]["up"]["kernel"]
    assert up.sharding.spec == jax.sharding.PartitionSpec(None, "tensor")  # hidden split 8 ways
    prompt = jnp.ones((1, 4), jnp.int32)
    args = dict(max_new_tokens=20, sampling=GREEDY)
    np.testing.assert_array_equal(
        generate(run.model, split, prompt, jax.random.key(0), **args),
        generate(run.model, whole, prompt, jax.random.key(0), **args),
    )


@pytest.mark.parametrize(
    "changes",
    [dict(n_kv_head=4), dict(n_kv_head=2), dict(n_kv_head=1), dict(n_kv_head=2, dtype="bfloat16", scan_layers=True)],
    ids=["MHA", "GQA", "MQA", "GQA-bf16-scanned"],
)
def test_cache_bytes_are_the_cache_sampling_allocates(changes):
    """The key and value arrays init_cache makes (everything but its position counter)."""
    config = ModelConfig(vocab_size=50, block_size=64, n_layer=3, n_head=4, d_model=32, **changes)
    cache = init_cache(config, batch_size=3)
    arrays = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0] if path[-1].key in ("key", "value")]
    assert len(arrays) == 2 * (1 if config.scan_layers else config.n_layer)
    assert sum(a.nbytes for a in arrays) == cache_bytes(config, tokens=64, batch_size=3)
    # and by hand for MHA: 2 x 3 layers x 4 heads x 8 dims x 4 bytes per token
    assert cache_bytes(config.replace(n_kv_head=4, dtype="float32"), tokens=1) == 768


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sampled_frequencies_follow_the_tempered_softmax(temperature):
    """Temperature T samples token i with probability softmax(logits / T)_i. 200,000 draws of a
    5-token distribution: each frequency's standard error is at most sqrt(0.25 / 2e5) = 0.0011,
    so 0.006 is over 5 sigma; the untempered softmax is further than that from the tempered one
    at both temperatures, so a sampler that ignored T would fail."""
    logits = jnp.asarray([[2.0, 1.0, 0.5, -1.0, 0.0]])
    draws = 200_000
    keys = jax.random.split(jax.random.key(0), draws)
    tokens = jax.jit(jax.vmap(lambda k: sample_token(logits, k, SamplingConfig(temperature=temperature))))(keys)
    frequencies = np.bincount(np.asarray(tokens).ravel(), minlength=5) / draws
    expected = np.asarray(jax.nn.softmax(logits[0] / temperature))
    np.testing.assert_allclose(frequencies, expected, atol=0.006)
    assert np.abs(np.asarray(jax.nn.softmax(logits[0])) - expected).max() > 0.05
