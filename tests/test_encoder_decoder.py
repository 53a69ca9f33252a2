"""The encoder–decoder (jaxgpt/encoder_decoder.py) and its digit tasks (jaxgpt/seq2seq_tasks.py): what
each half may see, decoding with the caches against the full forward pass, and learning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt import seq2seq_tasks as seq2seq
from jaxgpt.config import ModelConfig
from jaxgpt.encoder_decoder import EncoderDecoder

LENGTH = 8


def config(**changes) -> ModelConfig:
    base = dict(vocab_size=seq2seq.VOCAB, block_size=LENGTH, n_layer=2, n_head=4, d_model=32, position="learned")
    return ModelConfig(**base | changes)


def visible(params, seed=0):
    """Weights re-drawn at std 0.3 so that every position's logits differ by whole units."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)])


@pytest.fixture(scope="module")
def model():
    c = config()
    return c, visible(seq2seq.init(c, 0, LENGTH))


def test_the_task_answers_are_the_reversal_and_the_sort():
    source, target = seq2seq.examples("reverse", 3, 5, 1)
    np.testing.assert_array_equal(target, source[:, ::-1])
    source, target = seq2seq.examples("sort", 3, 5, 1)
    assert all(sorted(s) == list(t) for s, t in zip(source.tolist(), target.tolist(), strict=True))
    train_source, _ = seq2seq.examples("reverse", 100, LENGTH, (0, seq2seq.TRAINING, 0))
    held_out, _ = seq2seq.held_out("reverse", LENGTH, 100)
    assert not {tuple(r) for r in train_source} & {tuple(r) for r in held_out}


def test_every_source_digit_reaches_every_output_and_the_decoder_sees_only_the_past(model):
    """Changing any source digit j moves the encoder's output at every source position, those
    before j too (the encoder is bidirectional), and the logits at every target position
    (cross-attention has no mask); changing decoder input token i moves positions i and
    after, never before."""
    c, params = model
    source, target = (jnp.asarray(a) for a in seq2seq.examples("reverse", 1, LENGTH, 3))
    inputs = seq2seq.decoder_input(target)
    forward = jax.jit(lambda s, t: EncoderDecoder(c).apply({"params": params}, s, t)[0])
    encode = jax.jit(lambda s: EncoderDecoder(c).apply({"params": params}, s, method="encode")[0])
    base, base_memory = forward(source, inputs), encode(source)
    for j in range(LENGTH):
        changed = source.at[0, j].set((source[0, j] + 1) % 10)
        assert np.all(np.abs(encode(changed) - base_memory).max(-1) > 1e-3), j
        moved = np.abs(forward(changed, inputs) - base).max(-1)
        assert np.all(moved > 1e-3), j
    for i in (1, 4):
        moved = np.abs(forward(source, inputs.at[0, i].set((inputs[0, i] + 1) % 10)) - base).max(-1)
        assert np.all(moved[:i] == 0) and np.all(moved[i:] > 1e-3), i


def test_decoding_with_the_caches_gives_the_full_forward_passs_logits(model):
    """Feeding the decoder input one token at a time, the memory handed over only at the first
    step (the cross-attention's keys and values are read from its cache after that), gives the
    logits of the teacher-forced forward pass: float32 agreement, the same sums in another
    order (1e-4 on logits of O(1))."""
    c, params = model
    source, target = (jnp.asarray(a) for a in seq2seq.examples("reverse", 2, LENGTH, 4))
    inputs = seq2seq.decoder_input(target)
    full = EncoderDecoder(c).apply({"params": params}, source, inputs)
    m = EncoderDecoder(c)
    memory = m.apply({"params": params}, source, method="encode")
    cache = seq2seq.empty_cache(c, memory, inputs[:, :1])
    steps = []
    for i in range(LENGTH):
        logits, state = m.apply(
            {"params": params, "cache": cache}, inputs[:, i : i + 1], memory if i == 0 else None, True,
            method="decode", mutable=["cache"],
        )  # fmt: skip
        cache = state["cache"]
        steps.append(logits[:, 0])
    assert np.abs(full).max() > 1.0
    np.testing.assert_allclose(np.stack(steps, axis=1), full, atol=1e-4)


