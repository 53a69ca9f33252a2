"""Sequence classification (model.objective=classification; jaxgpt/data/labels.py, the
classifier in jaxgpt/model/transformer.py, `Classified` in jaxgpt/training/objectives.py): a
labelled text's class read at one position of each example, its loss and confusion matrix
against numpy, a run that learns a task through train.py, and BERT's body fine-tuned with a
fresh head. Trained with every setting of the engine and resumed bit for bit in
tests/test_composition.py."""

import json

import jax
import numpy as np
import pytest
from conftest import small_run_config

from jaxgpt.config import ModelConfig
from jaxgpt.data.labels import Labelled, bracket_examples, labelled_row, read_labelled
from jaxgpt.errors import UserError
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.model.transformer import GPT, init_params
from jaxgpt.training.train_step import eval_step, scored

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py

CLASSES = 3


def balanced(text: str) -> bool:
    depth = 0
    for bracket in text:
        depth += 1 if bracket == "(" else -1
        if depth < 0:
            return False
    return depth == 0


def test_the_bracket_texts_are_labelled_by_whether_they_balance():
    """An independent balance check agrees with every label, half of each, and the texts are
    4 to 24 brackets."""
    labels, texts = bracket_examples(count=2_000, seed=3)
    assert [("balanced" if balanced(t) else "unbalanced") for t in texts] == labels
    assert labels.count("balanced") == 1_000 and {len(t) for t in texts} <= set(range(4, 25))


