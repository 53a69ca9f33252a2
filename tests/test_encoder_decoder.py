"""The encoder–decoder (model.encoder_layers): what each half may see, decoding with the KV cache
against the full forward pass, packed examples kept apart, the decoder-only switches honoured,
and training through the engine (on a mesh, resumed, learned) on text pairs."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, small_run_config, train_losses, users_environment
from test_pairs import char_examples

from jaxgpt.config import ConfigError, MixtureOfExperts, ModelConfig
from jaxgpt.config_files import resolve
from jaxgpt.data.pairs import digit_pairs, encoder_decoder_row
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.model.sampling import encode
from jaxgpt.model.transformer import GPT, init_cache, init_params, stack_blocks

CONFIG = ModelConfig(vocab_size=12, block_size=16, n_layer=2, n_head=4, d_model=32, encoder_layers=2)


def visible(params, seed=0):
    """Weights re-drawn at std 0.3 so that every position's logits differ by whole units."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)])


def digits(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 10, shape), jnp.int32)


@pytest.fixture(scope="module")
def params():
    return visible(jax.jit(init_params, static_argnums=0)(CONFIG, jax.random.key(0)))


def test_every_source_token_reaches_every_output_and_the_decoder_sees_only_the_past(params):
    """Changing any source token j moves the encoder's output at every source position, those
    before j too (the encoder is bidirectional), and the logits at every target position
    (cross-attention has no causal mask); changing decoder input token i moves positions i and
    after, never before."""
    source, inputs = digits(1, (1, 8)), digits(2, (1, 8))
    forward = jax.jit(lambda s, t: GPT(CONFIG).apply({"params": params}, t, sources=s)[0])
    memory = jax.jit(lambda s: encode(CONFIG, params, s)[0])
    base, base_memory = forward(source, inputs), memory(source)
    for j in range(8):
        changed = source.at[0, j].set((source[0, j] + 1) % 10)
        assert np.all(np.abs(memory(changed) - base_memory).max(-1) > 1e-3), j
        assert np.all(np.abs(forward(changed, inputs) - base).max(-1) > 1e-3), j
    for i in (1, 4):
        moved = np.abs(forward(source, inputs.at[0, i].set((inputs[0, i] + 1) % 10)) - base).max(-1)
        assert np.all(moved[:i] == 0) and np.all(moved[i:] > 1e-3), i


def test_decoding_with_the_kv_cache_gives_the_full_forward_passs_logits(params):
    """The decoder fed one token at a time with its KV cache, the source encoded once and handed
    to every step, gives the teacher-forced forward pass's logits: float32 agreement, the same
    sums in another order (1e-4 on logits of O(1))."""
    source, inputs = digits(3, (2, 8)), digits(4, (2, 8))
    full = jax.jit(lambda p: GPT(CONFIG).apply({"params": p}, inputs, sources=source))(params)
    memory = jax.jit(encode, static_argnums=0)(CONFIG, params, source)
    step = jax.jit(
        lambda p, cache, token: GPT(CONFIG).apply(
            {"params": p, "cache": cache}, token, memory=memory, decode=True, mutable=["cache"]
        )
    )
    cache, steps = init_cache(CONFIG, 2), []
    for i in range(8):
        logits, state = step(params, cache, inputs[:, i : i + 1])
        cache = state["cache"]
        steps.append(logits[:, 0])
    assert np.abs(full).max() > 1.0
    np.testing.assert_allclose(np.stack(steps, axis=1), full, atol=1e-4)


def test_a_row_pairs_each_target_with_its_own_source():
    """Worked by hand, "12<TAB>21" and "345<TAB>543" packed for an encoder–decoder (seq_len 9):
    the encoder's row holds "12\\n345\\n" then padding, the decoder's "\\n21\\n\\n543\\n" then padding, each
    example segment 1 then 2 on both sides; scored: each answer and its end."""
    examples, tokenizer = char_examples(["12\t21", "345\t543", "6789\t9876"])
    row = encoder_decoder_row(examples, iter([0, 1, 2]), 9)
    assert tokenizer.decode(row["sources"]) == "12\n345\n\n\n"
    assert row["source_segments"].tolist() == [1, 1, 1, 2, 2, 2, 2, 0, 0]
    assert row["source_positions"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1]
    assert tokenizer.decode(np.append(row["inputs"], row["targets"][-1])) == "\n21\n\n543\n\n"
    scored = "".join(tokenizer.decode([t]) if w else "." for t, w in zip(row["targets"], row["weights"], strict=True))
    assert scored == "21\n.543\n."
    assert row["segments"].tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 2]


