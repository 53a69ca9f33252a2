"""jaxgpt export: a trained run as a Hugging Face folder, read back independently by the
converter's loader (safetensors, installed with the requirements; tests/test_hf.py holds the
converter itself to transformers' logits)."""

import json
from functools import partial

import jax
import numpy as np
import pytest

from jaxgpt.commands import export
from jaxgpt.config_files import resolve
from jaxgpt.hf import load_pretrained, save_pretrained
from jaxgpt.job.checkpoint import load_latest
from jaxgpt.model.transformer import init_params, stack_blocks
from jaxgpt.tokenizers import load_tokenizer


def test_a_run_exports_as_the_weights_of_its_newest_checkpoint(trained_small_run, tmp_path, capsys):
    out = tmp_path / "exported"
    export.main(["--workdir", str(trained_small_run), "--out", str(out)])
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out}: GPT2LMHeadModel from {trained_small_run} (step 20)")
    names = ["config.json", "jaxgpt_tokenizer.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in out.iterdir()) == names
    run, params, tokenizer, _ = load_latest(trained_small_run)
    config, loaded, family = load_pretrained(str(out))
    assert family == "gpt2" and (config.n_layer, config.d_model, config.vocab_size) == (2, 32, run.model.vocab_size)
    jax.tree.map(np.testing.assert_array_equal, loaded, jax.device_get(params))  # float32 in, float32 out
    assert load_tokenizer(out / "jaxgpt_tokenizer.json").to_dict() == tokenizer.to_dict()
    from jaxgpt.hf import pretrained_tokenizer

    assert pretrained_tokenizer(str(out), family).to_dict() == tokenizer.to_dict()  # the run's chars, not GPT-2's


def test_a_runs_tokenizer_alone_exports_as_hugging_faces_files(trained_small_run, tmp_path, capsys):
    from tokenizers import Tokenizer

    out = tmp_path / "tokenizer"
    export.main(["--workdir", str(trained_small_run), "--out", str(out), "--tokenizer_only"])
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    _, _, tokenizer, _ = load_latest(trained_small_run)
    text = "The assert statement"
    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode(text).ids == tokenizer.encode(text)
    assert "char tokenizer" in capsys.readouterr().out


def test_a_kept_step_exports_its_own_weights(trained_small_run, tmp_path):
    export.main(["--workdir", str(trained_small_run), "--out", str(tmp_path / "ten"), "--step", "10"])
    _, loaded, _ = load_pretrained(str(tmp_path / "ten"))
    _, params, _, _ = load_latest(trained_small_run, step=10)
    jax.tree.map(np.testing.assert_array_equal, loaded, jax.device_get(params))


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_status:
        export.main(argv)
    assert exit_status.value.code == 2
    return capsys.readouterr().err.strip()


def test_an_existing_folder_is_never_written_into(trained_small_run, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    error = refused(["--workdir", str(trained_small_run), "--out", str(tmp_path / "out")], capsys)
    assert (
        error
        == f"error: --out {tmp_path / 'out'} exists and is not an empty folder; name a new one (nothing is overwritten)"
    )
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]


def test_a_model_no_family_describes_is_refused_before_its_weights_are_read(tmp_path, capsys):
    """A workdir holding only config.json (no checkpoint to read): the refusal names the switch."""
    model = {"qk_norm": True, "vocab_size": 40, "n_layer": 1, "block_size": 16}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(resolve({"model": model}).to_dict()))
    error = refused(["--workdir", str(tmp_path / "run"), "--out", str(tmp_path / "out")], capsys)
    assert error.startswith("error: model.qk_norm=True has no counterpart in Hugging Face's GPT-2, Llama or Mistral")
    assert not (tmp_path / "out").exists() and not any(p.name.endswith(".partial") for p in tmp_path.iterdir())


def test_scanned_layers_export_a_block_a_layer(tmp_path):
    """The scan is a layout of the computation: a scanned model's folder is the unscanned one's."""
    config = resolve({"model": {"vocab_size": 40, "n_layer": 3, "block_size": 16, "d_model": 32}}).model
    params = jax.jit(partial(init_params, config))(jax.random.key(0))
    save_pretrained(config, params, tmp_path / "unrolled")
    save_pretrained(config.replace(scan_layers=True), stack_blocks(params, 3), tmp_path / "scanned")
    assert json.loads((tmp_path / "scanned" / "config.json").read_text()) == json.loads(
        (tmp_path / "unrolled" / "config.json").read_text()
    )
    assert (tmp_path / "scanned" / "model.safetensors").read_bytes() == (
        tmp_path / "unrolled" / "model.safetensors"
    ).read_bytes()


def test_a_write_that_fails_part_way_leaves_nothing_behind(trained_small_run, tmp_path, monkeypatch, capsys):
    """The weights written, then the disk fills: one line, and neither the folder nor the
    half-written one beside it stays."""
    import errno

    import jaxgpt.tokenizers

    def disk_full(tokenizer, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jaxgpt.tokenizers, "save_tokenizer", disk_full)
    error = refused(["--workdir", str(trained_small_run), "--out", str(tmp_path / "out")], capsys)
    assert (
        error
        == f"error: cannot write {tmp_path / 'out'} (No space left on device); free some space or choose another --out"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_disk_that_fills_while_the_weights_are_written_is_one_line(trained_small_run, tmp_path, monkeypatch, capsys):
    """safetensors reports a full disk in an exception of its own, not an OSError; on a 64 KiB
    tmpfs its writer raised exactly this one. Nothing is left behind."""
    import safetensors.numpy
    from safetensors import SafetensorError

    def disk_full(tensors, path, metadata=None):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full)
    error = refused(["--workdir", str(trained_small_run), "--out", str(tmp_path / "out")], capsys)
    assert error == (
        f"error: cannot write {tmp_path / 'out'} (I/O error: No space left on device (os error 28)); free some space "
        "or choose another --out"
    )
    assert list(tmp_path.iterdir()) == []
