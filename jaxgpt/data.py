"""Data: read a corpus, tokenize it once into a flat token file, and cut batches from it.

Sources (`data.source`):
  builtin:python-docs  the Python language reference shipped inside CPython (`pydoc_data`),
                       ~465 KB of English: the offline default.
  text:PATH            a file, a directory, or a glob: .jsonl and .parquet files are read as
                       records, any other file as UTF-8 text (one document per file), with
                       `datasets`' local builders.
  hf:NAME[:CONFIG]     a Hugging Face Hub dataset, streamed, using its text column.

Preparation writes every document's tokens end to end into `tokens.bin` (uint16 when the
vocabulary fits, else uint32) under a cache folder named by a hash of (source, tokenizer,
split): the last `val_fraction` of the tokens is validation. Later runs memory-map it.
`meta.json` records what the file must be (token count, byte size, SHA-256 taken while
writing); every run checks the size, and the checksum when hashing is cheap or asked for. A
damaged cache is moved aside and prepared again.

Batches are a pure function of (seed, step): a resumed run sees exactly the batches it would
have seen, with no iterator state to save.
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import glob
import hashlib
import itertools
import json
import multiprocessing
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from tqdm import tqdm

from jaxgpt.config import DataConfig
from jaxgpt.config import cache_root as config_cache_root
from jaxgpt.errors import UserError, warn
from jaxgpt.tokenizers import load_tokenizer, make_tokenizer, save_tokenizer, tokenizer_from_dict

# Files read as records; any other file is read as plain UTF-8 text, one document per file.
STRUCTURED_SUFFIXES = {".jsonl": "json", ".parquet": "parquet"}
# Below this many documents, starting worker processes costs more than tokenizing serially.
PARALLEL_MIN_DOCS = 5000
# bump when the token file format or splitting changes (2: meta.json records a checksum;
# 3: documents.bin records where each document begins)
PREPARATION_VERSION = 3
# tokens.bin is hashed at every start up to this size: SHA-256 ran at 0.74 GB/s on the 2-core
# EPYC this was written on, so at most ~0.2 s; larger corpora are hashed with verify=True.
CHECKSUM_ON_START_BYTES = 128 << 20


@dataclasses.dataclass
class Dataset:
    """A prepared corpus: its tokenizer, the train/validation token streams (memory-mapped),
    and where each document begins in the whole stream (the separator token before it, 0 for
    the first: a window aligned to a document reads the separator, then predicts its start)."""

    tokenizer: object
    train: np.ndarray
    val: np.ndarray
    documents: np.ndarray


# ----------------------------------------------------------------------------- reading


def read_documents(config: DataConfig, progress: bool = True) -> tuple[Iterable[str], int | None]:
    """The corpus, with its number of documents when known: a list or stream of strings, or
    (local files) a `datasets.Dataset` with a "text" column."""
    kind, _, rest = config.source.partition(":")
    if kind == "builtin" and rest == "python-docs":
        from pydoc_data.topics import topics

        docs = [topics[name] for name in sorted(topics)]
        return docs, len(docs)
    if kind == "text" and rest:
        return _read_local(rest, config.text_column, progress)
    if kind == "hf" and rest:
        return _read_hub(rest, config.text_column), None
    raise UserError(
        f"unknown data.source {config.source!r}; use builtin:python-docs, text:PATH (file, directory or glob) "
        "or hf:NAME[:CONFIG]"
    )


def _local_files(pattern: str) -> list[Path]:
    path = Path(pattern).expanduser()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    else:
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise UserError(f"data.source text:{pattern}: no such file, directory or glob match")
    if not files:
        raise UserError(f"data.source text:{pattern}: the directory holds no files")
    return files


def _check_is_text(path: Path, probe_bytes: int = 1 << 20) -> None:
    """A file read as plain text must be UTF-8 (judged by its first MiB, whatever its name):
    a binary file would otherwise fail deep inside datasets without naming itself."""
    with open(path, "rb") as f:
        head = f.read(probe_bytes)
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < probe_bytes)
        binary = b"\0" in head
    except UnicodeDecodeError:
        binary = True
    if binary:
        raise UserError(
            f"{path} is not UTF-8 text; data.source text: reads text files (any name), .jsonl and .parquet. "
            "Remove it from the source or point the source at the text alone"
        )


def _first_bad_json_line(files: list[str]) -> str | None:
    """'file line N: problem' for the first line of a .jsonl file that is not a JSON object."""
    for name in files:
        with open(name, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    if not isinstance(json.loads(line), dict):
                        return f"{name} line {number}: not a JSON object"
                except ValueError as error:
                    return f"{name} line {number}: {error}"
    return None


def _read_local(pattern: str, text_column: str, progress: bool) -> tuple[Iterable[str], int]:
    import datasets

    # datasets draws its own bars ("Generating train split"); --quiet silences them too.
    datasets.enable_progress_bars() if progress else datasets.disable_progress_bars()
    builders: dict[str, list[str]] = {}
    for f in _local_files(pattern):
        builder = STRUCTURED_SUFFIXES.get(f.suffix, "text")
        if builder == "text":
            _check_is_text(f)
        builders.setdefault(builder, []).append(str(f))
    parts = []
    for builder, data_files in builders.items():
        options = {"sample_by": "document"} if builder == "text" else {}
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # the failure is reported below, once
        try:
            part = datasets.load_dataset(builder, data_files=data_files, split="train", **options)
        except Exception as error:  # datasets raises many types for unreadable files
            if builder == "json" and (bad_line := _first_bad_json_line(data_files)):
                raise UserError(f"could not read {bad_line}; fix or remove that line") from None
            files = ", ".join(data_files[:3])
            raise UserError(f"could not read {files} ({_cause(error)}); fix or remove that file") from None
        finally:
            datasets.logging.set_verbosity(verbosity)
        if text_column not in part.column_names:
            raise UserError(
                f"{data_files[0]} has no column {text_column!r} (columns: {', '.join(part.column_names)}); "
                "set data.text_column"
            )
        part = part.select_columns([text_column])
        parts.append(part if text_column == "text" else part.rename_column(text_column, "text"))
    corpus = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    return corpus, len(corpus)


def _cause(error: BaseException) -> str:
    """The innermost message of a chained exception ("An error occurred while generating
    the dataset" says nothing; what caused it does)."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def _texts(docs) -> Iterator[str]:
    if hasattr(docs, "column_names"):  # a datasets.Dataset: read its column in slices
        for start in range(0, len(docs), 1000):
            yield from docs[start : start + 1000]["text"]
    else:
        yield from docs


def _encoded(docs, count: int | None, tokenizer, separator: list[int]) -> Iterator[list[int]]:
    """Each document's token ids followed by the separator; a large local corpus is
    tokenized by one worker process per core, in order."""
    workers = os.cpu_count() or 1
    if (count or 0) < PARALLEL_MIN_DOCS or workers < 2:
        for text in _texts(docs):
            yield tokenizer.encode(text) + separator
        return
    # "spawn", not fork: forking a process whose JAX runtime threads are running can deadlock.
    encode = partial(_encode_chunk, tokenizer.to_dict(), separator)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        in_flight: collections.deque = collections.deque()
        texts = _texts(docs)
        for chunk in iter(lambda: tuple(itertools.islice(texts, 500)), ()):
            in_flight.append(pool.submit(encode, chunk))
            if len(in_flight) > 2 * workers:  # bounded: never the whole corpus in memory
                yield from in_flight.popleft().result()
        while in_flight:
            yield from in_flight.popleft().result()


def _encode_chunk(tokenizer_dict: dict, separator: list[int], texts: tuple[str, ...]) -> list[list[int]]:
    tokenizer = tokenizer_from_dict(tokenizer_dict)
    return [tokenizer.encode(text) + separator for text in texts]


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _read_hub(spec: str, text_column: str) -> Iterator[str]:
    import datasets
    import huggingface_hub.constants

    name, _, subset = spec.partition(":")
    if not _hub_reachable():
        # Without this, datasets retries the network for ~20 s before failing; offline mode
        # fails at once, or reads the local Hub cache if the dataset was fetched before.
        datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        stream = datasets.load_dataset(name, subset or None, split="train", streaming=True)
    except (ConnectionError, OSError) as error:
        raise UserError(
            f"cannot load hf:{spec} ({str(error).splitlines()[0]}); offline, download it where you have a network "
            "(datasets.load_dataset(...).to_json('corpus.jsonl')) and use data.source=text:corpus.jsonl"
        ) from None
    except Exception as error:  # unknown names, bad configs: datasets' own message says which
        raise UserError(f"cannot load hf:{spec}: {str(error).splitlines()[0]}") from None
    for example in stream:
        if text_column not in example:
            raise UserError(f"hf:{spec} has no column {text_column!r} ({', '.join(example)}); set data.text_column")
        yield example[text_column]


# ----------------------------------------------------------------------------- preparing


def cache_root(config: DataConfig) -> Path:
    return (Path(config.cache_dir) if config.cache_dir else config_cache_root()) / "data"


def _fingerprint(config: DataConfig) -> str:
    """Names the prepared data: same inputs, same folder; any change, a new one."""
    key = {
        "version": PREPARATION_VERSION,
        "source": config.source,
        "tokenizer": config.tokenizer,
        "val_fraction": config.val_fraction,
        "text_column": config.text_column,
        "max_tokens": config.max_tokens,
    }
    kind, _, rest = config.source.partition(":")
    if kind == "text":  # local files can change under the same name
        key["files"] = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in _local_files(rest)]
    if kind == "builtin":  # pydoc_data differs between Python versions
        key["python"] = sys.version.split()[0]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def prepare(config: DataConfig, progress: bool = True, verify: bool = False) -> Dataset:
    """Tokenize the corpus once (or reuse the cached result, checked) and memory-map it.
    `verify` hashes the token file whatever its size."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in config.source)[:40]
    folder = cache_root(config) / f"{slug}-{config.tokenizer}-{_fingerprint(config)}"
    problem = cache_problem(folder, verify) if folder.exists() else None
    if problem:
        aside = _set_aside(folder)
        where = f"moved to {aside}" if aside else "another process moved it aside"
        warn(f"the prepared data in {folder} is damaged ({problem}); {where}, preparing it again")
    if not folder.exists():
        try:
            built = _build(config, folder, progress)
        except Exception as error:  # after damage: the source may be gone, the network down, ...
            if not problem:
                raise
            raise UserError(
                f"the prepared data in {folder} was damaged ({problem}) and preparing it again failed "
                f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); make {config.source} readable "
                "again and rerun, which prepares it afresh"
            ) from None
        # Another process prepared the same data first: its file is checked in full.
        if not built and (problem := cache_problem(folder, verify=True)):
            raise UserError(f"the prepared data in {folder}, just written by another process, is damaged ({problem})")
    meta = json.loads((folder / "meta.json").read_text())
    tokens = np.memmap(folder / "tokens.bin", dtype=meta["dtype"], mode="r")
    split = meta["train_tokens"]
    documents = np.fromfile(folder / "documents.bin", np.int64)
    return Dataset(load_tokenizer(folder / "tokenizer.json"), tokens[:split], tokens[split:], documents)


def cache_problem(folder: Path, verify: bool = False) -> str | None:
    """What is wrong with a prepared-data folder, in a few words, or None when it is whole:
    its metadata readable, the token file the size it records, the tokenizer loadable, and
    (when the file is small or `verify`) the token file's SHA-256 the one taken as it was written."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        expected = meta["tokens"] * np.dtype(meta["dtype"]).itemsize, meta["bytes"], meta["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"meta.json cannot be read: {type(error).__name__}: {error}"
    if expected[0] != expected[1]:
        return f"meta.json says {meta['tokens']:,} {meta['dtype']} tokens but {expected[1]:,} bytes"
    path = folder / "tokens.bin"
    size = path.stat().st_size if path.exists() else None
    if size != meta["bytes"]:
        found = "is missing" if size is None else f"has {size:,} bytes"
        return f"tokens.bin {found}; meta.json records {meta['tokens']:,} tokens = {meta['bytes']:,} bytes"
    documents = folder / "documents.bin"
    starts_size = documents.stat().st_size if documents.exists() else None
    if starts_size != 8 * meta.get("documents", -1):
        found = "is missing" if starts_size is None else f"has {starts_size:,} bytes"
        return f"documents.bin {found}; meta.json records {meta.get('documents')} documents"
    try:
        load_tokenizer(folder / "tokenizer.json")
    except Exception as error:  # garbage JSON, a missing key, a missing file
        return f"tokenizer.json cannot be read: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    if (verify or size <= CHECKSUM_ON_START_BYTES) and _sha256(path) != meta["sha256"]:
        return "tokens.bin's SHA-256 differs from the one recorded when it was written"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _set_aside(folder: Path) -> Path | None:
    """Move a damaged folder out of the way under a name no other process can be using."""
    aside = Path(tempfile.mkdtemp(prefix=f"{folder.name}.damaged-", dir=folder.parent))
    try:
        folder.rename(aside / folder.name)
    except FileNotFoundError:  # another process found the damage first
        aside.rmdir()
        return None
    return aside


