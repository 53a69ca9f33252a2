"""Training end to end in a temp workdir: the loss falls, the files are well-formed, and the
same config and seed give the same numbers bit for bit."""

import json
import math
import re

import jax
import pytest
from conftest import small_run_config as small_config

from jaxgpt.config import run_config_from_dict
from jaxgpt.config_files import resolve
from jaxgpt.errors import UserError
from jaxgpt.job.trainer import train_and_evaluate


def read_metrics(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run")
    last = train_and_evaluate(small_config(), workdir, progress=False)
    return workdir, last


def test_loss_falls(trained):
    workdir, last = trained
    metrics = read_metrics(workdir)
    assert metrics[0]["train_loss"] > 3.5  # near ln(vocab ~ 90 characters) = 4.5 at the start
    assert last["val_loss"] < metrics[0]["train_loss"] - 0.8


def test_metrics_lines_are_complete(trained):
    workdir, _ = trained
    metrics = read_metrics(workdir)
    assert [m["step"] for m in metrics] == [5, 10, 15, 20, 25, 30]
    for m in metrics:
        assert {"train_loss", "lr", "grad_norm", "tokens_per_sec", "mfu", "elapsed_sec"} <= m.keys()
        assert all(math.isfinite(v) for v in m.values())
    assert {"val_loss", "eval_train_loss"} <= metrics[2].keys() and "val_loss" not in metrics[1]


def test_workdir_holds_config_tokenizer_and_checkpoints(trained):
    workdir, _ = trained
    run = run_config_from_dict(json.loads((workdir / "config.json").read_text()))
    assert run.model.n_layer == 2 and run.model.vocab_size > 50 and run.train.steps == 30
    assert json.loads((workdir / "tokenizer.json").read_text())["name"] == "char"
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [10, 20, 30]


def test_same_seed_same_losses_bit_for_bit(trained, tmp_path):
    workdir, _ = trained
    train_and_evaluate(small_config(), tmp_path, progress=False)
    keys = ("train_loss", "grad_norm", "val_loss", "eval_train_loss")
    first = [[m.get(k) for k in keys] for m in read_metrics(workdir)]
    assert [[m.get(k) for k in keys] for m in read_metrics(tmp_path)] == first


def test_another_seed_other_losses(trained, tmp_path):
    workdir, _ = trained
    train_and_evaluate(small_config(seed=1, steps=5, warmup_steps=1), tmp_path, progress=False)
    assert read_metrics(tmp_path)[0]["train_loss"] != read_metrics(workdir)[0]["train_loss"]


def test_rerun_resumes_from_the_checkpoint_and_extends(trained, tmp_path):
    train_and_evaluate(small_config(steps=10), tmp_path, progress=False)
    train_and_evaluate(small_config(steps=20), tmp_path, progress=False)
    assert [m["step"] for m in read_metrics(tmp_path)] == [5, 10, 15, 20]


def test_a_run_that_ends_before_its_first_step_leaves_nothing_running(trained, tmp_path, monkeypatch):
    """Already trained: the command returns with no thread of its own still running evaluation's
    programs (started beside the step's compile) into what the process does next, however long
    they take (here half a second more)."""
    import shutil
    import threading
    import time

    from jaxgpt.job.trainer import Trainer

    score = Trainer._score_a_batch_a_device
    monkeypatch.setattr(Trainer, "_score_a_batch_a_device", lambda self, p: (time.sleep(0.5), score(self, p)))
    workdir, last = trained
    shutil.copytree(workdir, tmp_path / "run")
    assert train_and_evaluate(small_config(), tmp_path / "run", progress=False) == {"step": last["step"]}
    assert not [t.name for t in threading.enumerate() if t.name == "jaxgpt-compile"]


@pytest.mark.slow
def test_bfloat16_training_runs_and_learns(tmp_path):
    last = train_and_evaluate(small_config(dtype="bfloat16", steps=15), tmp_path, progress=False)
    assert last["val_loss"] < read_metrics(tmp_path)[0]["train_loss"]


def test_divergence_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    # A learning rate of 1e4 blows the weights up within a few steps (no clipping to slow it).
    with pytest.raises(UserError, match=r"training diverged at step \d+: .*(nan|inf).* are kept, all finite"):
        train_and_evaluate(
            small_config(lr=1e4, min_lr=0.0, grad_clip=0.0, steps=30, checkpoint_every=1), tmp_path, progress=False
        )


def test_a_loss_that_runs_away_without_nan_stops_the_run(tmp_path):
    """The fault probe's case: a learning rate of 10 sends the loss into the thousands without a
    NaN from the first evaluation on. Past warmup each evaluation more than a nat worse than a
    uniform guess warns, and the third in a row stops the run in one line; its best checkpoint
    as hopeless, the way back is a fresh start (the best checkpoint outliving pruning is
    tests/test_resume.py's). An overflowing perplexity is logged as null, not a crash."""
    config = small_config(lr=10.0, steps=60, warmup_steps=1, eval_every=5, checkpoint_every=5, keep_checkpoints=2)
    with pytest.raises(
        UserError, match=r"training ran away: .* at the last 3 evaluations \(steps 5, 10, 15\)"
    ) as error:
        train_and_evaluate(config, tmp_path, progress=False)
    assert str(error.value).endswith("and --fresh (no checkpoint was saved at a sound evaluation)")
    assert [r["val_perplexity"] for r in read_metrics(tmp_path) if "val_loss" in r][0] is None  # e^3000 overflows


def test_a_spike_that_recovers_only_warns():
    """A loss far above its best at one or two evaluations, then back: warnings, no stop; and
    the watch starts counting again after the recovery."""
    from jaxgpt.job.stopping import RunawayWatch

    warned = []
    watch = RunawayWatch(outputs=100, checkpoints=None, warn=warned.append)  # ceiling ln 100 = 4.6
    for step, loss in enumerate([3.0, 2.0, 3.5, 3.6, 2.1, 3.2, 3.3, 1.9, 4.7], start=1):
        watch.evaluated(step, loss, lr=1e-3)
    # far: 3.5, 3.6 (over 2.0 + 1), then 3.2, 3.3 (over 2.0 + 1), 4.7 (over ln 100): never 3 in a row
    assert [w.split(" at step ")[1].split(",")[0] for w in warned] == ["3", "4", "6", "7", "9"]


def test_a_run_worse_than_a_uniform_guess_from_its_first_evaluation_is_stopped():
    """--config.train.lr=3 on configs/tiny.py: val loss 300, 290, 286 where ln 96 = 4.56, each a
    new best, so never far above the best; past warmup, more than a nat above a uniform guess
    counts as running away (before warmup it does not), and the best checkpoint, as hopeless,
    is not the way back."""
    from types import SimpleNamespace

    from jaxgpt.job.stopping import RunawayWatch

    warned = []
    saved = SimpleNamespace(best=lambda: (30, 286.0))
    watch = RunawayWatch(outputs=96, checkpoints=saved, warn=warned.append, warmup_steps=10)
    watch.evaluated(10, 400.0, lr=3.0)  # still warming up: not counted
    watch.evaluated(20, 300.0, lr=3.0)
    watch.evaluated(30, 290.0, lr=3.0)
    assert warned[0] == (
        "val loss 300.0000 at step 20, more than 1 nat above ln 96 = 4.5643, a uniform guess's: the loss may be "
        "running away; the run stops if it stays this far off for 3 evaluations"
    )
    with pytest.raises(UserError, match=r"training ran away: val loss 286.0000 at step 40, .* \(steps 20, 30, 40\)"):
        watch.evaluated(40, 286.0, lr=3.0)
    assert len(warned) == 2
    watch.evaluated(50, 5.0, lr=3.0)  # within a nat of a uniform guess: the count starts again
    assert watch.far == []
    # from a sound best, far above it three times: back to the best checkpoint
    watch = RunawayWatch(outputs=96, checkpoints=SimpleNamespace(best=lambda: (5, 2.0)), warn=warned.append)
    with pytest.raises(UserError, match=r"against its best 2.0000 at step 5, .* --from_step 5 \(the best checkpoint"):
        for step, loss in [(5, 2.0), (10, 3.5), (15, 3.6), (20, 3.7)]:
            watch.evaluated(step, loss, lr=3.0)


@pytest.mark.parametrize("leaf", ["float32", "bfloat16"])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
def test_the_parameter_check_finds_one_bad_value_on_the_host_as_on_the_devices(bad, leaf):
    """The check after each logged interval: on a CPU numpy reads the arrays in place; the
    compiled reduction used elsewhere is the reference. One bad value among 4,000, in the
    float32 leaf or the bfloat16 one, makes both say so."""
    import jax.numpy as jnp

    from jaxgpt.job.stopping import _all_finite_on_devices, all_finite

    tree = {"float32": jnp.ones(2000), "nested": {"bfloat16": jnp.zeros(2000, jnp.bfloat16), "step": jnp.int32(3)}}
    if bad is not None:
        holder = tree if leaf == "float32" else tree["nested"]
        holder[leaf] = holder[leaf].at[1234].set(bad)
    assert all_finite(tree) == bool(_all_finite_on_devices(tree)) == (bad is None)


def test_vocab_size_below_the_tokenizer_is_refused(tmp_path):
    config = small_config()
    config.model.vocab_size = 10
    with pytest.raises(UserError, match="model.vocab_size=10 is smaller than the tokenizer's"):
        train_and_evaluate(config, tmp_path, progress=False)
    assert not (tmp_path / "config.json").exists()


def test_resolved_config_round_trips():
    run = resolve(small_config(), vocab_size=77)
    assert run_config_from_dict(json.loads(json.dumps(run.to_dict()))) == run


def test_validation_is_fixed_windows_and_bits_per_byte_follow_from_the_loss(trained):
    """Every evaluation scores the same windows (val_loss at a step is a pure function of the
    parameters), and bits per byte is the loss in nats x tokens / bytes / ln 2. The built-in
    corpus is ASCII apart from a few characters, so the byte count is checked by decoding the
    scored tokens and encoding them as UTF-8 here."""
    import numpy as np

    from jaxgpt import data

    run = resolve(small_config(), vocab_size=1)
    dataset = data.prepare(run.data, progress=False)
    t = run.train
    v = data.validation_set(
        dataset.val, dataset.tokenizer.token_bytes(), run.model.block_size, t.batch_size, t.eval_batches
    )
    assert v.contiguous and v.target_tokens == t.eval_batches * t.batch_size * run.model.block_size
    targets = dataset.val[1 : v.target_tokens + 1]  # back-to-back windows: their targets are one span
    assert v.target_bytes == len(dataset.tokenizer.decode(targets).encode("utf-8"))
    for record in (r for r in read_metrics(trained[0]) if "val_loss" in r):
        want = record["val_loss"] * v.target_tokens / v.target_bytes / math.log(2)
        assert record["val_bpb"] == pytest.approx(want, rel=1e-12)
        assert record["val_perplexity"] == pytest.approx(math.exp(record["val_loss"]), rel=1e-12)
    assert np.all(np.diff(v.starts) == run.model.block_size)


def test_a_short_validation_split_is_covered_by_spread_windows():
    import numpy as np

    from jaxgpt import data

    tokens = np.arange(50) % 7
    v = data.validation_set(tokens, np.full(7, 2), seq_len=8, batch_size=4, batches=3)  # wants 96 + 1 tokens
    assert not v.contiguous and v.starts[0] == 0 and v.starts[-1] == 50 - 8 - 1
    assert v.target_bytes == 2 * 12 * 8  # every token 2 bytes here
    assert "spread over all of the 50-token split" in v.describe()


def test_evaluating_one_checkpoint_twice_gives_the_same_numbers_as_the_run_logged(trained):
    """...and the restored run's evaluation traces and compiles nothing: the trainer compiled its
    programs beside the step's, before the first step (Trainer.__init__, _compile)."""
    workdir = trained[0]
    from jaxgpt.job import setup
    from jaxgpt.job.resume import restore_or_start
    from jaxgpt.job.trainer import Trainer

    resolved = setup.resolve_run(small_config(), workdir, progress=False, verify_data=False)
    trainer = Trainer.on_this_machine(resolved, workdir, print)
    run, tokenizer = trainer.config, resolved.dataset.tokenizer
    compiled_while_evaluating = []

    def note(event: str, seconds: float, **kwargs) -> None:
        if event in ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/backend_compile_duration"):
            compiled_while_evaluating.append(event)

    try:
        start = restore_or_start(
            trainer.checkpoints, trainer.state, run, tokenizer, workdir, False, main=False, say=print, warn=print
        )
        trainer.state = start.state
        trainer._compile(trainer.batch(start.step))
        jax.monitoring.register_event_duration_secs_listener(note)
        try:
            first = trainer.evaluate()
        finally:
            jax.monitoring.unregister_event_duration_listener(note)
        second = trainer.evaluate()
    finally:
        trainer.checkpoints.close()
    assert compiled_while_evaluating == []
    logged = read_metrics(workdir)[-1]
    assert start.step == logged["step"]
    assert first == second
    assert first["val_loss"] == logged["val_loss"] and first["val_bpb"] == logged["val_bpb"]


def test_a_run_without_the_causal_mask_says_why_and_logs_its_past_only_score(tmp_path, capsys):
    config = small_config(steps=10, eval_every=5, log_every=5)
    config.model.causal = False
    last = train_and_evaluate(config, tmp_path, progress=True)
    printed = capsys.readouterr()
    assert "note: model.causal=false: training sees the token each position predicts" in printed.out + printed.err
    evaluations = [r for r in read_metrics(tmp_path) if "val_loss" in r]
    assert len(evaluations) == 2 and all(math.isfinite(r["val_loss_past_only"]) for r in evaluations)
    assert last["val_bpb_past_only"] / last["val_loss_past_only"] == pytest.approx(last["val_bpb"] / last["val_loss"])


def test_the_closing_line_gives_the_runs_average_speed(tmp_path, capsys):
    """Not the last logging interval's: every step's tokens over the training time of all the
    intervals, which is what metrics.jsonl's per-interval rates add up to (tokens_i / rate_i is
    interval i's seconds); printed to the whole token."""
    config = small_config()  # every fetch of metrics is a logged one: each 5 steps, to 30
    train_and_evaluate(config, tmp_path, progress=True)
    done = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done: "))
    printed = float(re.search(r"averaged over the 30 steps trained here: ([\d,]+) tokens/s", done)[1].replace(",", ""))
    records = read_metrics(tmp_path)
    tokens = 30 * config.train.batch_size * config.model.block_size
    seconds = sum(tokens / 6 / r["tokens_per_sec"] for r in records)  # six intervals of five steps
    assert len(records) == 6 and abs(printed - tokens / seconds) <= 0.5 + 1e-6 * printed, (done, tokens / seconds)


def test_a_causal_run_logs_no_past_only_score(trained):
    workdir, _ = trained
    assert not [r for r in read_metrics(workdir) if "val_loss_past_only" in r]


def test_per_layer_gradient_norms_are_logged_when_asked_and_make_up_the_global_norm(tmp_path):
    """train.log_layer_grad_norms adds grad_norm/<group> to each training record: the groups
    partition the parameters, so their squares sum to the global norm's square (float32 sums
    of a few thousand squares in another order: 1e-5 relative)."""
    last = train_and_evaluate(small_config(steps=5, log_every=5, log_layer_grad_norms=True), tmp_path, progress=False)
    (record,) = [r for r in read_metrics(tmp_path) if "train_loss" in r]
    groups = {k: v for k, v in record.items() if k.startswith("grad_norm/")}
    assert sorted(groups) == [
        "grad_norm/block_0",
        "grad_norm/block_1",
        "grad_norm/norm_f",
        "grad_norm/wpe",
        "grad_norm/wte",
    ]
    assert math.sqrt(sum(v * v for v in groups.values())) == pytest.approx(record["grad_norm"], rel=1e-5)
    assert last["step"] == 5


def test_aligned_to_documents_every_training_window_begins_at_a_document_or_a_window_into_one(tmp_path, monkeypatch):
    """data.align_to_documents on the built-in corpus (79 topics, one per document): every
    training batch the run reads, its evaluation's training batches too, is drawn from the
    offsets data.aligned_starts gives (tests/test_data.py checks those offsets by hand). With
    data.attend_within_documents too, every batch, validation's included, carries its tokens'
    documents (tests/test_batch_contract.py checks what attention and positions make of them)."""
    from jaxgpt import data
    from jaxgpt.data import batches

    read, fields = [], set()
    offsets, windows_at = batches.window_offsets, batches.windows_at
    monkeypatch.setattr(
        batches, "window_offsets", lambda *a, **k: read.append(k.get("starts", a[-1])) or offsets(*a, **k)
    )
    monkeypatch.setattr(batches, "windows_at", lambda *a: fields.add(tuple(sorted(windows_at(*a)))) or windows_at(*a))
    config = small_config(steps=2, warmup_steps=1, eval_every=2, eval_batches=1)
    config.data.align_to_documents = config.data.attend_within_documents = True
    train_and_evaluate(config, tmp_path, progress=False)
    dataset = data.prepare(resolve(config).data, progress=False)
    want = data.aligned_starts(dataset.documents, len(dataset.train), config.model.block_size)
    assert read and all(starts is not None and starts.tolist() == want.tolist() for starts in read)
    assert fields == {("inputs", "positions", "segments", "targets")}
    assert json.loads((tmp_path / "config.json").read_text())["data"]["attend_within_documents"] is True


def test_bits_per_byte_divide_by_the_bytes_the_scored_tokens_stand_for(tmp_path):
    """On text of one-, two- and three-byte characters (a char run: each id's bytes read off its
    character, by Python): val_bpb is the loss in bits times the validation windows' scored
    tokens over their UTF-8 bytes. Planted, bits per byte divided by tokens passes on ASCII, one
    byte a token; here the bytes are a fifth more than the tokens."""
    import numpy as np

    from jaxgpt import data
    from jaxgpt.config_files import with_tokenizer_vocab

    rng = np.random.default_rng(0)
    words = ["naïve", "café", "中文", "plain", "ñandú", "Ωmega", "x = 1"]
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text(" ".join(rng.choice(words, 3000)) + "\n", encoding="utf-8")
    config = small_config(steps=2, warmup_steps=1, eval_every=2, checkpoint_every=2)
    config.data.update(source=f"text:{tmp_path / 'text'}", tokenizer="char")
    train_and_evaluate(config, tmp_path / "run", progress=False)
    record = [r for r in read_metrics(tmp_path / "run") if "val_bpb" in r][-1]
    dataset = data.prepare(resolve(config).data, progress=False)
    run = with_tokenizer_vocab(resolve(config), dataset.tokenizer.vocab_size)
    _, validation = data.batch_sources(dataset, run)
    targets = np.concatenate([validation.tokens[s + 1 : s + 1 + validation.seq_len] for s in validation.starts])
    chars = dataset.tokenizer.chars
    scored_bytes = sum(len(chars[t].encode("utf-8")) for t in targets)
    assert scored_bytes > 1.15 * len(targets)
    assert record["val_bpb"] == pytest.approx(record["val_loss"] / math.log(2) * len(targets) / scored_bytes, rel=1e-12)
