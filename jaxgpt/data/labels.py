"""Labelled text, for sequence classification (model.objective=classification): one example a
text and its label.

    labels:PATH       a UTF-8 file, one example a line: its label, a tab, its text
    builtin:brackets  strings of 4 to 24 brackets, "balanced" or "unbalanced" (half each,
                      20,000 generated offline from a fixed seed, `bracket_examples`): a
                      text's label depends on every bracket in it, so no one position tells

The texts are the corpus's documents (jaxgpt/data/prepared.py: tokenized by the run's
tokenizer, cached, the last data.val_fraction held out) and the labels stay beside them, read
from the source again at each start: the classes are the labels' names in sorted order. An
example is one segment of a packed row, "<SEP> text", scored at one position: its last token
for a decoder (the only one that has read the whole text), its first, the separator, for an
encoder (BERT's [CLS]: attention reads the whole text from there). The target at that position
is the example's class, and the model's classifier (model.classes outputs) reads it there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import numpy as np

from jaxgpt.config import source_kind
from jaxgpt.data.images import read_images
from jaxgpt.data.pairs import (
    TAB,
    PackedRow,
    PairValidation,
    document_splits,
    numbered_lines,
    random_rows,
    rows_in_order,
    stacked,
)
from jaxgpt.errors import UserError
from jaxgpt.tokenizers import separator_id
from jaxgpt.training.batch import segment_positions


def read_labelled(path: str) -> tuple[list[str], list[str]]:
    """(labels, texts) of a labels:PATH file, each stripped; one line naming the first line that
    is not "label<TAB>text"."""
    labels, texts = [], []
    for number, line in numbered_lines(path, f"labels:{path}"):
        label, tab, text = line.partition(TAB)
        if not tab or not label.strip() or not text.strip():
            raise UserError(
                f"line {number} of {path} is not a labelled text: write its label, a tab, then its text "
                f"(found {line[:60]!r})"
            )
        labels.append(label.strip())
        texts.append(text.strip())
    if len(set(labels)) < 2:
        raise UserError(f"{path} has {len(set(labels))} label(s); a classifier needs at least 2 to tell apart")
    return labels, texts


def bracket_examples(count: int = 20_000, seed: int = 0) -> tuple[list[str], list[str]]:
    """(labels, texts): half balanced strings of ( and ) (a random walk that never goes below
    zero and ends there), half the same with one bracket flipped (never balanced: the count of
    each changes by one), in random order."""
    rng = np.random.default_rng(seed)
    labels, texts = [], []
    for i in range(count):
        pairs = int(rng.integers(2, 13))
        depth, text = 0, []
        for left in range(2 * pairs, 0, -1):  # `left` brackets still to write
            opens = depth == 0 or (depth < left and rng.random() < 0.5)
            depth += 1 if opens else -1
            text.append("(" if opens else ")")
        if i % 2:
            at = int(rng.integers(len(text)))
            text[at] = "(" if text[at] == ")" else ")"
        labels.append("unbalanced" if i % 2 else "balanced")
        texts.append("".join(text))
    order = rng.permutation(count)
    return [labels[i] for i in order], [texts[i] for i in order]


def labelled_examples(source: str) -> tuple[list[str], list[str]]:
    """(labels, texts) of a labelled source, in the corpus's order."""
    kind, _, rest = source.partition(":")
    return bracket_examples() if kind == "builtin" else read_labelled(rest)


def class_names(source: str) -> list[str]:
    """The classes of a labelled source, texts or images: its labels' names (class i is the
    i-th): a text source's sorted, an image source's as it names them (jaxgpt/data/images.py)."""
    if source_kind(source) == "images":
        return read_images(source).names
    return sorted(set(labelled_examples(source)[0]))


@dataclasses.dataclass(frozen=True)
class Labelled:
    """A split's labelled texts: example i is the text tokens[starts[i]:ends[i]], of class
    classes[i]."""

    tokens: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    classes: np.ndarray
    separator: int
    left_out: int = 0  # texts too long for a row of block_size tokens

    def __len__(self) -> int:
        return len(self.starts)

    def unit(self, i: int) -> np.ndarray:
        return np.concatenate([[self.separator], np.asarray(self.tokens[self.starts[i] : self.ends[i]], np.int64)])


