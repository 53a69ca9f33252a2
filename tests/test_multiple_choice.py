"""Multiple-choice scoring (HellaSwag, ARC, PIQA, Winogrande): each format read into the questions
it holds, each ending's log-likelihood against a hand computation and against the model's own
unpadded forward pass, Winogrande's partial scoring, both accuracies and the centred average,
and the question file's bad input as one line."""

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, small_run_config

from jaxgpt.commands import hellaswag
from jaxgpt.config import ConfigError
from jaxgpt.config_files import resolve
from jaxgpt.errors import UserError
from jaxgpt.job.checkpoint import load_latest
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.lab import multiple_choice
from jaxgpt.model.transformer import GPT, init_params
from jaxgpt.tokenizers import ByteTokenizer

FIXTURE = ROOT / "tests" / "data" / "hellaswag_sample.jsonl"  # three questions in HellaSwag's format
ARC, PIQA, WINOGRANDE = (ROOT / "tests" / "data" / f"{name}_sample.jsonl" for name in ("arc", "piqa", "winogrande"))


def byte_model(block_size=32, position="learned"):
    config = small_run_config()
    config.model.update(block_size=block_size, position=position)
    model = resolve(config, vocab_size=256).model
    return model, init_params(model, jax.random.key(0))


def test_the_fixture_reads_as_three_questions_with_their_labels():
    questions = multiple_choice.read_questions(str(FIXTURE))
    assert [q.label for q in questions] == [0, 1, 2]  # the third label is the string "2", as the Hub gives it
    assert questions[2].context == "Plates are stacked beside the sink. a woman"  # ctx_a + " " + ctx_b
    assert all(len(q.endings) == 4 for q in questions)
    assert len(multiple_choice.read_questions(str(FIXTURE), limit=2)) == 2


def test_each_format_reads_as_the_questions_it_holds():
    arc = multiple_choice.read_questions(str(ARC))  # AI2's form twice (letter and digit labels), the Hub's once
    assert [q.label for q in arc] == [1, 0, 1] and arc[0].endings == ("a stone", "the sun", "a shadow", "a cup")
    assert arc[2].context == "Question: Water that freezes becomes\nAnswer:" and len(arc[1].endings) == 3
    piqa = multiple_choice.read_questions(str(PIQA))
    assert [q.label for q in piqa] == [0, 1] and piqa[1].context == "Question: To keep bread fresh,\nAnswer:"
    wino = multiple_choice.read_questions(str(WINOGRANDE))
    assert [q.label for q in wino] == [0, 1, 0]
    assert wino[0].option_contexts == ("The cup would not fit in the box because the cup",) + (
        "The cup would not fit in the box because the box",
    )
    assert wino[0].endings == ("was too big.", "was too big.")  # the same words scored after each option


def test_winogrande_scores_what_follows_the_blank_after_each_option():
    """Partial scoring: the rows differ in their contexts (the option written in) and end in the
    same tokens, which alone are scored; with all weights zero both score -n log 256 exactly."""
    model, params = byte_model()
    (question, *_) = multiple_choice.read_questions(str(WINOGRANDE))
    encoded = multiple_choice.encode(question, ByteTokenizer(), model.block_size)
    tail = list(b" was too big.")
    assert [list(row[-len(tail) :]) for row in encoded.rows] == [tail, tail]
    assert encoded.ending_lengths == [len(tail)] * 2
    contexts = [bytes(row[: -len(tail)].tolist()).decode() for row in encoded.rows]
    assert contexts[0].endswith("because the cup") and contexts[1].endswith("because the box")
    zero = jax.tree.map(jnp.zeros_like, params)
    (totals,) = multiple_choice.ending_log_probs(model, zero, [encoded])
    np.testing.assert_allclose(totals, -len(tail) * math.log(256), rtol=1e-6)


def test_the_centred_average_subtracts_chance_and_divides_by_what_is_left():
    """By hand: 0.5 of four-choice questions right is (0.5 - 0.25) / 0.75 = 1/3 of the way from
    guessing to all right; 0.5 of two-choice ones is guessing, 0; their average 1/6."""
    four = multiple_choice.Score(4, 0.5, 0.5, 0.25, 0)
    two = multiple_choice.Score(2, 1.0, 0.5, 0.5, 0)
    assert four.centred == pytest.approx(1 / 3) and two.centred == 0.0
    assert multiple_choice.centred_average([four, two]) == pytest.approx(1 / 6)