def _build(config: DataConfig, folder: Path, progress: bool) -> bool:
    """Write tokens.bin, tokenizer.json and meta.json into a temp folder, then rename it into
    place: an interrupted preparation leaves no half-written cache behind. False when another
    process renamed its own into place first (theirs is kept)."""
    docs, count = read_documents(config, progress)
    if config.tokenizer == "char":  # the vocabulary is the corpus's character set
        characters = set("\n")
        for text in _texts(docs):
            characters.update(text)
        tokenizer = make_tokenizer("char", "".join(characters))
    else:
        tokenizer = make_tokenizer(config.tokenizer)
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    separator = [tokenizer.eot_id] if tokenizer.eot_id is not None else tokenizer.encode("\n")

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".preparing-", dir=folder.parent))
    total = 0
    digest = hashlib.sha256()  # taken while writing: checking the file later costs no second read here
    starts = []  # per document, where a window aligned to it begins
    encoded = _encoded(docs, count, tokenizer, separator)
    bar = tqdm(encoded, total=count, desc=f"tokenizing {config.source}", unit="doc", disable=not progress)
    with open(staging / "tokens.bin", "wb") as out:
        for doc_ids in bar:
            starts.append(max(total - len(separator), 0))
            ids = np.asarray(doc_ids, dtype)
            if config.max_tokens:
                ids = ids[: config.max_tokens - total]
            chunk = ids.tobytes()
            out.write(chunk)
            digest.update(chunk)
            total += len(ids)
            if config.max_tokens and total >= config.max_tokens:
                break
    bar.close()
    if total == 0 or total == len(separator) * (count or 0):
        shutil.rmtree(staging)
        raise UserError(f"data.source {config.source!r} holds no text; point it at a non-empty corpus")
    val = max(1, int(total * config.val_fraction))
    save_tokenizer(tokenizer, staging / "tokenizer.json")
    np.asarray(starts, np.int64).tofile(staging / "documents.bin")
    meta = {"source": config.source, "tokenizer": config.tokenizer, "version": PREPARATION_VERSION}
    meta |= {"dtype": np.dtype(dtype).name, "tokens": total, "train_tokens": total - val, "val_tokens": val}
    meta |= {"bytes": total * np.dtype(dtype).itemsize, "sha256": digest.hexdigest(), "documents": len(starts)}
    (staging / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
        staging.rename(folder)
    except OSError:  # another process prepared the same data first: keep theirs
        shutil.rmtree(staging, ignore_errors=True)
        return False
    return True


# ----------------------------------------------------------------------------- batching

TRAIN_STREAM, EVAL_TRAIN_STREAM = 0, 2  # stream 1 was random validation windows, now fixed ones


def batch_at(
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int,
    seed: int,
    stream: int,
    index: int,
    rows: slice = slice(None),
    starts: np.ndarray | None = None,
) -> np.ndarray:
    """Batch number `index` of a stream: (batch_size, seq_len + 1) int32 windows at random
    offsets drawn from (seed, stream, index) alone: anywhere, or among `starts` when given
    (aligned_starts). Inputs are [:, :-1], targets [:, 1:]. `rows` reads only part of the batch
    (one process's share): the offsets of the whole batch are drawn, so every process agrees on
    them, but only those rows are read."""
    rng = np.random.default_rng([seed, stream, index])
    if starts is None:
        offsets = rng.integers(0, len(tokens) - seq_len, size=batch_size)[rows]
    else:
        offsets = starts[rng.integers(0, len(starts), size=batch_size)[rows]]
    return np.stack([tokens[s : s + seq_len + 1] for s in offsets]).astype(np.int32)


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
    validation split, `batch_size` windows per evaluation batch."""

    starts: np.ndarray
    seq_len: int
    batch_size: int
    split_tokens: int
    target_bytes: int  # UTF-8 bytes of text the scored (target) tokens stand for

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


def validation_set(tokens: np.ndarray, token_bytes: np.ndarray, seq_len: int, batch_size: int, batches: int):
    """`batches` x `batch_size` windows of the validation split: back to back from its start
    when it is long enough (a fixed prefix), else spread evenly over all of it (overlapping)."""
    count = batches * batch_size
    if count * seq_len + 1 <= len(tokens):
        starts = np.arange(count) * seq_len
    else:
        starts = np.linspace(0, len(tokens) - seq_len - 1, count).round().astype(np.int64)
    # bytes of each window's targets from running totals: memory in the split's length, not
    # in windows x seq_len (overlapping windows would repeat tokens)
    running = np.concatenate([[0], np.cumsum(token_bytes[tokens], dtype=np.int64)])
    target_bytes = int((running[starts + seq_len + 1] - running[starts + 1]).sum())
    return ValidationSet(starts, seq_len, batch_size, len(tokens), target_bytes)


def validation_batch(tokens: np.ndarray, validation: ValidationSet, mesh, index: int):
    """Evaluation batch `index` of the fixed validation set, sharded over `mesh`."""
    from jaxgpt.sharding import global_batch

    b, t = validation.batch_size, validation.seq_len

    def rows(start: int, stop: int) -> np.ndarray:
        starts = validation.starts[index * b + start : index * b + stop]
        return np.stack([tokens[s : s + t + 1] for s in starts]).astype(np.int32)

    return global_batch(mesh, rows, b)


def sharded_batch(tokens: np.ndarray, run, mesh, index: int, stream: int = TRAIN_STREAM, starts=None):
    """Batch `index` of a stream for `run` (a RunConfig) as one array sharded over `mesh`'s
    data axes, windows at `starts` when given; each process reads only its own rows."""
    from jaxgpt.sharding import global_batch  # numpy-only callers of this module need no JAX

    t = run.train

    def rows(start: int, stop: int) -> np.ndarray:
        part = slice(start, stop)
        return batch_at(tokens, run.model.block_size, t.batch_size, t.seed, stream, index, part, starts)

    return global_batch(mesh, rows, t.batch_size)


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
