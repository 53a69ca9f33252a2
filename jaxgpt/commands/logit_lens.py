"""What the model would predict if it stopped after each layer (the logit lens):
python -m jaxgpt logit-lens --workdir DIR --prompt TEXT [--step N | --init] [--positions 12]

Examples:
  python -m jaxgpt logit-lens --workdir runs/tiny --prompt "if x is None: x = x + 1"
  python -m jaxgpt logit-lens --workdir runs/llama_tiny --prompt "    def __init__(self, x):" --positions 8
  python -m jaxgpt logit-lens --init_from gpt2 --prompt "The Eiffel Tower is in the city of"
  python -m jaxgpt logit-lens --workdir runs/tiny --prompt "if x is None: x = x + 1" --html lens.html

The final norm and the LM head are applied to the residual stream before the first block and
after each (jaxgpt/lab/capture.py): a row per layer with the stream's mean norm, the loss of that
readout on the prompt's own next tokens, and its most likely next token at each of the last
--positions positions. A model builds its prediction over its depth: the loss falls, and the
guesses turn from the current token's bigram into the continuation. --html PAGE also writes the
whole table (every position) as a page to touch: hover a cell for that layer's five likeliest
next tokens and the probability it gives the one that does come next (jaxgpt/lab/views.py).
"""

from __future__ import annotations

import numpy as np
from absl import flags

from jaxgpt.commands import cli, inspected
from jaxgpt.lab.capture import capture, lens_log_probabilities
from jaxgpt.lab.views import logit_lens_view

CELL = 7  # characters per token column


def lens_rows(logit_lens: np.ndarray, residual: np.ndarray, ids: np.ndarray) -> list[dict]:
    """Per layer (embeddings first): mean residual norm, mean cross-entropy (nats) of the
    readout against the next prompt token, and the readout's top token at every position.
    logit_lens (layers, t, vocab), residual (layers, t, d), ids (t,)."""
    rows = []
    for lens, stream in zip(logit_lens, residual, strict=True):
        log_probs = lens_log_probabilities(lens)
        targets = log_probs[np.arange(len(ids) - 1), ids[1:]]
        rows.append(
            {
                "norm": float(np.linalg.norm(stream, axis=-1).mean()),
                "loss": float(-targets.mean()) if len(ids) > 1 else float("nan"),
                "top": lens.argmax(-1),
            }
        )
    return rows


def lens_caption(tokens: int, positions: int) -> str:
    """What the table shows; it names a cut, so a long prompt's first tokens are not taken
    for missing (the loss column is over the whole prompt either way)."""
    where = "each position" if positions >= tokens else f"each of the last {positions} positions (--positions)"
    return f"a row per layer, its loss over the whole prompt and its top next token at {where}"


def shown(text: str) -> str:
    """A token as a fixed-width cell: escaped, cut to fit."""
    return repr(text)[1:-1][: CELL - 1].ljust(CELL)


def table(rows: list[dict], ids: np.ndarray, decode, positions: int) -> list[str]:
    first = max(0, len(ids) - positions)
    names = ["embed"] + [f"block {i}" for i in range(len(rows) - 1)]
    lines = [f"{'':8} {'|x|':>7} {'loss':>6}   " + "".join(shown(decode([i])) for i in ids[first:]) + "  <- input"]
    for name, row in zip(names, rows, strict=True):
        guesses = "".join(shown(decode([int(i)])) for i in row["top"][first:])
        lines.append(f"{name:8} {row['norm']:>7.2f} {row['loss']:>6.3f}   {guesses}")
    lines.append(f"{'':26}" + "".join(shown(decode([i])) for i in ids[first + 1 :]) + f"{'?':{CELL}}  <- next")
    return lines


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    f = inspected.parse_flags(argv, __doc__, _define_flags)
    config, params, tokenizer, source = inspected.load_model(f)
    cli.refuse_unless_served(
        config, "logit-lens", f.workdir or f.init_from, "its layers have no next-token guesses to read"
    )
    cli.refuse_an_encoder_decoder(config, f.workdir or f.init_from, "the logit lens reads a decoder given text alone")
    ids = inspected.prompt_ids(tokenizer, f.prompt, config)
    captured = capture(config, params, ids[None])
    rows = lens_rows(captured.logit_lens[:, 0], captured.residual[:, 0], ids)
    print(f"logit lens ({source}, {len(ids)} tokens): {lens_caption(len(ids), f.positions)}")
    print("\n".join(table(rows, ids, tokenizer.decode, f.positions)))
    if f.html:
        title = f"logit lens ({source}): {f.prompt}"
        page = logit_lens_view(captured.logit_lens[:, 0], ids, tokenizer.decode, title=title).save(f.html)
        print(f"wrote {page} (every position; hover a cell for its guesses)")


def _define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_integer("positions", 12, "Show the last this many positions.", lower_bound=1, flag_values=f)
    flags.DEFINE_string("html", None, "Also write the whole table as an interactive page (HTML).", flag_values=f)


if __name__ == "__main__":
    main()
