"""Text pairs: a source and the target a model should answer it with, one pair an example.

    pairs:PATH       a UTF-8 file, one pair a line, source and target separated by a tab
    builtin:dates    dates written many ways and their ISO form ("3rd of March, 2021" ->
                     "2021-03-03"), 20,000 generated offline from a fixed seed (`date_pairs`)
    builtin:reverse  strings of 4 to 12 digits and the same reversed ("31415" -> "51413"):
                     output position i reads source position L - 1 - i, so cross-attention
                     learns an anti-diagonal, the paper's alignment made visible
    builtin:sort     the same digits sorted ("31415" -> "11345"): each output digit depends on
                     the whole source, so no single source position answers it

A pair is prepared as a document "source<TAB>target" (jaxgpt/data/prepared.py: tokenized by the
run's tokenizer, cached, the last data.val_fraction held out), so the separator that ends every
document ends every answer. A decoder-only model reads each example as one sequence,

    <SEP> source <TAB> target <SEP>
                         ^^^^^^^^^^^^ scored: the loss is on the target and its end alone

several examples packed into a row of block_size + 1 tokens, each its own segment (attention
never crosses from one example into another, positions restart at each; jaxgpt/training/batch.py), the
rest of the row padding of weight 0. Generation gives the source and the tab, and stops at the
separator. Batches are a pure function of (seed, stream, step), as windows are.
"""

from __future__ import annotations

import dataclasses
import datetime
from functools import partial

import numpy as np

from jaxgpt.errors import UserError
from jaxgpt.model.sampling import Answering
from jaxgpt.tokenizers import separator_id
from jaxgpt.training.batch import segment_positions

TAB = "\t"


def numbered_lines(path: str, source: str) -> list[tuple[int, str]]:
    """(number from 1, text) of each line of a UTF-8 file holding something; one line where it
    cannot be read, naming data.source `source`. A byte-order mark opening the file (as some
    editors write one) is not text: a pairs file and a chat file read alike without it."""
    try:
        lines = open(path, encoding="utf-8-sig").read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read data.source {source} ({type(error).__name__}: {error})") from None
    return [(number, line) for number, line in enumerate(lines, 1) if line.strip()]


def read_pairs(path: str) -> list[str]:
    """The file's pairs as documents "source<TAB>target", each side stripped of surrounding
    whitespace; one line naming the first line that is not a pair."""
    documents = []
    for number, line in numbered_lines(path, f"pairs:{path}"):
        parts = line.split(TAB)
        if len(parts) != 2:
            raise UserError(
                f"line {number} of {path} is not a pair: one tab between a source and a target is needed, "
                f"found {len(parts) - 1} tab(s) in {line[:60]!r}"
            )
        if empty := [side for side, text in zip(("source", "target"), parts, strict=True) if not text.strip()]:
            where = "before" if empty[0] == "source" else "after"
            raise UserError(
                f"line {number} of {path} has an empty {empty[0]} (nothing {where} its tab) in {line[:60]!r}; write "
                "a source and its target on each line"
            )
        documents.append(f"{parts[0].strip()}{TAB}{parts[1].strip()}")
    if not documents:
        raise UserError(f"{path} holds no pairs; write one pair a line, source<TAB>target")
    return documents


MONTHS = [datetime.date(2000, m, 1).strftime("%B") for m in range(1, 13)]
WEEKDAYS = [datetime.date(2000, 1, 3 + d).strftime("%A") for d in range(7)]  # Monday first


def ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


DATE_FORMATS = (
    lambda d: f"{ordinal(d.day)} of {MONTHS[d.month - 1]}, {d.year}",
    lambda d: f"the {ordinal(d.day)} of {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{MONTHS[d.month - 1]} {ordinal(d.day)}, {d.year}",
    lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1][:3]} {d.day}, {d.year}",
    lambda d: f"{WEEKDAYS[d.weekday()]}, {MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{WEEKDAYS[d.weekday()][:3]} {d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1].upper()} {d.day}, {d.year}",
    lambda d: f"{d.day} {MONTHS[d.month - 1].lower()} {d.year}",
    lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
    lambda d: f"{d.day}-{MONTHS[d.month - 1][:3]}-{d.year}",
)


def date_pairs(count: int = 20_000, seed: int = 0) -> list[str]:
    """`count` dates between 1900 and 2099, each written one of DATE_FORMATS' ways, paired
    with its ISO 8601 form: the same list every time (numpy's generator, seeded)."""
    rng = np.random.default_rng(seed)
    first, last = datetime.date(1900, 1, 1).toordinal(), datetime.date(2099, 12, 31).toordinal()
    days = rng.integers(first, last + 1, count)
    styles = rng.integers(0, len(DATE_FORMATS), count)
    return [
        f"{DATE_FORMATS[style](date)}{TAB}{date.isoformat()}"
        for date, style in zip(map(datetime.date.fromordinal, days.tolist()), styles.tolist(), strict=True)
    ]


