"""Corpus preparation: tokens/s of `jaxgpt.data.prepare` against tiktoken's own rate.

    python bench/prepare_throughput.py [--megabytes 40] [--rounds 3] [--out bench/results/prepare_throughput.json]

The corpus is parquet shards shaped like FineWeb's (a `text` column beside id, url, dump and
token_count), each document one topic of the Python reference shipped with CPython, repeated
to --megabytes of text; it is written once, then prepared with the GPT-2 BPE (tiktoken) from a
fresh cache every round. Rows, side by side in each round, medians over the rounds:

  tiktoken, 1 thread        encode_ordinary on each document in turn: the tokenizer alone
  tiktoken, N threads       encode_ordinary_batch(num_threads=N): tiktoken's own parallelism
  prepare, 0 workers        data.prepare tokenizing in its own process
  prepare, W workers        data.prepare with W tokenizing processes (JAXGPT_PREPARE_WORKERS=W),
                            for W from 1 to the core count; the default is marked

prepare's time is the whole preparation: reading the parquet, tokenizing, writing the shards,
hashing them, the validation split, spawning the workers; `datasets`' one-time conversion of the
parquet to its Arrow cache is left out (a first, untimed preparation). Cores used: the tokenizing
processes plus the preparing one (which reads and writes), at most the machine's; per core =
tokens/s / cores used.
The GPT-2 BPE file must be in tiktoken's cache (TIKTOKEN_CACHE_DIR); offline, --tiktoken_cache
names a folder holding it, which is copied to a temporary, writable one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxgpt import data  # noqa: E402
from jaxgpt.config import DataConfig  # noqa: E402
from jaxgpt.hardware.machine import usable_cores  # noqa: E402
from jaxgpt.hardware.peak_flops import describe_cpu  # noqa: E402


def write_corpus(folder: Path, megabytes: float, shards: int = 4) -> list[str]:
    """FineWeb-shaped parquet shards of about `megabytes` of text; returns the texts."""
    from pydoc_data.topics import topics

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts, size = [], 0
    while size < megabytes * 1e6:
        for name in sorted(topics):
            texts.append(topics[name])
            size += len(topics[name].encode())
    folder.mkdir(parents=True, exist_ok=True)
    per_shard = -(-len(texts) // shards)
    for shard in range(shards):
        part = texts[shard * per_shard : (shard + 1) * per_shard]
        table = pa.table(
            {
                "text": part,
                "id": [f"<urn:uuid:{shard:04d}-{i:08d}>" for i in range(len(part))],
                "dump": ["CC-MAIN-2024-10"] * len(part),
                "url": [f"https://example.org/{shard}/{i}" for i in range(len(part))],
                "token_count": [len(t) // 4 for t in part],
            }
        )
        pq.write_table(table, folder / f"{shard:03d}_00000.parquet")
    return texts


def tiktoken_rate(texts: list[str], threads: int) -> tuple[float, int]:
    """(seconds, tokens) to encode every text with tiktoken directly."""
    from jaxgpt.tokenizers import make_tokenizer

    encoding = make_tokenizer("gpt2")._encoding
    start = time.perf_counter()
    if threads == 1:
        tokens = sum(len(encoding.encode_ordinary(text)) for text in texts)
    else:
        tokens = sum(len(ids) for ids in encoding.encode_ordinary_batch(texts, num_threads=threads))
    return time.perf_counter() - start, tokens


def prepare_rate(corpus: Path, workers: int) -> tuple[float, int]:
    """(seconds, tokens) of a whole data.prepare of `corpus` into a fresh cache, with `workers`
    tokenizing processes."""
    cache = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    os.environ[data.WORKERS_ENV] = str(workers)
    try:
        start = time.perf_counter()
        dataset = data.prepare(DataConfig(source=f"text:{corpus}", tokenizer="gpt2", cache_dir=str(cache)), False)
        seconds = time.perf_counter() - start
        return seconds, len(dataset.train) + len(dataset.val) - len(dataset.documents)  # less the separators
    finally:
        del os.environ[data.WORKERS_ENV]
        shutil.rmtree(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=40, help="text in the corpus")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiktoken_cache", default="", help="a folder holding tiktoken's cached GPT-2 BPE")
    parser.add_argument("--out", default="bench/results/prepare_throughput.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="prepare-corpus-"))
    if args.tiktoken_cache:
        shutil.copytree(args.tiktoken_cache, work / "tiktoken")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(work / "tiktoken")
    os.environ.pop(data.WORKERS_ENV, None)
    default_workers = data.tokenizing_workers()
    cores = usable_cores()
    texts = write_corpus(work / "corpus", args.megabytes)
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    print(f"{describe_cpu()}; {len(texts):,} documents, {megabytes:.1f} MB of text in 4 parquet shards")
    cases = {
        "tiktoken, 1 thread": (1, lambda: tiktoken_rate(texts, 1)),
        f"tiktoken, {cores} threads": (cores, lambda: tiktoken_rate(texts, cores)),
    }
    for workers in range(cores + 1):
        name = f"prepare, {workers} worker{'' if workers == 1 else 's'}"
        name += " (default)" if workers == default_workers else ""
        cases[name] = (min(workers + 1, cores), lambda workers=workers: prepare_rate(work / "corpus", workers))
    prepare_rate(work / "corpus", 0)  # datasets converts the parquet to Arrow once, and caches it
    rates: dict[str, list[float]] = {name: [] for name in cases}
    counts: dict[str, int] = {}
    for round_ in range(args.rounds):
        for name, (_, measure) in cases.items():
            seconds, tokens = measure()
            rates[name].append(tokens / seconds)
            counts[name] = tokens
            print(f"round {round_ + 1}: {name:28s} {tokens / seconds / 1e6:6.2f} M tokens/s", flush=True)
    assert len(set(counts.values())) == 1, f"the cases counted different tokens: {counts}"
    baseline = statistics.median(rates["tiktoken, 1 thread"])
    rows = []
    print(f"\n{describe_cpu()}, GPT-2 BPE, {counts['tiktoken, 1 thread']:,} tokens, median of {args.rounds} rounds")
    print("| case | cores | M tokens/s | M tokens/s per core | per core / tiktoken's 1 thread |")
    print("|---|---|---|---|---|")
    for name, (used, _) in cases.items():
        rate = statistics.median(rates[name])
        rows.append({"case": name, "cores": used, "tokens_per_sec": rate, "rounds": rates[name]})
        print(f"| {name} | {used} | {rate / 1e6:.2f} | {rate / used / 1e6:.2f} | {rate / used / baseline:.2f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"machine": describe_cpu(), "documents": len(texts), "megabytes": megabytes, "rows": rows}
    out.write_text(json.dumps(summary | {"tokens": counts["tiktoken, 1 thread"]}, indent=2))
    print(f"wrote {out}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