def split_labelled(dataset, source: str, seq_len: int) -> tuple[Labelled, Labelled]:
    """(training, validation) examples of a prepared labelled corpus; a text longer than a row
    with its separator is left out (counted). One line where a split has none."""
    labels = labelled_examples(source)[0]
    names = sorted(set(labels))
    classes = np.asarray([names.index(label) for label in labels])
    starts, ends, train, val = document_splits(dataset)
    if len(starts) != len(classes):
        raise UserError(
            f"data.source {source} has {len(classes)} labelled texts and its prepared corpus {len(starts)} documents; "
            "prepare it again (python -m jaxgpt prepare --config ... --force)"
        )
    separator, n_train = separator_id(dataset.tokenizer), len(dataset.train)
    splits = []
    for name, chosen, tokens, offset in (
        ("training", train, dataset.train, 0),
        ("validation", val, dataset.val, n_train),
    ):
        fits = chosen & (ends - starts + 1 <= seq_len)
        examples = Labelled(tokens, starts[fits] - offset, ends[fits] - offset, classes[fits], separator,
                            int((chosen & ~fits).sum()))  # fmt: skip
        if not len(examples):
            raise UserError(
                f"no {name} text fits in model.block_size = {seq_len} tokens with its separator; raise "
                "model.block_size or shorten the texts"
            )
        splits.append(examples)
    return splits[0], splits[1]


def labelled_row(examples: Labelled, chosen, seq_len: int, first: bool) -> dict[str, np.ndarray]:
    """One row of the batch contract: the examples `chosen` yields packed while they fit in
    seq_len tokens, each its own segment (from 1), the rest padding of segment 0; each
    example's class the target at its first (`first`: an encoder) or last token, weight 1
    there and 0 everywhere else."""
    row = PackedRow(seq_len, examples.separator)
    classes = np.zeros(seq_len, np.int32)
    for segment, i in enumerate(chosen, 1):
        unit = examples.unit(i)
        if not row.fits(unit):
            break
        at = row.used if first else row.used + len(unit) - 1
        row.add(unit, segment)
        row.weights[at], classes[at] = 1.0, examples.classes[i]
    positions = segment_positions(row.segments)
    return {"inputs": row.tokens.astype(np.int32), "targets": classes, "weights": row.weights,
            "segments": row.segments, "positions": positions}  # fmt: skip


def row_maker(model) -> Callable:
    """How a row of a labelled corpus is packed for `model`: scored at each text's first token
    for an encoder (causal=False), at its last for a decoder."""
    return partial(labelled_row, first=not model.causal)


@dataclasses.dataclass(frozen=True)
class TrainLabelled:
    """The training split's labelled texts, batches drawn from them by (seed, stream, step)."""

    examples: Labelled

    def batch(self, run, mesh, index: int, stream: int) -> dict:
        from jaxgpt.sharding import global_batch

        t, make_row = run.train, row_maker(run.model)

        def rows(start: int, stop: int) -> dict:
            return random_rows(self.examples, run.model.block_size, t.seed, stream, index, range(start, stop), make_row)

        return global_batch(mesh, rows, t.batch_size)


@dataclasses.dataclass(frozen=True)
class LabelValidation(PairValidation):
    kind: str = "labelled texts"

    def describe(self) -> str:
        of = f"{self.examples:,} of the {self.held_out:,}" if self.held_out > self.examples else f"{self.examples:,}"
        return (
            f"validation: {of} held-out labelled texts in {self.batches * self.batch_size} packed rows, each scored "
            "on its class" + (f"; {self.left_out:,} texts longer than a row left out" if self.left_out else "")
        )


def batch_sources(dataset, run) -> tuple[TrainLabelled, LabelValidation]:
    """(what training batches are drawn from, the fixed validation batches) of a labelled corpus."""
    t, seq_len, make_row = run.train, run.model.block_size, row_maker(run.model)
    train, held_out = split_labelled(dataset, run.data.source, seq_len)
    rows = rows_in_order(held_out, seq_len, make_row)
    count = min(t.eval_batches * t.batch_size, -(-len(rows) // t.batch_size) * t.batch_size)
    kept = rows[:count] + [{name: np.zeros_like(x) for name, x in rows[0].items()}] * max(0, count - len(rows))
    scored = sum(int(row["segments"].max()) for row in rows[:count])
    text_bytes = int(dataset.tokenizer.token_bytes()[np.asarray(held_out.tokens)].sum())
    validation = LabelValidation(stacked(kept), t.batch_size, scored, scored, text_bytes, held_out=len(held_out),
                                 left_out=train.left_out + held_out.left_out)  # fmt: skip
    return TrainLabelled(train), validation