def digit_pairs(task: str, count: int = 20_000, seed: int = 0) -> list[str]:
    """`count` strings of 4 to 12 digits with the task's answer (reverse or sort): the same
    list every time."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 13, count)
    answer = {"reverse": lambda digits: digits[::-1], "sort": lambda digits: "".join(sorted(digits))}[task]
    strings = ["".join(map(str, rng.integers(0, 10, n))) for n in lengths]
    return [f"{digits}{TAB}{answer(digits)}" for digits in strings]


def builtin_pairs(name: str) -> list[str]:
    """builtin:NAME's pairs, as documents."""
    return date_pairs() if name == "dates" else digit_pairs(name)


@dataclasses.dataclass(frozen=True)
class Examples:
    """A split's pairs as token ranges of its stream: example i is tokens[starts[i]:ends[i]],
    its source the first source_lengths[i] of them, then the tab, then the target."""

    tokens: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    source_lengths: np.ndarray
    separator: int  # the token that starts and ends every example
    left_out: int  # examples too long for a row of block_size + 1 tokens

    def __len__(self) -> int:
        return len(self.starts)

    def unit(self, i: int) -> np.ndarray:
        """Example i as the model reads it: separator, source, tab, target, separator."""
        body = np.asarray(self.tokens[self.starts[i] : self.ends[i]], np.int64)
        return np.concatenate([[self.separator], body, [self.separator]])

    def scored(self, i: int) -> np.ndarray:
        """The weight of predicting each token of unit(i): the target and its end."""
        length = int(self.ends[i] - self.starts[i]) + 2
        return (np.arange(length) >= 2 + int(self.source_lengths[i])).astype(np.float32)  # past separator, source, tab


