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


# ------------------------------------------------- what a run keeps of its tokenizer (its whole form)


def test_a_kept_gpt2_bpe_reads_text_where_tiktoken_has_no_file(gpt2_bpe, tmp_path):
    """The whole form of tiktoken's GPT-2 BPE (its split pattern, special token and merges)
    rebuilds the same encoding in a fresh process whose tiktoken cache is empty, offline: every
    id of a text with contractions, digits, spaces and non-ASCII letters, which the pattern splits."""
    import json

    from conftest import run_script

    text = "Don't split 12345 numbers   oddly: naïve café, ünïcödé and <|endoftext|> as text.\n\tdef f(x): return x"
    save_tokenizer(make_tokenizer("gpt2"), tmp_path / "tokenizer.json")
    read = (
        "import json, sys; from jaxgpt.tokenizers import load_tokenizer, make_tokenizer; "
        f"kept = load_tokenizer({str(tmp_path / 'tokenizer.json')!r}); text = json.loads(sys.argv[1]); "
        "print(json.dumps([kept.encode(text), kept.decode(kept.encode(text)), kept.vocab_size, kept.eot_id])); "
        "make_tokenizer('gpt2')"  # the cache really is empty: this one fails
    )
    empty = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty")}
    result = run_script("-c", read, json.dumps(text), env=empty)
    assert json.loads(result.stdout) == [make_tokenizer("gpt2").encode(text), text, 50257, 50256]
    assert result.returncode == 1 and "could not load its 'gpt2' BPE file" in result.stderr


def test_a_kept_vocabulary_that_was_edited_is_one_line(gpt2_bpe, tmp_path):
    import json

    save_tokenizer(make_tokenizer("gpt2"), tmp_path / "tokenizer.json")
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    saved["ranks"] = saved["ranks"].replace(" 1000\n", " 1001\n", 1)
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))
    with pytest.raises(UserError, match="the kept 'gpt2' BPE in this run's tokenizer.json has SHA-256 .* damaged"):
        load_tokenizer(tmp_path / "tokenizer.json")


def hugging_face_folder(folder, text: str, vocab_size: int):
    """A Hugging Face tokenizer folder: a byte-level BPE trained on `text`, with its config."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([text], trainer)
    bpe.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return folder


def test_a_hugging_face_tokenizer_is_read_from_the_runs_copy_once_its_folder_changes_or_goes(tmp_path, capsys):
    folder = hugging_face_folder(tmp_path / "tok", "the cat sat on the mat. " * 20, 300)
    tokenizer = make_tokenizer(str(folder))
    (tmp_path / "run").mkdir()
    save_tokenizer(tokenizer, tmp_path / "run" / "tokenizer.json")
    ids = tokenizer.encode("the cat sat")
    assert load_tokenizer(tmp_path / "run" / "tokenizer.json").encode("the cat sat") == ids
    assert capsys.readouterr().err == ""  # the folder unchanged: nothing to say
    hugging_face_folder(folder, "completely other words, another vocabulary " * 20, 280)
    assert make_tokenizer(str(folder)).encode("the cat sat") != ids  # the folder now tokenizes otherwise
    for step in ("changed", "gone"):
        if step == "gone":
            folder.rename(tmp_path / "moved")
        kept = load_tokenizer(tmp_path / "run" / "tokenizer.json")
        assert kept.encode("the cat sat") == ids and (kept.eot_id, kept.vocab_size) == (0, tokenizer.vocab_size)
        said = "has changed" if step == "changed" else "is gone"
        assert capsys.readouterr().err == (
            f"warning: {folder / 'tokenizer.json'} {said} since this run was made; using the run's own copy of the "
            "tokenizer it was trained with\n"
        )


def test_records_written_before_runs_kept_their_tokenizers_name_the_same_tokenizer(tmp_path):
    """A checkpoint of an older run names a Hugging Face folder by its path and a tiktoken BPE by
    its name alone: it still resumes, and still refuses another folder."""
    from jaxgpt.tokenizers import same_tokenizer

    folder = hugging_face_folder(tmp_path / "tok", "the cat sat on the mat. " * 20, 300)
    now = make_tokenizer(str(folder)).to_dict()
    assert same_tokenizer({"name": "huggingface", "directory": str(folder)}, now)
    assert not same_tokenizer({"name": "huggingface", "directory": str(tmp_path / "other")}, now)
    assert same_tokenizer({"name": "gpt2"}, {"name": "gpt2", "sha256": "0" * 64})
    assert not same_tokenizer(now | {"sha256": "0" * 64}, now)
