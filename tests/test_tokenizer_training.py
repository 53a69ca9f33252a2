"""A tokenizer trained on the user's text (jaxgpt/tokenizers.py's TrainedBPE, `jaxgpt tokenizer`):
its first merges are the ones worked by hand, any text round-trips exactly and its bytes are
accounted for token by token, and data.tokenizer=FOLDER carries it through preparation,
training and sampling (the run keeping its own copy)."""

import json

import numpy as np
import pytest
from conftest import small_run_config, trained

from jaxgpt.tokenizers import END_OF_TEXT, load_tokenizer, make_tokenizer, tokenizer_from_dict, train_bpe


def test_the_first_merges_are_the_ones_worked_by_hand():
    """'abababcab' as one word: the pairs ab 4, ba 3, bc 1, ca 1, so a+b merges first; then the
    word is ab ab ab c ab, whose pairs are (ab ab) 2, (ab c) 1, (c ab) 1: ab+ab next. 256 bytes,
    two merges and the separator: 259 ids."""
    tokenizer = train_bpe(["abababcab"], vocab_size=259)
    merges = json.loads(tokenizer.tokenizer_json())["model"]["merges"]
    assert [tuple(m) for m in merges] == [("a", "b"), ("ab", "ab")]
    assert tokenizer.vocab_size == 259 and tokenizer.eot_id == 258
    assert tokenizer.encode("abababcab") == tokenizer.encode("abab") + tokenizer.encode("ab") + tokenizer.encode(
        "c"
    ) + tokenizer.encode("ab")
    assert len(tokenizer.encode("abab")) == 1


def unicode_texts(seed=0, count=200):
    """Random strings over every plane (no surrogates: UTF-8 cannot hold them), with the
    characters that trip tokenizers: NUL, controls, combining marks, emoji, spaces of all kinds."""
    rng = np.random.default_rng(seed)
    awkward = ["\x00", "\n", "\r\n", "\t", "\u0301", "😀", "👩‍👩‍👧", "\u00a0", "\u3000", "  ", "ÿ", "\x7f", "\ufeff"]
    texts = []
    for _ in range(count):
        points = rng.integers(0, 0x110000, rng.integers(1, 30))
        chars = [chr(p) for p in points if not 0xD800 <= p <= 0xDFFF]
        chars += list(rng.choice(awkward, 3))
        rng.shuffle(chars)
        texts.append("".join(chars))
    return texts


def test_any_text_round_trips_exactly_and_every_byte_is_accounted_for():
    tokenizer = train_bpe(["the cat sat on the mat, the cat ate the rat. " * 20, "naïve café 😀 " * 5], vocab_size=300)
    sizes = tokenizer.token_bytes()
    assert sizes[tokenizer.eot_id] == 0 and (sizes[:256] == 1).all()  # the 256 bytes come first
    for text in unicode_texts() + [chr(i) for i in range(256)] + ["the cat sat"]:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert sizes[ids].sum() == len(text.encode("utf-8"))  # bits per byte counts each byte once
        assert tokenizer.eot_id not in ids  # the separator is never text
    assert tokenizer.decode(tokenizer.encode("a") + [tokenizer.eot_id] + tokenizer.encode("b")) == f"a{END_OF_TEXT}b"
    again = tokenizer_from_dict(json.loads(json.dumps(tokenizer.to_dict())))  # as a run's tokenizer.json holds it
    assert all(again.encode(t) == tokenizer.encode(t) for t in unicode_texts(seed=1, count=20))


@pytest.fixture
def book(tmp_path):
    text = "".join(f"Chapter {i}. It was the best of times, it was the worst of times.\n" for i in range(300))
    path = tmp_path / "book.txt"
    path.write_text(text)
    return path


