"""Text <-> token ids: characters, bytes, or a tiktoken BPE.

Every tokenizer serialises to a small dict (`to_dict`), saved as `tokenizer.json` in a run's
workdir, so sampling rebuilds exactly the tokenizer training used.
"""

from __future__ import annotations

import json
import os
import threading
from functools import partial
from pathlib import Path

import numpy as np

from jaxgpt.errors import UserError

TIKTOKEN_ENCODINGS = ("gpt2", "r50k_base", "cl100k_base", "o200k_base")
TOKENIZERS = ("char", "byte", *TIKTOKEN_ENCODINGS)


class CharTokenizer:
    """One id per distinct character of the training corpus, in sorted order (nanoGPT's
    shakespeare_char). Small vocabularies make tiny models learn spelling fast."""

    name = "char"
    eot_id = None

    def __init__(self, chars: str):
        self.chars = chars
        self._ids = {ch: i for i, ch in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as missing:
            raise UserError(
                f"character {missing.args[0]!r} is not in this model's {self.vocab_size}-character vocabulary; "
                "use only characters from the training text"
            ) from None

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)

    def token_bytes(self) -> np.ndarray:
        return np.array([len(ch.encode("utf-8")) for ch in self.chars], np.int64)

    def to_dict(self) -> dict:
        return {"name": "char", "chars": self.chars}


class ByteTokenizer:
    """The 256 byte values of the UTF-8 encoding: any text, no vocabulary to build."""

    name = "byte"
    eot_id = None
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        return np.ones(256, np.int64)

    def to_dict(self) -> dict:
        return {"name": "byte"}


DOWNLOAD_TIMEOUT_SEC = 60.0  # tiktoken's own download has no timeout: a silent network hangs it


def _get_encoding(name: str):
    import tiktoken

    return tiktoken.get_encoding(name)


def _within(seconds: float, work):
    """work() in a daemon thread, or TimeoutError after `seconds` (the thread is abandoned:
    a stuck socket read cannot be interrupted, and a daemon thread does not keep the process)."""
    result: dict = {}

    def run():
        try:
            result["value"] = work()
        except BaseException as error:  # re-raised in the caller
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


class TiktokenTokenizer:
    """A tiktoken BPE (`gpt2` is GPT-2's 50,257-token vocabulary). Special tokens in the text
    are encoded as ordinary text; documents are separated by the end-of-text token."""

    def __init__(self, name: str, timeout: float = DOWNLOAD_TIMEOUT_SEC):
        self.name = name
        try:
            self._encoding = _within(timeout, partial(_get_encoding, name))
        except (OSError, ValueError, TimeoutError) as error:  # requests' ConnectionError is an OSError
            what = f"timed out after {timeout:.0f} s" if isinstance(error, TimeoutError) else type(error).__name__
            cache = os.environ.get("TIKTOKEN_CACHE_DIR", "(unset)")
            raise UserError(
                f"tiktoken could not load its '{name}' BPE file ({what}); it downloads it once and "
                f"caches it in TIKTOKEN_CACHE_DIR (now {cache}). Offline, point TIKTOKEN_CACHE_DIR at a writable "
                "folder holding the cached file, or use data.tokenizer=char or byte"
            ) from None
        self.eot_id = self._encoding.eot_token
        self.vocab_size = self._encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def decode(self, ids) -> str:
        return self._encoding.decode([int(i) for i in ids])

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes of text each id stands for; the end-of-text separator stands for none."""
        out = np.zeros(self.vocab_size, np.int64)
        for i in range(self.vocab_size):
            if i != self.eot_id:
                try:
                    out[i] = len(self._encoding.decode_single_token_bytes(i))
                except KeyError:  # an unused id in the vocabulary's range
                    pass
        return out

    def to_dict(self) -> dict:
        return {"name": self.name}


class HuggingFaceTokenizer:
    """A pretrained checkpoint's own tokenizer.json (e.g. Llama's), read with `tokenizers`."""

    def __init__(self, directory: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError("reading tokenizer.json needs `tokenizers`: pip install -r requirements-hf.txt") from None
        path = Path(directory) / "tokenizer.json"
        if not path.exists():
            raise UserError(f"{directory} has no tokenizer.json; this checkpoint's text cannot be encoded")
        self.name, self.directory = "huggingface", str(directory)
        self._tokenizer = Tokenizer.from_file(str(path))
        config = json.loads((Path(directory) / "config.json").read_text())
        self.eot_id = config.get("eos_token_id") if isinstance(config.get("eos_token_id"), int) else None
        self.vocab_size = self._tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tokenizer.decode([int(i) for i in ids])

    def to_dict(self) -> dict:
        return {"name": "huggingface", "directory": self.directory}


def make_tokenizer(name: str, corpus: str | None = None):
    """The tokenizer called `name`; a char tokenizer needs the corpus to build its vocabulary."""
    if name == "char":
        return CharTokenizer.from_text(corpus or "")
    if name == "byte":
        return ByteTokenizer()
    if name in TIKTOKEN_ENCODINGS:
        return TiktokenTokenizer(name)
    raise UserError(f"unknown tokenizer {name!r}; data.tokenizer must be one of {', '.join(TOKENIZERS)}")


def tokenizer_from_dict(d: dict):
    if d.get("name") == "char":
        return CharTokenizer(d["chars"])
    if d.get("name") == "huggingface":
        return HuggingFaceTokenizer(Path(d["directory"]))
    return make_tokenizer(d.get("name", "?"))


def save_tokenizer(tokenizer, path: Path) -> None:
    Path(path).write_text(json.dumps(tokenizer.to_dict(), ensure_ascii=False))


def load_tokenizer(path: Path):
    try:
        return tokenizer_from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise UserError(f"no tokenizer at {path}; is this a jaxgpt run directory?") from None
