"""Text pairs (jaxgpt/data/pairs.py): read, generated, packed into rows with the loss on the
answers, trained, resumed, evaluated and answered through the engine's own commands."""

import datetime
import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, small_run_config

from jaxgpt import data
from jaxgpt.data.pairs import DATE_FORMATS, Examples, date_pairs, packed_row, read_pairs, rows_in_order
from jaxgpt.errors import UserError
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.tokenizers import CharTokenizer
from jaxgpt.training.objectives import exact_matches


def test_a_pairs_file_is_read_a_pair_a_line_and_a_line_that_is_not_one_is_named(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("  hello \tbonjour\n\nthank you\tmerci  \n")
    assert read_pairs(str(path)) == ["hello\tbonjour", "thank you\tmerci"]
    for line, tabs in (("no tab here", 0), ("a\tb\tc", 2)):
        path.write_text(f"hello\tbonjour\n{line}\n")
        with pytest.raises(UserError, match=rf"line 2 of .* found {tabs} tab"):
            read_pairs(str(path))
    for line, side in (("\tmerci", "source \\(nothing before"), ("hello \t ", "target \\(nothing after")):
        path.write_text(f"hello\tbonjour\n{line}\n")
        with pytest.raises(UserError, match=rf"line 2 of .* has an empty {side} its tab\)"):
            read_pairs(str(path))


def test_a_byte_order_mark_opening_a_pairs_or_chat_file_is_not_text(tmp_path):
    """As some editors write it: without it read, U+FEFF became a character of the vocabulary
    (a pairs file) or the file was refused (a chat file); both now read as without it."""
    from jaxgpt.data.conversations import read_conversations

    (tmp_path / "pairs.tsv").write_text("\ufeffhello\tbonjour\n", encoding="utf-8")
    assert read_pairs(str(tmp_path / "pairs.tsv")) == ["hello\tbonjour"]
    chat = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    (tmp_path / "chat.jsonl").write_text("\ufeff" + chat, encoding="utf-8")
    (tmp_path / "plain.jsonl").write_text(chat, encoding="utf-8")
    assert read_conversations(str(tmp_path / "chat.jsonl")) == read_conversations(str(tmp_path / "plain.jsonl"))


def test_a_source_to_answer_holding_the_tab_is_refused():
    """The tab ends a source in training: a prompt holding one would be read as its answer begun."""
    from jaxgpt.data.pairs import prompt_ids, source_ids

    tokenizer = CharTokenizer("\t\nab")
    assert prompt_ids(tokenizer, " ab ") == [1, 2, 3, 0]
    for ids in (prompt_ids, source_ids):
        with pytest.raises(UserError, match="the source 'a\\\\tb' holds a tab, which ends a source in training"):
            ids(tokenizer, "a\tb")


def parsed(text: str) -> datetime.date:
    """The date a source names, read back by strptime's formats (an independent reading)."""
    text = re.sub(r"^the ", "", text)
    text = re.sub(r"(\d+)(st|nd|rd|th)\b( of)?", r"\1", text)
    for form in ("%d %B, %Y", "%d %B %Y", "%B %d, %Y", "%d %b %Y", "%b %d, %Y", "%A, %B %d, %Y", "%a %d %b %Y"):
        try:
            return datetime.datetime.strptime(text, form).date()
        except ValueError:
            continue
    for form in ("%Y/%m/%d", "%d-%b-%Y"):
        try:
            return datetime.datetime.strptime(text, form).date()
        except ValueError:
            continue
    raise AssertionError(f"no format reads {text!r}")


WEEKDAY_NAMES = {datetime.date(2000, 1, 3 + d).strftime(form) for d in range(7) for form in ("%A", "%a")}


def test_every_generated_date_names_the_day_its_iso_form_gives():
    """All 20,000 pairs: the source, read back by strptime (weekday names checked too, since
    strptime ignores them), is the ISO target's date; every format is used; the list is the
    same every time."""
    pairs = date_pairs()
    assert pairs == date_pairs() and len(pairs) == 20_000
    for pair in pairs:
        source, target = pair.split("\t")
        day = datetime.date.fromisoformat(target)
        assert parsed(source) == day, pair
        first_word = re.split(r"[ ,]", source)[0]
        if first_word in WEEKDAY_NAMES:  # "Wednesday, March 3, 2021" or "Wed 3 Mar 2021": the day's own
            assert first_word in (day.strftime("%A"), day.strftime("%a")), pair
    shapes = {re.sub(r"\d", "9", re.sub(r"[A-Za-z]+", "w", pair.split("\t")[0])) for pair in pairs}
    assert len(shapes) >= len(DATE_FORMATS) - 3  # formats that share a shape once words are masked


def char_examples(pairs: list[str], tokenizer=None) -> tuple[Examples, CharTokenizer]:
    """`pairs` as a split of a stream, "\\n" their separator, as preparation writes them."""
    tokenizer = tokenizer or CharTokenizer.from_text("".join(pairs) + "\n")
    tokens = np.array(tokenizer.encode("\n".join(pairs) + "\n"))
    lengths = np.array([len(p) for p in pairs])
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
    sources = np.array([p.index("\t") for p in pairs])
    examples = Examples(tokens, starts, starts + lengths, sources, tokenizer.encode("\n")[0], 0)
    return examples, tokenizer


def test_a_row_packs_whole_examples_and_scores_their_answers_alone():
    """Worked by hand: "ab<TAB>c" and "d<TAB>ef" are 6 tokens each with their separators, so a
    row of 14 tokens (seq_len 13) holds both and then 2 of padding, where "gh<TAB>ij" (7) would
    not fit; the answer tokens and each example's end are scored, nothing else; each example
    its own segment, positions from 0; padding segment 0."""
    examples, tokenizer = char_examples(["ab\tc", "d\tef", "gh\tij"])
    row = packed_row(examples, iter([0, 1, 2]), 13)
    text = tokenizer.decode(np.append(row["inputs"], row["targets"][-1]))
    assert text == "\nab\tc\n\nd\tef\n\n\n"  # two examples, then two tokens of padding (the separator)
    scored = "".join(tokenizer.decode([t]) if w else "." for t, w in zip(row["targets"], row["weights"], strict=True))
    assert scored == "...c\n...ef\n.."
    assert row["segments"].tolist() == [1] * 6 + [2] * 6 + [0]
    assert row["positions"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0]
    rows = rows_in_order(examples, 13, packed_row)
    assert [r["segments"].max() for r in rows] == [2, 1]  # every example once, in order


def test_exact_matches_count_examples_with_every_answer_token_right():
    """Two rows: row 0 holds examples 1 (all right) and 2 (one wrong), row 1 example 1 (right)
    and padding; a wrong token outside the answers (weight 0) does not count."""
    segments = jnp.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 0, 0]])
    weights = jnp.array([[0, 1, 1, 0, 1, 1], [0, 0, 1, 1, 0, 0]], jnp.float32)
    right = jnp.array([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]], bool)
    counted = exact_matches(right, weights, segments)
    assert (float(counted["exact_matches"]), float(counted["examples"])) == (2.0, 3.0)


