"""The lab's pages (jaxgpt/lab/views.py): the data each embeds is the arrays it was made from,
and a page fetches nothing. What a browser draws from that data: tests/test_browser.py (slow)."""

import html
import re

import numpy as np
import pytest

from jaxgpt.lab.views import DECIMALS, attention_view, embedded_data


def random_maps(layers=2, heads=3, t=5, s=None, seed=0) -> np.ndarray:
    """Rows of weights over the keys: causal (zero above the diagonal) for self-attention."""
    s = t if s is None else s
    scores = np.random.default_rng(seed).normal(size=(layers, heads, t, s))
    if s == t:
        scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


def test_the_page_embeds_the_weights_and_the_tokens_it_was_given():
    maps = random_maps()
    tokens = ["if", " x", " is", " </script>", "\n"]  # a token that would end the data's element, and a newline
    page = attention_view(maps, tokens, title="t <b>", first_layer=3)
    data = embedded_data(page)
    assert data["queries"] == data["keys"] == tokens and data["heads"] == 3
    assert data["layers"] == ["layer 3", "layer 4"] and data["title"] == "t <b>"
    np.testing.assert_allclose(data["weights"], maps, atol=0.5 * 10**-DECIMALS)  # rounded, no more
    assert "<title>t &lt;b&gt;</title>" in page  # the title is text, not markup


def test_cross_attention_has_its_own_keys_and_unequal_sizes_are_refused():
    maps = random_maps(t=3, s=6)
    data = embedded_data(attention_view(maps, list("abc"), list("uvwxyz"), title="cross"))
    assert (data["queries"], data["keys"]) == (list("abc"), list("uvwxyz"))
    with pytest.raises(ValueError, match="3 query and 5 key tokens for maps of 3 x 6"):
        attention_view(maps, list("abc"), list("uvwxy"), title="cross")


def test_a_page_fetches_nothing_and_shows_inline_in_a_notebook():
    page = attention_view(random_maps(), list("abcde"), title="t")
    assert not re.search(r"\b(src|href)\s*=|https?://|@import|url\(", page)  # scripts and styles inline
    frame = page._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and html.unescape(frame.split('"')[1]) == page


def test_attention_maps_writes_the_page_of_the_runs_weights(trained_small_run, tmp_path, capsys):
    from jaxgpt.commands import attention_maps as command
    from jaxgpt.job.checkpoint import load_latest

    page = tmp_path / "maps.html"
    command.main(["--workdir", str(trained_small_run), "--prompt", "x = 1", "--out", str(tmp_path / "maps.png"),
                  "--html", str(page)])  # fmt: skip
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {page} (hover a query token: the weights on each key)"
    run, params, tokenizer, _ = load_latest(trained_small_run)
    ids = np.asarray(tokenizer.encode("x = 1"))
    data = embedded_data(page.read_text())
    assert data["queries"] == [tokenizer.decode([int(i)]) for i in ids]
    np.testing.assert_allclose(data["weights"], command.attention_maps(run.model, params, ids), atol=1e-4)


def test_the_page_wants_weights_not_scores(trained_small_run, tmp_path, capsys):
    from jaxgpt.commands import attention_maps as command

    with pytest.raises(SystemExit) as exit_status:
        out = ["--out", str(tmp_path / "a.png"), "--html", str(tmp_path / "a.html")]
        command.main(["--workdir", str(trained_small_run), "--prompt", "x", "--scores", *out])
    assert exit_status.value.code == 2 and "--html shows attention weights" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
