"""Data: read a corpus, tokenize it once into cached token files, and cut batches from them.
Three steps, a module each (and the cache's files):

  sources.py   where the text comes from (`data.source`: the built-in Python reference, local
               files, a Hugging Face Hub dataset)
  prepared.py  how it becomes cached tokens: tokenized on every core into shards, checked at
               every start, memory-mapped (`prepare` returns the `Dataset`)
  shards.py    the files it keeps: shards written whole, meta.json, the shards read as one
               stream
  batches.py   how batches are cut from them: a pure function of (seed, step), and a fixed
               validation set
  pairs.py     text pairs (a source, the target to answer it with) as examples packed into
               rows, the loss on the targets
  conversations.py  the chat template, conversations packed as pairs are, the loss on the
               assistant's turns

The names below are what the rest of jaxgpt uses; `from jaxgpt import data; data.prepare(...)`.
"""

from jaxgpt.data.batches import (
    EVAL_TRAIN_STREAM,
    TRAIN_STREAM,
    TrainWindows,
    ValidationSet,
    aligned_starts,
    batch_sources,
    check_batches_fit,
    check_long_enough,
    prefetch,
    read_windows,
    sharded_batch,
    train_windows,
    validation_batch,
    validation_documents,
    validation_set,
    window_offsets,
)
from jaxgpt.data.labels import class_names
from jaxgpt.data.pairs import PairValidation, TrainPairs
from jaxgpt.data.prepared import (
    WORKERS_ENV,
    Dataset,
    cache_folder,
    cache_root,
    prepare,
    stop_for_damage,
    tokenizing_workers,
    vocab_size_for,
)
from jaxgpt.data.shards import TokenShards
from jaxgpt.data.sources import read_documents

__all__ = [
    "EVAL_TRAIN_STREAM",
    "TRAIN_STREAM",
    "WORKERS_ENV",
    "Dataset",
    "PairValidation",
    "TokenShards",
    "TrainPairs",
    "TrainWindows",
    "ValidationSet",
    "aligned_starts",
    "batch_sources",
    "cache_folder",
    "cache_root",
    "check_batches_fit",
    "check_long_enough",
    "class_names",
    "prefetch",
    "read_windows",
    "prepare",
    "read_documents",
    "sharded_batch",
    "stop_for_damage",
    "tokenizing_workers",
    "train_windows",
    "validation_batch",
    "validation_documents",
    "validation_set",
    "window_offsets",
    "vocab_size_for",
]
