"""The files of a prepared corpus, and nothing about where its text came from: shards of tokens
written whole (each durable and recorded before the next begins, so a killed preparation keeps
every shard it finished), `meta.json` joining them (token counts, SHA-256 taken while writing,
where each document begins), and the shards read back as one stream (`TokenShards`).
jaxgpt/data/prepared.py decides what to write and checks what it finds."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxgpt.config import DataConfig
from jaxgpt.errors import UserError

# bump when the token file format or splitting changes (2: meta.json records a checksum;
# 3: documents.bin records where each document begins; 4: the tokens are in shards)
PREPARATION_VERSION = 4
SHARD_FILES = ("tokens", "starts", "record")  # per shard: its tokens, its documents' starts, its record


def shard_name(index: int, kind: str) -> str:
    return f"{kind}-{index:05d}.{'json' if kind == 'record' else 'bin'}"


def write_whole(path: Path, write: Callable[[Path], None]) -> None:
    """write(a path beside `path`), then rename it to `path`: a kill leaves it whole or absent."""
    beside = path.with_name(path.name + ".partial")
    write(beside)
    os.replace(beside, path)


class ShardWriter:
    """One shard being written: its tokens, their SHA-256 taken while writing (checking the
    file later needs no second read here), and where each of its documents begins in the
    whole stream (the separator before it, 0 for the first document)."""

    def __init__(self, staging: Path, index: int, offset: int):
        self.staging, self.index, self.offset = staging, index, offset
        self.path = staging / shard_name(index, "tokens")
        self.file = open(self.path, "wb")
        self.digest = hashlib.sha256()
        self.starts: list[int] = []
        self.tokens = 0

    @property
    def documents(self) -> int:
        return len(self.starts)

    def add(self, ids: np.ndarray, separator_length: int) -> None:
        self.starts.append(max(self.offset + self.tokens - separator_length, 0))
        chunk = ids.tobytes()
        self.file.write(chunk)
        self.digest.update(chunk)
        self.tokens += len(ids)

    def close(self) -> dict:
        """Make the shard durable, then record it: the record's presence says it is whole."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        np.asarray(self.starts, np.int64).tofile(self.staging / shard_name(self.index, "starts"))
        record = {"file": self.path.name, "tokens": self.tokens, "documents": self.documents}
        record["sha256"] = self.digest.hexdigest()
        write_whole(self.staging / shard_name(self.index, "record"), lambda path: path.write_text(json.dumps(record)))
        return record

    def discard(self) -> None:
        self.file.close()
        self.path.unlink()


def whole_shards(staging: Path, itemsize: int) -> list[dict]:
    """The shards a killed preparation finished, in order (each has its record, written last),
    with everything after them removed: the shard it was writing is written again."""
    shards = []
    while (record := staging / shard_name(len(shards), "record")).exists():
        shard = json.loads(record.read_text())
        if (staging / shard["file"]).stat().st_size != shard["tokens"] * itemsize:
            break
        shards.append(shard)
    keep = {"lock", "tokenizer.json"} | {shard_name(i, k) for i in range(len(shards)) for k in SHARD_FILES}
    for path in staging.iterdir():
        if path.name not in keep:
            path.unlink()
    return shards


def write_meta(config: DataConfig, staging: Path, shards: list[dict], dtype, separator_length: int) -> None:
    """Join the shards' document starts, split off validation, and write meta.json."""
    total = sum(shard["tokens"] for shard in shards)
    documents = sum(shard["documents"] for shard in shards)
    if total == documents * separator_length:  # nothing but separators (or nothing at all)
        shutil.rmtree(staging)
        raise UserError(f"data.source {config.source!r} holds no text; point it at a non-empty corpus")
    starts_digest = hashlib.sha256()
    with open(staging / "documents.bin", "wb") as out:
        for index in range(len(shards)):
            starts = (staging / shard_name(index, "starts")).read_bytes()
            out.write(starts)
            starts_digest.update(starts)
            (staging / shard_name(index, "starts")).unlink()
            (staging / shard_name(index, "record")).unlink()
    val = max(1, int(total * config.val_fraction))
    meta = {"source": config.source, "tokenizer": config.tokenizer, "version": PREPARATION_VERSION}
    meta |= {"dtype": np.dtype(dtype).name, "tokens": total, "train_tokens": total - val, "val_tokens": val}
    meta |= {"documents": documents, "documents_sha256": starts_digest.hexdigest()}
    meta |= {"shards": [{k: s[k] for k in ("file", "tokens", "sha256")} for s in shards]}
    (staging / "meta.json").write_text(json.dumps(meta, indent=1))


class TokenShards:
    """Memory-mapped token files read as one stream: `len`, slices (a window that crosses from
    one file into the next reads as from a single file) and `np.asarray`, which is what
    batches and evaluation use, over tokens [start, stop) of the files end to end. Only the
    windows read are loaded, so a corpus larger than memory trains."""

    def __init__(self, shards: list[np.ndarray], start: int, stop: int):
        self.shards, self.start, self.stop = shards, start, stop
        self.ends = np.cumsum([len(shard) for shard in shards])
        self.dtype = shards[0].dtype

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, window: slice) -> np.ndarray:
        if not isinstance(window, slice):
            raise TypeError("TokenShards reads slices (tokens[a:b]); np.asarray(tokens) reads it whole")
        first, last, stride = window.indices(len(self))
        return self._read(self.start + first, self.start + max(first, last))[::stride]

    def _read(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        shard = int(np.searchsorted(self.ends, start, side="right"))
        while start < stop:
            offset = int(self.ends[shard - 1]) if shard else 0
            end = min(stop, int(self.ends[shard]))
            pieces.append(self.shards[shard][start - offset : end - offset])
            start, shard = end, shard + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces or [np.empty(0, self.dtype)])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self._read(self.start, self.stop)
        return whole if dtype is None else whole.astype(dtype)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def token_streams(folder: Path, meta: dict) -> tuple[np.ndarray | TokenShards, np.ndarray | TokenShards]:
    """The training and validation tokens, memory-mapped: slices of the one file, or of the
    shards read end to end."""
    shards = [np.memmap(folder / shard["file"], dtype=meta["dtype"], mode="r") for shard in meta["shards"]]
    split = meta["train_tokens"]
    if len(shards) == 1:
        return shards[0][:split], shards[0][split:]
    return TokenShards(shards, 0, split), TokenShards(shards, split, meta["tokens"])
