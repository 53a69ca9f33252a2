"""Where a corpus's text comes from (`data.source`): a list or stream of documents.

builtin:python-docs  the Python language reference shipped inside CPython (`pydoc_data`),
                     ~465 KB of English: the offline default.
builtin:repeated-random  random text made to be copied: 20,000 documents of 64 characters,
                     each a random string of 4 to 16 letters (32 letters to draw from)
                     repeated; what forms induction heads (`repeated_random_documents`).
text:PATH            a file, a directory, or a glob: .jsonl and .parquet files are read as
                     records, any other file as UTF-8 text (one document per file), with
                     `datasets`' local builders.
hf:NAME[:CONFIG]     a Hugging Face Hub dataset, streamed, using its text column.
pairs:PATH, builtin:dates, builtin:reverse, builtin:sort
                     text pairs, a document "source<TAB>target" each (jaxgpt/data/pairs.py).
labels:PATH, builtin:brackets
                     labelled texts, a document each text, its label beside it
                     (jaxgpt/data/labels.py).
chat:PATH.jsonl, prompts:PATH, builtin:arithmetic-chat, builtin:arithmetic-chat-3
                     conversations, a document each as the chat template renders it;
builtin:arithmetic, builtin:arithmetic-balanced
                     and sums written out to pretrain on (jaxgpt/data/conversations.py).
"""

from __future__ import annotations

import codecs
import glob
import itertools
import json
import socket
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from jaxgpt.config import BUILTIN_SOURCES, DataConfig
from jaxgpt.data.conversations import BUILTIN_SUMS, builtin_documents, read_conversations, read_prompts
from jaxgpt.data.labels import bracket_examples, read_labelled
from jaxgpt.data.pairs import builtin_pairs, read_pairs
from jaxgpt.errors import UserError

# Files read as records; any other file is read as plain UTF-8 text, one document per file.
STRUCTURED_SUFFIXES = {".jsonl": "json", ".parquet": "parquet"}


def read_documents(config: DataConfig, progress: bool = True) -> tuple[Iterable[str], int | None]:
    """The corpus, with its number of documents when known: a list or stream of strings, or
    (local files) a `datasets.Dataset` with a "text" column."""
    kind, _, rest = config.source.partition(":")
    if kind == "builtin" and rest == "python-docs":
        from pydoc_data.topics import topics

        docs = [topics[name] for name in sorted(topics)]
        return docs, len(docs)
    if kind == "builtin" and rest == "repeated-random":
        docs = repeated_random_documents()
        return docs, len(docs)
    if kind == "builtin" and rest in BUILTIN_SOURCES["pairs"]:
        docs = builtin_pairs(rest)
        return docs, len(docs)
    if kind == "pairs" and rest:
        docs = read_pairs(rest)
        return docs, len(docs)
    if kind == "builtin" and rest in BUILTIN_SOURCES["labels"]:  # the texts; their labels stay beside them
        docs = bracket_examples()[1]
        return docs, len(docs)
    if kind == "labels" and rest:
        docs = read_labelled(rest)[1]
        return docs, len(docs)
    if kind == "builtin" and rest in (*BUILTIN_SOURCES["chat"], *BUILTIN_SUMS):
        docs = builtin_documents(rest)
        return docs, len(docs)
    if kind == "chat" and rest:
        docs = read_conversations(rest)
        return docs, len(docs)
    if kind == "prompts" and rest:
        docs = read_prompts(rest)
        return docs, len(docs)
    if kind == "text" and rest:
        return _read_local(rest, config.text_column, progress)
    if kind == "hf" and rest:
        return _read_hub(rest, config.text_column), None
    raise UserError(
        f"unknown data.source {config.source!r}; use builtin:python-docs, builtin:repeated-random, "
        "builtin:arithmetic(-balanced), text:PATH (file, directory or glob), hf:NAME[:CONFIG], "
        "for text pairs pairs:PATH or builtin:dates, reverse or sort, for labelled texts labels:PATH or "
        "builtin:brackets, or for conversations chat:PATH.jsonl, prompts:PATH, builtin:arithmetic-chat or "
        "builtin:arithmetic-chat-3"
    )


REPEATED_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEF"  # 32 letters


def repeated_random_documents(
    count: int = 20_000, length: int = 64, periods: tuple[int, int] = (4, 16), seed: int = 0
) -> list[str]:
    """Documents in which only copying helps: each is a random string of a random period (4
    to 16 letters, uniformly) repeated to `length` letters. Nothing in the first period can be
    predicted (ln 32 = 3.47 nats a letter); every later letter is the one a period back, so a
    model that learns to find the earlier copy of the current letter and read what followed
    it (an induction head, Olsson et al. 2022) predicts it exactly. The period varies, so no
    fixed offset does the job. Seeded: the same documents every time."""

    rng = np.random.default_rng(seed)
    letters = np.frombuffer(REPEATED_ALPHABET.encode(), np.uint8)
    docs = []
    for period in rng.integers(periods[0], periods[1] + 1, count):
        docs.append(np.resize(rng.choice(letters, period), length).tobytes().decode())
    return docs


def local_files(pattern: str) -> list[Path]:
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

    # datasets draws its own bars ("Generating train split"), redrawn with carriage returns even
    # into a file: only on a terminal, and never under --quiet.
    shown = progress and sys.stderr.isatty()
    datasets.enable_progress_bars() if shown else datasets.disable_progress_bars()
    builders: dict[str, list[str]] = {}
    for f in local_files(pattern):
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


def document_texts(docs, skip: int = 0) -> Iterator[str]:
    """The documents' texts from number `skip` on (a resumed preparation's first unwritten one)."""
    if hasattr(docs, "column_names"):  # a datasets.Dataset: read its column in slices
        for start in range(skip, len(docs), 1000):
            yield from docs[start : start + 1000]["text"]
    else:
        yield from itertools.islice(docs, skip, None)


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