def document_spans(dataset) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((starts, ends) of the training split, the same of the validation split): where each
    document of a prepared corpus lies in its split's stream, between the separator before it
    (the stream's start, for the first) and the one after it; a document the split cuts in
    two belongs to neither."""
    starts, ends, train, val = document_splits(dataset)
    n_train = len(dataset.train)
    return (starts[train], ends[train]), (starts[val] - n_train, ends[val] - n_train)


def document_splits(dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(each document's start and end in the whole stream, whether it lies in the training
    split, whether in the validation split), by the documents' order in the corpus."""
    documents = np.asarray(dataset.documents)
    n_train, total = len(dataset.train), len(dataset.train) + len(dataset.val)
    starts = np.where(np.arange(len(documents)) == 0, 0, documents + 1)
    ends = np.append(documents[1:], total - 1)  # the separator after each: the stream ends with one
    return starts, ends, ends <= n_train, starts >= n_train


def split_examples(dataset, seq_len: int) -> tuple[Examples, Examples]:
    """(training, validation) pairs of a prepared pairs corpus."""
    (train_starts, train_ends), (val_starts, val_ends) = document_spans(dataset)
    tokenizer = dataset.tokenizer
    return (
        examples_of(dataset.train, train_starts, train_ends, tokenizer, seq_len),
        examples_of(dataset.val, val_starts, val_ends, tokenizer, seq_len),
    )


def examples_of(tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, tokenizer, seq_len: int) -> Examples:
    """The pairs at tokens[starts[i]:ends[i]] of a split; one longer than seq_len + 1 tokens
    with its separators is left out (counted in `left_out`)."""
    separator, tab = separator_id(tokenizer), tab_token(tokenizer)
    tabs = np.flatnonzero(np.asarray(tokens) == tab)
    first_tab = tabs[np.minimum(np.searchsorted(tabs, starts), len(tabs) - 1)] if len(tabs) else starts - 1
    found = (first_tab >= starts) & (first_tab < ends)
    if not found.all():
        raise UserError(
            f"the tokenizer {tokenizer.name!r} joins the tab between source and target to its neighbours in "
            f"{int((~found).sum())} pair(s); use data.tokenizer=char, byte or gpt2"
        )
    fits = ends - starts + 2 <= seq_len + 1
    return Examples(tokens, starts[fits], ends[fits], (first_tab - starts)[fits], separator, int((~fits).sum()))


def tab_token(tokenizer) -> int:
    ids = tokenizer.encode(TAB)
    if len(ids) != 1:
        raise UserError(f"the tokenizer {tokenizer.name!r} has no single token for a tab; use data.tokenizer=char")
    return ids[0]


def prompt_ids(tokenizer, source: str) -> list[int]:
    """What a model trained on pairs reads before answering `source`: the separator, the
    source, the tab (as in training); its answer ends at the separator (`separator_id`)."""
    return [separator_id(tokenizer), *tokenizer.encode(checked_source(source)), tab_token(tokenizer)]


def source_ids(tokenizer, source: str) -> list[int]:
    """What an encoder–decoder trained on pairs encodes: the source and the separator (its
    decoder starts from the separator alone)."""
    return [*tokenizer.encode(checked_source(source)), separator_id(tokenizer)]


def checked_source(source: str) -> str:
    """A source to answer, stripped; one line where it holds the tab that ends a source in
    training (the model would read its answer as begun)."""
    if TAB in source.strip():
        raise UserError(
            f"the source {source.strip()[:60]!r} holds a tab, which ends a source in training: the model would read "
            "what follows it as its answer begun; give the source alone"
        )
    return source.strip()


def answering(tokenizer) -> Answering:
    """How an encoder–decoder trained on pairs is asked: the source and the separator encoded,
    the decoder started from the separator, the answer ended by it."""
    separator = separator_id(tokenizer)
    return Answering(partial(source_ids, tokenizer), (separator,), separator)


class PackedRow:
    """A row of `length` tokens being filled with whole examples, each its own segment (from 1);
    the rest is padding: the separator, segment 0, weight 0."""

    def __init__(self, length: int, separator: int):
        self.tokens = np.full(length, separator, np.int64)
        self.segments = np.zeros(length, np.int32)
        self.weights = np.zeros(length, np.float32)  # weights[j]: of predicting tokens[j]
        self.used = 0

    def fits(self, unit: np.ndarray) -> bool:
        return self.used + len(unit) <= len(self.tokens)

    def add(self, unit: np.ndarray, segment: int, scored: np.ndarray | None = None) -> None:
        """`unit` next, the weight of predicting each of its tokens `scored` (None: 0)."""
        span = slice(self.used, self.used + len(unit))
        self.tokens[span], self.segments[span] = unit, segment
        if scored is not None:
            self.weights[span] = scored
        self.used = span.stop

    def decoder_fields(self) -> dict[str, np.ndarray]:
        """The row as the batch contract's inputs and targets (each token predicting the next)."""
        segments = self.segments[:-1]
        return {
            "inputs": self.tokens[:-1].astype(np.int32),
            "targets": self.tokens[1:].astype(np.int32),
            "weights": self.weights[1:],
            "segments": segments,
            "positions": segment_positions(segments),
        }

    def encoder_fields(self) -> dict[str, np.ndarray]:
        """The row as what an encoder–decoder's encoder reads."""
        return {
            "sources": self.tokens.astype(np.int32),
            "source_segments": self.segments,
            "source_positions": segment_positions(self.segments),
        }


def packed_row(examples, chosen, seq_len: int) -> dict[str, np.ndarray]:
    """One row of the batch contract (jaxgpt/training/batch.py): the examples `chosen` yields, packed in
    order while they fit in seq_len + 1 tokens (the first always does), then padding; scored:
    what each example's `scored` says (a pair's answer and its end; a conversation's
    assistant turns, jaxgpt/data/conversations.py)."""
    row = PackedRow(seq_len + 1, examples.separator)
    for segment, i in enumerate(chosen, 1):
        unit = examples.unit(i)
        if not row.fits(unit):
            break
        row.add(unit, segment, examples.scored(i))
    return row.decoder_fields()


def encoder_decoder_row(examples: Examples, chosen, seq_len: int) -> dict[str, np.ndarray]:
    """One row for an encoder–decoder (model.encoder_layers): the sources packed into the
    encoder's row of seq_len tokens, each "source <SEP>", and the targets into the decoder's
    of seq_len + 1, each "<SEP> target <SEP>", the k-th of both segment k, so a target token
    attends to its own source alone; scored: each target and its end."""
    targets, sources = PackedRow(seq_len + 1, examples.separator), PackedRow(seq_len, examples.separator)
    for segment, i in enumerate(chosen, 1):
        unit = examples.unit(i)  # separator, source, tab, target, separator
        n = int(examples.source_lengths[i])
        source = np.append(unit[1 : n + 1], examples.separator)
        target = np.concatenate([[examples.separator], unit[n + 2 :]])
        if not (targets.fits(target) and sources.fits(source)):
            break
        targets.add(target, segment, scored=(np.arange(len(target)) >= 1).astype(np.float32))
        sources.add(source, segment)
    return targets.decoder_fields() | sources.encoder_fields()


def stacked(rows: list[dict]) -> dict[str, np.ndarray]:
    return {name: np.stack([row[name] for row in rows]) for name in rows[0]}


def row_maker(encoder: bool):
    """How a row is packed: for a decoder alone (`packed_row`) or an encoder–decoder."""
    return encoder_decoder_row if encoder else packed_row


def random_rows(examples, seq_len: int, seed: int, stream: int, index: int, rows: range, make_row) -> dict:
    """Rows `rows` of batch `index` of a stream, each packed by make_row(examples, chosen,
    seq_len) (`row_maker`): row r packs examples drawn at random from (seed, stream, index, r)
    alone, so every process builds its own rows and a resumed run the same batches."""

    def drawn(r: int):
        rng = np.random.default_rng([seed, stream, index, r])
        while True:
            yield int(rng.integers(0, len(examples)))

    return stacked([make_row(examples, drawn(r), seq_len) for r in rows])


def rows_in_order(examples, seq_len: int, make_row) -> list[dict]:
    """Every example once, packed in order by `make_row`: the fixed validation rows."""
    rows, i = [], 0
    while i < len(examples):
        row = make_row(examples, iter(range(i, len(examples))), seq_len)
        i += int(row["segments"].max())
        rows.append(row)
    return rows


@dataclasses.dataclass(frozen=True)
class TrainPairs:
    """The training split's pairs, batches drawn from them by (seed, stream, step)."""

    examples: Examples
    encoder: bool = False  # rows for an encoder–decoder

    def batch(self, run, mesh, index: int, stream: int) -> dict:
        from jaxgpt.sharding import global_batch

        t = run.train

        def rows(start: int, stop: int) -> dict:
            part = range(start, stop)
            return random_rows(
                self.examples, run.model.block_size, t.seed, stream, index, part, row_maker(self.encoder)
            )

        return global_batch(mesh, rows, t.batch_size)


@dataclasses.dataclass(frozen=True)
class PairValidation:
    """The held-out pairs every evaluation scores: each once, packed in order, `batch_size`
    rows a batch (the last filled out with empty rows of weight 0), at most `most` batches."""

    rows: dict  # stacked rows, a multiple of batch_size
    batch_size: int
    examples: int
    target_tokens: int  # positions scored: each answer's tokens and its end
    target_bytes: int  # UTF-8 bytes they stand for
    left_out: int = 0  # pairs too long for a row, in both splits
    kind: str = "pairs"  # what the examples are: "pairs", or "conversations" (jaxgpt/data/conversations.py)
    held_out: int = 0  # the split's examples that fit a row: `examples` of them in the batches scored

    @property
    def batches(self) -> int:
        return len(self.rows["inputs"]) // self.batch_size

    def batch(self, mesh, index: int) -> dict:
        from jaxgpt.sharding import global_batch

        first = index * self.batch_size
        return global_batch(
            mesh, lambda a, b: {name: x[first + a : first + b] for name, x in self.rows.items()}, self.batch_size
        )

    def describe(self) -> str:
        beyond = self.held_out - self.examples
        of = (
            f"{self.examples:,} of the {self.held_out:,} held-out {self.kind} (the train.eval_batches batches of "
            f"packed rows hold them; jaxgpt evaluate scores all {self.held_out:,})"
            if beyond > 0
            else f"{self.examples:,} held-out {self.kind}"
        )
        return (
            f"validation: {of} in {self.batches * self.batch_size} packed rows, "
            f"{self.target_tokens:,} answer tokens scored, {self.target_bytes:,} bytes of text"
            + (f"; {self.left_out:,} {self.kind} longer than a row left out" if self.left_out else "")
        )


def pair_validation(
    examples: Examples, token_bytes: np.ndarray, seq_len: int, batch_size: int, most: int, encoder: bool = False
):
    rows = rows_in_order(examples, seq_len, row_maker(encoder))
    count = min(most * batch_size, -(-len(rows) // batch_size) * batch_size)
    kept = rows[:count]
    scored_examples = sum(int(row["segments"].max()) for row in kept)
    empty = {name: np.zeros_like(x) for name, x in kept[0].items()}
    kept += [empty] * (count - len(kept))
    stacked_rows = stacked(kept)
    weights = stacked_rows["weights"]
    target_bytes = int((token_bytes[stacked_rows["targets"]] * weights).sum())
    kind = "pairs" if isinstance(examples, Examples) else "conversations"
    return PairValidation(
        stacked_rows, batch_size, scored_examples, int(weights.sum()), target_bytes, kind=kind, held_out=len(examples)
    )
