"""A run's story in one page: its loss curves on top, each train.lab measure's curves beneath
(a line a head, or a layer boundary), and a step slider showing every head's attention pattern on
the probe at that step (jaxgpt/lab/watch.py keeps it small at each evaluation). Hover a chart for
the values at the nearest step. One self-contained page (views.document: its data, script and
style inline, nothing fetched), and the same curves as a PNG for a paper (`timeline_figure`).
"""

from __future__ import annotations

import numpy as np

from jaxgpt.lab.views import DECIMALS, View, document

PER_HEAD = ("induction", "previous_token", "dla", "entropy")  # a list per block of a value per head
UNITS = {
    "induction": "induction score (1: a perfect induction head)",
    "previous_token": "previous-token score (1: attends to the token before)",
    "dla": "direct logit attribution to the next token (logits)",
    "entropy": "attention entropy on text (nats)",
    "logit_lens": "logit lens: next-token loss read after each layer (nats)",
    "norms": "residual stream norm at each layer boundary",
    "probe": "linear probe: has the token been seen before in its window? (balanced accuracy, 0.5: chance)",
}


def timeline_data(records: list[dict], decode) -> dict:
    """What the page draws, from a run's metrics records; `decode(ids) -> list of texts`, one
    a token, for the probe's tokens. Raises ValueError when no record holds lab measures."""
    evaluated = [r for r in records if "lab_pattern" in r]
    if not evaluated:
        raise ValueError("no record holds train.lab's measures")
    steps = [r["step"] for r in evaluated]
    measures = []
    for key in (k for k in evaluated[-1] if k.startswith("lab_") and not k.startswith("lab_pattern")):
        name = key.removeprefix("lab_")
        values = np.asarray([r[key] for r in evaluated if key in r], np.float64)  # (steps, L, H) or (steps, L + 1)
        measured = [r["step"] for r in evaluated if key in r]
        if name in PER_HEAD:
            labels = [f"block {i} head {h}" for i in range(values.shape[1]) for h in range(values.shape[2])]
            groups = [i for i in range(values.shape[1]) for _ in range(values.shape[2])]
            series = values.reshape(len(measured), -1).T
        else:
            labels = ["embeddings"] + [f"after block {i}" for i in range(values.shape[1] - 1)]
            groups = list(range(values.shape[1]))
            series = values.T
        measures.append(
            {"name": name, "unit": UNITS.get(name, name), "steps": measured, "labels": labels, "groups": groups,
             "values": np.round(series, DECIMALS).tolist()}
        )  # fmt: skip
    train = [(r["step"], r["train_loss"]) for r in records if r.get("train_loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    return {
        "title": "",
        "loss": {"train": train, "val": val},
        "measures": measures,
        "steps": steps,
        "tokens": decode(evaluated[-1]["lab_pattern_tokens"]),
        "patterns": [r["lab_pattern"] for r in evaluated],  # (steps, L, H, k, k)
    }


def timeline_view(data: dict, *, title: str) -> View:
    return document(title, _STYLE, _BODY, data | {"title": title}, _SCRIPT)


def timeline_figure(data: dict, path, *, title: str) -> None:
    """The page's curves as a PNG: the losses on top, each measure beneath, a line a head (a
    colour a block) or a layer boundary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 1 + len(data["measures"])
    figure, axes = plt.subplots(panels, 1, figsize=(9, 2.2 * panels), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for name, style in (("train", "-"), ("val", "--")):
        steps, losses = zip(*data["loss"][name], strict=True) if data["loss"][name] else ((), ())
        axes[0].plot(steps, losses, style, label=f"{name} loss")
    axes[0].set_ylabel("loss (nats)")
    axes[0].legend(fontsize=8)
    colours = plt.get_cmap("tab10")
    for ax, measure in zip(axes[1:], data["measures"], strict=True):
        named = set()  # a legend entry a colour: a block's heads, or a layer boundary
        for label, group, values in zip(measure["labels"], measure["groups"], measure["values"], strict=True):
            legend = label.rsplit(" head", 1)[0] if group not in named else None
            ax.plot(measure["steps"], values, color=colours(group % 10), lw=1, label=legend)
            named.add(group)
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
        ax.set_ylabel(measure["name"], fontsize=8)
        ax.set_title(measure["unit"], fontsize=8, loc="left")
    axes[-1].set_xlabel("step")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


_STYLE = """
svg.chart { display: block; margin: 2px 0 10px; background: #fff; border: 1px solid #ddd; }
svg.chart text { font-size: 10px; fill: #444; }
.controls { margin: 8px 0; }
#patterns { display: grid; gap: 6px; margin: 6px 0; }
#patterns canvas { border: 1px solid #ccc; image-rendering: pixelated; width: 96px; height: 96px; }
.cell .label { text-align: center; }
"""

_BODY = """<div class="label">loss (nats per token): train solid, validation dashed</div>
<svg class="chart" id="loss" width="900" height="160"></svg>
<div id="measures"></div>
<div class="controls"><label>step <input type="range" id="step" min="0" value="0"></label>
<span id="stepname"></span></div>
<div class="label" id="probe"></div>
<div id="patterns"></div>
<div class="legend">key: each head's attention on the probe at the chosen step, query down and key across,
0 <span class="ramp"></span> 1; on a chart, a line a head (a colour a block) or a layer boundary, hover for the
values at the nearest step</div>
<div id="readout"></div>
"""

_SCRIPT = """const W = 900, H = 160, PAD = 34;
const colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];
const allSteps = data.loss.train.map((p) => p[0]).concat(data.steps);
const x0 = Math.min(...allSteps), x1 = Math.max(...allSteps);
const sx = (s) => PAD + (W - 2 * PAD) * (s - x0) / Math.max(1, x1 - x0);
function chart(svg, lines) {  // lines: [{points: [[step, value]], colour, dash, label}]
  const values = lines.flatMap((l) => l.points.map((p) => p[1])).filter((v) => v !== null);
  const y0 = Math.min(...values), y1 = Math.max(...values);
  const sy = (v) => H - PAD / 2 - (H - PAD) * (v - y0) / Math.max(1e-12, y1 - y0);
  const ns = "http://www.w3.org/2000/svg";
  lines.forEach((l) => {
    const path = document.createElementNS(ns, "polyline");
    path.setAttribute("points", l.points.map((p) => sx(p[0]) + "," + sy(p[1])).join(" "));
    path.setAttribute("fill", "none"); path.setAttribute("stroke", l.colour);
    path.setAttribute("stroke-width", "1.2");
    if (l.dash) path.setAttribute("stroke-dasharray", "4 3");
    svg.appendChild(path);
  });
  [[y0, H - PAD / 2], [y1, PAD / 2 + 8]].forEach(([v, y]) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 2); t.setAttribute("y", y); t.textContent = v.toPrecision(3); svg.appendChild(t);
  });
  const marker = document.createElementNS(ns, "line");
  marker.setAttribute("y1", 0); marker.setAttribute("y2", H); marker.setAttribute("stroke", "#c05621");
  marker.classList.add("marker"); svg.appendChild(marker);
  svg.addEventListener("mousemove", (event) => {
    const box = svg.getBoundingClientRect();
    const step = x0 + (event.clientX - box.left - PAD) / (W - 2 * PAD) * (x1 - x0);
    const near = (points) => points.reduce((a, p) => Math.abs(p[0] - step) < Math.abs(a[0] - step) ? p : a);
    document.getElementById("readout").textContent = lines.map((l) => {
      const p = near(l.points); return l.label + " at step " + p[0] + ": " + p[1].toFixed(4);
    }).join("\\n");
  });
  return marker;
}
const markers = [chart(document.getElementById("loss"), [
  { points: data.loss.train, colour: "#222", label: "train loss" },
  { points: data.loss.val, colour: "#2b6cb0", dash: true, label: "val loss" }])];