@pytest.fixture(scope="module")
def pairs_run(tmp_path_factory):
    """A 2-layer model trained 40 steps on 600 reversal pairs of a file, checkpointed at 20."""
    folder = tmp_path_factory.mktemp("pairs")
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefgh"), rng.integers(2, 7))) for _ in range(600)]
    (folder / "reverse.tsv").write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    config = small_run_config(steps=40, eval_every=20, checkpoint_every=20, eval_batches=2)
    config.data.source = f"pairs:{folder / 'reverse.tsv'}"
    config.model.position = "rope"
    train_and_evaluate(config, folder / "run", progress=False)
    return folder, config


def metrics(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_a_pairs_run_logs_the_answers_loss_accuracy_and_exact_match(pairs_run):
    folder, _ = pairs_run
    evaluated = [r for r in metrics(folder / "run") if "val_loss" in r]
    assert [r["step"] for r in evaluated] == [20, 40]
    last = evaluated[-1]
    assert 0 <= last["val_exact_match"] <= last["val_token_accuracy"] <= 1
    assert last["val_loss"] < evaluated[0]["val_loss"]


def test_a_pairs_run_resumes_bit_for_bit(pairs_run, tmp_path):
    """Stopped at 20 and resumed, the losses are those of the straight run: batches of packed
    examples are a pure function of (seed, step), as windows are."""
    folder, config = pairs_run
    train_and_evaluate(config, tmp_path / "run", progress=False, stop_at=20)
    train_and_evaluate(config, tmp_path / "run", progress=False)
    straight = [r for r in metrics(folder / "run") if "train_loss" in r or "val_loss" in r]
    resumed = [r for r in metrics(tmp_path / "run") if "train_loss" in r or "val_loss" in r]
    keys = ("step", "train_loss", "val_loss", "val_exact_match")
    assert [{k: r.get(k) for k in keys} for r in resumed] == [{k: r.get(k) for k in keys} for r in straight]


def test_sample_answers_a_source_and_evaluate_scores_every_held_out_pair(pairs_run):
    """sample.py frames the prompt as training framed sources and stops at the answer's end;
    evaluate scores every held-out pair (more than the run's 2 evaluation batches hold)."""
    folder, config = pairs_run
    run = folder / "run"
    answered = subprocess.run(
        [sys.executable, "sample.py", "--workdir", str(run), "--prompt", "abcd", "--temperature", "0"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    source, answer = answered.stdout.rstrip("\n").split("\t")
    assert source == "abcd" and set(answer) <= set("abcdefgh") and "\n" not in answer
    evaluated = subprocess.run(
        [sys.executable, "-m", "jaxgpt", "evaluate", "--workdir", str(run)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    held_out = data.pairs.split_examples(data.prepare(config_data(config), progress=False), 32)[1]
    assert f"{len(held_out)} held-out pairs" in evaluated.stdout
    assert "exactly right (greedy decoding)" in evaluated.stdout


def test_the_validation_line_says_how_many_held_out_pairs_its_batches_hold(pairs_run):
    """A run scores the held-out pairs its train.eval_batches batches of rows hold: the line
    says of how many, and that evaluate scores them all (a 2,000-pair file printed "196
    held-out pairs" with no reason)."""
    from jaxgpt.data.pairs import pair_validation

    _, config = pairs_run
    dataset = data.prepare(config_data(config), progress=False)
    held_out = data.pairs.split_examples(dataset, 32)[1]
    one_batch = pair_validation(held_out, dataset.tokenizer.token_bytes(), 32, batch_size=2, most=1)
    assert 0 < one_batch.examples < len(held_out)
    assert one_batch.describe().startswith(
        f"validation: {one_batch.examples} of the {len(held_out)} held-out pairs (the train.eval_batches batches "
        f"of packed rows hold them; jaxgpt evaluate scores all {len(held_out)}) in 2 packed rows"
    )
    every = pair_validation(held_out, dataset.tokenizer.token_bytes(), 32, batch_size=2, most=len(held_out))
    assert every.describe().startswith(f"validation: {len(held_out)} held-out pairs in ")


def test_exact_match_is_what_greedy_decoding_writes(pairs_run):
    """The exact match evaluation logs, read off one teacher-forced pass, against answers
    written by greedy decoding with the KV cache (sampling.generate): for 8 held-out sources,
    the pair with the answer greedy decoding writes scores 1, and the same pair with its first
    answer character changed scores 0."""
    from jaxgpt.data.pairs import prompt_ids
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.model.sampling import SamplingConfig, generate
    from jaxgpt.model.transformer import GPT
    from jaxgpt.training.train_step import eval_step

    folder, _ = pairs_run
    run, params, tokenizer, _ = load_latest(folder / "run")
    held_out = data.pairs.split_examples(data.prepare(run.data, progress=False), 32)[1]
    separator, greedy = held_out.separator, SamplingConfig(temperature=0.0)
    pairs = []
    for i in range(8):
        source = tokenizer.decode(held_out.unit(i)[1:-1].tolist()).split("\t")[0]
        prompt = jnp.asarray([prompt_ids(tokenizer, source)], jnp.int32)
        made = generate(
            run.model, params, prompt, jax.random.key(0), max_new_tokens=12, sampling=greedy, eot_id=separator
        )
        made = made[0].tolist()
        if separator in made:  # an answer that ends within the row
            answer = tokenizer.decode(made[: made.index(separator)])
            other = "a" if answer[:1] != "a" else "b"
            pairs += [f"{source}\t{answer}", f"{source}\t{other}{answer[1:]}"]
    assert len(pairs) >= 8
    examples, _ = char_examples(pairs, tokenizer)
    score = jax.jit(lambda p, b: eval_step(p, b, model=GPT(run.model)))
    for i in range(len(pairs)):
        row = {k: jnp.asarray(x[None]) for k, x in packed_row(examples, iter([i]), 32).items()}
        assert float(score(params, row)["exact_matches"]) == (i % 2 == 0), pairs[i]


def config_data(config):
    from jaxgpt.config_files import resolve

    return resolve(config).data


def test_a_pairs_source_refuses_window_switches():
    config = small_run_config()
    config.data.source = "builtin:dates"
    config.data.align_to_documents = True
    from jaxgpt.config_files import resolve

    with pytest.raises(UserError, match="align_to_documents"):
        resolve(config)


def test_each_pair_is_in_one_split(pairs_run):
    """Every example of either split is a line of the file, each line in one split (the pair
    the split point cuts in two in neither)."""
    folder, config = pairs_run
    dataset = data.prepare(config_data(config), progress=False)
    train, held_out = data.pairs.split_examples(dataset, 32)
    lines = set((folder / "reverse.tsv").read_text().splitlines())

    def texts(examples):
        return [dataset.tokenizer.decode(examples.unit(i)[1:-1].tolist()) for i in range(len(examples))]

    seen, unseen = texts(train), texts(held_out)
    assert set(seen) <= lines and set(unseen) <= lines
    assert len(seen) + len(unseen) in (600, 599) and len(unseen) > 0


def test_a_small_pairs_file_trains_and_one_of_pairs_too_long_says_so(tmp_path):
    """The held-out tenth of 40 short pairs is fewer tokens than one window of block_size + 1,
    which a token stream could not cut from, but rows of whole pairs can: it trains. Pairs all
    longer than a row are refused in one line before anything is trained."""
    (tmp_path / "short.tsv").write_text("".join(f"{w}\t{w[::-1]}\n" for w in ["ab", "cde", "fgh", "ij"] * 10))
    config = small_run_config(steps=2, eval_every=2, checkpoint_every=2, eval_batches=1)
    config.data.source = f"pairs:{tmp_path / 'short.tsv'}"
    assert train_and_evaluate(config, tmp_path / "run", progress=False)["step"] == 2
    (tmp_path / "long.tsv").write_text("".join(f"{'x' * 30}\t{'y' * 30}\n" for _ in range(40)))
    config.data.source = f"pairs:{tmp_path / 'long.tsv'}"
    with pytest.raises(UserError, match="no training pair fits in model.block_size"):
        train_and_evaluate(config, tmp_path / "refused", progress=False)
    assert not (tmp_path / "refused" / "checkpoints").exists()
