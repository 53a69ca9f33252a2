"""Data: preparation from each source, the cache, deterministic batches, clear errors."""

import json
import time

import numpy as np
import pytest

from jaxgpt import data
from jaxgpt.config import DataConfig
from jaxgpt.data import prepared as preparation
from jaxgpt.data import sources
from jaxgpt.errors import UserError


def batch_at(tokens, seq_len, *draw, **where):
    """Batch `draw` = (batch_size, seed, stream, index) of a stream as windows (rows, seq_len + 1)."""
    return data.read_windows(tokens, data.window_offsets(len(tokens), seq_len, *draw, **where), seq_len)


def test_builtin_corpus_prepares_offline_into_a_char_stream():
    dataset = data.prepare(DataConfig(source="builtin:python-docs"), progress=False)
    tok = dataset.tokenizer
    total = len(dataset.train) + len(dataset.val)
    assert total > 400_000  # the Python reference is ~465 KB of text
    assert len(dataset.val) == int(total * 0.1)  # the last 10% is validation
    assert "assert" in tok.decode(dataset.train[:20_000])
    assert dataset.train.dtype == np.uint16 and int(dataset.train.max()) < tok.vocab_size


def smallest_period(text: str) -> int:
    return next(p for p in range(1, len(text) + 1) if text[p:] == text[:-p])


def test_repeated_random_documents_can_be_predicted_only_by_copying():
    """Each document repeats a random string whose length is drawn from 4 to 16: its smallest
    period is that length (or, rarely, a divisor of it, when the random string happens to
    repeat itself), every period from 4 to 16 occurs, the letters cover the 32 of the
    alphabet about evenly, and the documents are the same on every call."""
    docs = sources.repeated_random_documents()
    assert len(docs) == 20_000 and {len(d) for d in docs} == {64}
    periods = np.array([smallest_period(d) for d in docs])
    assert periods.max() == 16 and set(range(4, 17)) <= set(periods.tolist())
    assert (periods < 4).mean() < 0.01  # a 4-letter string of period 1 or 2: (1/32)**2 or so
    letters, counts = np.unique(list("".join(docs)), return_counts=True)
    assert "".join(letters) == "".join(sorted(sources.REPEATED_ALPHABET))
    assert counts.min() > 0.9 * counts.mean()  # 40,000 expected each; binomial spread ~1%
    assert docs == sources.repeated_random_documents()


def test_repeated_random_source_prepares_into_a_32_letter_char_stream():
    dataset = data.prepare(DataConfig(source="builtin:repeated-random"), progress=False)
    text = dataset.tokenizer.decode(dataset.train[: 65 * 3])  # three documents, each ended by "\n"
    assert text.split("\n")[:3] == sources.repeated_random_documents()[:3]
    assert dataset.tokenizer.vocab_size == 33  # the 32 letters and the separator
    assert set(dataset.tokenizer.decode(dataset.train[:10_000])) <= set(sources.REPEATED_ALPHABET) | {"\n"}


def test_text_file_round_trips_through_preparation(tmp_path):
    text = "hello world, " * 50
    (tmp_path / "corpus.txt").write_text(text)
    dataset = data.prepare(DataConfig(source=f"text:{tmp_path / 'corpus.txt'}", val_fraction=0.2), progress=False)
    stream = np.concatenate([dataset.train, dataset.val])
    assert dataset.tokenizer.decode(stream) == text + "\n"  # one document, newline-terminated


def test_directory_and_glob_sources_read_every_document(tmp_path, gpt2_bpe):
    (tmp_path / "a.txt").write_text("first document")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "second one"}) + "\n" + json.dumps({"text": "third"}) + "\n")
    for source in (f"text:{tmp_path}", f"text:{tmp_path}/*"):
        dataset = data.prepare(DataConfig(source=source, tokenizer="gpt2", val_fraction=0.1), progress=False)
        stream = np.concatenate([dataset.train, dataset.val])
        docs = dataset.tokenizer.decode(stream).split("<|endoftext|>")
        assert sorted(docs) == sorted(["first document", "second one", "third", ""])


def test_preparation_is_cached_and_reused(tmp_path):
    (tmp_path / "c.txt").write_text("abcdefgh" * 100)
    config = DataConfig(source=f"text:{tmp_path / 'c.txt'}", cache_dir=str(tmp_path / "cache"))
    data.prepare(config, progress=False)
    (folder,) = (tmp_path / "cache" / "data").iterdir()
    stamp = (folder / "tokens-00000.bin").stat().st_mtime_ns
    time.sleep(0.01)
    data.prepare(config, progress=False)
    assert (folder / "tokens-00000.bin").stat().st_mtime_ns == stamp  # not rewritten
    data.prepare(DataConfig(source=config.source, cache_dir=config.cache_dir, tokenizer="byte"), progress=False)
    assert len(list((tmp_path / "cache" / "data").iterdir())) == 2  # another tokenizer, another entry


