"""A run that starts from trained weights takes their model (jaxgpt/job/pretrained.py): Llama
3.2's positions (theta 500000, llama3 scaling) and Qwen2's (theta 1e6, its biases) fine-tuned
from a config file that says otherwise, checked against transformers' logits of the same
folder; a context extension only on purpose, said in one line; any other override refused
before the data is prepared or a workdir made; a resume that needs its source no more.

Needs the optional extras (pip install -r requirements-hf.txt); skipped without them.
"""

import importlib
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the parity tests need torch: pip install -r requirements-hf.txt")
transformers = pytest.importorskip(
    "transformers", reason="the parity tests need transformers: pip install -r requirements-hf.txt"
)

from test_hf import LLAMA, with_visible_weights  # noqa: E402

from jaxgpt.config_files import resolve  # noqa: E402
from jaxgpt.data import cache_folder  # noqa: E402
from jaxgpt.errors import UserError  # noqa: E402
from jaxgpt.job.checkpoint import load_latest  # noqa: E402
from jaxgpt.job.trainer import train_and_evaluate  # noqa: E402
from jaxgpt.model.transformer import GPT  # noqa: E402

TEXT = "the cat sat on the mat; the dog sat on the log. " * 40
# Llama 3.2's positions, as its config.json on the Hub writes them (rope_theta beside a
# rope_scaling section), on a model 32 wide
LLAMA_32_ROPE = {
    "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}  # fmt: skip


def with_bpe(folder, rows: int):
    """A byte-level BPE of the text, saved as the folder's tokenizer.json, its ids below `rows`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        [TEXT], trainers.BpeTrainer(vocab_size=290, special_tokens=["</s>"], initial_alphabet=alphabet)
    )
    assert bpe.get_vocab_size() <= rows
    bpe.save(str(folder / "tokenizer.json"))


def saved(model, folder, hub_rope: dict | None = None):
    """`model` saved by transformers into `folder` with a BPE; with `hub_rope`, config.json
    rewritten as Llama 3.2's on the Hub is (rope_theta beside a rope_scaling section)."""
    with_visible_weights(model).save_pretrained(folder)
    with_bpe(folder, model.config.vocab_size)
    if hub_rope:
        hf = json.loads((folder / "config.json").read_text())
        hf.pop("rope_parameters", None)
        (folder / "config.json").write_text(json.dumps(hf | hub_rope))
    return model


@pytest.fixture(scope="module")
def llama_32(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-3.2")
    config = transformers.LlamaConfig(**LLAMA | {"vocab_size": 320, "max_position_embeddings": 131072,
                                                 "tie_word_embeddings": True})  # fmt: skip
    hub = {"rope_theta": 500000.0, "rope_scaling": LLAMA_32_ROPE, "max_position_embeddings": 131072}
    saved(transformers.LlamaForCausalLM(config), folder, hub)
    reference = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    return folder, reference


def llama_tiny_from(folder, tmp_path, **train):
    """configs/llama_tiny.py (4 layers x 128, rope_theta 10000, no scaling, untied) fine-tuning
    the folder's weights on a small text with its tokenizer, at a learning rate that moves no
    weight: the trained model is the folder's model."""
    (tmp_path / "text").mkdir(exist_ok=True)
    for name in ("a", "b"):
        (tmp_path / "text" / f"{name}.txt").write_text(TEXT)
    config = importlib.import_module("configs.llama_tiny").get_config()
    config.data.update(source=f"text:{tmp_path / 'text'}", tokenizer=str(folder), val_fraction=0.5)
    config.train.update(
        dict(init_from=str(folder), steps=2, warmup_steps=1, lr=1e-9, min_lr=0.0, batch_size=8, eval_every=2,
             eval_batches=1, checkpoint_every=2, log_every=1) | train
    )  # fmt: skip
    return config


def logits_of_the_run(workdir, ids) -> np.ndarray:
    run, params, _, _ = load_latest(workdir)
    return np.asarray(jax.jit(GPT(run.model).apply)({"params": params}, jnp.asarray(ids)))


def reference_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


IDS = np.random.default_rng(0).integers(0, 290, (2, 24))


def test_llama_32_fine_tuned_from_a_config_that_says_otherwise_keeps_its_own_positions(llama_32, tmp_path, capsys):
    folder, reference = llama_32
    train_and_evaluate(llama_tiny_from(folder, tmp_path), tmp_path / "run")
    printed = capsys.readouterr().out
    model = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert (model["rope_theta"], model["rope_scaling"]["kind"], model["rope_scaling"]["factor"]) == (
        500000.0,
        "llama3",
        32,
    )
    assert model["rope_scaling"]["original_block_size"] == 8192 and model["tie_embeddings"]
    assert (model["n_layer"], model["d_model"], model["n_kv_head"], model["block_size"]) == (2, 32, 2, 128)
    assert "the model is train.init_from=" in printed and "rope_theta 10000 -> 500000" in printed
    # The run's model computes what transformers computes from the folder: every position rotated as trained.
    np.testing.assert_allclose(logits_of_the_run(tmp_path / "run", IDS), reference_logits(reference, IDS), atol=1e-4)


def test_qwen2s_theta_and_biases_come_from_its_weights(tmp_path):
    folder = tmp_path / "qwen2"
    config = transformers.Qwen2Config(**LLAMA | {"vocab_size": 320}, rope_parameters={"rope_type": "default",
                                                                                        "rope_theta": 1e6})  # fmt: skip
    reference = saved(transformers.Qwen2ForCausalLM(config), folder).eval()
    train_and_evaluate(llama_tiny_from(folder, tmp_path), tmp_path / "run", progress=False)
    model = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert (model["rope_theta"], model["qkv_bias"], model["bias"], model["tie_embeddings"]) == (1e6, True, False, False)
    np.testing.assert_allclose(logits_of_the_run(tmp_path / "run", IDS), reference_logits(reference, IDS), atol=1e-4)


def test_a_context_extension_on_purpose_is_said_in_one_line(llama_32, tmp_path, capsys):
    """--config.model.rope_theta given on purpose moves the weights' base; their llama3 scaling
    stays, and a factor given alone stretches it further."""
    folder, _ = llama_32
    config = llama_tiny_from(folder, tmp_path)
    config.model.rope_theta = 2e6
    config.model.rope_scaling.factor = 64.0
    train_and_evaluate(config, tmp_path / "run", overrides=("model.rope_theta", "model.rope_scaling.factor"))
    assert "extending context: rope_scaling llama3 x32 -> llama3 x64; rope_theta 500000 -> 2000000" in (
        capsys.readouterr().out
    )
    model = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert (model["rope_theta"], model["rope_scaling"]["factor"], model["rope_scaling"]["original_block_size"]) == (
        2e6, 64.0, 8192,
    )  # fmt: skip


@pytest.mark.parametrize(
    "override, value, message",
    [
        ("n_layer", 3, "--config.model.n_layer=3, but train.init_from=.*'s weights have n_layer=2: fine-tuning takes"),
        ("norm_eps", 1e-5, "--config.model.norm_eps=1e-05, but .* have norm_eps=1e-06"),
    ],
)
def test_any_other_override_is_refused_before_the_data_is_prepared(llama_32, tmp_path, override, value, message):
    folder, _ = llama_32
    config = llama_tiny_from(folder, tmp_path)
    config.model[override] = value
    with pytest.raises(UserError, match=message):
        train_and_evaluate(config, tmp_path / "run", progress=False, overrides=(f"model.{override}",))
    assert not (tmp_path / "run").exists() and not cache_folder(resolve(config).data).exists()


def test_a_run_starts_from_the_kept_checkpoint_init_step_names(trained_small_run, llama_32, tmp_path):
    """train.init_step=10 starts from the source run's checkpoint of step 10, not its newest (20):
    after one step at lr 1e-9 each weight is step 10's within 1e-8 (Adam's first step moves a
    weight by about lr), while steps 10 and 20 differ by far more. A step the run does not keep,
    a step without init_from, and a step with Hugging Face weights are each refused in one line,
    before a workdir is made."""
    from conftest import small_run_config

    config = small_run_config(
        steps=1, eval_every=1, checkpoint_every=1, eval_batches=1, lr=1e-9, min_lr=0.0, warmup_steps=0
    )
    config.train.update(init_from=str(trained_small_run), init_step=10)
    train_and_evaluate(config, tmp_path / "run", progress=False)
    _, started, _, _ = load_latest(tmp_path / "run")
    _, at_10, _, _ = load_latest(trained_small_run, step=10)
    _, at_20, _, _ = load_latest(trained_small_run)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=0, atol=1e-8), started, at_10)
    assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), at_10, at_20))) > 1e-3
    config.train.init_step = 15
    with pytest.raises(UserError, match=r"train.init_step=15: .* keeps no checkpoint of step 15; it keeps 10, 20"):
        train_and_evaluate(config, tmp_path / "refused", progress=False)
    with pytest.raises(UserError, match="train.init_step=10 needs train.init_from"):
        config.train.update(init_from="", init_step=10)
        train_and_evaluate(config, tmp_path / "refused", progress=False)
    folder, _ = llama_32
    with pytest.raises(UserError, match=r"train.init_step=10 chooses a checkpoint of a jaxgpt run.* is not one"):
        train_and_evaluate(llama_tiny_from(folder, tmp_path, init_step=10), tmp_path / "refused", progress=False)
    assert not (tmp_path / "refused").exists()


