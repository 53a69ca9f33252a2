"""The lab's pages (jaxgpt/lab/views.py): the data each embeds is the arrays it was made from,
and a page fetches nothing. What a browser draws from that data: tests/test_browser.py (slow)."""

import html
import re

import numpy as np
import pytest

from jaxgpt.lab.views import DECIMALS, TOP_K, attention_view, embedded_data, logit_lens_view


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


def test_the_lens_page_holds_each_cells_likeliest_tokens_and_the_true_next_ones_probability():
    """Logits made so that layer 1 at position 0 ranks token 3, then 1, with known softmax
    probabilities; the last position has no next token."""
    vocab, ids = 8, np.array([2, 5, 7])
    logits = np.zeros((2, 3, vocab))
    logits[1, 0, 3], logits[1, 0, 1] = 4.0, 2.0
    probs = np.exp(logits[1, 0]) / np.exp(logits[1, 0]).sum()
    data = embedded_data(logit_lens_view(logits, ids, lambda t: "abcdefgh"[t[0]], title="lens"))
    assert data["layers"] == ["embed", "block 0"] and data["tokens"] == ["c", "f", "h"]
    cell = data["cells"][1][0]
    assert [text for text, _ in cell["top"]][:2] == ["d", "b"] and len(cell["top"]) == TOP_K
    np.testing.assert_allclose([p for _, p in cell["top"]][:2], probs[[3, 1]], atol=0.5 * 10**-DECIMALS)
    assert cell["next"] == pytest.approx(probs[5], abs=0.5 * 10**-DECIMALS)  # token 5 follows token 2
    assert data["cells"][0][1]["next"] == pytest.approx(1 / vocab, abs=1e-4) and data["cells"][1][2]["next"] is None


def test_logit_lens_writes_the_page_of_the_runs_readouts(trained_small_run, tmp_path, capsys):
    from jaxgpt.commands import logit_lens
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab.capture import capture

    page = tmp_path / "lens.html"
    logit_lens.main(
        ["--workdir", str(trained_small_run), "--prompt", "import os", "--positions", "4", "--html", str(page)]
    )
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {page} (every position; hover a cell for its guesses)"
    run, params, tokenizer, _ = load_latest(trained_small_run)
    ids = np.asarray(tokenizer.encode("import os"))
    lens = np.asarray(capture(run.model, params, ids[None]).logit_lens[:, 0], np.float64)
    probs = np.exp(lens - lens.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    data = embedded_data(page.read_text())
    assert len(data["cells"]) == run.model.n_layer + 1 and all(len(row) == len(ids) for row in data["cells"])
    for layer, position in ((0, 0), (2, len(ids) - 1)):
        top = probs[layer, position].argsort()[::-1][:TOP_K]
        shown = data["cells"][layer][position]["top"]
        assert [text for text, _ in shown] == [tokenizer.decode([int(i)]) for i in top]
        np.testing.assert_allclose([p for _, p in shown], probs[layer, position, top], atol=1e-4)


def test_the_patching_page_embeds_each_table_with_its_labels():
    from jaxgpt.lab.views import patching_view

    tables = {"resid_pre": np.random.default_rng(4).normal(size=(2, 5)), "head_out": np.eye(2, 3)}
    labels = {"resid_pre": list("ab</c"), "head_out": ["head 0", "head 1", "head 2"]}
    data = embedded_data(patching_view(tables, labels, title="p", note="clean 2.000, corrupted -1.000"))
    assert [panel["name"] for panel in data["panels"]] == ["resid_pre", "head_out"]
    for panel in data["panels"]:
        assert panel["columns"] == labels[panel["name"]] and panel["rows"] == ["layer 0", "layer 1"]
        np.testing.assert_allclose(panel["values"], tables[panel["name"]], atol=0.5 * 10**-DECIMALS)
    assert data["note"] == "clean 2.000, corrupted -1.000"
    with pytest.raises(ValueError, match="resid_pre: 5 columns of values and 4 labels"):
        patching_view(tables, labels | {"resid_pre": list("abcd")}, title="p", note="")


def test_every_picture_names_what_it_shows_its_axes_and_its_scale(trained_small_run, tmp_path, monkeypatch):
    """The PNGs the commands write, captured before saving: each says what it shows (a title),
    names both axes with their units (loss in nats per token), and labels its colour bar."""
    from jaxgpt.commands import attention_maps, evaluate, patch, plot

    drawn = []
    for module in (plot, attention_maps, evaluate, patch):
        monkeypatch.setattr(module, "save_png", lambda figure, out: drawn.append(figure) or out)
    plot.plot_runs([trained_small_run], "loss", tmp_path / "loss.png")
    attention_maps.draw(random_maps(1, 2, 3, 3, seed=0), list("abc"), 0, tmp_path / "a.png")
    evaluate.draw([("run", 32, [evaluate.LengthResult(32, 4, np.linspace(3, 2, 32))])], tmp_path / "e.png")
    tables = {"resid_pre": np.ones((2, 3)), "head_out": np.ones((2, 4))}
    patch.draw(tables, {"resid_pre": list("abc"), "head_out": [f"head {h}" for h in range(4)]}, "t", tmp_path / "p")
    assert len(drawn) == 4
    for figure in drawn:
        plotted = [axes for axes in figure.axes if axes.get_label() != "<colorbar>"]
        assert figure.get_suptitle() or all(axes.get_title() for axes in plotted), figure
        assert any(axes.get_xlabel() for axes in plotted) and any(axes.get_ylabel() for axes in plotted), figure
        for bar in (axes for axes in figure.axes if axes.get_label() == "<colorbar>"):
            assert bar.get_ylabel() or bar.get_xlabel(), figure
    assert drawn[0].axes[0].get_ylabel() == "loss (nats per token)"
    assert drawn[2].axes[0].get_ylabel() == "validation loss (nats per token)"
