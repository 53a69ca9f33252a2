"""Multiple-choice scoring by log-likelihood: the downstream yardstick of HellaSwag.

Each question is a context and several endings, one of them right. The model reads the
context followed by each ending and scores the ending by the log-probability of its tokens;
the question counts as right when the right ending scores highest. Two scores, as the field
reports them (lm-evaluation-harness's `acc` and `acc_norm`):

  - accuracy: the ending with the highest total log-probability;
  - normalised accuracy: the highest log-probability per byte of the ending, which removes
    the total's bias towards short endings (every token costs probability).

Questions come from JSONL files (or Hugging Face datasets with the same fields) in the common
formats, told apart by their fields:

  HellaSwag   ctx (or ctx_a + ctx_b), endings, label
  ARC         question (its stem and choices, as AI2 releases it, or the text with a choices
              column {text, label}, as the Hub does), answerKey; read "Question: ...\nAnswer:"
  PIQA        goal, sol1, sol2, label; read "Question: ...\nAnswer:" as ARC
  Winogrande  sentence with a blank "_", option1, option2, answer ("1" or "2"): partial
              scoring, as the harness does it: each option is written into the blank and what
              follows the blank is scored after it (the same tokens for both options)

An ending is scored as " " + ending after its context, as GPT-2 tokenizes running text. Over
several tasks, each task's normalised accuracy is centred (chance subtracted, over 1 - chance,
as nanochat's CORE metric does: 0 is guessing, 1 is every question right) and the centred
accuracies averaged, so tasks of two and of four choices weigh alike.
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.model.transformer import GPT
from jaxgpt.training.train_step import token_losses


@dataclasses.dataclass(frozen=True)
class Question:
    context: str
    endings: tuple[str, ...]
    label: int  # index of the right ending
    # Winogrande's partial scoring: ending i is read after option_contexts[i], not after context
    option_contexts: tuple[str, ...] = ()


FORMATS = ("HellaSwag", "ARC", "PIQA", "Winogrande")


def record_format(record: dict) -> str | None:
    """Which of FORMATS a record is in, by its fields; None for none of them."""
    if "endings" in record:
        return "HellaSwag"
    if "answerKey" in record and "question" in record:
        return "ARC"
    if {"goal", "sol1", "sol2"} <= record.keys():
        return "PIQA"
    if {"sentence", "option1", "option2"} <= record.keys():
        return "Winogrande"
    return None


def question_from_record(record: dict, where: str) -> Question:
    """A Question from one record in any of FORMATS; `where` names it in the error."""
    kind = record_format(record)
    if kind == "ARC":
        return _arc_question(record, where)
    if kind == "PIQA":
        return _labelled(
            f"Question: {record['goal']}\nAnswer:", (record["sol1"], record["sol2"]), record.get("label"), where
        )
    if kind == "Winogrande":
        return _winogrande_question(record, where)
    if kind is None and "ctx" not in record and "ctx_a" not in record:
        raise UserError(
            f"{where} is in none of the formats read here ({', '.join(FORMATS)}): it has the fields "
            f"{sorted(record)[:8]}"
        )
    context = record.get("ctx") or " ".join(part for part in (record.get("ctx_a"), record.get("ctx_b")) if part)
    endings = record.get("endings")
    label = record.get("label")
    if not context or not isinstance(endings, list) or len(endings) < 2:
        raise UserError(f"{where} is not a HellaSwag question: it needs 'ctx' (or ctx_a/ctx_b) and a list of 'endings'")
    if label in (None, "") or not str(label).isdigit() or int(label) >= len(endings):
        raise UserError(
            f"{where} has no usable label ({label!r}); HellaSwag's test split is unlabelled: use its validation split"
        )
    return Question(context, tuple(endings), int(label))


def _labelled(context: str, endings, label, where: str, option_contexts: tuple[str, ...] = ()) -> Question:
    if label in (None, "") or not str(label).isdigit() or int(label) >= len(endings):
        raise UserError(f"{where} has no usable label ({label!r}); a test split is unlabelled: use a validation split")
    return Question(context, tuple(endings), int(label), option_contexts)


def _arc_question(record: dict, where: str) -> Question:
    """ARC in AI2's form ({question: {stem, choices: [{text, label}]}}) or the Hub's ({question,
    choices: {text: [...], label: [...]}}); answerKey is a choice's label (A-E, or 1-5)."""
    question = record["question"]
    if isinstance(question, dict):
        stem, texts = question.get("stem", ""), [c["text"] for c in question.get("choices", [])]
        labels = [c["label"] for c in question.get("choices", [])]
    else:
        choices = record.get("choices") or {}
        stem, texts, labels = question, list(choices.get("text", [])), list(choices.get("label", []))
    if len(texts) < 2 or record["answerKey"] not in labels:
        raise UserError(
            f"{where} is not an ARC question: it needs two or more choices and an answerKey among their labels"
        )
    return _labelled(f"Question: {stem}\nAnswer:", texts, labels.index(record["answerKey"]), where)


