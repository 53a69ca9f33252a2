"""Score a model on multiple-choice questions (HellaSwag) by the log-likelihood of each ending:
python -m jaxgpt hellaswag --workdir DIR --questions FILE [--limit N] [--step N | --init]

Examples:
  python -m jaxgpt hellaswag --workdir runs/tiny --questions tests/data/hellaswag_sample.jsonl
  python -m jaxgpt hellaswag --init_from gpt2 --questions hf:Rowan/hellaswag --limit 1000

Prints the accuracy and the length-normalised accuracy (jaxgpt/lab/multiple_choice.py), beside
chance: HellaSwag has four endings, so 0.25. GPT-2 124M scores about 0.29 normalised.
"""

from __future__ import annotations

from absl import flags
from tqdm import tqdm

from jaxgpt.commands import cli, inspected
from jaxgpt.lab import multiple_choice


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    f = inspected.parse_flags(argv, __doc__, _define_flags, prompt=False)
    cli.require(f, "questions", what="the questions to score: a HellaSwag JSONL file, or hf:Rowan/hellaswag")
    questions = multiple_choice.read_questions(f.questions, f.limit)
    config, params, tokenizer, source = inspected.load_model(f)
    cli.refuse_an_encoder_decoder(config, f.workdir or f.init_from, "its endings are scored as text continuing text")
    with tqdm(total=len(questions), unit="question", leave=False, disable=None) as bar:
        result = multiple_choice.score(config, params, tokenizer, questions, f.batch, progress=bar.update)
    print(result.line(f"{f.questions} ({source})"))


def _define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_string("questions", None, "A HellaSwag JSONL file, or hf:NAME[:SPLIT].", flag_values=f)
    flags.DEFINE_integer("limit", None, "Score only the first this many questions.", lower_bound=1, flag_values=f)
    flags.DEFINE_integer("batch", 8, "Questions per forward pass.", lower_bound=1, flag_values=f)


if __name__ == "__main__":
    main()
