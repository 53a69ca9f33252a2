"""A run's tokenizer as Hugging Face's tokenizer.json, which transformers' AutoTokenizer (and so
lm-eval, vLLM or any tool that reads a model folder) loads offline: the same ids for every text.

Each of jaxgpt's tokenizers becomes a `tokenizers` pipeline:

  char       a WordLevel vocabulary of the characters, each character its own piece
  byte       a byte-level BPE with no merges: byte b is id b (ByteLevel's alphabet names them)
  tiktoken   a byte-level BPE whose merges are recovered from tiktoken's ranks (a token of rank r
             is the merge of the two pieces BPE reaches on its bytes with the ranks below r), its
             split pattern the encoding's own; the end-of-text token a special one
  bpe        the trained tokenizer's own file, the end-of-text separator added after it
  huggingface  the checkpoint's own file
  +special   the base's, the chat template's markers added after it as special tokens

One difference stays: a special token's own text inside a text ("<|endoftext|>") is that token
to transformers, as in GPT-2's own tokenizer.json, and plain text to jaxgpt, as tiktoken's
encode_ordinary reads it; the chat template's markers are special tokens to both.

tokenizer_config.json beside it says the end-of-text token where there is one, the context, and
that decoding must not "clean up" spaces (transformers' habit, which would change the text).
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxgpt.tokenizers import (
    END_OF_TEXT,
    ByteTokenizer,
    CharTokenizer,
    HuggingFaceTokenizer,
    TiktokenTokenizer,
    TrainedBPE,
    WithSpecialTokens,
    _byte_alphabet,
)

FILES = ("tokenizer.json", "tokenizer_config.json")


def hugging_face_tokenizer(tokenizer):
    """A `tokenizers.Tokenizer` giving `tokenizer`'s ids for every text it encodes."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if isinstance(tokenizer, WithSpecialTokens):
        out = hugging_face_tokenizer(tokenizer.base)
        _add_specials(out, tokenizer.base.vocab_size, tokenizer.specials)
        return out
    if isinstance(tokenizer, CharTokenizer):
        out = Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(tokenizer.chars)}, unk_token="\uffff"))
        out.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # a character a piece
        out.decoder = decoders.Fuse()  # joined as they are, not with spaces between
        return out
    if isinstance(tokenizer, ByteTokenizer):
        return _byte_level(_byte_alphabet(), merges=[])
    if isinstance(tokenizer, TiktokenTokenizer):
        kept = tokenizer.kept()
        vocab, merges = _merges_from_ranks(kept["ranks"])
        out = _byte_level(vocab, merges, split=kept["pattern"])
        for text, i in sorted(kept["special_tokens"].items(), key=lambda item: item[1]):
            out.add_special_tokens([AddedToken(text, special=True, normalized=False)])
            assert out.token_to_id(text) == i, (text, i)
        return out
    if isinstance(tokenizer, TrainedBPE):
        out = Tokenizer.from_str(tokenizer.tokenizer_json())
        _add_specials(out, tokenizer.eot_id, (END_OF_TEXT,))
        return out
    if isinstance(tokenizer, HuggingFaceTokenizer):
        return Tokenizer.from_str(tokenizer.to_dict(whole=True)["tokenizer_json"])
    raise TypeError(f"no Hugging Face form for a {type(tokenizer).__name__}")


def save_hugging_face_tokenizer(tokenizer, folder: Path, context: int | None = None) -> list[str]:
    """Write tokenizer.json and tokenizer_config.json into `folder`; returns their names."""
    folder = Path(folder)
    hugging_face_tokenizer(tokenizer).save(str(folder / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if tokenizer.eot_id is not None:
        settings["eos_token"] = tokenizer.decode([tokenizer.eot_id])
    if context:
        settings["model_max_length"] = context
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return list(FILES)


def _add_specials(out, first_id: int, specials) -> None:
    from tokenizers import AddedToken

    if out.get_vocab_size() != first_id:
        raise ValueError(f"special tokens start at {first_id}, not at the vocabulary's end ({out.get_vocab_size()})")
    out.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in specials])


def _byte_level(vocab: dict[str, int], merges: list[tuple[str, str]], split: str | None = None):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    out = Tokenizer(models.BPE(vocab, merges, ignore_merges=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if split is None:
        out.pre_tokenizer = byte_level
    else:
        out.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level]
        )
    out.decoder = decoders.ByteLevel()
    return out


def _merges_from_ranks(ranks_text: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of the byte-level BPE tiktoken's ranks describe: each token of two bytes
    or more is the merge of the two pieces that merging its bytes by rank, with the ranks below
    its own, ends at; merges listed in their token's rank order."""
    import base64

    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in ranks_text.splitlines())}
    alphabet = {byte: piece for piece, byte in _byte_alphabet().items()}
    as_piece = lambda b: "".join(alphabet[x] for x in b)  # noqa: E731
    vocab = {as_piece(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            pairs = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
            best, at = min(pairs)
            if best >= rank:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2:
            merges.append((as_piece(parts[0]), as_piece(parts[1])))
    return vocab, merges