def test_the_two_accuracies_choose_by_total_and_by_byte():
    """By hand: totals -4 and -6 over 2 and 12 bytes. The total prefers the first (-4 > -6);
    per byte, -2 against -0.5, the second."""
    assert multiple_choice.choices(np.array([-4.0, -6.0]), [2, 12]) == (0, 1)


def test_a_model_with_zero_weights_gives_each_ending_minus_n_log_v():
    """All parameters zero: every logit is 0, every token has probability 1/256, and an ending
    of n byte tokens scores exactly -n log 256 (float32: within 1e-6 relative per token)."""
    model, params = byte_model()
    zero = jax.tree.map(jnp.zeros_like, params)
    question = multiple_choice.Question("Some context.", ("a", "bb b", "a much longer ending"), 0)
    encoded = multiple_choice.encode(question, ByteTokenizer(), model.block_size)
    (totals,) = multiple_choice.ending_log_probs(model, zero, [encoded])
    n = np.array([len(" " + e) for e in question.endings])
    np.testing.assert_allclose(totals, -n * math.log(256), rtol=1e-6)
    by_total, by_byte = multiple_choice.choices(totals, encoded.ending_bytes)
    assert by_total == 0  # the shortest ending costs the least probability
    assert by_byte == 0  # per byte all tie at -log 256: the first


@pytest.mark.parametrize("position", ["learned", pytest.param("rope", marks=pytest.mark.slow)])
def test_the_batched_scores_are_the_unpadded_forward_pass(position):
    """The padded, masked, batched scores against each row run alone through the model and
    summed in float64 over its ending's tokens. A context longer than the window loses its
    beginning: the last 32 + 1 tokens are kept, the ending whole."""
    model, params = byte_model(position=position)
    questions = multiple_choice.read_questions(str(FIXTURE), limit=1)  # each row alone compiles its own length
    long = multiple_choice.Question("x" * 100 + " then", ("yes.", "no, not at all."), 1)
    encoded = [multiple_choice.encode(q, ByteTokenizer(), model.block_size) for q in [*questions, long]]
    assert len(encoded[-1].rows[1]) == model.block_size + 1
    got = multiple_choice.ending_log_probs(model, params, encoded)
    for e, totals in zip(encoded, got, strict=True):
        for row, n, total in zip(e.rows, e.ending_lengths, totals, strict=True):
            logits = np.asarray(GPT(model).apply({"params": params}, jnp.asarray(row[None, :-1])), np.float64)[0]
            log_probs = logits - logits.max(-1, keepdims=True)
            log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
            want = log_probs[np.arange(len(row) - 1), row[1:]][-n:].sum()
            # float32 log-softmax over 256 logits, summed over <= 60 tokens: ~1e-6 relative each
            assert abs(total - want) <= 1e-5 * (abs(want) + 1), (total, want)