def test_greedy_decoding_writes_what_the_full_forward_pass_would_choose(model):
    """The cached decoder's answer equals the one found by rerunning the whole model on the
    digits chosen so far and taking the most likely next one. The rerun is always on LENGTH
    decoder inputs, those not yet chosen left at 0: the decoder is causal (tested above), so
    they cannot move the position read, and one compiled program serves every step."""
    c, params = model
    source, _ = seq2seq.examples("reverse", 4, LENGTH, 5)
    decoded = np.asarray(seq2seq.greedy_decode(c, params, jnp.asarray(source), LENGTH))
    chosen = np.zeros((4, LENGTH), np.int32)
    chosen[:, 0] = seq2seq.BOS
    forward = jax.jit(lambda s, t: EncoderDecoder(c).apply({"params": params}, s, t))
    for i in range(LENGTH):
        next_digits = np.asarray(forward(source, chosen)[:, i].argmax(-1))
        if i + 1 < LENGTH:
            chosen[:, i + 1] = next_digits
    np.testing.assert_array_equal(decoded[:, :-1], chosen[:, 1:])
    np.testing.assert_array_equal(decoded[:, -1], next_digits)


@pytest.mark.slow  # 300 training steps: 15 s of test time on a Zen 4 core, 22 s in the quick set's compile mode
def test_reversal_is_learned_and_cross_attention_reads_the_mirrored_digit():
    """300 steps (measured: 100% of held-out answers right after 400 steps of the command's
    default): more than 90% of 200 held-out answers right, where chance is 10^-8; and in the
    last decoder layer, averaged over its heads, the attention from output position i (reading
    BOS and the answer so far, predicting answer digit i) to source digit 7 - i, the one it
    copies, is above 0.5."""
    c = config(d_model=64)
    params = seq2seq.train(c, "reverse", steps=300, length=LENGTH)
    source, target = seq2seq.held_out("reverse", LENGTH, 200)
    decoded = seq2seq.greedy_decode(c, params, jnp.asarray(source), LENGTH)
    assert seq2seq.accuracy(decoded, target).sequences > 0.9
    weights = seq2seq.cross_attention_weights(c, params, source[:50], target[:50])  # (layer, b, head, t, s)
    mirrored = weights[-1][..., np.arange(LENGTH), LENGTH - 1 - np.arange(LENGTH)]
    assert mirrored.mean() > 0.5


def test_the_command_prints_its_accuracy_draws_the_maps_and_saves_for_attention_maps(tmp_path, capsys):
    """seq2seq's own map, and attention-maps on the saved model: the answer it prints is the
    greedy decode of the reloaded parameters, so the save and load are exact."""
    from jaxgpt.commands import attention_maps
    from jaxgpt.commands import seq2seq as command

    run = tmp_path / "run"
    command.main(["--steps", "20", "--examples", "10", "--maps", str(tmp_path / "cross.png"), "--length", "4",
                  "--workdir", str(run)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "held-out accuracy, greedy decoding with the caches" in printed and "of 10 answers right" in printed
    assert (tmp_path / "cross.png").stat().st_size > 1000
    c, task, params = seq2seq.load(run)
    assert task == "reverse" and c.block_size == 4
    answer = np.asarray(seq2seq.greedy_decode(c, params, jnp.asarray([[3, 1, 4, 1]]), 4))[0]
    attention_maps.main(["--workdir", str(run), "--prompt", "3141", "--out", str(tmp_path / "saved.png")])
    printed = capsys.readouterr().out
    assert f"reverse: 3141 -> {''.join(map(str, answer))}" in printed and (tmp_path / "saved.png").stat().st_size > 1000
    with pytest.raises(SystemExit) as stop:
        attention_maps.main(["--workdir", str(run), "--prompt", "31a1"])
    assert stop.value.code == 2 and "reads exactly 4 digits" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        command.main(["--length", "0"])
    assert stop.value.code == 2 and "--length 0: must be at least 1" in capsys.readouterr().err
