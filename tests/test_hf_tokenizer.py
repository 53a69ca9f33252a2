"""Every run's tokenizer as Hugging Face's tokenizer.json (jaxgpt/hf/tokenizer.py), read back by
transformers' own AutoTokenizer from the folder alone: the same ids as jaxgpt's tokenizer for
every text, and the same text decoded. The texts: a sentence of each kind of character
(spaces in runs, a tab, newlines, accents, CJK, an emoji), and this repository's own
jaxgpt/tokenizers.py, 25 KB of English and Python, against the GPT-2 BPE's 50,000 merges."""

from pathlib import Path

import pytest

from jaxgpt.data.conversations import TEMPLATE_TOKENS, chat_tokenizer
from jaxgpt.hf.tokenizer import save_hugging_face_tokenizer
from jaxgpt.tokenizers import END_OF_TEXT, ByteTokenizer, CharTokenizer, make_tokenizer, train_bpe

transformers = pytest.importorskip(
    "transformers", reason="reading the folder back needs transformers: pip install -r requirements-hf.txt"
)

TEXTS = [
    "Hello world!\n  The  quick brown fox's 123 jumps.",
    "né café ünïcödé 日本語 🙂 — “quoted”",
    "  leading and trailing  ",
    "a\n\n\nb\tc",
    # The one difference: the end-of-text token's own text inside a text is that token to
    # transformers (as GPT-2's own tokenizer.json has it) and plain text to jaxgpt (tiktoken's
    # encode_ordinary); the source names it, so it is spelled otherwise here.
    (Path(__file__).parents[1] / "jaxgpt" / "tokenizers.py").read_text().replace(END_OF_TEXT, "<|end of text|>"),
]


def kinds(gpt2: bool):
    chars = CharTokenizer.from_text("".join(TEXTS))
    yield "char", chars
    yield "byte", ByteTokenizer()
    yield "bpe", train_bpe(TEXTS * 3, 400)
    yield "char+chat", chat_tokenizer(chars)
    yield "byte+chat", chat_tokenizer(ByteTokenizer())
    if gpt2:
        yield "gpt2", make_tokenizer("gpt2")


def same_ids(tokenizer, folder: Path, texts) -> None:
    read = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in texts:
        ids = tokenizer.encode(text)
        assert read.encode(text, add_special_tokens=False) == ids, (tokenizer.name, text[:60])
        assert read.decode(ids) == tokenizer.decode(ids), (tokenizer.name, text[:60])
    return read


@pytest.mark.parametrize("name", ["char", "byte", "bpe", "char+chat", "byte+chat"])
def test_transformers_reads_each_runs_tokenizer_as_the_same_ids(name, tmp_path):
    tokenizer = dict(kinds(gpt2=False))[name]
    save_hugging_face_tokenizer(tokenizer, tmp_path, context=128)
    template = "".join(f"{marker}x" for marker in TEMPLATE_TOKENS)
    read = same_ids(tokenizer, tmp_path, TEXTS + ([template] if "chat" in name else []))
    assert len(read) == tokenizer.vocab_size and read.model_max_length == 128
    if tokenizer.eot_id is not None:
        assert read.eos_token_id == tokenizer.eot_id


def test_the_gpt2_bpe_keeps_its_merges_and_its_end_of_text_token(gpt2_bpe, tmp_path):
    tokenizer = make_tokenizer("gpt2")
    save_hugging_face_tokenizer(tokenizer, tmp_path)
    read = same_ids(tokenizer, tmp_path, TEXTS)
    assert read.eos_token_id == 50256 and len(read) == 50257
    assert read.encode(END_OF_TEXT) == [50256] and tokenizer.encode(END_OF_TEXT) != [50256]
