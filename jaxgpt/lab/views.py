"""Views to touch: each one self-contained HTML page (its data, script and style inline, nothing
fetched), written to a file by the commands and shown inline in Jupyter or Colab (`_repr_html_`).

The attention view: every layer and head of one prompt; pick a layer and a head, hover a query
token (or tab to it) and each key token it may see is shaded by the weight the query gives it,
the weights listed to three decimals. An encoder–decoder's cross-attention is the same view with
the source's tokens as keys. The data a page embeds is JSON in a <script type="application/json">
element, read back by tests/test_views.py against the arrays it came from.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

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
    return View(_PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA__", _script_safe(data)))


def _script_safe(data: dict) -> str:
    """JSON that cannot end the <script> element it sits in (a token "</script>" would)."""
    return json.dumps(data).replace("</", "<\\/")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 16px; margin: 0 0 8px; }
.controls button { margin: 0 4px 4px 0; padding: 2px 8px; border: 1px solid #999; background: #f4f4f4;
                   cursor: pointer; }
.controls button.on { background: #2b6cb0; color: #fff; border-color: #2b6cb0; }
.tokens { margin: 10px 0; line-height: 2.2; }
.token { font-family: ui-monospace, monospace; padding: 2px 3px; margin: 1px; border: 1px solid #ccc;
         border-radius: 3px; white-space: pre; }
.query { cursor: pointer; }
.query.on { outline: 2px solid #c05621; }
#readout { font-family: ui-monospace, monospace; white-space: pre-wrap; min-height: 3em; }
.label { color: #666; font-size: 12px; }
</style></head>
<body>
<h1>__TITLE__</h1>
<div class="controls" id="layers"></div>
<div class="controls" id="heads"></div>
<div class="label">queries (hover one, or tab to it)</div>
<div class="tokens" id="queries"></div>
<div class="label">keys, shaded by the chosen query's weight on each</div>
<div class="tokens" id="keys"></div>
<div id="readout"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const state = { layer: 0, head: 0, query: data.queries.length - 1 };
function shown(text) { return JSON.stringify(text).slice(1, -1); }
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
</script>
</body></html>
"""