def _winogrande_question(record: dict, where: str) -> Question:
    sentence = record["sentence"]
    if sentence.count("_") != 1:
        raise UserError(f"{where} is not a Winogrande question: its sentence needs exactly one blank '_'")
    before, after = sentence.split("_")
    options = (record["option1"], record["option2"])
    label = int(record["answer"]) - 1 if str(record.get("answer", "")).isdigit() else None
    contexts = tuple(before + option for option in options)
    return _labelled(contexts[0], (after.strip(),) * 2, label, where, option_contexts=contexts)


def read_questions(source: str, limit: int | None = None) -> list[Question]:
    """The first `limit` questions (all with None) of a JSONL file, or of `hf:NAME[:SPLIT]` (a
    Hugging Face dataset, split validation unless named; needs a network or the datasets cache)."""
    if source.startswith("hf:"):
        name, _, split = source[3:].partition(":")
        records = _hub_records(name, split or "validation", limit)
        return [question_from_record(r, f"{source} record {i}") for i, r in enumerate(records)]
    path = Path(source)
    if not path.is_file():
        raise UserError(f"no questions file {source}; give a HellaSwag JSONL file or hf:Rowan/hellaswag")
    questions = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if limit is not None and len(questions) >= limit:
                break
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                problem = f"{source} line {number} is not JSON ({error.msg})"
                raise UserError(f"{problem}; give one question per line") from None
            questions.append(question_from_record(record, f"{source} line {number}"))
    if not questions:
        raise UserError(f"{source} holds no questions")
    return questions


def _hub_records(name: str, split: str, limit: int | None) -> list[dict]:
    import datasets

    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as error:  # noqa: BLE001 (offline, unknown name, unknown split: one line each way)
        raise UserError(
            f"cannot load hf:{name}:{split} ({str(error).splitlines()[0]}); offline, save it where you have a network "
            f"(datasets.load_dataset({name!r}, split={split!r}).to_json('hellaswag.jsonl')) and give that file"
        ) from None
    return list(dataset.select(range(min(limit, len(dataset))))) if limit is not None else list(dataset)


@dataclasses.dataclass(frozen=True)
class Encoded:
    """One question's endings as token rows: context + ending, cut from the left to fit."""

    rows: list[np.ndarray]  # per ending: the tokens the model reads and predicts (<= block_size + 1)
    ending_lengths: list[int]  # per ending: how many of the row's last tokens are the ending's
    ending_bytes: list[int]  # per ending: UTF-8 bytes of " " + ending, the normalisation
    label: int


def encode(question: Question, tokenizer, block_size: int) -> Encoded:
    """The question's rows. A context longer than the model's window loses its beginning; the
    ending is always scored whole unless it alone is longer than the window."""
    contexts = question.option_contexts or (question.context,) * len(question.endings)
    rows, lengths, sizes = [], [], []
    for context, ending in zip(contexts, question.endings, strict=True):
        text = " " + ending
        tokens = tokenizer.encode(text)
        row = np.asarray(tokenizer.encode(context) + tokens, np.int32)[-(block_size + 1) :]
        rows.append(row)
        lengths.append(min(len(tokens), len(row) - 1))  # the first token has no prediction
        sizes.append(len(text.encode("utf-8")))
    return Encoded(rows, lengths, sizes, question.label)


