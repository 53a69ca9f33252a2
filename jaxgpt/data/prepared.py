"""How a corpus becomes cached tokens, read back by every later run.

Preparation tokenizes the documents (on every core, for a long corpus) and writes their tokens
end to end into shards of `data.shard_tokens` (uint16 when the vocabulary fits, else uint32)
under a cache folder named by a hash of (source, tokenizer, split): the last `val_fraction` of
the tokens is validation. A preparation that is killed continues from its last whole shard.
`meta.json` records what every file must be (token counts, SHA-256 taken while writing); every
start checks the sizes and the document starts, and the checksums when hashing is cheap or
asked for (a training run on a larger cache takes them in a thread). A damaged cache is moved
aside and prepared again. Later runs memory-map the shards (jaxgpt/data/shards.py).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import fcntl
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from tqdm import tqdm

from jaxgpt.config import DataConfig
from jaxgpt.data import images
from jaxgpt.data.conversations import chat_tokenizer, without_markers
from jaxgpt.data.shards import (
    PREPARATION_VERSION,
    ShardWriter,
    sha256_of,
    token_streams,
    whole_shards,
    write_meta,
    write_whole,
)
from jaxgpt.data.sources import document_texts, local_files, read_documents
from jaxgpt.errors import UserError, warn
from jaxgpt.hardware.machine import cache_root as machine_cache_root
from jaxgpt.hardware.machine import usable_cores
from jaxgpt.tokenizers import (
    HUGGING_FACE_TOKENIZER_FILES,
    is_hugging_face_folder,
    load_tokenizer,
    make_tokenizer,
    save_tokenizer,
    separator_id,
    tokenizer_from_dict,
)

# Below this many documents, starting worker processes costs more than tokenizing serially.
PARALLEL_MIN_DOCS = 5000
WORKERS_ENV = "JAXGPT_PREPARE_WORKERS"
# The token files are hashed at every start up to this size: SHA-256 runs at under a GB/s on one
# core, so a fraction of a second; larger corpora are hashed in a thread (and with verify=True).
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
    folder: Path | None = None
    checksums: BackgroundChecksums | None = None  # prepare(check_in_background=True) on a large cache

    def damage(self, wait: bool = False) -> str | None:
        """What the background checksums found wrong with the token files so far (with `wait`,
        once they are all taken), or None."""
        if self.checksums is None:
            return None
        if wait:
            self.checksums.finished.wait()
        return self.checksums.problem


class BackgroundChecksums:
    """The token files' SHA-256, taken in a daemon thread while training starts and runs: a
    corpus too large to hash before every start (CHECKSUM_ON_START_BYTES) is still checked
    once in every run, at a cost the start does not wait for. hashlib lets go of the GIL while
    it hashes a chunk, so the training loop runs on beside it (it takes one core for size /
    0.7 GB/s: about 30 s for the 20 GB of a 10B-token corpus)."""

    def __init__(self, folder: Path, shards: list[tuple[str, str]]):
        self.problem: str | None = None
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._check, args=(folder, shards), daemon=True, name="checksums")
        self._thread.start()

    def _check(self, folder: Path, shards: list[tuple[str, str]]) -> None:
        try:
            for name, digest in shards:
                if sha256_of(folder / name) != digest:
                    self.problem = f"{name}'s SHA-256 differs from the one recorded when it was written"
                    break
        except OSError as error:
            self.problem = f"{error.filename or 'a token file'} cannot be read: {error.strerror}"
        finally:
            self.finished.set()


def stop_for_damage(dataset: Dataset, problem: str, step: int) -> UserError:
    """The line a run stops with when the background checksums find damage: the folder is set
    aside, so the same command prepares the data again and resumes from the last checkpoint."""
    aside = _set_aside(dataset.folder)
    where = f"moved to {aside}" if aside else "another process moved it aside"
    return UserError(
        f"the prepared data in {dataset.folder} is damaged ({problem}), found by the checksums taken while training; "
        f"{where}. Stopped at step {step}: rerun the same command to prepare it again and resume from the last "
        "checkpoint (the steps before it read the damaged files)"
    )


def tokenizing_workers() -> int:
    """Worker processes to tokenize a long corpus on: $JAXGPT_PREPARE_WORKERS, else one per core
    this process may run on but one, since the preparing process needs a core of its own to read
    the documents and write the shards; and none below two workers, where tokenizing in-process
    is as fast (measured on 2 cores, docs/benchmarks.md "Corpus preparation": 2 workers prepared
    at 0.98-1.04x in-process when quiet and 0.70-0.99x beside one busy process; 1 worker at
    0.61-0.80x)."""
    setting = os.environ.get(WORKERS_ENV, "")
    if setting:
        if not setting.isdigit():
            raise UserError(f"{WORKERS_ENV}={setting!r} is not a worker count; set a whole number >= 0, or unset it")
        return int(setting)
    workers = usable_cores() - 1
    return workers if workers >= 2 else 0


def _encoded(texts: Iterator[str], tokenizer, separator: list[int], dtype) -> Iterator[np.ndarray]:
    """Each document's token ids followed by the separator, in order: tokenized by
    tokenizing_workers() processes once the corpus proves longer than PARALLEL_MIN_DOCS documents
    (a stream's length is unknown until it ends, so its head is read first to find out)."""
    workers = tokenizing_workers()
    head = list(itertools.islice(texts, PARALLEL_MIN_DOCS))
    if len(head) < PARALLEL_MIN_DOCS or workers < 1:
        for text in itertools.chain(head, texts):
            yield np.asarray(tokenizer.encode(text) + separator, dtype)
        return
    texts = itertools.chain(head, texts)
    # "spawn", not fork: forking a process whose JAX runtime threads are running can deadlock.
    context = multiprocessing.get_context("spawn")
    start = (tokenizer.to_dict(whole=True), separator, dtype)  # rebuilt in each worker where its source may not be
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=start) as pool:
        in_flight: collections.deque = collections.deque()
        for chunk in iter(lambda: tuple(itertools.islice(texts, 500)), ()):
            in_flight.append(pool.submit(_encode_chunk, chunk))
            if len(in_flight) > 2 * workers:  # bounded: never the whole corpus in memory
                yield from _split(*in_flight.popleft().result())
        while in_flight:
            yield from _split(*in_flight.popleft().result())


