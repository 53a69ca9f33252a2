"""Views to touch: each one self-contained HTML page (its data, script and style inline, nothing
fetched), written to a file by the commands and shown inline in Jupyter or Colab (`_repr_html_`).

The attention view: every layer and head of one prompt; pick a layer and a head, hover a query
token (or tab to it) and each key token it may see is shaded by the weight the query gives it,
the weights listed to three decimals. An encoder–decoder's cross-attention is the same view with
the source's tokens as keys. The logit-lens view: a row per layer and a column per position,
each cell that layer's likeliest next token; hover it for the five likeliest and the probability
of the token that does come next. The patching view: a heatmap per patching table (each layer
by position, or by head), hover a cell for the fraction of the logit difference it restores.
The data a page embeds is JSON in a <script type="application/json"> element, read back by
tests/test_views.py against the arrays it came from. Every page has a key (class "legend") saying
what its shading means, on what scale; tokens show a space as ␣ and a line break as \n.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from jaxgpt.lab.capture import lens_log_probabilities

DECIMALS = 4  # embedded weights; the page shows three


class View(str):
    """An HTML page: a string, written with `save`, drawn by a notebook that displays it."""

    def _repr_html_(self) -> str:
        # An iframe keeps the page's script and style to itself inside the notebook's own page.
        return f'<iframe srcdoc="{html.escape(self)}" style="width:100%;height:560px;border:0"></iframe>'

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self, encoding="utf-8")
        return path


def embedded_data(page: str) -> dict:
    """The JSON a view embeds (what its script draws from)."""
    start = page.index('<script type="application/json" id="data">') + len('<script type="application/json" id="data">')
    return json.loads(page[start : page.index("</script>", start)])


def attention_view(
    maps: np.ndarray,
    queries: list[str],
    keys: list[str] | None = None,
    *,
    title: str,
    first_layer: int = 0,
    layer_names: list[str] | None = None,
) -> View:
    """maps (layers, heads, queries, keys) of attention weights, rows summing to 1 over the keys a
    query may see (masked ones 0); `queries` and `keys` the tokens as text (keys: the same as
    queries for self-attention)."""
    maps = np.asarray(maps, np.float64)
    layers, heads, t, s = maps.shape
    keys = queries if keys is None else keys
    if (len(queries), len(keys)) != (t, s):
        raise ValueError(f"{len(queries)} query and {len(keys)} key tokens for maps of {t} x {s}")
    data = {
        "title": title,
        "layers": layer_names or [f"layer {first_layer + i}" for i in range(layers)],
        "heads": heads,
        "queries": queries,
        "keys": keys,
        "weights": np.round(maps, DECIMALS).tolist(),
    }
    return document(title, _ATTENTION_STYLE, _ATTENTION_BODY, data, _ATTENTION_SCRIPT)


TOP_K = 5  # guesses the logit-lens view lists for each layer and position


def logit_lens_view(logit_lens: np.ndarray, ids: np.ndarray, decode, *, title: str) -> View:
    """logit_lens (layers, t, vocab): the readout of the stream before the first block and after
    each (jaxgpt/lab/capture.py) for the prompt `ids` (t,); `decode` turns ids into text. A table,
    a row per layer and a column per position, each cell that layer's top guess for the next
    token, shaded by its probability; hover a cell for its TOP_K guesses and the probability it
    gives the token that does come next."""
    probs = np.exp(lens_log_probabilities(logit_lens))
    top = np.argsort(-probs, axis=-1, kind="stable")[..., :TOP_K]
    layers, t, _ = probs.shape
    following = [int(i) for i in ids[1:]] + [None]

    def cell(layer: int, position: int) -> dict:
        guesses = [[decode([int(i)]), round(float(probs[layer, position, i]), DECIMALS)] for i in top[layer, position]]
        nxt = following[position]
        return {"top": guesses, "next": None if nxt is None else round(float(probs[layer, position, nxt]), DECIMALS)}

    data = {
        "title": title,
        "layers": ["embed"] + [f"block {i}" for i in range(layers - 1)],
        "tokens": [decode([int(i)]) for i in ids],
        "cells": [[cell(layer, position) for position in range(t)] for layer in range(layers)],
    }
    return document(title, _LENS_STYLE, _LENS_BODY, data, _LENS_SCRIPT)


def patching_view(tables: dict[str, np.ndarray], columns: dict[str, list[str]], *, title: str, note: str) -> View:
    """Patching tables, a heatmap each: tables {name: (layers, columns)} of the fraction of the
    logit difference restored (jaxgpt/lab/patching.py), columns {name: a label per column} (the
    prompt's tokens, or heads). Blue restores, red works against; hover (or tab to) a cell for
    its value to three decimals. `note` says what the numbers are (the two logit differences)."""
    panels = []
    for name, values in tables.items():
        values = np.asarray(values, np.float64)
        if values.shape[1] != len(columns[name]):
            raise ValueError(f"{name}: {values.shape[1]} columns of values and {len(columns[name])} labels")
        rows = [f"layer {i}" for i in range(values.shape[0])]
        panels.append(
            {"name": name, "rows": rows, "columns": columns[name], "values": np.round(values, DECIMALS).tolist()}
        )
    data = {"title": title, "note": note, "panels": panels}
    return document(title, _PATCHING_STYLE, _PATCHING_BODY, data, _PATCHING_SCRIPT)


def _script_safe(data: dict) -> str:
    """JSON that cannot end the <script> element it sits in (a token "</script>" would)."""
    return json.dumps(data).replace("</", "<\\/")


def document(title: str, style: str, body: str, data: dict, script: str) -> View:
    """One self-contained page: the shared look, the view's own style and body, its data as
    JSON, and its script, which draws from that data."""
    return View(
        _DOCUMENT.replace("__TITLE__", html.escape(title))
        .replace("__STYLE__", style)
        .replace("__BODY__", body)
        .replace("__DATA__", _script_safe(data))
        .replace("__SCRIPT__", script)
    )


_DOCUMENT = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 16px; margin: 0 0 8px; }
.label { color: #666; font-size: 12px; }
.token { font-family: ui-monospace, monospace; padding: 2px 3px; margin: 1px; border: 1px solid #ccc;
         border-radius: 3px; white-space: pre; }
#readout { font-family: ui-monospace, monospace; white-space: pre-wrap; min-height: 3em; }
.legend { color: #444; font-size: 12px; margin: 6px 0; }
.ramp { display: inline-block; width: 90px; height: 10px; vertical-align: middle; border: 1px solid #999;
        background: linear-gradient(to right, rgba(43, 108, 176, 0), rgba(43, 108, 176, 1)); }
.ramp.against { background: linear-gradient(to right, rgba(192, 86, 33, 1), rgba(192, 86, 33, 0)); }
__STYLE__</style></head>
<body>
<h1>__TITLE__</h1>
__BODY__<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
function shown(text) { return JSON.stringify(text).slice(1, -1).replace(/ /g, "\u2423"); }  // a space: ␣
__SCRIPT__</script>
</body></html>
"""

_ATTENTION_STYLE = """
.controls button { margin: 0 4px 4px 0; padding: 2px 8px; border: 1px solid #999; background: #f4f4f4;
                   cursor: pointer; }
.controls button.on { background: #2b6cb0; color: #fff; border-color: #2b6cb0; }
.tokens { margin: 10px 0; line-height: 2.2; }
.query { cursor: pointer; }
.query.on { outline: 2px solid #c05621; }
"""

_ATTENTION_BODY = """<div class="controls" id="layers"></div>
<div class="controls" id="heads"></div>
<div class="label">queries (hover one, or tab to it)</div>
<div class="tokens" id="queries"></div>
<div class="label">keys, shaded by the chosen query's weight on each</div>
<div class="tokens" id="keys"></div>
<div class="legend">key: the attention weight the chosen query gives each key, 0 <span class="ramp"></span> 1
(a query's weights over the keys it may see sum to 1); ␣ is a space</div>
<div id="readout"></div>
"""

_ATTENTION_SCRIPT = """const state = { layer: 0, head: 0, query: data.queries.length - 1 };
function buttons(id, labels, key) {
  const box = document.getElementById(id);
  labels.forEach((label, i) => {
    const b = document.createElement("button");
    b.textContent = label; b.dataset.index = i;
    b.addEventListener("click", () => { state[key] = i; draw(); });
    box.appendChild(b);
  });
}
function tokens(id, texts, cls) {
  const box = document.getElementById(id);
  return texts.map((text, i) => {
    const span = document.createElement("span");
    span.className = "token " + cls; span.textContent = shown(text); span.dataset.index = i;
    box.appendChild(span);
    return span;
  });
}
buttons("layers", data.layers, "layer");
buttons("heads", Array.from({ length: data.heads }, (_, h) => "head " + h), "head");
const querySpans = tokens("queries", data.queries, "query");
const keySpans = tokens("keys", data.keys, "key");
querySpans.forEach((span, i) => {
  span.tabIndex = 0;
  const choose = () => { state.query = i; draw(); };
  span.addEventListener("mouseenter", choose);
  span.addEventListener("focus", choose);
});
function draw() {
  document.querySelectorAll("#layers button").forEach((b, i) => b.classList.toggle("on", i === state.layer));
  document.querySelectorAll("#heads button").forEach((b, i) => b.classList.toggle("on", i === state.head));
  querySpans.forEach((span, i) => span.classList.toggle("on", i === state.query));
  const row = data.weights[state.layer][state.head][state.query];
  keySpans.forEach((span, j) => {
    span.style.background = "rgba(43, 108, 176, " + row[j] + ")";
    span.style.color = row[j] > 0.5 ? "#fff" : "#222";
    span.title = row[j].toFixed(3);
  });
  document.getElementById("readout").textContent =
    data.layers[state.layer] + ", head " + state.head + ", query " + state.query + " " +
    JSON.stringify(shown(data.queries[state.query])) + ":\\n" +
    row.map((w, j) => shown(data.keys[j]) + " " + w.toFixed(3)).join("  ");
}
draw();
"""

_LENS_STYLE = """
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #ddd; padding: 2px 4px; font-family: ui-monospace, monospace; white-space: pre; }
th { background: #f4f4f4; font-weight: normal; }
td.guess { cursor: pointer; min-width: 2.5em; }
td.guess.on { outline: 2px solid #c05621; }
"""

_LENS_BODY = """<div class="label">a row per layer, a column per position: the top guess for the next token,
shaded by its probability (hover a cell, or tab to it, for its guesses)</div>
<table id="lens"></table>
<div class="legend">key: the probability the layer gives its top guess, 0 <span class="ramp"></span> 1; ␣ is a
space</div>
<div id="readout"></div>
"""

_LENS_SCRIPT = """const table = document.getElementById("lens");
const header = table.insertRow();
header.appendChild(document.createElement("th"));
data.tokens.forEach((text) => {
  const th = document.createElement("th"); th.textContent = shown(text); header.appendChild(th);
});
const cells = data.layers.map((name, layer) => {
  const row = table.insertRow();
  const th = document.createElement("th"); th.textContent = name; row.appendChild(th);
  return data.cells[layer].map((cell, position) => {
    const td = row.insertCell();
    const [text, p] = cell.top[0];
    td.className = "guess"; td.tabIndex = 0; td.textContent = shown(text);
    td.style.background = "rgba(43, 108, 176, " + p + ")"; td.style.color = p > 0.5 ? "#fff" : "#222";
    td.title = p.toFixed(3);
    const choose = () => show(layer, position);
    td.addEventListener("mouseenter", choose);
    td.addEventListener("focus", choose);
    return td;
  });
});
function show(layer, position) {
  cells.flat().forEach((td) => td.classList.remove("on"));
  cells[layer][position].classList.add("on");
  const cell = data.cells[layer][position];
  const last = position + 1 === data.tokens.length;
  const after = last ? "(past the prompt)" : JSON.stringify(shown(data.tokens[position + 1]));
  document.getElementById("readout").textContent =
    data.layers[layer] + ", after " + JSON.stringify(shown(data.tokens[position])) + ":\\n" +
    cell.top.map(([text, p]) => shown(text) + " " + p.toFixed(3)).join("  ") +
    "\\nnext token " + after + (cell.next === null ? "" : ": " + cell.next.toFixed(3));
}
show(data.layers.length - 1, data.tokens.length - 1);
"""

_PATCHING_STYLE = """
table { border-collapse: collapse; margin: 4px 0 14px; }
td, th { border: 1px solid #ddd; padding: 2px 4px; font-family: ui-monospace, monospace; white-space: pre;
         font-size: 12px; }
th { background: #f4f4f4; font-weight: normal; }
td.value { cursor: pointer; min-width: 2.2em; text-align: right; }
td.value.on { outline: 2px solid #222; }
"""

_PATCHING_BODY = """<div class="label" id="note"></div>
<div class="legend">key: the fraction of the logit difference (clean less corrupted) that patching the cell
restores, blue 0 <span class="ramp"></span> 1 (1: all of it); red, below 0, works against it
<span class="ramp against"></span>; shading capped at 1; ␣ is a space</div>
<div id="panels"></div>
<div id="readout"></div>
"""

_PATCHING_SCRIPT = """document.getElementById("note").textContent = data.note;
const box = document.getElementById("panels");
const cells = [];
data.panels.forEach((panel, p) => {
  const heading = document.createElement("div");
  heading.className = "label"; heading.textContent = panel.name; box.appendChild(heading);
  const table = document.createElement("table"); box.appendChild(table);
  const header = table.insertRow();
  header.appendChild(document.createElement("th"));
  panel.columns.forEach((text) => {
    const th = document.createElement("th"); th.textContent = shown(text); header.appendChild(th);
  });
  panel.rows.forEach((name, r) => {
    const row = table.insertRow();
    const th = document.createElement("th"); th.textContent = name; row.appendChild(th);
    panel.values[r].forEach((v, c) => {
      const td = row.insertCell();
      td.className = "value"; td.tabIndex = 0; td.textContent = v.toFixed(2); td.title = v.toFixed(3);
      const strength = Math.min(1, Math.abs(v));
      td.style.background = v >= 0 ? "rgba(43, 108, 176, " + strength + ")" : "rgba(192, 86, 33, " + strength + ")";
      td.style.color = strength > 0.5 ? "#fff" : "#222";
      const choose = () => show(p, r, c);
      td.addEventListener("mouseenter", choose);
      td.addEventListener("focus", choose);
      cells.push(td);
      td.dataset.cell = p + "," + r + "," + c;
    });
  });
});
function show(p, r, c) {
  cells.forEach((td) => td.classList.toggle("on", td.dataset.cell === p + "," + r + "," + c));
  const panel = data.panels[p];
  document.getElementById("readout").textContent =
    panel.name + ", " + panel.rows[r] + ", " + JSON.stringify(shown(panel.columns[c])) + ": restored " +
    panel.values[r][c].toFixed(3);
}
"""