def test_the_command_measures_it_beside_a_character_tokenizer_and_writes_it(book, tmp_path, capsys):
    from jaxgpt.commands import tokenizer as command

    out = tmp_path / "bpe"
    command.main(["--text", str(book), "--vocab_size", "300", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("trained a byte-level BPE of 300 ids on ")
    rows = {line.split("  ")[1].strip(): line.rsplit(" ", 1)[1] for line in printed[2:-1]}
    ours, characters = (
        float(rows["this BPE (300 ids)"]),
        float(next(v for k, v in rows.items() if k.startswith("char"))),
    )
    assert characters == 1.0 and ours > 1.5  # plain ASCII: a byte a character; the merges join them
    assert printed[-1] == f"wrote {out / 'tokenizer.json'}; train with it: --config.data.tokenizer={out}"
    with pytest.raises(SystemExit) as exit_status:  # not again over it
        command.main(["--text", str(book), "--vocab_size", "300", "--out", str(out)])
    assert exit_status.value.code == 2 and "exists; pass --out a new folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--vocab_size", "257"], "--vocab_size 257 leaves no room for a merge"),
        (["--text", "no/such.txt"], "no/such.txt: no such file"),
        (["--held_out", "1.5"], "--held_out 1.5 must lie between 0 and 1"),
        # refused where `tokenizers` used to abort the process (status 134, a Rust backtrace)
        (["--vocab_size", "1000000000"], "--vocab_size 1,000,000,000 is more than this text can give"),
    ],
    ids=["no-merges", "no-text", "held-out", "more-than-the-text"],
)
def test_the_command_refuses_bad_input_in_one_line(book, tmp_path, capsys, flags, message):
    from jaxgpt.commands import tokenizer as command

    given = {"--text": str(book), "--vocab_size": "300", "--out": str(tmp_path / "bpe")}
    given |= dict(zip(flags[::2], flags[1::2], strict=True))
    with pytest.raises(SystemExit) as exit_status:
        command.main([x for pair in given.items() for x in pair])
    error = capsys.readouterr().err.strip()
    assert exit_status.value.code == 2 and "\n" not in error and message in error, error
    assert not (tmp_path / "bpe").exists()


def test_a_run_trains_and_samples_with_it_and_keeps_its_own_copy(book, tmp_path):
    """data.tokenizer=FOLDER: the corpus is prepared with it (a cache named by its file's hash:
    trained again, the folder's new tokenizer gets new tokens), the run trains, and its own
    tokenizer.json holds the whole tokenizer, so the folder can go."""
    import shutil

    from jaxgpt.config import DataConfig
    from jaxgpt.data.prepared import cache_folder
    from jaxgpt.tokenizers import TrainedBPE

    folder = tmp_path / "bpe"
    folder.mkdir()
    bpe = train_bpe([book.read_text()], vocab_size=320)
    (folder / "tokenizer.json").write_text(bpe.tokenizer_json())
    config = small_run_config(steps=3, eval_every=3, checkpoint_every=3)
    config.data.update(source=f"text:{book}", tokenizer=str(folder), cache_dir=str(tmp_path / "cache"))
    run = trained(tmp_path / "run", config)
    first_cache = cache_folder(DataConfig(**config.data.to_dict()))
    assert first_cache.name.split("-")[-2] == "bpe" and first_cache.exists()
    kept = load_tokenizer(run / "tokenizer.json")
    assert isinstance(kept, TrainedBPE) and kept.vocab_size == 320
    (folder / "tokenizer.json").write_text(train_bpe([book.read_text()], vocab_size=330).tokenizer_json())
    assert cache_folder(DataConfig(**config.data.to_dict())) != first_cache
    shutil.rmtree(folder)
    import jax
    import jax.numpy as jnp

    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.model.sampling import SamplingConfig, generate

    saved, params, tokenizer, _ = load_latest(run)
    prompt = jnp.asarray([tokenizer.encode("It was")], jnp.int32)
    made = generate(saved.model, params, prompt, jax.random.key(0), max_new_tokens=5, sampling=SamplingConfig())
    assert made.shape == (1, 5) and isinstance(tokenizer.decode(np.asarray(made[0])), str)  # the new tokens


def hugging_face_folder(folder, tokenizer_json: str, **files) -> str:
    """A folder as a Hugging Face checkpoint or tokenizer leaves it: tokenizer.json, and the JSON
    files given (config.json, tokenizer_config.json) beside it."""
    folder.mkdir()
    (folder / "tokenizer.json").write_text(tokenizer_json)
    for name, content in files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return str(folder)


