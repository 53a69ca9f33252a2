"""Text <-> token ids: characters, bytes, a tiktoken BPE, or a byte-level BPE trained on your own
text (`train_bpe`; `jaxgpt tokenizer` writes one, data.tokenizer=DIR reads it).

Every tokenizer serialises to a small dict (`to_dict`) that names it — a checkpoint records
it, a resume compares it — and, with `whole`, to everything needed to rebuild it where its
source is not: the vocabulary file itself (a Hugging Face tokenizer.json, a tiktoken BPE) with
its SHA-256. A run's `tokenizer.json` holds the whole form, so sampling rebuilds exactly the
tokenizer training used, offline, after the folder it came from was moved, deleted or
overwritten: a reader that finds the source changed or gone says so in one line and uses the
run's copy.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
from functools import partial
from pathlib import Path

import numpy as np

from jaxgpt.errors import UserError, warn_once

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

    def to_dict(self, whole: bool = False) -> dict:
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

    def to_dict(self, whole: bool = False) -> dict:
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
    are encoded as ordinary text; documents are separated by the end-of-text token. Its whole
    form keeps the BPE (its pattern, special tokens and merges, as a .tiktoken file holds them),
    so a run reads its text where tiktoken's download and cache are not."""

    def __init__(self, name: str, timeout: float = DOWNLOAD_TIMEOUT_SEC, encoding=None):
        self.name = name
        try:
            self._encoding = encoding or _within(timeout, partial(_get_encoding, name))
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
        self._kept: dict | None = None

    @classmethod
    def from_kept(cls, kept: dict) -> TiktokenTokenizer:
        """The BPE a run kept (`to_dict(whole=True)`), checked against its SHA-256."""
        import tiktoken

        check_kept(kept, _tiktoken_digest(kept), f"the kept '{kept['name']}' BPE")
        ranks = {
            base64.b64decode(token): int(rank) for token, rank in (line.split() for line in kept["ranks"].splitlines())
        }
        encoding = tiktoken.Encoding(
            kept["name"], pat_str=kept["pattern"], mergeable_ranks=ranks, special_tokens=kept["special_tokens"]
        )
        return cls(kept["name"], encoding=encoding)

    def kept(self) -> dict:
        """The BPE as tiktoken builds it: the split pattern (tiktoken keeps it in `_pat_str`; a
        test rebuilds the encoding from it), the special tokens and each token's bytes by rank."""
        if self._kept is None:
            e = self._encoding
            specials = {token: e.encode_single_token(token) for token in sorted(e.special_tokens_set)}
            ranks = "".join(
                f"{base64.b64encode(e.decode_single_token_bytes(i)).decode()} {i}\n"
                for i in range(e.n_vocab)
                if i not in specials.values()
            )
            kept = {"name": self.name, "pattern": e._pat_str, "special_tokens": specials, "ranks": ranks}
            self._kept = kept | {"sha256": _tiktoken_digest(kept)}
        return self._kept

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

    def to_dict(self, whole: bool = False) -> dict:
        kept = self.kept()
        return kept if whole else {"name": self.name, "sha256": kept["sha256"]}


