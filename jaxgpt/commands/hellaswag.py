"""Score a model on multiple-choice questions (HellaSwag) by the log-likelihood of each ending:
python -m jaxgpt.hellaswag --workdir DIR --questions hellaswag_val.jsonl [--limit N] [--step N | --init]
python -m jaxgpt.hellaswag --init_from gpt2 --questions hf:Rowan/hellaswag

Prints the accuracy and the length-normalised accuracy (jaxgpt/multiple_choice.py), beside
chance: HellaSwag has four endings, so 0.25. GPT-2 124M scores about 0.29 normalised.
"""

from __future__ import annotations

from tqdm import tqdm

from jaxgpt import multiple_choice
from jaxgpt.commands import cli, inspected
from jaxgpt.errors import UserError


def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    cli.run(lambda: _score(argv))


def _score(argv: list[str] | None) -> None:
    parser = cli.argument_parser(__doc__, __name__)
    inspected.add_flags(parser, prompt=False)
    parser.add_argument("--questions", required=True, help="a HellaSwag JSONL file, or hf:NAME[:SPLIT]")
    parser.add_argument("--limit", type=int, default=None, help="score only the first this many questions")
    parser.add_argument("--batch", type=int, default=8, help="questions per forward pass")
    args = parser.parse_args(argv)
    for flag in ("limit", "batch"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)}: give at least 1")
    questions = multiple_choice.read_questions(args.questions, args.limit)
    config, params, tokenizer, source = inspected.load_model(args)
    with tqdm(total=len(questions), unit="question", leave=False, disable=None) as bar:
        result = multiple_choice.score(config, params, tokenizer, questions, args.batch, progress=bar.update)
    print(result.line(f"{args.questions} ({source})"))


if __name__ == "__main__":
    main()