def test_a_hugging_face_folder_is_read_with_its_own_end_token_and_rows(tmp_path):
    """data.tokenizer=FOLDER on a Hugging Face checkpoint: the end of text is the checkpoint's
    eos_token_id (not one id past the vocabulary, a trained BPE's), the ids span its config's
    vocab_size (padded past the tokenizer's own count here, as Qwen2's is), and every byte of any text
    is counted once (byte-level pieces), the padded rows none. Alone, the same tokenizer.json is
    a trained BPE's, as `jaxgpt tokenizer` writes it."""
    from jaxgpt.tokenizers import HuggingFaceTokenizer, TrainedBPE

    bpe = train_bpe(["the cat sat on the mat, " * 20, "naïve café 😀 " * 5], vocab_size=300)
    spec, pieces = bpe.tokenizer_json(), bpe.eot_id  # the merges this text allows, after the 256 bytes
    config = {"model_type": "llama", "eos_token_id": 5, "vocab_size": 320}
    checkpoint = make_tokenizer(hugging_face_folder(tmp_path / "llama", spec, config=config))
    assert isinstance(checkpoint, HuggingFaceTokenizer) and (checkpoint.eot_id, checkpoint.vocab_size) == (5, 320)
    sizes = checkpoint.token_bytes()
    assert len(sizes) == 320 and (sizes[pieces:] == 0).all() and pieces < 300
    for text in unicode_texts(seed=2, count=50) + ["the cat sat"]:
        assert sizes[checkpoint.encode(text)].sum() == len(text.encode("utf-8"))
    several_ends = {"model_type": "llama", "eos_token_id": [7, 8]}  # Llama 3.1's instruct models list three
    assert make_tokenizer(hugging_face_folder(tmp_path / "instruct", spec, config=several_ends)).eot_id == 7
    named = {"eos_token": {"content": "c", "special": True}}  # a tokenizer alone: its settings name the token
    tokenizer_only = make_tokenizer(hugging_face_folder(tmp_path / "tokenizer", spec, tokenizer_config=named))
    assert tokenizer_only.eot_id == tokenizer_only.encode("c")[0]
    trained = make_tokenizer(hugging_face_folder(tmp_path / "trained", spec))
    assert isinstance(trained, TrainedBPE) and trained.eot_id == trained.vocab_size - 1 == pieces


def test_a_sentencepiece_vocabulary_counts_its_word_marks_as_spaces(tmp_path):
    """Llama 2's and Mistral's kind of tokenizer.json: words marked by "▁" (a space; one is put
    before the text), bytes outside the vocabulary as "<0xNN>" pieces of one byte each. So a
    text's pieces count its bytes and the one space put before it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "</s>": 1, "<0x0A>": 2, "<0xC3>": 3, "<0xA9>": 4, "▁": 5}
    for word in ("▁the", "▁cat", "▁sat", "t", "h", "e", "c", "a", "s"):
        vocab[word] = len(vocab)
    merges = [("▁", "t"), ("▁t", "h"), ("▁th", "e"), ("▁", "c"), ("▁c", "a"), ("▁ca", "t"), ("▁", "s"), ("▁s", "a")]
    merges += [("▁sa", "t")]
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    model = models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    spaces, first_space = decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)
    tokenizer.decoder = decoders.Sequence([spaces, decoders.ByteFallback(), decoders.Fuse(), first_space])
    tokenizer.add_special_tokens(["</s>"])
    config = {"model_type": "llama", "eos_token_id": 1}
    loaded = make_tokenizer(hugging_face_folder(tmp_path / "llama2", tokenizer.to_str(), config=config))
    sizes = loaded.token_bytes()
    assert sizes[1] == 0 and (sizes[2:5] == 1).all() and sizes[vocab["▁the"]] == 4
    for text in ("the cat sat", "the cat\nsat", "the caé sat"):  # é: two bytes outside the vocabulary
        ids = loaded.encode(text)
        assert loaded.decode(ids) == text
        assert sizes[ids].sum() == len((" " + text).encode("utf-8")), (text, ids)


def test_prepared_data_is_named_by_the_files_that_decide_a_hugging_face_folders_ids(tmp_path):
    """The end-of-text id a Hugging Face folder's corpus is prepared with comes from config.json
    (or tokenizer_config.json) beside its tokenizer.json, so a change there prepares the corpus
    anew; a trained BPE's folder is named by its tokenizer.json alone, as before."""
    from jaxgpt.config import DataConfig
    from jaxgpt.data.prepared import cache_folder

    (tmp_path / "book.txt").write_text("the cat sat on the mat")
    spec = train_bpe(["the cat sat on the mat, " * 20], vocab_size=270).tokenizer_json()
    folder = hugging_face_folder(tmp_path / "llama", spec, config={"model_type": "llama", "eos_token_id": 5})
    data = DataConfig(source=f"text:{tmp_path / 'book.txt'}", tokenizer=folder)
    before = cache_folder(data)
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 6}))
    assert cache_folder(data) != before
    trained = DataConfig(source=data.source, tokenizer=hugging_face_folder(tmp_path / "bpe", spec))
    named = cache_folder(trained)
    (tmp_path / "bpe" / "notes.json").write_text("{}")
    assert cache_folder(trained) == named


def test_the_most_a_text_can_give_is_a_merge_per_byte_pair():
    """Two bytes of text allow one merge: 256 + 1 + the separator = 258 ids; 259 is refused."""
    from jaxgpt.errors import UserError
    from jaxgpt.tokenizers import train_bpe

    assert train_bpe(["ab"], 258).vocab_size == 258
    with pytest.raises(UserError, match="allow at most 258 ids"):
        train_bpe(["ab"], 259)