def _tiktoken_digest(kept: dict) -> str:
    parts = {key: kept[key] for key in ("name", "pattern", "special_tokens", "ranks")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def check_kept(kept: dict, digest: str, what: str) -> None:
    """One line where a run's copy of its vocabulary is not the one it recorded (damaged, edited)."""
    if digest != kept.get("sha256"):
        raise UserError(
            f"{what} in this run's tokenizer.json has SHA-256 {digest[:16]}..., not the "
            f"{str(kept.get('sha256'))[:16]}... it recorded: the file is damaged or was edited; restore it from a copy"
        )


HUGGING_FACE_TOKENIZER_FILES = ("config.json", "tokenizer_config.json")  # beside tokenizer.json: its end token, rows


class HuggingFaceTokenizer:
    """A pretrained checkpoint's own tokenizer.json (e.g. Llama's), read with `tokenizers`: its
    end-of-text id is the checkpoint's (config.json's eos_token_id, else tokenizer_config.json's
    eos_token), and its ids span the checkpoint's embedding (config.json's vocab_size, which
    may be padded past the tokenizer's own count, as Qwen2's is). Named by its folder and the
    file's SHA-256; its whole form carries the file, and the two numbers read beside it."""

    def __init__(self, directory: Path, kept: dict | None = None):
        """The folder's tokenizer.json, or with `kept` (a record of one: to_dict) that file as
        the record holds it, with the end-of-text id and rows the record says."""
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError("reading tokenizer.json needs `tokenizers`: pip install -r requirements.txt") from None
        path = Path(directory) / "tokenizer.json"
        if kept is None and not path.exists():
            raise UserError(f"{directory} has no tokenizer.json; this checkpoint's text cannot be encoded")
        self.name, self.directory = "huggingface", str(directory)
        self._text = kept["tokenizer_json"] if kept else path.read_text(encoding="utf-8")
        self.sha256 = hashlib.sha256(self._text.encode("utf-8")).hexdigest()
        self._tokenizer = Tokenizer.from_str(self._text)
        if kept:
            self.eot_id, self.vocab_size = kept["eot_id"], kept["vocab_size"]
            return
        model, settings = (_json_or_empty(Path(directory) / name) for name in HUGGING_FACE_TOKENIZER_FILES)
        self.eot_id = self._end_of_text(model.get("eos_token_id"), settings)
        rows = model.get("vocab_size")
        self.vocab_size = max(self._tokenizer.get_vocab_size(), rows if isinstance(rows, int) else 0)

    @classmethod
    def from_record(cls, record: dict) -> HuggingFaceTokenizer:
        """The tokenizer a run recorded: its folder's file where it is still the one the run
        used, else the run's copy (the whole record), saying so in one line."""
        source = Path(record["directory"]) / "tokenizer.json"
        if "sha256" not in record:  # recorded before runs kept their tokenizer: the folder's file, as it is now
            return cls(Path(record["directory"]))
        now = hashlib.sha256(source.read_bytes()).hexdigest() if source.is_file() else None
        if now == record["sha256"] or "tokenizer_json" not in record:
            if now != record["sha256"]:
                raise UserError(
                    f"{source} {'has changed' if now else 'is gone'} since this run was made, and the run's record "
                    "holds no copy of the file it used; put that file back, or read the run through its own "
                    "tokenizer.json (its workdir keeps a copy)"
                )
            return cls(Path(record["directory"]), kept=record | {"tokenizer_json": source.read_text(encoding="utf-8")})
        tokenizer = cls(Path(record["directory"]), kept=record)
        check_kept(record, tokenizer.sha256, "the kept tokenizer.json")
        using_the_runs_copy(source, changed=now is not None)
        return tokenizer

    def _end_of_text(self, eos, tokenizer_config: dict) -> int | None:
        if isinstance(eos, list):  # several ends (Llama 3.1's instruct models): the first is the text's own
            eos = eos[0] if eos else None
        if isinstance(eos, int):
            return eos
        for name in ("eos_token", "sep_token"):  # BERT's WordPiece has no end of text: its [SEP] ends a text
            token = tokenizer_config.get(name)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str) and self._tokenizer.token_to_id(token) is not None:
                return self._tokenizer.token_to_id(token)
        return self._tokenizer.token_to_id("[SEP]")

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tokenizer.decode([int(i) for i in ids])

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes of text each id stands for (for bits per byte): a byte-level BPE's pieces
        count their bytes (GPT-2, Qwen2, Llama 3); a SentencePiece vocabulary's "▁" is a space
        and "<0xNN>" one byte (Llama 2, Mistral); a WordPiece continuation ("##ing") its letters,
        the spaces between words uncounted; special tokens and padded rows none."""
        spec = json.loads(self._tokenizer.to_str())
        byte_level = '"ByteLevel"' in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
        special = {i for i, added in self._tokenizer.get_added_tokens_decoder().items() if added.special}
        out = np.zeros(self.vocab_size, np.int64)
        for token, i in self._tokenizer.get_vocab().items():
            if i not in special:
                out[i] = _byte_level_bytes(token) if byte_level else _piece_bytes(token)
        return out

    def to_dict(self, whole: bool = False) -> dict:
        named = {
            "name": "huggingface", "directory": self.directory, "sha256": self.sha256, "eot_id": self.eot_id,
            "vocab_size": self.vocab_size,
        }  # fmt: skip
        return named | {"tokenizer_json": self._text} if whole else named


def _json_or_empty(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _piece_bytes(token: str) -> int:
    """Bytes of a SentencePiece or WordPiece token's text."""
    if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
        return 1
    return len(token.removeprefix("##").replace("\u2581", " ").encode("utf-8"))