def test_batches_are_a_pure_function_of_seed_and_step():
    tokens = np.arange(1000, dtype=np.uint16)
    later_first = batch_at(tokens, 16, 4, 0, data.TRAIN_STREAM, 7)
    for step in range(7):
        batch_at(tokens, 16, 4, 0, data.TRAIN_STREAM, step)
    np.testing.assert_array_equal(batch_at(tokens, 16, 4, 0, data.TRAIN_STREAM, 7), later_first)
    assert not np.array_equal(batch_at(tokens, 16, 4, 0, data.TRAIN_STREAM, 8), later_first)
    assert not np.array_equal(batch_at(tokens, 16, 4, 1, data.TRAIN_STREAM, 7), later_first)
    # Each row is a contiguous window: consecutive token ids here.
    assert later_first.shape == (4, 17) and np.all(np.diff(later_first, axis=1) == 1)


def test_preparation_records_where_each_document_begins(tmp_path):
    """Byte tokens, documents joined by a newline: document k > 0 begins right after the
    newline that ends document k - 1, and its aligned window begins at that newline."""
    texts = ["first", "the second one", "3rd"]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    config = DataConfig(source=f"text:{tmp_path / 'docs.jsonl'}", tokenizer="byte", val_fraction=0.1)
    dataset = data.prepare(config, progress=False)
    lengths = [len(t) + 1 for t in texts]  # + the newline after each
    assert dataset.documents.tolist() == [0, lengths[0] - 1, lengths[0] + lengths[1] - 1]
    stream = np.concatenate([dataset.train, dataset.val])
    for start, text in zip(dataset.documents[1:], texts[1:], strict=True):
        assert dataset.tokenizer.decode(stream[start : start + 1 + len(text)]) == "\n" + text


def test_aligned_windows_begin_at_documents_and_cover_long_ones_window_by_window():
    """Documents at 0, 10, 13 and 40 of 60 tokens, windows of 8 (+ 1): the 10-token document
    gives 0 and 8; the 3-token one 10 (packed with the next); the 27-token one 13, 21, 29, 37;
    the last 40 and 48 (56 has no 9 tokens after it)."""
    documents = np.array([0, 10, 13, 40])
    assert data.aligned_starts(documents, 60, 8).tolist() == [0, 8, 10, 13, 21, 29, 37, 40, 48]
    assert data.aligned_starts(documents, 30, 8).tolist() == [0, 8, 10, 13, 21]  # the train split's first 30
    tokens = np.arange(60, dtype=np.uint16)
    starts = data.aligned_starts(documents, 60, 8)
    batch = batch_at(tokens, 8, 64, 0, data.TRAIN_STREAM, 3, starts=starts)
    assert set(batch[:, 0].tolist()) <= set(starts.tolist()) and len(set(batch[:, 0].tolist())) > 5
    np.testing.assert_array_equal(batch, batch_at(tokens, 8, 64, 0, data.TRAIN_STREAM, 3, starts=starts))
    half = batch_at(tokens, 8, 64, 0, data.TRAIN_STREAM, 3, rows=slice(32, 64), starts=starts)
    np.testing.assert_array_equal(half, batch[32:])  # a process's share: the same draw, its rows


def test_prefetch_yields_in_order_and_reraises():
    assert list(data.prefetch(lambda i: i * i, range(6))) == [0, 1, 4, 9, 16, 25]

    def broken(i):
        if i == 3:
            raise RuntimeError("bad batch")
        return i

    with pytest.raises(RuntimeError, match="bad batch"):
        list(data.prefetch(broken, range(6)))


@pytest.mark.parametrize(
    "source, message",
    [
        ("text:/no/such/file.txt", "no such file, directory or glob match"),
        ("ftp:somewhere", "unknown data.source 'ftp:somewhere'"),
        ("builtin:wikipedia", "unknown data.source"),
    ],
)
def test_bad_sources_are_clear_errors(source, message):
    with pytest.raises(UserError, match=message):
        data.prepare(DataConfig(source=source), progress=False)