def test_packed_examples_compute_what_each_computes_alone(params):
    """Two examples packed on both sides, each its own segment, give each target the logits it
    gets alone with its source: its self-attention, its cross-attention and its (learned)
    positions stay within its example (float32 sums of different lengths: 2e-5)."""
    examples, _ = char_examples(["12\t21", "345\t543"])
    row = {k: jnp.asarray(x[None]) for k, x in encoder_decoder_row(examples, iter([0, 1]), 9).items()}
    model_inputs = {k: row[k] for k in ("segments", "positions", "sources", "source_segments", "source_positions")}
    apply = jax.jit(lambda p, tokens, **given: GPT(CONFIG).apply({"params": p}, tokens, **given))
    packed = np.asarray(apply(params, row["inputs"], **model_inputs))
    for (a, b), (sa, sb) in (((0, 4), (0, 3)), ((4, 9), (3, 7))):
        alone = apply(params, row["inputs"][:, a:b], sources=row["sources"][:, sa:sb])
        np.testing.assert_allclose(packed[:, a:b], alone, atol=2e-5, rtol=2e-5)


def test_the_bottleneck_decoder_reads_each_sources_mean_alone(params):
    """model.encoder_summary=mean, two examples packed: the logits are those of the attending
    model (the same weights: the summary adds none) handed as its memory each source's mean
    of the encoder's outputs, computed in numpy; every cross-attention query then spreads its
    weight evenly over its source (all its keys are one vector), and the source's order
    reaches the output only through that mean. float32 sums in another order: 2e-5."""
    summary = CONFIG.replace(encoder_summary="mean")
    examples, _ = char_examples(["12\t21", "345\t543"])
    row = {k: jnp.asarray(x[None]) for k, x in encoder_decoder_row(examples, iter([0, 1]), 9).items()}
    given = {k: row[k] for k in ("segments", "positions", "source_segments", "source_positions")}
    full = np.asarray(GPT(CONFIG).apply({"params": params}, None, sources=row["sources"], encode_only=True, **given))
    segments = np.asarray(row["source_segments"][0])
    means = np.stack([full[0, segments == s].mean(0) for s in segments])[None]
    expected = GPT(CONFIG).apply({"params": params}, row["inputs"], memory=jnp.asarray(means), **given)
    got, state = GPT(summary).apply(
        {"params": params}, row["inputs"], sources=row["sources"], **given, mutable=["sites"]
    )
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=2e-5)
    assert not np.allclose(got, GPT(CONFIG).apply({"params": params}, row["inputs"], sources=row["sources"], **given))
    pattern = np.asarray(state["sites"]["block_1"]["cross"]["hook_pattern"][0])[0]  # (heads, t, s)
    for t, query_segment in enumerate(np.asarray(row["segments"][0])):
        keys = segments == query_segment
        np.testing.assert_allclose(pattern[:, t, keys], 1 / keys.sum(), atol=1e-6)


def test_a_summary_needs_an_encoder():
    with pytest.raises(ConfigError, match="model.encoder_summary='mean' summarises an encoder's output"):
        ModelConfig(vocab_size=12, block_size=16, encoder_summary="mean")


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"norm_position": "post"}, id="post-norm"),
        pytest.param({"activation": "swiglu", "norm": "rmsnorm", "position": "rope"}, id="llama-style"),
        pytest.param({"moe": MixtureOfExperts(experts=4, top_k=2)}, id="moe"),
    ],
)
def test_the_decoder_blocks_take_the_decoder_only_switches(changes):
    """Each decoder block holds cross-attention beside what the switch builds (the experts in
    the MLP's place; the encoder stays dense), and the forward pass runs."""
    config = CONFIG.replace(**changes)
    p = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
    block = p["block_1"]
    assert {"cross", "norm_cross", "attn"} <= set(block) and set(p["encoder"]) >= {"block_0", "block_1"}
    assert ("moe" in block) == ("moe" in changes) and "moe" not in p["encoder"]["block_1"]
    logits = jax.jit(lambda p, t, s: GPT(config).apply({"params": p}, t, sources=s))(
        p, digits(5, (2, 8)), digits(6, (2, 8))
    )
    assert logits.shape == (2, 8, 12) and np.isfinite(np.asarray(logits)).all()