END_OF_TEXT = "<|endoftext|>"


def _byte_level_bytes(token: str) -> int:
    """Bytes of a byte-level BPE token: one per character of GPT-2's byte alphabet."""
    return sum(ch in BYTE_ALPHABET for ch in token)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte value (the
    printable ASCII and Latin-1 bytes for themselves, the other 68 for code points from 256 on),
    which `tokenizers`' ByteLevel pre-tokenizer also uses. Inverted: character -> byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    chars = {b: chr(b) for b in kept} | {b: chr(256 + i) for i, b in enumerate(shifted)}
    return {ch: b for b, ch in chars.items()}


BYTE_ALPHABET = _byte_alphabet()


class TrainedBPE:
    """A byte-level BPE trained on the user's text (Sennrich et al. 2016, on bytes as GPT-2 does
    it): the 256 byte values first, so any text encodes, then the merges training found; the
    end-of-text separator is one id past them, never produced by encoding text. Held as the
    `tokenizers` library's tokenizer.json, which a run's own tokenizer.json embeds whole (a run
    does not depend on the folder it was read from)."""

    name = "bpe"

    def __init__(self, tokenizer_json: str):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError("a trained BPE needs `tokenizers`: pip install -r requirements.txt") from None
        self._tokenizer = Tokenizer.from_str(tokenizer_json)
        self.eot_id = self._tokenizer.get_vocab_size()
        self.vocab_size = self.eot_id + 1

    @classmethod
    def from_folder(cls, folder: Path) -> TrainedBPE:
        path = Path(folder) / "tokenizer.json"
        try:
            return cls(path.read_text(encoding="utf-8"))
        except Exception as error:  # OSError, or `tokenizers`' own exception for a file it cannot parse
            raise UserError(
                f"{path} cannot be read as a trained tokenizer ({type(error).__name__}); "
                "write one with python -m jaxgpt tokenizer --text FILE --vocab_size N --out FOLDER"
            ) from None

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        out, run = [], []
        for i in (int(i) for i in ids):
            if i == self.eot_id:
                out += [self._tokenizer.decode(run), END_OF_TEXT]
                run = []
            else:
                run.append(i)
        return "".join(out) + self._tokenizer.decode(run)

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each id stands for (a merge of byte pieces: their count); the separator none."""
        out = np.zeros(self.vocab_size, np.int64)
        for token, i in self._tokenizer.get_vocab().items():
            out[i] = _byte_level_bytes(token)
        return out

    def tokenizer_json(self) -> str:
        """The `tokenizers` library's tokenizer.json (its merges and byte-level alphabet)."""
        return self._tokenizer.to_str()

    def to_dict(self, whole: bool = False) -> dict:
        return {"name": "bpe", "tokenizer": json.loads(self.tokenizer_json())}


