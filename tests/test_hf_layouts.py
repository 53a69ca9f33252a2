"""Checkpoints as the world stores them. The Hub keeps most models as their *base* class saved
(openai-community/gpt2's file holds GPT2Model's names, without `transformer.` and without a
head), with older names (the original BERT's LayerNorm gamma and beta) and buffers no model
holds (GPT-2's causal masks, RoPE's frequency tables). Each layout is written here by
transformers and read twice: by transformers' own task class (`*ForCausalLM.from_pretrained`,
the reference, which accepts them all) and by jaxgpt, to the same logits; and a folder whose
head the task needs is missing is one line naming the class that has it.

Needs the optional extras (pip install -r requirements-hf.txt); skipped without them.
"""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the parity tests need torch: pip install -r requirements-hf.txt")
transformers = pytest.importorskip(
    "transformers", reason="the parity tests need transformers: pip install -r requirements-hf.txt"
)

from safetensors.numpy import load_file  # noqa: E402
from test_hf import (  # noqa: E402
    GEMMA3,
    LLAMA,
    bart_logits,
    bart_model,
    bart_pair,
    bert_model,
    gpt2_hub_folder,
    rewrite_weights,
    tokens,
    with_visible_weights,
)

from jaxgpt.errors import UserError  # noqa: E402
from jaxgpt.hf import check_folder, load_pretrained  # noqa: E402
from jaxgpt.model.transformer import GPT  # noqa: E402

TIED = LLAMA | {"tie_word_embeddings": True}  # a base model's folder has no head: it must be the embedding


def with_rotary_buffers(layers: int, head_dim: int):
    """Llama-family weights as checkpoints before transformers 4.35 hold them: each layer's RoPE
    frequency table saved beside its weights."""

    def edit(weights):
        for i in range(layers):
            weights[f"layers.{i}.self_attn.rotary_emb.inv_freq"] = 1 / 500.0 ** (np.arange(0, head_dim, 2) / head_dim)
        return weights

    return edit


# A base model's class, the task class transformers reads it with, its config, and what else the
# Hub's files of that family hold
DECODERS = {
    "gpt2": None,  # gpt2_hub_folder
    "llama": ("LlamaModel", "LlamaForCausalLM", transformers.LlamaConfig(**TIED), with_rotary_buffers(2, 8)),
    "mistral": (
        "MistralModel", "MistralForCausalLM", transformers.MistralConfig(**TIED, sliding_window=4),
        with_rotary_buffers(2, 8),
    ),
    "qwen2": ("Qwen2Model", "Qwen2ForCausalLM", transformers.Qwen2Config(**TIED), lambda w: w),
    "qwen3": ("Qwen3Model", "Qwen3ForCausalLM", transformers.Qwen3Config(**TIED, head_dim=16), lambda w: w),
    "gemma3": ("Gemma3TextModel", "Gemma3ForCausalLM", transformers.Gemma3TextConfig(**GEMMA3), lambda w: w),
    "mixtral": (
        "MixtralModel", "MixtralForCausalLM",
        transformers.MixtralConfig(**TIED, num_local_experts=4, num_experts_per_tok=2), lambda w: w,
    ),
}  # fmt: skip


def decoder_hub_folder(kind: str, directory):
    """The family's base model saved by transformers, as the Hub stores it; transformers' task
    model read from that folder, the reference."""
    if kind == "gpt2":
        return gpt2_hub_folder(directory)
    base, task, config, edit = DECODERS[kind]
    with_visible_weights(getattr(transformers, base)(config)).save_pretrained(directory)
    rewrite_weights(directory, edit)
    return getattr(transformers, task).from_pretrained(directory).eval()


