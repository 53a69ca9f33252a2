"""`jaxgpt inspect`: every architectural choice of a model, each beside the line of
docs/model.md that explains it, read from a run and from a folder transformers itself wrote."""

import json
import re

import jax
import numpy as np
import pytest
from conftest import ROOT

from jaxgpt.commands import inspect_model
from jaxgpt.config import MixtureOfExperts, ModelConfig
from jaxgpt.model.transformer import count_params, init_params

DOCS = (ROOT / "docs" / "model.md").read_text().splitlines()


def rows(lines: list[str]) -> dict[str, tuple[str, int]]:
    """{choice: (value, the docs line it points at)} from the printed report."""
    out = {}
    for line in lines[1:]:
        what, value, where = re.match(r"  (\S+)\s+(.*?)\s+docs/model\.md:(\d+)$", line).groups()
        out[what] = (value, int(where))
    return out


def assert_each_row_points_at_its_explanation(config, lines):
    for what, _, anchor in inspect_model.choices(config):
        _, line = rows(lines)[what]
        assert anchor in DOCS[line - 1], (what, anchor, DOCS[line - 1])


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(vocab_size=64, n_layer=2, d_model=32, n_head=4),
        ModelConfig(vocab_size=64, n_layer=2, d_model=32, n_head=4, n_kv_head=2, position="rope", norm="rmsnorm",
                    activation="swiglu", bias=False, tie_embeddings=False, qk_norm=True, attention_gate="headwise"),
        ModelConfig(vocab_size=64, n_layer=2, d_model=32, n_head=4, token_mixer="convolution", x0_mix=True,
                    moe=MixtureOfExperts(experts=4, top_k=2)),
    ],
    ids=["gpt2", "llama-gated", "convolution-moe"],
)  # fmt: skip
def test_every_choice_and_switch_is_named_beside_the_docs_line_that_explains_it(config):
    """Each row's docs line holds its anchor (a table row naming the switch, a heading); every
    switch that differs from GPT-2's defaults has a row; the parts sum to count_params."""
    params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))  # shapes are all a count needs
    lines = inspect_model.report(config, params, "a model")
    assert_each_row_points_at_its_explanation(config, lines)
    shown = rows(lines)
    on = {
        f
        for f in ("qk_norm", "attention_gate", "token_mixer", "x0_mix")
        if getattr(config, f) != getattr(ModelConfig(), f)
    }
    assert on <= set(shown)
    total, parts = shown["parameters"][0].split(": ")
    counted = {name: int(n.replace(",", "")) for name, n in (p.rsplit(" ", 1) for p in parts.split(", "))}
    assert int(total.replace(",", "")) == sum(counted.values()) == count_params(params)


def test_a_llama_folder_transformers_wrote_is_read_choice_by_choice(tmp_path, capsys):
    """The exercise as the texts set it: a real model's config, its every choice named. The
    values are the folder's own config.json's (as transformers wrote it), not ours."""
    pytest.importorskip("transformers", reason="needs the Hugging Face extras: pip install -r requirements-hf.txt")
    from test_hf import reference_model

    reference_model("llama").save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    inspect_model.main(["--init_from", str(tmp_path)])
    shown = rows(capsys.readouterr().out.splitlines())
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    assert shown["heads"][0].startswith(f"{heads} query, {kv} key/value (grouped-query")
    assert shown["positions"][0].startswith(f"rope, theta {hf['rope_parameters']['rope_theta']:g}")
    assert shown["norm"][0] == f"rmsnorm, eps {hf['rms_norm_eps']:g}, pre-norm"
    assert shown["MLP"][0].startswith(f"swiglu, hidden {hf['intermediate_size']}")
    assert shown["vocabulary"][0] == f"{hf['vocab_size']} tokens"
    assert shown["blocks"][0] == f"{hf['num_hidden_layers']}, d_model {hf['hidden_size']}"
    assert shown["embeddings"][0].startswith("tied" if hf.get("tie_word_embeddings") else "untied")
    assert np.isfinite(int(shown["parameters"][0].split(":")[0].replace(",", "")))


def test_a_run_is_inspected_from_its_checkpoint(trained_small_run, capsys):
    inspect_model.main(["--workdir", str(trained_small_run)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{trained_small_run} (step ") and "2-layer decoder" in out[0]
    assert rows(out)["blocks"][0] == "2, d_model 32"


def test_inspect_without_a_model_is_one_line():
    from conftest import run_script

    result = run_script("jaxgpt", "inspect")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--workdir" in result.stderr and "--init_from" in result.stderr
