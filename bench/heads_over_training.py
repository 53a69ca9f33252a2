"""What each head became over a run, from the measures train.lab logged, and what removing the
heads that formed costs at the end.

    python bench/heads_over_training.py RUN [RUN ...] [--formed 0.3] [--out bench/results/heads_over_training.json]

For each run (trained with --config.train.lab including entropy, previous_token and induction):
each head's attention entropy at the first evaluation and the last; the heads that end as
previous-token or induction heads (a score above --formed at the last evaluation) and the step at
which each passed halfway from its first evaluation's score to its last; then the validation loss
at block_size of the last checkpoint with every head, without the previous-token heads, without
the induction heads, and without both, each removal zeroing the heads' outputs (`jaxgpt evaluate
--remove_heads`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def halfway_step(steps: list[int], values: list[float]) -> int:
    middle = (values[0] + values[-1]) / 2
    return next(s for s, v in zip(steps, values, strict=True) if (v - middle) * (values[-1] - values[0]) >= 0)


def story(workdir: Path, formed: float, tokens: int) -> dict:
    from jaxgpt.commands.evaluate import load_run, without_heads
    from jaxgpt.job.metrics import read_metrics

    records = [r for r in read_metrics(workdir) if "lab_entropy" in r]
    steps = [r["step"] for r in records]
    entropy = np.asarray([r["lab_entropy"] for r in records])  # (evals, L, H)
    kinds = {}
    for kind in ("previous_token", "induction"):
        scores = np.asarray([r[f"lab_{kind}"] for r in records])
        heads = [(int(layer), int(head)) for layer, head in zip(*np.nonzero(scores[-1] > formed), strict=True)]
        kinds[kind] = [
            {"head": f"{layer}.{head}", "final": float(scores[-1, layer, head]),
             "halfway": halfway_step(steps, scores[:, layer, head].tolist())}
            for layer, head in heads
        ]  # fmt: skip
    run, params, _, val = load_run(workdir, None, say=lambda line: None, budget=tokens)
    heads = {kind: [tuple(map(int, h["head"].split("."))) for h in formed] for kind, formed in kinds.items()}
    removed = {"none": [], **heads, "both": sorted(set(heads["previous_token"]) | set(heads["induction"]))}
    return {
        "run": workdir.name,
        "steps": [steps[0], steps[-1]],
        "entropy_first": entropy[0].round(3).tolist(),
        "entropy_last": entropy[-1].round(3).tolist(),
        "formed": kinds,
        "loss_without": {name: without_heads(run.model, params, val, tokens, gone) for name, gone in removed.items()},
    }


def main() -> None:
    from jaxgpt.hardware import runtime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--formed", type=float, default=0.3)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--out", default=str(ROOT / "bench/results/heads_over_training.json"))
    args = parser.parse_args()
    runtime.configure()
    rows = [story(Path(run), args.formed, args.tokens) for run in args.runs]
    for r in rows:
        print(f"{r['run']}: entropy per head (nats), step {r['steps'][0]} -> {r['steps'][1]}")
        for layer, (first, last) in enumerate(zip(r["entropy_first"], r["entropy_last"], strict=True)):
            print(f"  block {layer}: " + "  ".join(f"{a:.2f}->{b:.2f}" for a, b in zip(first, last, strict=True)))
        for kind, heads in r["formed"].items():
            listed = ", ".join(f"{h['head']} ({h['final']:.2f}, halfway at {h['halfway']})" for h in heads) or "none"
            print(f"  {kind} heads above {args.formed}: {listed}")
        loss = r["loss_without"]
        print(
            f"  val loss {loss['none']:.4f}; without the previous-token heads {loss['previous_token']:.4f}, "
            f"the induction heads {loss['induction']:.4f}, both {loss['both']:.4f}"
        )
    Path(args.out).write_text(json.dumps({"formed": args.formed, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
