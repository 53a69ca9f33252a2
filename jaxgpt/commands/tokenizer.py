"""Train a byte-level BPE tokenizer on your own text:
python -m jaxgpt tokenizer --text PATH --vocab_size N --out DIR

Examples:
  python -m jaxgpt tokenizer --text path/to/book.txt --vocab_size 512 --out runs/book_bpe
  python -m jaxgpt tokenizer --text builtin:python-docs --vocab_size 2048 --out runs/docs_bpe

--text is a file, a folder or a glob of UTF-8 text (or any data.source, such as
builtin:python-docs). The last --held_out of it (its documents, or its characters if it is one)
is kept out of training and measured: bytes per token for the new tokenizer beside GPT-2's
(where tiktoken has its file) and a character tokenizer, so you see how much shorter your text
becomes. Writes DIR/tokenizer.json (the `tokenizers` library's format); train on it with
--config.data.tokenizer=DIR: it is copied into the run, so the run needs DIR no more.
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import flags

from jaxgpt.commands import cli
from jaxgpt.errors import UserError

KINDS = ("builtin", "text", "hf", "pairs")  # data.source's prefixes


def held_out_split(texts: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): the last `fraction` of the documents, or of one
    document's characters."""
    if len(texts) == 1:
        cut = int(len(texts[0]) * (1 - fraction))
        return [texts[0][:cut]], [texts[0][cut:]]
    cut = max(1, int(len(texts) * (1 - fraction)))
    return texts[:cut], texts[cut:]


def bytes_per_token(tokenizer, texts: list[str]) -> float:
    """UTF-8 bytes of `texts` over the tokens `tokenizer` makes of them."""
    size = sum(len(t.encode("utf-8")) for t in texts)
    return size / max(1, sum(len(tokenizer.encode(t)) for t in texts))


def comparison_rows(trained, train_texts: list[str], held_out: list[str]) -> list[tuple[str, str]]:
    """(tokenizer, bytes per token on the held-out text) for the trained one, GPT-2's and a
    character tokenizer's (one token a character: bytes per character)."""
    from jaxgpt.tokenizers import TiktokenTokenizer

    rows = [(f"this BPE ({trained.vocab_size:,} ids)", f"{bytes_per_token(trained, held_out):.2f}")]
    try:
        gpt2 = TiktokenTokenizer("gpt2", timeout=10.0)
        rows.append((f"GPT-2's BPE ({gpt2.vocab_size:,} ids)", f"{bytes_per_token(gpt2, held_out):.2f}"))
    except UserError:
        rows.append(("GPT-2's BPE", "not here (tiktoken has no cached file and no network)"))
    characters = sum(len(t) for t in held_out)
    size = sum(len(t.encode("utf-8")) for t in held_out)
    vocabulary = len(set("".join(train_texts)))
    rows.append((f"characters ({vocabulary:,} ids)", f"{size / max(1, characters):.2f}"))
    return rows


def read_texts(spec: str) -> list[str]:
    from jaxgpt.config import DataConfig
    from jaxgpt.data.sources import document_texts, read_documents

    source = spec if spec.partition(":")[0] in KINDS else f"text:{spec}"
    docs, _ = read_documents(DataConfig(source=source), progress=False)
    return [text for text in document_texts(docs) if text]


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    argv, f = cli.command_flags(argv)
    flags.DEFINE_string("text", None, "The text to learn from: a file, folder, glob or data.source.", flag_values=f)
    flags.DEFINE_integer("vocab_size", None, "Ids in all: 256 bytes, the merges, the separator.", flag_values=f)
    flags.DEFINE_string("out", None, "Folder to write tokenizer.json into (a new one).", flag_values=f)
    flags.DEFINE_float("held_out", 0.1, "Share of the text kept out to measure on.", flag_values=f)
    cli.parse_flags(argv, __doc__, f)
    for name, what in (("text", "the text to learn from"), ("vocab_size", "how many ids"), ("out", "where to write")):
        cli.require(f, name, what=what)
    if not 0 < f.held_out < 1:
        raise UserError(f"--held_out {f.held_out} must lie between 0 and 1 (the share of the text measured on)")
    out = Path(f.out) / "tokenizer.json"
    if out.exists():
        raise UserError(f"{out} exists; pass --out a new folder (a run trained on it keeps its own copy either way)")
    from jaxgpt.tokenizers import train_bpe

    texts = read_texts(f.text)
    train_texts, held_out = held_out_split(texts, f.held_out)
    if not held_out or not any(held_out):
        raise UserError(f"{f.text} is too short to hold out {f.held_out:.0%} of it; give more text")
    start = time.perf_counter()
    tokenizer = train_bpe(train_texts, f.vocab_size)
    seconds = time.perf_counter() - start
    characters = sum(len(t) for t in train_texts)
    print(f"trained a byte-level BPE of {tokenizer.vocab_size:,} ids on {characters:,} characters in {seconds:.1f} s")
    size = sum(len(t.encode("utf-8")) for t in held_out)
    print(f"bytes per token on the held-out {f.held_out:.0%} ({size:,} bytes; more bytes a token, shorter sequences):")
    for name, value in comparison_rows(tokenizer, train_texts, held_out):
        print(f"  {name:<28} {value}")
    with cli.writing(out, "a folder"):
        out.write_text(tokenizer.tokenizer_json(), encoding="utf-8")
    print(f"wrote {out}; train with it: --config.data.tokenizer={f.out}")


if __name__ == "__main__":
    main()