def test_score_counts_right_answers_of_both_kinds():
    """score() against choices() applied by hand to the same totals; questions whose characters
    the tokenizer lacks are skipped and counted."""
    model, params = byte_model()
    questions = multiple_choice.read_questions(str(FIXTURE))
    encoded = [multiple_choice.encode(q, ByteTokenizer(), model.block_size) for q in questions]
    totals = multiple_choice.ending_log_probs(model, params, encoded)
    picks = [multiple_choice.choices(t, e.ending_bytes) for e, t in zip(encoded, totals, strict=True)]
    result = multiple_choice.score(model, params, ByteTokenizer(), questions, batch=2)
    assert result.questions == 3 and result.skipped == 0 and result.chance == 0.25
    assert result.accuracy == sum(p[0] == q.label for p, q in zip(picks, questions, strict=True)) / 3
    assert result.normalised_accuracy == sum(p[1] == q.label for p, q in zip(picks, questions, strict=True)) / 3

    class NoTildes(ByteTokenizer):
        def encode(self, text):
            if "~" in text:
                raise UserError("no ~")
            return super().encode(text)

    odd = multiple_choice.Question("a ~ b", ("c", "d"), 0)
    assert multiple_choice.score(model, params, NoTildes(), [*questions, odd]).skipped == 1


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "line 1 is not JSON"),
        (json.dumps({"ctx": "a", "endings": ["b", "c"], "label": ""}), "no usable label (''); HellaSwag's test split"),
        (json.dumps({"ctx": "a", "endings": ["b", "c"], "label": 2}), "no usable label (2)"),
        (json.dumps({"endings": ["b", "c"], "label": 0}), "needs 'ctx' (or ctx_a/ctx_b)"),
        (json.dumps({"prompt": "a", "answer": "b"}), "is in none of the formats read here (HellaSwag, ARC, PIQA"),
        (json.dumps({"sentence": "no blank", "option1": "a", "option2": "b", "answer": "1"}), "exactly one blank"),
        (
            json.dumps({"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "E"}),
            "an answerKey among",
        ),
    ],
)
def test_a_bad_question_file_is_one_line_naming_the_line(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(UserError, match=re.escape(message)):
        multiple_choice.read_questions(str(path))


def test_a_hub_dataset_is_read_as_the_jsonl_is(monkeypatch):
    """hf:NAME[:SPLIT] goes through datasets.load_dataset (offline here: given the fixture's
    records as a real datasets.Dataset), validation unless a split is named."""
    import datasets

    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    for r in records:
        r["label"] = str(r["label"])
        r.setdefault("ctx", r["ctx_a"] + " " + r["ctx_b"])
    asked = []

    def load_dataset(name, split):
        asked.append((name, split))
        return datasets.Dataset.from_list(records)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert multiple_choice.read_questions("hf:Rowan/hellaswag", limit=2) == multiple_choice.read_questions(
        str(FIXTURE), limit=2
    )
    multiple_choice.read_questions("hf:Rowan/hellaswag:train")
    assert asked == [("Rowan/hellaswag", "validation"), ("Rowan/hellaswag", "train")]


def test_the_command_scores_a_trained_run(trained_small_run, capsys):
    hellaswag.main(["--workdir", str(trained_small_run), "--questions", str(FIXTURE)])
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{FIXTURE} (step 20): 3 questions, accuracy ")
    for accuracy in map(float, re.search(r"accuracy ([\d.]+), normalised accuracy ([\d.]+)", line).groups()):
        assert abs(3 * accuracy - round(3 * accuracy)) < 1e-3  # a whole number of the 3 questions right
    assert line.endswith("(chance 0.2500)")


def test_the_command_scores_several_tasks_and_their_centred_average(trained_small_run, capsys):
    argv = ["--workdir", str(trained_small_run)]
    for path in (FIXTURE, ARC, PIQA, WINOGRANDE):
        argv += ["--questions", str(path)]
    hellaswag.main(argv)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(" (step 20)")[0] for line in lines[:4]] == [str(p) for p in (FIXTURE, ARC, PIQA, WINOGRANDE)]
    chances = [float(re.search(r"chance ([\d.]+)", line).group(1)) for line in lines[:4]]
    assert chances == [0.25, pytest.approx((1 / 4 + 1 / 3 + 1 / 4) / 3, abs=1e-4), 0.5, 0.5]
    normalised = [float(re.search(r"normalised accuracy ([\d.]+)", line).group(1)) for line in lines[:4]]
    centred = [(n - c) / (1 - c) for n, c in zip(normalised, chances, strict=True)]
    average = float(re.search(r"centred average over 4 tasks: (-?[\d.]+)", lines[4]).group(1))
    assert average == pytest.approx(np.mean(centred), abs=2e-4)  # from the 4-decimal lines


def test_the_command_refuses_bad_flags_in_one_line(trained_small_run, capsys):
    with pytest.raises(SystemExit) as exit_:
        hellaswag.main(["--workdir", str(trained_small_run), "--questions", "missing.jsonl"])
    assert exit_.value.code == 2
    assert "no questions file missing.jsonl" in capsys.readouterr().err


def test_training_scores_the_questions_every_n_steps_and_at_the_end(tmp_path):
    """train.multiple_choice every 4 steps of 10: records at 4, 8 and 10, the last equal to
    scoring the final checkpoint's parameters."""
    config = small_run_config(steps=10, warmup_steps=2, multiple_choice=str(FIXTURE), multiple_choice_every=4)
    train_and_evaluate(config, tmp_path, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    asked = [r for r in records if "multiple_choice_accuracy" in r]
    assert [r["step"] for r in asked] == [4, 8, 10]
    run, params, tokenizer, step = load_latest(tmp_path)
    want = multiple_choice.score(run.model, params, tokenizer, multiple_choice.read_questions(str(FIXTURE)))
    assert step == 10
    assert asked[-1]["multiple_choice_accuracy"] == want.accuracy
    assert asked[-1]["multiple_choice_accuracy_norm"] == want.normalised_accuracy


def test_training_refuses_unusable_questions_before_it_starts(tmp_path):
    empty = "multiple_choice_every=10 scores questions from train.multiple_choice, which is empty"
    with pytest.raises(ConfigError, match=empty):
        resolve(small_run_config(multiple_choice_every=10), vocab_size=96)
    with pytest.raises(UserError, match="no questions file missing.jsonl"):
        train_and_evaluate(small_run_config(multiple_choice="missing.jsonl"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()