def test_empty_corpus_is_a_clear_error(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    config = DataConfig(source=f"text:{tmp_path / 'empty.txt'}", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(UserError, match="holds no text"):
        data.prepare(config, progress=False)
    assert not any(p.name.startswith(".preparing") for p in data.cache_root(config).iterdir())


def test_corpus_shorter_than_a_window_is_a_clear_error(tmp_path):
    (tmp_path / "short.txt").write_text("just a few words")
    dataset = data.prepare(DataConfig(source=f"text:{tmp_path / 'short.txt'}"), progress=False)
    with pytest.raises(UserError, match="fewer than model.block_size \\+ 1 = 65"):
        data.check_long_enough(dataset, 64)


def test_hub_source_offline_fails_at_once_with_advice(monkeypatch):
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)  # as offline, whatever the machine
    start = time.perf_counter()
    with pytest.raises(UserError, match="cannot load hf:someone/corpus.*data.source=text:"):
        data.prepare(DataConfig(source="hf:someone/corpus"), progress=False)
    assert time.perf_counter() - start < 5


def test_parallel_tokenization_writes_the_same_tokens_as_serial(tmp_path, monkeypatch):
    lines = [json.dumps({"text": f"document number {i}: " + "words " * (i % 7)}) for i in range(60)]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")

    def prepared(min_docs, cache):
        monkeypatch.setattr(preparation, "PARALLEL_MIN_DOCS", min_docs)
        config = DataConfig(source=f"text:{tmp_path / 'docs.jsonl'}", tokenizer="byte", cache_dir=str(tmp_path / cache))
        dataset = data.prepare(config, progress=False)
        return np.concatenate([dataset.train, dataset.val])

    monkeypatch.setenv(data.WORKERS_ENV, "2")  # two workers, whatever the machine's cores
    np.testing.assert_array_equal(prepared(1, "parallel"), prepared(10**9, "serial"))


def test_tokenizing_workers_leave_the_preparing_process_a_core(monkeypatch):
    monkeypatch.delenv(data.WORKERS_ENV, raising=False)
    for cores, workers in ((1, 0), (2, 0), (3, 2), (16, 15)):  # one worker beside it is never worth it
        monkeypatch.setattr(preparation, "usable_cores", lambda cores=cores: cores)
        assert data.tokenizing_workers() == workers
    monkeypatch.setenv(data.WORKERS_ENV, "1")
    assert data.tokenizing_workers() == 1
    monkeypatch.setenv(data.WORKERS_ENV, "two")
    with pytest.raises(UserError, match="JAXGPT_PREPARE_WORKERS='two' is not a worker count"):
        data.tokenizing_workers()


# ----------------------------------------------------------------------------- shards


def test_shards_read_as_one_stream():
    """TokenShards against the files joined in memory: every slice, windows that cross one or
    several boundaries, a whole-stream read, and batches drawn from it."""
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 60_000, size=n).astype(np.uint16) for n in (7, 1, 30, 12)]
    joined = np.concatenate(parts)
    for start, stop in ((0, 50), (5, 40), (7, 8), (8, 38)):
        stream = data.TokenShards(parts, start, stop)
        assert len(stream) == stop - start
        np.testing.assert_array_equal(np.asarray(stream), joined[start:stop])
        for a in range(len(stream) + 1):
            for b in range(a, len(stream) + 2):
                np.testing.assert_array_equal(stream[a:b], joined[start:stop][a:b])
    stream = data.TokenShards(parts, 0, 50)
    for index in range(20):
        np.testing.assert_array_equal(
            batch_at(stream, 9, 4, 0, data.TRAIN_STREAM, index),
            batch_at(joined, 9, 4, 0, data.TRAIN_STREAM, index),
        )