@pytest.mark.parametrize("kind", list(DECODERS))
def test_a_base_models_folder_loads_with_the_logits_transformers_reads_from_it(kind, tmp_path):
    reference = decoder_hub_folder(kind, tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert not any(name.startswith(("transformer.", "model.", "lm_head")) for name in stored)  # the Hub's layout
    config, params, _ = load_pretrained(str(tmp_path))
    ids = tokens()
    ours = np.asarray(jax.jit(GPT(config).apply)({"params": params}, jnp.asarray(ids)))
    with torch.no_grad():
        theirs = reference(torch.tensor(ids)).logits.numpy()
    assert np.abs(theirs).max() > 1.0  # logits that really vary: every weight was read from the folder
    # Two float32 implementations of the same math: O(1e-6) relative apart on logits of O(10).
    assert np.abs(ours - theirs).max() < 1e-4


def test_berts_hub_layout_loads_with_the_logits_transformers_reads_from_it(tmp_path):
    """bert-base-uncased's file: BertForPreTraining's weights (the masked-token head beside the
    pooler and the next-sentence head, which masked-token prediction does not use) under the
    original BERT's names, LayerNorm gamma and beta, with the position-id buffer."""

    def as_the_original_bert(weights):
        weights = {
            re.sub(r"LayerNorm\.weight$", "LayerNorm.gamma", re.sub(r"LayerNorm\.bias$", "LayerNorm.beta", k)): v
            for k, v in weights.items()
        }
        rng = np.random.default_rng(0)
        extra = {"bert.pooler.dense.weight": (32, 32), "bert.pooler.dense.bias": (32,),
                 "cls.seq_relationship.weight": (2, 32), "cls.seq_relationship.bias": (2,)}  # fmt: skip
        buffers = {"bert.embeddings.position_ids": np.arange(32, dtype=np.int64)[None]}  # older files hold it
        return weights | buffers | {name: rng.normal(size=shape).astype(np.float32) for name, shape in extra.items()}

    bert_model().save_pretrained(tmp_path)
    rewrite_weights(tmp_path, as_the_original_bert)
    assert "bert.embeddings.LayerNorm.gamma" in load_file(tmp_path / "model.safetensors")
    reference = transformers.BertForMaskedLM.from_pretrained(tmp_path).eval()
    config, params, _ = load_pretrained(str(tmp_path))
    ids = tokens()
    with torch.no_grad():
        theirs = reference(torch.tensor(ids)).logits.numpy()
    ours = np.asarray(jax.jit(GPT(config).apply)({"params": params}, jnp.asarray(ids)))
    assert np.abs(theirs).max() > 1.0
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_a_bart_models_folder_loads_with_the_logits_transformers_reads_from_it(tmp_path):
    """BartModel's weights alone (no `model.` prefix, no final_logits_bias): transformers'
    BartForConditionalGeneration starts that bias at zero, and so does jaxgpt."""
    bart_model().model.save_pretrained(tmp_path)
    assert "shared.weight" in load_file(tmp_path / "model.safetensors")
    reference = transformers.BartForConditionalGeneration.from_pretrained(tmp_path).eval()
    config, params, _ = load_pretrained(str(tmp_path))
    sources, targets = bart_pair()
    ours = jax.jit(GPT(config).apply)({"params": params}, jnp.asarray(targets), sources=jnp.asarray(sources))
    theirs = bart_logits(reference, sources, targets)
    assert np.abs(theirs).max() > 1.0
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)


@pytest.mark.parametrize(
    "write, message",
    [
        (
            lambda d: transformers.BertModel(bert_model().config).save_pretrained(d),
            "holds a BertModel, which has no masked-token head (cls.predictions.transform.dense.weight); "
            "jaxgpt needs a BertForMaskedLM's weights, its head included",
        ),
        (
            lambda d: transformers.LlamaModel(transformers.LlamaConfig(**LLAMA)).save_pretrained(d),
            "holds a LlamaModel, which has no language-model head (lm_head.weight), and config.json's "
            "tie_word_embeddings=false says the head is not the token embedding",
        ),
    ],
    ids=["bert-without-its-head", "llama-untied-without-its-head"],
)
def test_a_folder_without_the_head_its_model_needs_is_one_line_naming_the_class_that_has_it(write, message, tmp_path):
    """Refused before any weight is read (check_folder reads the headers alone, as train.py does
    before preparing its data) and when loaded; transformers would start such a head at random."""
    write(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"][0].endswith("Model")
    for read in (check_folder, load_pretrained):
        with pytest.raises(UserError, match=re.escape(message)):
            read(str(tmp_path))


def test_a_task_models_weights_keep_their_names_so_another_tasks_head_shows_as_itself(tmp_path):
    """A BertForSequenceClassification: its `bert.` weights are the encoder's, its classifier
    another task's head, named as it is stored (not mistaken for a base model's weight)."""
    config = bert_model().config
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(UserError, match=r"holds a BertForSequenceClassification, which has no masked-token head"):
        load_pretrained(str(tmp_path))


def test_the_commands_read_gpt2_as_the_hub_stores_it(gpt2_bpe, tmp_path, capsys):
    """sample, logit-lens and attention-maps --init_from a folder laid out as openai-community/
    gpt2's (the README's "start from GPT-2 weights"), with the real 50,257-token vocabulary."""
    from jaxgpt.commands import attention_maps, logit_lens, sample

    reference = gpt2_hub_folder(tmp_path / "gpt2", vocab_size=50257, seed=1)
    folder = str(tmp_path / "gpt2")
    sample.main(["--init_from", folder, "--prompt", "def f", "--max_new_tokens", "6", "--temperature", "0"])
    written = capsys.readouterr().out
    import tiktoken

    ids = tiktoken.get_encoding("gpt2").encode_ordinary("def f")
    with torch.no_grad():
        greedy = reference.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert written == tiktoken.get_encoding("gpt2").decode(greedy[0].tolist()) + "\n"  # transformers' text
    logit_lens.main(["--init_from", folder, "--prompt", "def f(x):", "--html", str(tmp_path / "lens.html")])
    attention_maps.main(["--init_from", folder, "--prompt", "def f(x):", "--out", str(tmp_path / "maps.png")])
    assert (tmp_path / "lens.html").stat().st_size and (tmp_path / "maps.png").read_bytes()[:4] == b"\x89PNG"