def test_learned_positions_are_not_stretched(tmp_path):
    """GPT-2's learned table has a row per position: its block_size is the weights' (32 here,
    where configs/tiny.py says 128), and a block_size given on purpose is refused."""
    folder = tmp_path / "gpt2"
    gpt2 = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    with_visible_weights(transformers.GPT2LMHeadModel(gpt2)).save_pretrained(folder)
    config = importlib.import_module("configs.tiny").get_config()
    config.data.tokenizer = "byte"
    config.train.update(init_from=str(folder), steps=1, eval_every=1, eval_batches=1, checkpoint_every=1)
    run = resolve(config)
    from jaxgpt.job.pretrained import with_source_architecture

    assert with_source_architecture(run).model.block_size == 32 and run.model.block_size == 128
    with pytest.raises(UserError, match=r"block_size=128, but .* have block_size=32 \(learned positions have a row"):
        with_source_architecture(run, overrides={"model.block_size": 128})


@pytest.mark.slow
def test_a_resumed_fine_tune_needs_its_source_no_more(tmp_path):
    """Stopped at step 2, its source folder then deleted: the resume continues from the run's own
    config and checkpoint to the same losses as an uninterrupted run. Slow: 4.5 s on a Zen 5, three runs."""
    from conftest import train_losses

    folder = tmp_path / "gpt2"
    gpt2 = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    with_visible_weights(transformers.GPT2LMHeadModel(gpt2)).save_pretrained(folder)
    config = importlib.import_module("configs.tiny").get_config()
    config.data.tokenizer = "byte"
    config.train.update(init_from=str(folder), steps=4, warmup_steps=1, batch_size=8, eval_every=2, eval_batches=1,
                        checkpoint_every=2, log_every=1, lr=1e-4, min_lr=1e-5)  # fmt: skip
    train_and_evaluate(config, tmp_path / "straight", progress=False)
    train_and_evaluate(config, tmp_path / "resumed", progress=False, stop_at=2)
    shutil.rmtree(folder)
    train_and_evaluate(config, tmp_path / "resumed", progress=False)
    np.testing.assert_array_equal(train_losses(tmp_path / "resumed"), train_losses(tmp_path / "straight"))