def _stream(dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.asarray(dataset.train), np.asarray(dataset.val), dataset.documents


def _many_documents(tmp_path, count: int = 300) -> str:
    """A .jsonl corpus of `count` documents of differing lengths; its data.source."""
    lines = [json.dumps({"text": f"document {i}: " + "several words " * (i % 11)}) for i in range(count)]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    return f"text:{tmp_path / 'docs.jsonl'}"


def test_shards_hold_the_stream_one_file_holds(tmp_path):
    """Shards of 500 tokens (a document ends each: 58 files) and one file of the whole corpus:
    the same train and validation tokens and document starts; the files are what meta.json lists."""
    source = _many_documents(tmp_path)
    one = data.prepare(DataConfig(source=source, tokenizer="byte", cache_dir=str(tmp_path / "one")), progress=False)
    config = DataConfig(source=source, tokenizer="byte", cache_dir=str(tmp_path / "many"), shard_tokens=500)
    many = data.prepare(config, progress=False)
    assert isinstance(many.train, data.TokenShards) and not isinstance(one.train, data.TokenShards)
    for a, b in zip(_stream(one), _stream(many), strict=True):
        np.testing.assert_array_equal(a, b)
    meta = json.loads((data.cache_folder(config) / "meta.json").read_text())
    sizes = [shard["tokens"] for shard in meta["shards"]]
    assert len(sizes) > 10 and all(size >= 500 for size in sizes[:-1]) and sum(sizes) == meta["tokens"]
    assert sorted(p.name for p in data.cache_folder(config).iterdir()) == sorted(
        [shard["file"] for shard in meta["shards"]] + ["documents.bin", "meta.json", "tokenizer.json"]
    )


class Crash(Exception):
    pass


@pytest.mark.parametrize("crash_after", [1, 37, 150, 299, "finish"])
def test_a_preparation_that_crashed_continues_to_the_same_files(tmp_path, monkeypatch, crash_after):
    """A crash after the first document, in a shard's middle, near the end, and with every shard
    written but the whole not yet put together: the next preparation continues from the last
    whole shard and writes exactly what an uninterrupted one writes (shards of 500 tokens)."""
    source = _many_documents(tmp_path)
    whole = data.prepare(DataConfig(source=source, tokenizer="char", cache_dir=str(tmp_path / "whole")), progress=False)
    config = DataConfig(source=source, tokenizer="char", cache_dir=str(tmp_path / "crashed"), shard_tokens=500)
    encoded = preparation._encoded

    def crashing(*args):
        for number, ids in enumerate(encoded(*args), 1):
            yield ids
            if number == crash_after:
                raise Crash

    def unfinished(*args):
        raise Crash

    with monkeypatch.context() as patched:
        patched.setattr(preparation, "_encoded", crashing)
        if crash_after == "finish":
            patched.setattr(preparation, "write_meta", unfinished)
        with pytest.raises(Crash):
            data.prepare(config, progress=False)
    assert not data.cache_folder(config).exists()
    tokenized = []

    def counting(*args):
        for ids in encoded(*args):
            tokenized.append(ids)
            yield ids

    monkeypatch.setattr(preparation, "_encoded", counting)
    resumed = data.prepare(config, progress=False)
    for a, b in zip(_stream(whole), _stream(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [p.name for p in data.cache_folder(config).parent.iterdir()] == [data.cache_folder(config).name]
    # The whole shards' documents were not tokenized again. A shard ends with the document that
    # brings it to 500 tokens; a document is its characters and the newline after it.
    lengths = [len(json.loads(line)["text"]) + 1 for line in (tmp_path / "docs.jsonl").read_text().splitlines()]
    kept = in_shard = shard = 0
    for length in lengths[: 300 if crash_after == "finish" else crash_after]:
        shard, in_shard = shard + length, in_shard + 1
        if shard >= 500:
            kept, shard, in_shard = kept + in_shard, 0, 0
    assert len(tokenized) == (0 if crash_after == "finish" else 300 - kept)


def test_a_preparation_killed_part_way_continues_to_the_same_files(tmp_path):
    """SIGKILL to a preparation (and its tokenizing workers: 20,000 documents are tokenized on
    every core) once it has written two whole shards: the next start continues from them and
    ends with the tokens, splits and document starts an uninterrupted preparation writes."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    source = _many_documents(tmp_path, 20_000)
    killed = DataConfig(source=source, tokenizer="byte", cache_dir=str(tmp_path / "killed"), shard_tokens=50_000)
    snippet = (
        "from jaxgpt import data; from jaxgpt.config import DataConfig; "
        f"data.prepare(DataConfig(source={source!r}, tokenizer='byte', cache_dir={killed.cache_dir!r}, "
        "shard_tokens=50_000), progress=False)"
    )
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", snippet], env=env, start_new_session=True)
    staging = data.cache_folder(killed).parent / f".preparing-{data.cache_folder(killed).name}"
    deadline = time.monotonic() + 120
    while not (staging / "record-00001.json").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the preparation ended before it could be killed"
    assert not data.cache_folder(killed).exists() and (staging / "record-00001.json").exists()

    resumed = data.prepare(killed, progress=False)
    whole = data.prepare(DataConfig(source=source, tokenizer="byte", cache_dir=str(tmp_path / "whole")), progress=False)
    for a, b in zip(_stream(whole), _stream(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not staging.exists()


def test_preparation_progress_counts_documents_tokens_and_their_rate(tmp_path, capsys):
    """Where stderr is not a terminal (here pytest's capture; a log file): whole lines, no bar
    redrawn with carriage returns, the last one counting everything prepared."""
    data.prepare(DataConfig(source=_many_documents(tmp_path), tokenizer="byte", cache_dir=str(tmp_path)))
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n"), err[-500:]
    last = err.splitlines()[-1]
    assert "300/300 docs" in last and " tokens, " in last and "tokens/s" in last, last