_worker_tokenizer: tuple = ()  # (tokenizer, separator, dtype) in a tokenizing worker process


def _start_worker(tokenizer_dict: dict, separator: list[int], dtype) -> None:
    global _worker_tokenizer
    # Ctrl-C reaches the terminal's whole process group: the preparing process answers it (and
    # its workers end with it), so a worker printing a KeyboardInterrupt of its own adds nothing.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_tokenizer = (tokenizer_from_dict(tokenizer_dict), separator, dtype)


def _encode_chunk(texts: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The chunk's documents as one array and each one's length: one buffer to send back. As a
    list of lists of Python ints, unpickling and converting them cost the receiving process about
    a fifth of the worker's tokenizing time; as one array, next to nothing."""
    tokenizer, separator, dtype = _worker_tokenizer
    ids = [tokenizer.encode(text) + separator for text in texts]
    return np.fromiter(itertools.chain.from_iterable(ids), dtype), np.array([len(doc) for doc in ids])


def _split(tokens: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(tokens, np.cumsum(lengths)[:-1])


def cache_root(config: DataConfig) -> Path:
    return (Path(config.cache_dir) if config.cache_dir else machine_cache_root()) / "data"


def _fingerprint(config: DataConfig, tokenizer=None) -> str:
    """Names the prepared data: same inputs, same folder; any change, a new one. A `tokenizer`
    given in place of the one data.tokenizer names is named by itself."""
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
        key["files"] = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in local_files(rest)]
    if kind in ("pairs", "chat", "prompts", "labels") and Path(rest).is_file():
        key["files"] = [(rest, Path(rest).stat().st_size, Path(rest).stat().st_mtime_ns)]
    if kind == "builtin":  # pydoc_data differs between Python versions
        key["python"] = sys.version.split()[0]
    folder = Path(config.tokenizer)
    if tokenizer is not None:
        key["tokenizer_given"] = hashlib.sha256(json.dumps(tokenizer.to_dict(), sort_keys=True).encode()).hexdigest()
    elif (folder / "tokenizer.json").is_file():  # a tokenizer folder: trained again in place, it tokenizes anew
        key["tokenizer_sha256"] = sha256_of(folder / "tokenizer.json")
        if is_hugging_face_folder(folder):  # its end-of-text id and rows are read from the files beside it
            beside = [folder / name for name in HUGGING_FACE_TOKENIZER_FILES if (folder / name).is_file()]
            key["hugging_face"] = {path.name: sha256_of(path) for path in beside}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def prepare(
    config: DataConfig, progress: bool = True, verify: bool = False, check_in_background: bool = False, tokenizer=None
) -> Dataset:
    """Tokenize the corpus once (or reuse the cached result, checked) and memory-map it.
    `verify` hashes the token files whatever their size; `check_in_background` hashes those
    too large to hash at the start (CHECKSUM_ON_START_BYTES) in a thread (Dataset.damage says
    what it found), as training does. `tokenizer` replaces the one data.tokenizer names (a
    resumed run's own, where that one changed: jaxgpt/job/resume.py). An image source has no
    tokens to cache: its images are read as they are (jaxgpt/data/images.py)."""
    if config.images:
        return images.prepare(config)
    folder = cache_folder(config, tokenizer)
    problem = cache_problem(folder, verify) if folder.exists() else None
    if problem:
        aside = _set_aside(folder)
        where = f"moved to {aside}" if aside else "another process moved it aside"
        warn(f"the prepared data in {folder} is damaged ({problem}); {where}, preparing it again")
    written_now = not folder.exists()  # hashed as written, or by the check below
    if written_now:
        try:
            built = _build(config, folder, progress, tokenizer)
        except Exception as error:  # after damage: the source may be gone, the network down, ...
            if not problem:
                raise
            raise UserError(
                f"the prepared data in {folder} was damaged ({problem}) and preparing it again failed "
                f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); make {config.source} readable "
                "again and rerun, which prepares it afresh"
            ) from None
        # Another process prepared the same data first: its files are checked in full.
        if not built and (problem := cache_problem(folder, verify=True)):
            raise UserError(f"the prepared data in {folder}, just written by another process, is damaged ({problem})")
    meta = json.loads((folder / "meta.json").read_text())
    train, val = token_streams(folder, meta)
    documents = np.fromfile(folder / "documents.bin", np.int64)
    dataset = Dataset(load_tokenizer(folder / "tokenizer.json"), train, val, documents, folder)
    hashed = verify or written_now or meta["tokens"] * np.dtype(meta["dtype"]).itemsize <= CHECKSUM_ON_START_BYTES
    if check_in_background and not hashed:
        dataset.checksums = BackgroundChecksums(folder, [(shard["file"], shard["sha256"]) for shard in meta["shards"]])
    return dataset