def train_bpe(texts, vocab_size: int) -> TrainedBPE:
    """A byte-level BPE of `vocab_size` ids (the separator included) trained on `texts` (an
    iterable of strings) by the `tokenizers` library: GPT-2's pre-tokenization (words, numbers,
    spaces, punctuation kept apart, so no merge crosses them), the 256 bytes, then the most
    frequent adjacent pair merged, again and again, until the vocabulary is full."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 258:
        raise UserError(f"--vocab_size {vocab_size} leaves no room for a merge: 256 bytes and the separator come first")
    texts = list(texts)
    # Each merge joins two pieces of the text into one, so a text of n bytes allows at most n - 1
    # merges (fewer: no merge crosses a word); past that `tokenizers` learns nothing more, and
    # asked for a billion ids it aborts the process reserving room for them
    most = 256 + max(0, sum(len(text.encode("utf-8")) for text in texts) - 1) + 1
    if vocab_size > most:
        raise UserError(
            f"--vocab_size {vocab_size:,} is more than this text can give: each merge joins two of its pieces, so "
            f"its bytes allow at most {most:,} ids (256 bytes, the merges, the separator); choose at most that"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    return TrainedBPE(tokenizer.to_str())


class WithSpecialTokens:
    """A tokenizer with special tokens added after its vocabulary (a chat template's role markers,
    jaxgpt/data/conversations.py): each special string in a text is its one id, vocab_size + k
    for the k-th, and nothing else encodes to those ids; the text between them is the base
    tokenizer's. A model of the base vocabulary grows a row per special token to read them
    (jaxgpt/job/resume.py)."""

    def __init__(self, base, specials: tuple[str, ...]):
        self.base, self.specials = base, tuple(specials)
        self.name = f"{base.name}+special"
        self.eot_id = base.eot_id
        self.first_special = base.vocab_size
        self.vocab_size = base.vocab_size + len(self.specials)
        self.special_ids = {text: self.first_special + k for k, text in enumerate(self.specials)}
        self._pattern = re.compile("(" + "|".join(map(re.escape, self.specials)) + ")")

    def pieces(self, text: str) -> list[str]:
        """`text` cut at its special strings, each kept as a piece of its own."""
        return [piece for piece in self._pattern.split(text) if piece]

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in self.pieces(text):
            ids += [self.special_ids[piece]] if piece in self.special_ids else self.base.encode(piece)
        return ids

    def decode(self, ids) -> str:
        out, run = [], []
        for i in (int(i) for i in ids):
            if i >= self.first_special:
                out += [self.base.decode(run), self.specials[i - self.first_special]]
                run = []
            else:
                run.append(i)
        return "".join(out) + self.base.decode(run)

    def token_bytes(self) -> np.ndarray:
        """The base's bytes per id; a special token stands for no text."""
        return np.concatenate([self.base.token_bytes(), np.zeros(len(self.specials), np.int64)])

    def to_dict(self, whole: bool = False) -> dict:
        return {"name": "special", "base": self.base.to_dict(whole), "specials": list(self.specials)}


def base_tokenizer(tokenizer):
    """The tokenizer without added special tokens: what a model's first vocab rows mean."""
    return tokenizer.base if isinstance(tokenizer, WithSpecialTokens) else tokenizer


def separator_id(tokenizer) -> int:
    """The token that ends every document of a prepared corpus: the end-of-text token, or
    where the tokenizer has none, the newline's; one line where it writes a newline as nothing."""
    if tokenizer.eot_id is not None:
        return tokenizer.eot_id
    if newline := tokenizer.encode("\n"):
        return newline[0]
    raise UserError(
        f"the tokenizer {tokenizer.name!r} has no end-of-text token and writes a newline as nothing, so nothing can "
        "end a document; give it an end-of-text token (tokenizer_config.json's eos_token or sep_token)"
    )


RUN_TOKENIZER_KEY = "name"  # a jaxgpt run's tokenizer.json is {"name": ..., ...}; the `tokenizers` library's is not


def is_tokenizer_folder(name: str) -> bool:
    """Whether data.tokenizer names a folder holding a tokenizer.json: one `jaxgpt tokenizer`
    trained, or a jaxgpt run's own (its workdir: the tokenizer it was trained with)."""
    return name not in TOKENIZERS and (Path(name) / "tokenizer.json").is_file()