def test_scanned_layers_with_remat_compute_what_unrolled_layers_do(params):
    """scan_layers stacks the encoder's blocks and the decoder's each into one scanned block;
    with the same weights stacked, the logits agree (float32, another order of the same sums)."""
    config = CONFIG.replace(scan_layers=True, remat="full")
    stacked = stack_blocks(params, 2) | {"encoder": stack_blocks(params["encoder"], 2)}
    assert set(jax.eval_shape(lambda key: init_params(config, key), jax.random.key(0))["encoder"]) == set(
        stacked["encoder"]
    )
    source, inputs = digits(7, (2, 8)), digits(8, (2, 8))

    def logits(config, p):
        return jax.jit(lambda p: GPT(config).apply({"params": p}, inputs, sources=source))(p)

    np.testing.assert_allclose(logits(config, stacked), logits(CONFIG, params), atol=1e-5)


def reverse_run(steps=10, **mesh):
    config = small_run_config(steps=steps, log_every=1, eval_every=steps, checkpoint_every=5, eval_batches=1)
    config.data.source = "builtin:reverse"
    config.model.encoder_layers = 2
    config.mesh.update(mesh)
    return config


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reverse")
    train_and_evaluate(reverse_run(), workdir, progress=False)
    return workdir


def test_the_runs_records_say_what_an_encoder_decoders_evaluation_measures(one_device):
    last = json.loads((one_device / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"val_loss", "val_token_accuracy", "val_exact_match"} <= set(last)


@pytest.mark.slow  # 15-19 s on a Zen 3: a second run; the layout rules are the decoder's (test_sharding.py)
def test_an_encoder_decoder_trains_on_a_mesh_as_on_one_device(one_device, tmp_path):
    """data 2 x fsdp 2 x tensor 2 over 8 CPU devices, cross-attention's weights split as
    self-attention's: the same losses to float32 reassociation (1e-5, as the decoder's layout
    tests)."""
    train_and_evaluate(reverse_run(data=2, fsdp=2, tensor=2), tmp_path, progress=False)
    np.testing.assert_allclose(train_losses(tmp_path), train_losses(one_device), rtol=1e-5)


def test_attention_pages_of_an_encoder_decoder_hold_its_three_kinds_of_attention(one_device, tmp_path, capsys):
    """attention-maps --html on an encoder–decoder: the cross-attention page (answer tokens
    querying source tokens) and the encoder's and the decoder's self-attention beside it, each
    the weights of encoder_decoder_maps for the answer the command printed."""
    from jaxgpt.commands import attention_maps
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab.views import embedded_data

    page = tmp_path / "reverse.html"
    argv = ["--workdir", str(one_device), "--prompt", "3141", "--out", str(tmp_path / "reverse.png")]
    attention_maps.main([*argv, "--html", str(page)])
    answer = capsys.readouterr().out.splitlines()[0].split(" -> ")[1]
    run, params, tokenizer, _ = load_latest(one_device)
    source, decoder_input = tokenizer.encode("3141\n"), tokenizer.encode("\n" + answer)
    maps = attention_maps.encoder_decoder_maps(run.model, params, np.asarray(source), np.asarray(decoder_input))
    texts = {
        "source": [tokenizer.decode([i]) for i in source],
        "answer": [tokenizer.decode([i]) for i in decoder_input],
    }
    for name, side, queries, keys in (
        ("reverse.html", "cross", "answer", "source"),
        ("reverse_encoder.html", "encoder", "source", "source"),
        ("reverse_decoder.html", "decoder", "answer", "answer"),
    ):
        data = embedded_data((tmp_path / name).read_text())
        assert (data["queries"], data["keys"]) == (texts[queries], texts[keys]), name
        np.testing.assert_allclose(data["weights"], maps[side], atol=1e-4)


@pytest.mark.slow  # 6 s: tests/test_pairs.py resumes a pairs run in the quick set
def test_an_encoder_decoder_resumes_bit_for_bit(one_device, tmp_path):
    train_and_evaluate(reverse_run(), tmp_path, progress=False, stop_at=5)
    train_and_evaluate(reverse_run(), tmp_path, progress=False)
    assert train_losses(tmp_path).tolist() == train_losses(one_device).tolist()


def test_the_digit_tasks_are_reversal_and_sorting():
    for task, answer in (("reverse", lambda s: s[::-1]), ("sort", lambda s: "".join(sorted(s)))):
        pairs = [pair.split("\t") for pair in digit_pairs(task, 500)]
        assert all(target == answer(source) and source.isdigit() for source, target in pairs)
        assert {len(source) for source, _ in pairs} == set(range(4, 13))


def by_length_cells(printed: str) -> dict[int, tuple[float, int]]:
    """evaluate's "exactly right by source length" line -> {length: (share right, answers)}."""
    cells = printed.split("(tokens before its end): ")[1].split(", ")
    return {int(c.split(":")[0]): (float(c.split(": ")[1].split("%")[0]) / 100, int(c.split(" of ")[1])) for c in cells}


def test_evaluate_counts_every_held_out_answer_once_by_its_source_length(one_device, capsys):
    """builtin:reverse's sources are 4 to 12 digits: the table's lengths are among those and
    its answers add up to the held-out answers the line above counts."""
    from jaxgpt.commands import evaluate

    evaluate.main(["--workdir", str(one_device)])
    summary, by_length = capsys.readouterr().out.splitlines()
    cells = by_length_cells(by_length)
    assert set(cells) <= set(range(4, 13)) and len(cells) >= 5
    held_out = int(summary.split(" held-out")[0].split(", ")[-1].replace(",", ""))
    assert sum(count for _, count in cells.values()) == held_out


def test_an_encoder_needs_pairs_and_a_next_token_decoder():
    config = small_run_config()
    config.model.encoder_layers = 2
    with pytest.raises(ConfigError, match="one stream of text"):
        resolve(config)
    with pytest.raises(ConfigError, match="encoder_layers"):
        CONFIG.replace(objective="masked", causal=False)


def test_the_seq2seq_command_names_its_successor():
    done = subprocess.run([sys.executable, "-m", "jaxgpt", "seq2seq"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "configs/seq2seq_reverse.py" in done.stderr and len(done.stderr.splitlines()) == 1


def test_the_commands_that_read_a_decoder_alone_refuse_an_encoder_decoder_in_one_line(one_device, capsys):
    from jaxgpt.commands import logit_lens

    with pytest.raises(SystemExit) as stop:
        logit_lens.main(["--workdir", str(one_device), "--prompt", "12"])
    said = capsys.readouterr().err
    assert stop.value.code == 2 and said.startswith("error: ") and "is an encoder–decoder" in said
    config = reverse_run()
    config.train.multiple_choice = "questions.jsonl"
    with pytest.raises(ConfigError, match="multiple_choice"):
        resolve(config)


@pytest.mark.slow  # configs/seq2seq_reverse.py, 400 of its 600 steps: about 17 s alone on a Zen 4
def test_reversal_is_learned_and_cross_attention_reads_the_mirrored_digit(tmp_path):
    """The shipped config trained for 400 steps instead of 600, its learning rate decaying over
    those (as shipped it is 98.8% exact at step 400 already, docs/lab.md): more than 95% of
    held-out answers exactly right (chance is about
    10^-8), and in the last decoder layer, averaged over its heads, output position i
    (predicting answer digit i) attends to source digit L - 1 - i, the one it copies, with
    weight above 0.5 on 31415926."""
    from jaxgpt.commands.attention_maps import encoder_decoder_maps
    from jaxgpt.job.checkpoint import load_latest

    config = ["--config", "configs/seq2seq_reverse.py", "--config.train.steps=400"]
    argv = [sys.executable, "train.py", *config, f"--workdir={tmp_path}", "--quiet"]
    # 400 steps: compiled as users compile, on a user's devices
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, env=users_environment())
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 400 and last["val_exact_match"] > 0.95
    from jaxgpt.commands import evaluate  # the table by length against the engine's own count of exact answers

    summary, by_length = evaluate.answers_line("run", tmp_path, None).splitlines()
    cells = by_length_cells(by_length)
    right = sum(share * count for share, count in cells.values()) / sum(count for _, count in cells.values())
    exact = float(summary.split(" and ")[1].split("%")[0]) / 100
    assert right == pytest.approx(exact, abs=0.01)  # the table's shares are rounded to 1%
    run, params, tokenizer, _ = load_latest(tmp_path)
    source = np.asarray(tokenizer.encode("31415926\n"))
    decoder_input = np.asarray(tokenizer.encode("\n62951413"))
    cross = encoder_decoder_maps(run.model, params, source, decoder_input)["cross"][-1].mean(0)  # (t, s)
    assert cross[np.arange(8), 7 - np.arange(8)].mean() > 0.5


def test_the_activations_command_reads_a_source_as_the_encoder_does(one_device, capsys):
    """The prompt is the source with the end its training gave it (5 digits + separator), the
    decoder's input its start token: the encoder's sites span 6 positions, cross-attention's
    pattern is 1 query by 6 keys."""
    from jaxgpt.commands import activations

    activations.main(["--workdir", str(one_device), "--prompt", "31415"])
    listed = capsys.readouterr().out
    assert "  encoder.blocks.1.hook_resid_post" in listed and "(1, 6, 32)" in listed
    activations.main(["--workdir", str(one_device), "--prompt", "31415", "--names", "blocks.0.cross_attn.hook_pattern"])
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "cross_attn.hook_pattern" in line]
    assert "(1, 2, 1, 6)" in line