@partial(jax.jit, static_argnums=0)
def _ending_log_probs(config: ModelConfig, params, tokens: jax.Array, scored: jax.Array) -> jax.Array:
    """Per row, the sum of log p(token | the tokens before it) over the positions `scored`
    marks. tokens (rows, t + 1) int, scored (rows, t) bool, for the predictions of tokens 1..t."""
    log_probs = -token_losses(GPT(config), params, tokens)  # the training loss: float32 logits, optax
    return jnp.where(scored, log_probs, 0.0).sum(axis=-1)


def padded_length(longest: int, block_size: int) -> int:
    """Rows are padded to a power of two (at least 16, at most block_size + 1), so a whole
    evaluation compiles a handful of programs, not one per length."""
    return min(max(16, 1 << (longest - 1).bit_length()), block_size + 1)


def ending_log_probs(config: ModelConfig, params, encoded: list[Encoded]) -> list[np.ndarray]:
    """For each question, the total log-probability of each of its endings. The rows are
    padded on the right, which a causal model never reads from the left of."""
    rows = [row for e in encoded for row in e.rows]
    lengths = [n for e in encoded for n in e.ending_lengths]
    width = padded_length(max(len(r) for r in rows), config.block_size)
    tokens = np.zeros((len(rows), width), np.int32)
    scored = np.zeros((len(rows), width - 1), bool)
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        tokens[i, : len(row)] = row
        scored[i, len(row) - 1 - n : len(row) - 1] = True  # predictions of the ending's tokens
    totals = np.asarray(_ending_log_probs(config, params, jnp.asarray(tokens), jnp.asarray(scored)), np.float64)
    splits = np.cumsum([len(e.rows) for e in encoded])[:-1]
    return np.split(totals, splits)


def choices(log_probs: np.ndarray, ending_bytes: list[int]) -> tuple[int, int]:
    """(the ending chosen by total log-probability, the one chosen per byte)."""
    return int(np.argmax(log_probs)), int(np.argmax(log_probs / np.asarray(ending_bytes, np.float64)))


@dataclasses.dataclass(frozen=True)
class Score:
    questions: int
    accuracy: float
    normalised_accuracy: float
    chance: float  # the accuracy of guessing: mean of 1 / number of endings
    skipped: int  # questions the tokenizer cannot encode (characters a char model never saw)

    @property
    def centred(self) -> float:
        """The normalised accuracy with chance subtracted, over 1 - chance: 0 guessing, 1 all right."""
        return (self.normalised_accuracy - self.chance) / (1 - self.chance)

    def line(self, name: str) -> str:
        skipped = f"; {self.skipped} skipped: characters outside the vocabulary" if self.skipped else ""
        return (
            f"{name}: {self.questions} questions, accuracy {self.accuracy:.4f}, normalised accuracy "
            f"{self.normalised_accuracy:.4f} (chance {self.chance:.4f}){skipped}"
        )


def score(config: ModelConfig, params, tokenizer, questions: list[Question], batch: int = 8, progress=None) -> Score:
    """Both accuracies of the model over `questions`, `batch` questions a forward pass.
    `progress(n)` is told each time n more questions are done."""
    encoded, skipped = [], 0
    for question in questions:
        try:
            encoded.append(encode(question, tokenizer, config.block_size))
        except UserError:  # a character this tokenizer has no id for
            skipped += 1
    if not encoded:
        raise UserError(f"none of the {len(questions)} questions can be written in this model's vocabulary")
    right = right_normalised = 0
    for start in range(0, len(encoded), batch):
        chunk = encoded[start : start + batch]
        for e, totals in zip(chunk, ending_log_probs(config, params, chunk), strict=True):
            by_total, by_byte = choices(totals, e.ending_bytes)
            right += by_total == e.label
            right_normalised += by_byte == e.label
        if progress:
            progress(len(chunk))
    n = len(encoded)
    chance = float(np.mean([1 / len(e.rows) for e in encoded]))
    return Score(n, right / n, right_normalised / n, chance, skipped)


def centred_average(scores: list[Score]) -> float:
    """The mean of the tasks' centred accuracies (Score.centred)."""
    return float(np.mean([score.centred for score in scores]))
