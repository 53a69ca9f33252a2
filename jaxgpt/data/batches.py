"""How batches are cut from the cached tokens: windows of block_size + 1 tokens, handed to the
engine as the batch contract's dict (jaxgpt/training/batch.py): inputs and targets, and with
data.attend_within_documents each token's document (segments) and its place in it (positions).

Batches are a pure function of (seed, step): a resumed run sees exactly the batches it would
have seen, with no iterator state to save. Validation is a fixed set of windows, the same at
every evaluation.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from jaxgpt.data import conversations, images, labels, pairs
from jaxgpt.data.prepared import Dataset
from jaxgpt.errors import UserError
from jaxgpt.training.batch import segment_positions, windows_batch

TRAIN_STREAM, EVAL_TRAIN_STREAM = 0, 2  # stream 1 was random validation windows, now fixed ones


def window_offsets(
    split_tokens: int,
    seq_len: int,
    batch_size: int,
    seed: int,
    stream: int,
    index: int,
    rows: slice = slice(None),
    starts: np.ndarray | None = None,
) -> np.ndarray:
    """Where the windows of batch number `index` of a stream begin: batch_size random offsets
    into a split of `split_tokens` tokens drawn from (seed, stream, index) alone, anywhere a
    window of seq_len + 1 fits, or among `starts` when given (aligned_starts). `rows` keeps
    only part of the batch (one process's share): the offsets of the whole batch are drawn, so
    every process agrees on them, but only those rows are read."""
    rng = np.random.default_rng([seed, stream, index])
    if starts is None:
        return rng.integers(0, split_tokens - seq_len, size=batch_size)[rows]
    return starts[rng.integers(0, len(starts), size=batch_size)[rows]]


def read_windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int) -> np.ndarray:
    """(len(offsets), seq_len + 1) int32 windows: inputs are [:, :-1], targets [:, 1:]."""
    return np.stack([tokens[s : s + seq_len + 1] for s in offsets]).astype(np.int32)


def windows_at(tokens: np.ndarray, offsets: np.ndarray, seq_len: int, documents: np.ndarray | None) -> dict:
    """The batch (jaxgpt/training/batch.py) of the windows at `offsets`; given the split's `documents`
    (where each begins), with each token's document as its segment and its place there as its
    position: attention stays within a document and positions restart at each (a window's
    first tokens may be the end of a document begun before it: a segment of their own)."""
    batch = windows_batch(read_windows(tokens, offsets, seq_len))
    if documents is not None:
        indices = offsets[:, None] + np.arange(seq_len)
        segments = (np.searchsorted(documents, indices, side="right") - 1).astype(np.int32)
        batch |= {"segments": segments, "positions": segment_positions(segments)}
    return batch


@dataclasses.dataclass(frozen=True)
class TrainWindows:
    """The training split and how its windows are cut: at any offset or among `starts`
    (data.align_to_documents), with each token's document from `documents` (the split's
    document starts; data.attend_within_documents) or without."""

    tokens: np.ndarray
    starts: np.ndarray | None = None
    documents: np.ndarray | None = None

    def batch(self, run, mesh, index: int, stream: int) -> dict:
        return sharded_batch(self, run, mesh, index, stream)


def train_windows(dataset: Dataset, run) -> TrainWindows:
    """`dataset`'s training split as `run` (a RunConfig) cuts it."""
    split_tokens = len(dataset.train)
    documents = dataset.documents[dataset.documents < split_tokens]
    starts = None
    if run.data.align_to_documents:
        # never empty: the first document starts at 0, and the split holds a window (check_long_enough)
        starts = aligned_starts(documents, split_tokens, run.model.block_size)
    return TrainWindows(dataset.train, starts, documents if run.data.attend_within_documents else None)


def validation_documents(dataset: Dataset, run) -> np.ndarray | None:
    """Where the validation split's documents begin, for a run that attends within documents:
    its first tokens end a document begun in the training split."""
    if not run.data.attend_within_documents:
        return None
    split_tokens = len(dataset.train)
    later = dataset.documents[dataset.documents >= split_tokens] - split_tokens
    return later if len(later) and later[0] == 0 else np.concatenate([[0], later])