def test_a_labels_file_reads_its_lines_and_a_bad_one_is_named(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("pos\tlovely day\n\nneg\t awful \n", encoding="utf-8")
    assert read_labelled(str(good)) == (["pos", "neg"], ["lovely day", "awful"])
    bad = tmp_path / "bad.txt"
    bad.write_text("pos\tlovely\nno tab here\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"^line 2 of .* is not a labelled text: write its label, a tab, then its text"):
        read_labelled(str(bad))
    one = tmp_path / "one.txt"
    one.write_text("pos\ta\npos\tb\n", encoding="utf-8")
    with pytest.raises(UserError, match="has 1 label"):
        read_labelled(str(one))


def test_a_row_scores_each_text_once_at_its_last_token_or_an_encoder_s_first():
    """Two texts packed into a row of 10: "<SEP> a b c" (class 2) and "<SEP> d e" (class 0),
    each its own segment; weight 1 and the class as target at the last token (decoder) or the
    separator (encoder), 0 everywhere else, and the padding segment 0."""
    tokens = np.array([1, 2, 3, 9, 4, 5, 9])
    examples = Labelled(tokens, np.array([0, 4]), np.array([3, 6]), np.array([2, 0]), separator=9)
    for first, scored_at in ((False, [3, 6]), (True, [0, 4])):
        row = labelled_row(examples, iter([0, 1]), 10, first=first)
        assert row["inputs"].tolist() == [9, 1, 2, 3, 9, 4, 5, 9, 9, 9]
        assert row["segments"].tolist() == [1, 1, 1, 1, 2, 2, 2, 0, 0, 0]
        assert np.flatnonzero(row["weights"]).tolist() == scored_at
        assert row["targets"][scored_at].tolist() == [2, 0]


def test_the_loss_accuracy_and_confusion_matrix_are_numpy_s_at_the_scored_positions():
    """A random classifier over 3 classes: the loss is the mean over the scored positions of
    float64 log-softmax cross-entropy of the classifier's outputs there; the confusion matrix
    counts (true, predicted) pairs of those positions, its trace over its sum the accuracy. float32 logits of
    3 classes: 1e-6."""
    config = ModelConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=16, objective="classification",
                         classes=CLASSES)  # fmt: skip
    params = init_params(config, jax.random.key(0))
    rng = np.random.default_rng(0)
    weights = np.zeros((4, 8), np.float32)
    weights[np.arange(4), rng.integers(0, 8, 4)] = 1
    weights[0, 0] = 1  # two examples in the first row
    batch = {"inputs": rng.integers(0, 16, (4, 8)).astype(np.int32), "weights": weights}
    batch["targets"] = rng.integers(0, CLASSES, (4, 8)).astype(np.int32)
    logits = np.asarray(GPT(config).apply({"params": params}, batch["inputs"]), np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    at = np.nonzero(weights)
    truth, chosen = batch["targets"][at], logits[at].argmax(-1)
    want_loss = -log_probs[at][np.arange(len(truth)), truth].mean()
    measured = eval_step(params, batch, model=GPT(config))
    np.testing.assert_allclose(float(measured["loss"]), want_loss, rtol=1e-6)
    want = np.zeros((CLASSES, CLASSES))
    np.add.at(want, (truth, chosen), 1)
    np.testing.assert_array_equal(np.asarray(measured["confusion"]), want)
    np.testing.assert_allclose(float(measured["accuracy"]), np.trace(want) / want.sum(), rtol=1e-6)
    assert float(measured["scored"]) == len(truth) == 5
    value, trained = scored(GPT(config), params, batch, jax.random.key(0))
    np.testing.assert_allclose(float(value), want_loss, rtol=1e-6)  # nothing beside the loss
    assert "confusion" in trained  # measured in training too: the step's accuracy


def labelled_file(tmp_path, count: int = 600):
    """A task a small model learns in a few hundred steps: a string of letters is "x" when it
    holds an x, else "none" (the classifier must find one letter anywhere in the text)."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(count):
        letters = list(rng.choice(list("abcdefgh"), int(rng.integers(4, 12))))
        if i % 2:
            letters[int(rng.integers(len(letters)))] = "x"
        lines.append(f"{'x' if i % 2 else 'none'}\t{''.join(letters)}")
    path = tmp_path / "labels.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow  # learning: 250 steps, ~10 s a case on 2 cores; the quick set trains it in tests/test_composition.py
@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_train_py_learns_to_classify_and_reports_the_confusion_matrix(causal, tmp_path):
    """The engine trains it: a decoder reading the last token and an encoder reading the first
    both reach at least 90% of held-out texts right (chance is 50%), the confusion matrix in
    metrics.jsonl counts every held-out text scored, its trace over its sum val_accuracy.
    Each run ~10 s on 2 cores."""
    config = small_run_config(steps=250, lr=3e-3, eval_every=250, eval_batches=4, checkpoint_every=250, log_every=50)
    config.data.source = f"labels:{labelled_file(tmp_path)}"
    config.data.tokenizer = "char"
    config.data.val_fraction = 0.1
    config.model.update(objective="classification", causal=causal)
    train_and_evaluate(config, tmp_path / "run", progress=False)
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    confusion = np.array(last["val_confusion"])
    assert confusion.shape == (2, 2) and last["val_accuracy"] == np.trace(confusion) / confusion.sum()
    assert last["val_accuracy"] >= 0.9, last


def test_a_classifier_refuses_data_without_labels_and_commands_that_read_tokens(tmp_path):
    """Each in one line: a classifier on a stream of text before anything is written; sample,
    chat, patch, evaluate and export given a classifier (`Objective.commands`)."""
    from jaxgpt.commands import cli
    from jaxgpt.hf import family_of

    classifier = ModelConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=16, objective="classification",
                             classes=2)  # fmt: skip
    for command in ("sample", "chat", "patch", "evaluate"):
        with pytest.raises(UserError, match="is a classifier .* whose outputs are classes, not tokens"):
            cli.refuse_unless_served(classifier, command, "runs/x", "it has nothing to sample")
    with pytest.raises(UserError, match="no Hugging Face family jaxgpt writes holds its head"):
        family_of(classifier)
    config = small_run_config()
    config.model.objective = "classification"  # on a stream of text, with no labels
    with pytest.raises(UserError, match="labelled texts .* train a classifier and a classifier needs them"):
        train_and_evaluate(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_bert_s_body_is_fine_tuned_with_a_fresh_classifier_in_its_head_s_place(tmp_path):
    """train.init_from a BertForMaskedLM folder (random weights, a WordPiece tokenizer.json):
    the run takes BERT's architecture, keeps its body's weights and puts a fresh classifier
    where the masked-token head was. With the learning rate 0 the saved weights are the
    start: the classifier's outputs at a text's first token are transformers' BertModel's
    last hidden state there times the classifier's kernel plus its bias (float32: 1e-4), and
    the masked-token head is gone. ~15 s."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from jaxgpt.job.checkpoint import load_latest

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghx"]
    tokenizer = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.add_special_tokens(words[:5])
    bert_folder = tmp_path / "bert"
    torch.manual_seed(0)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32,
    ))  # fmt: skip
    bert.eval().save_pretrained(bert_folder)  # eval: without dropout
    tokenizer.save(str(bert_folder / "tokenizer.json"))
    texts = tmp_path / "spaced.txt"  # WordPiece splits words: letters apart, one token each
    lines = labelled_file(tmp_path, count=200).read_text().splitlines()
    texts.write_text("\n".join(f"{label}\t{' '.join(text)}" for label, text in (x.split("\t") for x in lines)) + "\n")
    config = small_run_config(steps=2, lr=1e-9, min_lr=0.0, warmup_steps=0, eval_every=2, eval_batches=1,
                              checkpoint_every=2)  # fmt: skip
    config.data.update(source=f"labels:{texts}", tokenizer=str(bert_folder), val_fraction=0.1)
    config.model.objective = "classification"
    config.train.update(init_from=str(bert_folder), weight_decay=0.0)
    train_and_evaluate(config, tmp_path / "run", progress=False)
    run, params, _, _ = load_latest(tmp_path / "run")
    assert (run.model.causal, run.model.classes, run.model.d_model) == (False, 2, 32)
    assert "classifier" in params and "head_dense" not in params and "head_bias" not in params
    ids = [words.index("[SEP]"), *(words.index(c) for c in "abxa")]
    ours = np.asarray(GPT(run.model).apply({"params": params}, np.array([ids], np.int32)))[0, 0]
    with torch.no_grad():
        hidden = bert.bert(torch.tensor([ids])).last_hidden_state[0, 0].numpy()
    kernel, bias = (np.asarray(params["classifier"][name]) for name in ("kernel", "bias"))
    np.testing.assert_allclose(ours, hidden @ kernel + bias, atol=1e-4)