def test_train_py_refuses_an_override_of_the_weights_architecture_in_one_line(llama_32, tmp_path):
    """The command line's --config.model.X are the values set on purpose: a layer count other
    than the weights' ends train.py with one line and status 2, with no workdir made."""
    from conftest import run_script

    folder, _ = llama_32
    config = f"--config.train.init_from={folder}"
    result = run_script("train.py", "--config=configs/llama_tiny.py", config, f"--config.data.tokenizer={folder}",
                        "--config.model.n_layer=3", f"--workdir={tmp_path / 'run'}", devices=1)  # fmt: skip
    assert result.returncode == 2 and not (tmp_path / "run").exists()
    assert result.stderr.strip().splitlines() == [
        f"error: --config.model.n_layer=3, but train.init_from={folder}'s weights have n_layer=2: fine-tuning takes "
        "the architecture from the weights; drop the override (only block_size, rope_theta and rope_scaling may "
        "move, to extend the context)"
    ]


def test_sampling_a_model_of_131072_positions_makes_a_page_by_default(llama_32, monkeypatch, capsys):
    """Without --max_new_tokens, sample writes at most 256 tokens, not the 131,071 its context
    has room for (minutes of silence on a laptop); asked for more, it makes more."""
    import jaxgpt.model.sampling
    from jaxgpt.commands import sample

    folder, _ = llama_32
    asked = []
    real = jaxgpt.model.sampling.generate

    def recorded(*args, max_new_tokens, **kwargs):
        asked.append(max_new_tokens)
        return real(*args, max_new_tokens=min(max_new_tokens, 300), **kwargs)

    monkeypatch.setattr(jaxgpt.model.sampling, "generate", recorded)
    sample.main(["--init_from", str(folder), "--prompt", "the cat", "--temperature", "0"])
    sample.main(["--init_from", str(folder), "--prompt", "the cat", "--temperature", "0", "--max_new_tokens", "300"])
    assert asked == [256, 300] and capsys.readouterr().out.startswith("the cat")