def _folder_tokenizer(folder: Path):
    """The tokenizer in `folder`: a run's (jaxgpt's own format); a Hugging Face checkpoint's or
    tokenizer's (a config.json naming a model_type, or a tokenizer_config.json, beside it: its
    own end-of-text token); else a trained BPE's (`jaxgpt tokenizer` writes tokenizer.json alone)."""
    saved = _json_or_empty(folder / "tokenizer.json")
    if isinstance(saved.get(RUN_TOKENIZER_KEY), str):
        return base_tokenizer(tokenizer_from_dict(saved))
    if is_hugging_face_folder(folder):
        return HuggingFaceTokenizer(folder)
    return TrainedBPE.from_folder(folder)


def is_hugging_face_folder(folder: Path) -> bool:
    """Whether a tokenizer folder is a Hugging Face checkpoint's or tokenizer's, not a trained BPE's."""
    return "model_type" in _json_or_empty(folder / "config.json") or (folder / "tokenizer_config.json").is_file()


def make_tokenizer(name: str, corpus: str | None = None):
    """The tokenizer called `name`, or the trained one in the folder `name`; a char tokenizer
    needs the corpus to build its vocabulary."""
    if name == "char":
        return CharTokenizer.from_text(corpus or "")
    if name == "byte":
        return ByteTokenizer()
    if name in TIKTOKEN_ENCODINGS:
        return TiktokenTokenizer(name)
    if is_tokenizer_folder(name):
        return _folder_tokenizer(Path(name))
    raise UserError(
        f"unknown tokenizer {name!r}; data.tokenizer must be one of {', '.join(TOKENIZERS)}, a folder holding "
        "a tokenizer.json that python -m jaxgpt tokenizer wrote, or a run's workdir (its tokenizer)"
    )


def tokenizer_from_dict(d: dict):
    """The tokenizer a record names (to_dict): from its own copy of the vocabulary where it
    holds one (a tiktoken BPE's, always: tiktoken's name fixes the file), else from its source."""
    if d.get("name") == "char":
        return CharTokenizer(d["chars"])
    if d.get("name") == "huggingface":
        return HuggingFaceTokenizer.from_record(d)
    if d.get("name") in TIKTOKEN_ENCODINGS and "ranks" in d:
        return TiktokenTokenizer.from_kept(d)
    if d.get("name") == "bpe":
        return TrainedBPE(json.dumps(d["tokenizer"]))
    if d.get("name") == "special":
        return WithSpecialTokens(tokenizer_from_dict(d["base"]), tuple(d["specials"]))
    return make_tokenizer(d.get("name", "?"))


def using_the_runs_copy(source: Path, changed: bool) -> None:
    """The one line a reader of a run says where the file its tokenizer came from has changed
    since, or is gone: it reads the run's own copy instead."""
    what = "has changed" if changed else "is gone"
    warn_once(f"{source} {what} since this run was made; using the run's own copy of the tokenizer it was trained with")


def same_tokenizer(recorded: dict, current: dict) -> bool:
    """Whether two records (to_dict) name one tokenizer. A record written before runs kept their
    tokenizer's files holds fewer keys (a Hugging Face folder's path, a tiktoken name alone):
    those it has must agree."""
    if recorded.keys() - current.keys():
        return False
    return all(
        same_tokenizer(value, current[key]) if key == "base" else value == current[key]
        for key, value in recorded.items()
    )


def save_tokenizer(tokenizer, path: Path) -> None:
    """The tokenizer whole (its vocabulary file too): what a run's or a prepared corpus's
    folder needs to encode and decode its text wherever the source is."""
    Path(path).write_text(json.dumps(tokenizer.to_dict(whole=True), ensure_ascii=False))


def load_tokenizer(path: Path):
    try:
        return tokenizer_from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise UserError(f"no tokenizer at {path}; is this a jaxgpt run directory?") from None
