"""Fill in the blanks with an encoder (a run trained with model.objective=masked):
python -m jaxgpt fill --workdir DIR --prompt "TEXT WITH [MASK] IN IT" [--top 5] [--step N | --init]

Examples:
  python -m jaxgpt fill --workdir runs/encoder_tiny --prompt "def __init__(se[MASK]f, x):"
  python -m jaxgpt fill --workdir runs/encoder_tiny --prompt "The [MASK][MASK][MASK] statement" --top 3

Each [MASK] in the prompt is one hidden token: the model reads the whole prompt, both sides of
every blank, and predicts every blank at once and independently of the others (as BERT's
masked-token objective trains it to; jaxgpt/training/masked.py). Printed: the prompt with each blank
filled by its most likely token, then for each blank its --top candidates with their
probabilities. The mask token itself is never a candidate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from jaxgpt.commands import cli, inspected
from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.model.transformer import GPT
from jaxgpt.training.masked import mask_token

BLANK = "[MASK]"


def prompt_with_blanks(tokenizer, prompt: str, config: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(token ids with the mask token at each [MASK], the blanks' positions); one line for a
    prompt without a blank or longer than block_size."""
    pieces = prompt.split(BLANK)
    if len(pieces) == 1:
        raise UserError(f"the prompt has no {BLANK}; mark each token to fill in with {BLANK}")
    ids, blanks = [], []
    for i, piece in enumerate(pieces):
        if i:
            blanks.append(len(ids))
            ids.append(mask_token(config))
        ids.extend(tokenizer.encode(piece) if piece else [])
    if len(ids) > config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens; give at most {config.block_size} (the model's block_size)")
    return np.asarray(ids, np.int32), np.asarray(blanks)


def blank_probabilities(config: ModelConfig, params, ids: np.ndarray, blanks: np.ndarray) -> np.ndarray:
    """(blanks, vocab) the model's distribution for each blank, the mask token left out and the
    rest renormalised."""
    logits = jax.jit(GPT(config).apply)({"params": params}, jnp.asarray(ids)[None])[0]
    logits = logits[jnp.asarray(blanks)].at[:, mask_token(config)].set(-jnp.inf)
    return np.asarray(jax.nn.softmax(logits, axis=-1))


def filled(prompt: str, guesses: list[str]) -> str:
    """The prompt with its blanks replaced, in order, by `guesses`."""
    pieces = prompt.split(BLANK)
    return pieces[0] + "".join(guess + piece for guess, piece in zip(guesses, pieces[1:], strict=True))


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    f = inspected.parse_flags(argv, __doc__, _define_flags)
    config, params, tokenizer, source = inspected.load_model(f)
    cli.refuse_unless_served(
        config, "fill", source, "fill needs a run trained with model.objective=masked (an encoder)"
    )
    ids, blanks = prompt_with_blanks(tokenizer, f.prompt, config)
    probabilities = blank_probabilities(config, params, ids, blanks)
    best = [tokenizer.decode([int(p.argmax())]) for p in probabilities]
    print(f"filled ({source}): {filled(f.prompt, best)!r}")
    for number, p in enumerate(probabilities):
        top = np.argsort(-p)[: f.top]
        candidates = "  ".join(f"{tokenizer.decode([int(i)])!r} {p[i]:.3f}" for i in top)
        print(f"blank {number + 1} (token {blanks[number]}): {candidates}")


def _define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_integer("top", 5, "Candidates shown for each blank.", lower_bound=1, flag_values=f)


if __name__ == "__main__":
    main()
