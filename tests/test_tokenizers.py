"""Tokenizers: every one round-trips text; failures are one clear UserError."""

import pytest
import requests

from jaxgpt.errors import UserError
from jaxgpt.tokenizers import ByteTokenizer, CharTokenizer, load_tokenizer, make_tokenizer, save_tokenizer

TEXT = "The assert statement: x = 1  # ok\n\tdone"


def test_char_tokenizer_round_trips_and_numbers_sorted_characters():
    tok = CharTokenizer.from_text(TEXT)
    assert tok.chars == "".join(sorted(set(TEXT)))
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.encode("\t\n") == [0, 1]  # tab and newline sort first


def test_char_tokenizer_names_an_unknown_character():
    with pytest.raises(UserError, match="character 'Z' is not in"):
        CharTokenizer.from_text("abc").encode("aZ")


def test_byte_tokenizer_round_trips_any_unicode():
    tok = ByteTokenizer()
    text = "naïve café — 東京 🙂"
    assert tok.decode(tok.encode(text)) == text
    assert max(tok.encode(text)) < 256 and len(tok.encode("é")) == 2  # UTF-8 bytes


def test_gpt2_round_trips_with_the_offline_cache(gpt2_bpe):
    tok = make_tokenizer("gpt2")
    assert tok.vocab_size == 50257 and tok.eot_id == 50256
    assert tok.encode("hello world") == [31373, 995]  # GPT-2's published ids
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.encode("<|endoftext|>") != [tok.eot_id]  # special tokens in text stay text


def test_token_bytes_count_the_utf8_text_each_id_stands_for(gpt2_bpe):
    """Summed over an encoding, the bytes per id are the text's UTF-8 length (what bits per byte
    divides by); the end-of-text separator stands for no text."""
    text = TEXT + " naïve — ünïcödé 日本語"
    for name in ("char", "byte", "gpt2"):
        tok = make_tokenizer(name, text)
        per_id = tok.token_bytes()
        assert per_id.shape == (tok.vocab_size,)
        assert int(per_id[tok.encode(text)].sum()) == len(text.encode("utf-8")), name
    assert make_tokenizer("gpt2").token_bytes()[50256] == 0


def test_missing_bpe_file_is_a_clear_error(tmp_path, monkeypatch):
    import tiktoken.load

    def offline(url):
        raise requests.exceptions.ConnectionError(f"cannot reach {url}")

    monkeypatch.setattr(tiktoken.load, "read_file", offline)  # as offline, without touching the network
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(UserError, match="could not load its 'o200k_base' BPE file.*TIKTOKEN_CACHE_DIR"):
        make_tokenizer("o200k_base")


def test_unknown_tokenizer_is_a_clear_error():
    with pytest.raises(UserError, match="unknown tokenizer 'sentencepiece'; data.tokenizer must be one of"):
        make_tokenizer("sentencepiece")


@pytest.mark.parametrize("tok", [CharTokenizer.from_text(TEXT), ByteTokenizer()], ids=["char", "byte"])
def test_saved_tokenizer_loads_identically(tok, tmp_path):
    save_tokenizer(tok, tmp_path / "tokenizer.json")
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert loaded.to_dict() == tok.to_dict() and loaded.encode(TEXT) == tok.encode(TEXT)