const box = document.getElementById("measures");
data.measures.forEach((m) => {
  const label = document.createElement("div"); label.className = "label"; label.textContent = m.unit;
  box.appendChild(label);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "chart"); svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.id = "measure-" + m.name; box.appendChild(svg);
  markers.push(chart(svg, m.values.map((values, i) => ({
    points: m.steps.map((s, j) => [s, values[j]]), colour: colours[m.groups[i] % 10], label: m.labels[i] }))));
});
document.getElementById("probe").textContent = "probe: " + data.tokens.map(shown).join("");
const layers = data.patterns[0].length, heads = data.patterns[0][0].length;
const grid = document.getElementById("patterns");
grid.style.gridTemplateColumns = "repeat(" + heads + ", 100px)";
const canvases = [];
for (let l = 0; l < layers; l++) for (let h = 0; h < heads; h++) {
  const cell = document.createElement("div"); cell.className = "cell";
  const canvas = document.createElement("canvas");
  const k = data.patterns[0][l][h].length; canvas.width = k; canvas.height = k;
  canvas.title = "block " + l + " head " + h;
  const name = document.createElement("div"); name.className = "label"; name.textContent = "block " + l + " head " + h;
  cell.appendChild(canvas); cell.appendChild(name); grid.appendChild(cell); canvases.push([canvas, l, h]);
}
const slider = document.getElementById("step");
slider.max = data.steps.length - 1; slider.value = data.steps.length - 1;
function draw() {
  const i = Number(slider.value), step = data.steps[i];
  document.getElementById("stepname").textContent = step;
  markers.forEach((m) => { m.setAttribute("x1", sx(step)); m.setAttribute("x2", sx(step)); });
  canvases.forEach(([canvas, l, h]) => {
    const weights = data.patterns[i][l][h], k = weights.length;
    const context = canvas.getContext("2d"), image = context.createImageData(k, k);
    for (let q = 0; q < k; q++) for (let s = 0; s < k; s++) {
      const w = weights[q][s], at = 4 * (q * k + s);
      image.data[at] = 255 - (255 - 43) * w; image.data[at + 1] = 255 - (255 - 108) * w;
      image.data[at + 2] = 255 - (255 - 176) * w; image.data[at + 3] = 255;
    }
    context.putImageData(image, 0, 0);
    canvas.dataset.weights = JSON.stringify(weights);
  });
}
slider.addEventListener("input", draw);
draw();
"""