def cache_folder(config: DataConfig, tokenizer=None) -> Path:
    """Where `config`'s prepared data lives: named by the source, the tokenizer and a hash of
    everything that changes the tokens (`tokenizer`: prepare's)."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in config.source)[:40]
    return cache_root(config) / f"{slug}-{Path(config.tokenizer).name or 'bpe'}-{_fingerprint(config, tokenizer)}"


def cache_problem(folder: Path, verify: bool = False) -> str | None:
    """What is wrong with a prepared-data folder, in a few words, or None when it is whole:
    its metadata readable, each token file the size it records, the document starts and the
    tokenizer there, and (when the files are small or `verify`) each token file's SHA-256 the
    one taken as it was written."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        itemsize, total = np.dtype(meta["dtype"]).itemsize, meta["tokens"]
        shards = [(shard["file"], shard["tokens"], shard["sha256"]) for shard in meta["shards"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"meta.json cannot be read: {type(error).__name__}: {error}"
    if (held := sum(count for _, count, _ in shards)) != total:
        return f"meta.json says {total:,} tokens but its token files hold {held:,}"
    for name, count, _ in shards:
        size = (folder / name).stat().st_size if (folder / name).exists() else None
        if size != count * itemsize:
            found = "is missing" if size is None else f"has {size:,} bytes"
            return f"{name} {found}; meta.json records {count:,} tokens = {count * itemsize:,} bytes"
    documents = folder / "documents.bin"
    starts_size = documents.stat().st_size if documents.exists() else None
    if starts_size != 8 * meta.get("documents", -1):
        found = "is missing" if starts_size is None else f"has {starts_size:,} bytes"
        return f"documents.bin {found}; meta.json records {meta.get('documents')} documents"
    starts = np.fromfile(documents, np.int64)  # 8 bytes a document: read whole at every start anyway
    if len(starts) and (starts[0] != 0 or starts[-1] >= total or np.any(np.diff(starts) < 0)):
        return f"documents.bin does not hold document starts (rising from 0, each below the {total:,} tokens)"
    if "documents_sha256" in meta and sha256_of(documents) != meta["documents_sha256"]:  # caches since 2026-11
        return "documents.bin's SHA-256 differs from the one recorded when it was written"
    try:
        load_tokenizer(folder / "tokenizer.json")
    except Exception as error:  # garbage JSON, a missing key, a missing file
        return f"tokenizer.json cannot be read: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    if verify or total * itemsize <= CHECKSUM_ON_START_BYTES:
        for name, _, digest in shards:
            if sha256_of(folder / name) != digest:
                return f"{name}'s SHA-256 differs from the one recorded when it was written"
    return None


def _set_aside(folder: Path) -> Path | None:
    """Move a damaged folder out of the way under a name no other process can be using."""
    aside = Path(tempfile.mkdtemp(prefix=f"{folder.name}.damaged-", dir=folder.parent))
    try:
        folder.rename(aside / folder.name)
    except FileNotFoundError:  # another process found the damage first
        aside.rmdir()
        return None
    return aside


def _build(config: DataConfig, folder: Path, progress: bool, given=None) -> bool:
    """Prepare into a staging folder beside `folder`, a shard at a time, then rename it into
    place, so no half-written cache is ever read. The staging folder's name is fixed: a
    preparation that was killed is continued by the next from its last whole shard, reading
    the source from the first document not yet written, and ends with the same files an
    uninterrupted one writes. A lock keeps a second process from writing it at the same time
    (it waits, then finds the work done). False when another process prepared it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".preparing-{folder.name}"
    staging.mkdir(exist_ok=True)
    with open(staging / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if folder.exists():  # the process this one waited for prepared it
            shutil.rmtree(staging, ignore_errors=True)
            return False
        docs, count = read_documents(config, progress)
        try:
            tokenizer = _staged_tokenizer(config, staging, docs, given)
            dtype = _token_dtype(tokenizer)
            separator = [separator_id(tokenizer)]
            shards = whole_shards(staging, np.dtype(dtype).itemsize)
            if not config.max_tokens or sum(shard["tokens"] for shard in shards) < config.max_tokens:
                _write_shards(config, staging, shards, (docs, count), tokenizer, separator, dtype, progress)
            write_meta(config, staging, shards, dtype, len(separator))
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise _out_of_space(config, staging) from None
        (staging / "lock").unlink()
        staging.rename(folder)
    return True


def _token_dtype(tokenizer):
    return np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32


def _out_of_space(config: DataConfig, staging: Path) -> UserError:
    """The line for a disk that filled while preparing: the whole shards stay (the same command
    continues from them once there is room), the one cut short goes, and the user learns how
    much the folder holds and how to give it back."""
    tokenizer = staging / "tokenizer.json"
    whole = (
        whole_shards(staging, np.dtype(_token_dtype(load_tokenizer(tokenizer))).itemsize) if tokenizer.exists() else []
    )
    kept = sum(p.stat().st_size for p in staging.iterdir() if p.is_file())
    return UserError(
        f"the disk filled while preparing {config.source}: {len(whole)} whole shard(s), {kept / 2**20:,.0f} MiB, "
        f"are kept in {staging}. Free space (or set data.cache_dir to a larger disk) and rerun the same command to "
        "continue from them, or delete that folder to give its space back"
    )


def _staged_tokenizer(config: DataConfig, staging: Path, docs, given=None):
    """The tokenizer (`given`, or the one data.tokenizer names), saved in the staging folder
    first: the character vocabulary of a corpus is read from the corpus once, not again when a
    preparation resumes."""
    path = staging / "tokenizer.json"
    if path.exists():
        return load_tokenizer(path)
    if given is not None:
        tokenizer = given
    elif config.tokenizer == "char":  # the vocabulary is the corpus's character set
        characters = set("\n")
        for text in document_texts(docs):
            characters.update(without_markers(text) if config.chat else text)
        tokenizer = make_tokenizer("char", "".join(characters))
    else:
        tokenizer = make_tokenizer(config.tokenizer)
    if config.chat:  # the template's markers, one token each after the vocabulary
        tokenizer = chat_tokenizer(tokenizer)
    write_whole(path, partial(save_tokenizer, tokenizer))
    return tokenizer


LINE_SECONDS = 30  # between progress lines where stderr is not a terminal (a log file, a notebook's output)


def _write_shards(config: DataConfig, staging: Path, shards: list[dict], corpus, tokenizer, separator, dtype, progress):
    """Tokenize the documents after those in `shards` and append shards of config.shard_tokens
    tokens (a shard ends after the document that fills it), each recorded once it is whole.
    `corpus`: read_documents' (documents, count)."""
    docs, count = corpus
    skipped = sum(shard["documents"] for shard in shards)
    total = sum(shard["tokens"] for shard in shards)
    by_tokens = bool(config.max_tokens)  # then the size is known in tokens, and the bar counts them
    desc = f"tokenizing {config.source}" + (f", from shard {len(shards)}" if shards else "")
    size, unit = config.max_tokens or count, "token" if by_tokens else "doc"
    bar = tqdm(
        total=size,
        initial=total if by_tokens else skipped,
        desc=desc,
        unit=unit,
        unit_scale=by_tokens,
        disable=None if progress else True,  # None: no bar where stderr is a file or a pipe...
    )
    lines = progress and bar.disable  # ...but a line every LINE_SECONDS there instead, and at the end
    begun, written, last_line = time.perf_counter(), 0, time.perf_counter()

    def describe(final: bool = False) -> None:  # the count the bar does not keep, and the rate in tokens
        nonlocal last_line
        done = f"{skipped + writer.documents:,} docs" if by_tokens else f"{total:,} tokens"
        rate = written / max(time.perf_counter() - begun, 1e-9)
        bar.set_postfix_str(f"{done}, {rate:,.0f} tokens/s", refresh=False)
        if lines and (final or time.perf_counter() - last_line >= LINE_SECONDS):
            counted = f"{total:,}" if by_tokens else f"{skipped + writer.documents:,}"
            of = f"/{size:,}" if size else ""
            print(f"{desc}: {counted}{of} {unit}s, {done}, {rate:,.0f} tokens/s", file=sys.stderr, flush=True)
            last_line = time.perf_counter()

    writer = ShardWriter(staging, len(shards), total)
    for ids in _encoded(document_texts(docs, skipped), tokenizer, separator, dtype):
        ids = ids[: config.max_tokens - total] if config.max_tokens else ids
        writer.add(ids, len(separator))
        total, written = total + len(ids), written + len(ids)
        if (skipped + writer.documents) % 256 == 0:
            describe()
        bar.update(len(ids) if by_tokens else 1)
        if config.max_tokens and total >= config.max_tokens:
            break
        if writer.tokens >= config.shard_tokens:
            shards.append(writer.close())
            skipped += shards[-1]["documents"]
            writer = ShardWriter(staging, len(shards), total)
    describe(final=True)
    bar.close()
    if writer.tokens:
        shards.append(writer.close())
    else:
        writer.discard()


def vocab_size_for(config) -> int | None:
    """The tokenizer's vocabulary size where the config leaves model.vocab_size unset (None
    where it is set). Building the tokenizer may need the data (a char vocabulary is the
    corpus's characters); where that fails, one line says how to check without it."""
    if config.model.get("vocab_size"):
        return None
    try:
        data_config = config.data if isinstance(config.data, DataConfig) else DataConfig(**config.data.to_dict())
        return prepare(data_config, progress=False).tokenizer.vocab_size
    except Exception as error:  # noqa: BLE001 (any failure to reach the data means the same fix)
        first_line = (str(error) or type(error).__name__).splitlines()[0]
        raise UserError(
            f"the vocabulary size comes from the data, which could not be read ({first_line}); "
            "check without it by setting --config.model.vocab_size=N"
        ) from None