def aligned_starts(documents: np.ndarray, split_tokens: int, seq_len: int) -> np.ndarray:
    """Where a document-aligned window (data.align_to_documents) may begin in the first
    `split_tokens` tokens: at a document's start and, in a document longer than a window,
    every seq_len tokens after it, so its later parts are read too (in whole windows, never
    from the middle of one); only where seq_len + 1 tokens follow inside the split. A document
    shorter than a window is followed in it by the next ones, packed as without alignment."""
    documents = documents[documents < split_tokens]
    ends = np.append(documents[1:], split_tokens)
    chunks = np.maximum(1, -(-(ends - documents) // seq_len))  # windows to cover each document
    first_of_document = np.repeat(np.cumsum(chunks) - chunks, chunks)
    starts = np.repeat(documents, chunks) + seq_len * (np.arange(chunks.sum()) - first_of_document)
    return starts[starts + seq_len + 1 <= split_tokens]


@dataclasses.dataclass(frozen=True)
class ValidationSet:
    """The windows every evaluation scores: the same tokens each time, so two evaluations of
    one checkpoint agree bit for bit and runs compare. `starts` are window offsets into the
    validation split, `batch_size` windows per evaluation batch; `documents` where the split's
    documents begin, when tokens attend within their document."""

    starts: np.ndarray
    seq_len: int
    batch_size: int
    split_tokens: int
    target_bytes: int  # UTF-8 bytes of text the scored (target) tokens stand for
    documents: np.ndarray | None = None
    tokens: np.ndarray | None = dataclasses.field(default=None, repr=False)  # the validation split

    def batch(self, mesh, index: int) -> dict:
        return validation_batch(self.tokens, self, mesh, index)

    @property
    def batches(self) -> int:
        return len(self.starts) // self.batch_size

    @property
    def target_tokens(self) -> int:
        return len(self.starts) * self.seq_len

    def describe(self) -> str:
        where = "from the start" if self.contiguous else "spread over all"
        return (
            f"validation: {self.target_tokens:,} tokens in {len(self.starts)} fixed windows of {self.seq_len} "
            f"{where} of the {self.split_tokens:,}-token split, {self.target_bytes:,} bytes of text"
        )

    @property
    def contiguous(self) -> bool:
        return bool(np.all(np.diff(self.starts) == self.seq_len))


def validation_set(
    tokens: np.ndarray,
    token_bytes: np.ndarray,
    seq_len: int,
    batch_size: int,
    batches: int,
    documents: np.ndarray | None = None,
):
    """`batches` x `batch_size` windows of the validation split: back to back from its start
    when it is long enough (a fixed prefix), else spread evenly over all of it (overlapping);
    their tokens' documents from `documents` when given (`validation_documents`)."""
    count = batches * batch_size
    if count * seq_len + 1 <= len(tokens):
        starts = np.arange(count) * seq_len
    else:
        starts = np.linspace(0, len(tokens) - seq_len - 1, count).round().astype(np.int64)
    # bytes of each window's targets from running totals: memory in the split's length, not
    # in windows x seq_len (overlapping windows would repeat tokens)
    running = np.concatenate([[0], np.cumsum(token_bytes[tokens], dtype=np.int64)])
    target_bytes = int((running[starts + seq_len + 1] - running[starts + 1]).sum())
    return ValidationSet(starts, seq_len, batch_size, len(tokens), target_bytes, documents, tokens)


def validation_batch(tokens: np.ndarray, validation: ValidationSet, mesh, index: int):
    """Evaluation batch `index` of the fixed validation set, sharded over `mesh`."""
    from jaxgpt.sharding import global_batch

    b, t = validation.batch_size, validation.seq_len

    def rows(start: int, stop: int) -> dict:
        return windows_at(tokens, validation.starts[index * b + start : index * b + stop], t, validation.documents)

    return global_batch(mesh, rows, b)


def sharded_batch(split: TrainWindows, run, mesh, index: int, stream: int = TRAIN_STREAM) -> dict:
    """Batch `index` of a stream for `run` (a RunConfig) as arrays sharded over `mesh`'s data
    axes, cut from `split` (`train_windows`); each process reads only its own rows."""
    from jaxgpt.sharding import global_batch  # numpy-only callers of this module need no JAX

    t, seq_len = run.train, run.model.block_size

    def rows(start: int, stop: int) -> dict:
        part = slice(start, stop)
        offsets = window_offsets(len(split.tokens), seq_len, t.batch_size, t.seed, stream, index, part, split.starts)
        return windows_at(split.tokens, offsets, seq_len, split.documents)

    return global_batch(mesh, rows, t.batch_size)


def batch_sources(dataset: Dataset, run):
    """(what training batches are drawn from, the fixed validation batches) of `run` (a
    RunConfig) over `dataset`: windows of its token stream, or its pairs or conversations packed
    into rows (jaxgpt/data/pairs.py, conversations.py). Each has batch(...) giving the batch
    contract's dict, sharded."""
    t, seq_len = run.train, run.model.block_size
    if run.data.images:
        return images.batch_sources(dataset, run)
    if run.data.labelled:
        return labels.batch_sources(dataset, run)
    if run.data.examples:
        train, held_out = example_splits(dataset, run)
        token_bytes, encoder = dataset.tokenizer.token_bytes(), bool(run.model.encoder_layers)
        validation = pairs.pair_validation(held_out, token_bytes, seq_len, t.batch_size, t.eval_batches, encoder)
        left_out = train.left_out + held_out.left_out
        teacher_forced = pairs.TrainPairs(train, encoder)
        if run.train.rl:  # the model's own answers to the training conversations' questions
            from jaxgpt.data.rollouts import Rollouts

            teacher_forced = Rollouts(teacher_forced, run, dataset.tokenizer)
        return teacher_forced, dataclasses.replace(validation, left_out=left_out)
    validation = validation_set(
        dataset.val,
        dataset.tokenizer.token_bytes(),
        seq_len,
        t.batch_size,
        t.eval_batches,
        validation_documents(dataset, run),
    )
    return train_windows(dataset, run), validation


def example_splits(dataset: Dataset, run):
    """(training, validation) examples of a pairs or chat corpus (jaxgpt/data/pairs.py,
    conversations.py); one line where either split has none that fits a row."""
    seq_len = run.model.block_size
    if run.data.chat:
        train, held_out = conversations.split_conversations(dataset, seq_len, run.data.loss_on)
        what = "conversation"
    else:
        train, held_out = pairs.split_examples(dataset, seq_len)
        what = "pair"
    for split, examples in (("training", train), ("validation", held_out)):
        if not len(examples):
            raise UserError(
                f"no {split} {what} fits in model.block_size + 1 = {seq_len + 1} tokens with its separators "
                f"({examples.left_out} are longer); raise model.block_size or shorten the {what}s"
            )
    return train, held_out


def check_batches_fit(dataset: Dataset, run) -> None:
    """One line, before any state exists, where `run`'s batches cannot be cut from `dataset`:
    a split shorter than a window, or (text pairs, conversations) no example that fits a row."""
    if run.data.images:
        images.check_fits(dataset.images, run.model)
    elif run.data.labelled:
        labels.split_labelled(dataset, run.data.source, run.model.block_size)
    elif run.data.examples:
        example_splits(dataset, run)
    else:
        check_long_enough(dataset, run.model.block_size)


def check_long_enough(dataset: Dataset, seq_len: int) -> None:
    for split, tokens in (("train", dataset.train), ("val", dataset.val)):
        if len(tokens) < seq_len + 1:
            raise UserError(
                f"the {split} split has {len(tokens)} tokens, fewer than model.block_size + 1 = {seq_len + 1}; "
                "use a longer corpus, a smaller model.block_size, or another data.val_fraction"
            )


def prefetch(make: Callable[[int], object], indices: Iterable[int], depth: int = 2) -> Iterator[object]:
    """make(i) for each index, computed `depth` ahead on a host thread so the device never
    waits for numpy slicing or host-to-device copies."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def work():
        try:
            for i in indices:
                if stop.is_set():
                    return
                q.put(make(i))
        except BaseException as error:  # re-raised in the consumer
            q.put(error)
        q.put(done)

    threading.Thread(target=work, daemon=True).start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
