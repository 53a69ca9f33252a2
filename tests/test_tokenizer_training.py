"""A tokenizer trained on the user's text (jaxgpt/tokenizers.py's TrainedBPE, `jaxgpt tokenizer`):
its first merges are the ones worked by hand, any text round-trips exactly and its bytes are
accounted for token by token, and data.tokenizer=FOLDER carries it through preparation,
training and sampling (the run keeping its own copy)."""

import json

import numpy as np
import pytest
from conftest import small_run_config, trained

from jaxgpt.tokenizers import END_OF_TEXT, load_tokenizer, tokenizer_from_dict, train_bpe


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
    ],
    ids=["no-merges", "no-text", "held-out"],
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
