"""Score a model on multiple-choice questions (HellaSwag, ARC, PIQA, Winogrande):
python -m jaxgpt hellaswag --workdir DIR --questions FILE [--questions FILE ...]

Examples:
  python -m jaxgpt hellaswag --workdir runs/tiny --questions tests/data/hellaswag_sample.jsonl
  python -m jaxgpt hellaswag --init_from gpt2 --questions hf:Rowan/hellaswag --limit 1000
  python -m jaxgpt hellaswag --workdir runs/tiny --questions tests/data/hellaswag_sample.jsonl \\
      --questions tests/data/arc_sample.jsonl --questions tests/data/winogrande_sample.jsonl

Each ending is scored by the log-likelihood of its tokens after the context. Prints, per file, the
accuracy and the length-normalised accuracy (jaxgpt/lab/multiple_choice.py) beside chance:
HellaSwag has four endings, so 0.25; GPT-2 124M scores about 0.29 normalised. Each file's format is
told by its fields (HellaSwag, ARC, PIQA, Winogrande, the last scored partially). Given several, it
ends with their centred average: each normalised accuracy with chance subtracted, over 1 - chance
(nanochat's CORE centring), so two-choice and four-choice tasks weigh alike.
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
    cli.require(f, "questions", what="the questions to score: a JSONL file (HellaSwag, ARC, PIQA, Winogrande)")
    tasks = {path: multiple_choice.read_questions(path, f.limit) for path in f.questions}  # all read before a model
    config, params, tokenizer, source = inspected.load_model(f)
    cli.refuse_an_encoder_decoder(config, f.workdir or f.init_from, "its endings are scored as text continuing text")
    scores = []
    for path, questions in tasks.items():
        with tqdm(total=len(questions), unit="question", leave=False, disable=None) as bar:
            scores.append(multiple_choice.score(config, params, tokenizer, questions, f.batch, progress=bar.update))
        print(scores[-1].line(f"{path} ({source})"))
    if len(scores) > 1:
        centred = ", ".join(f"{score.centred:.4f}" for score in scores)
        average = multiple_choice.centred_average(scores)
        print(f"centred average over {len(scores)} tasks: {average:.4f} (each: {centred}; 0 is chance, 1 all right)")


def _define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_multi_string(
        "questions", None, "A JSONL file of questions, or hf:NAME[:SPLIT]; repeatable.", flag_values=f
    )
    flags.DEFINE_integer("limit", None, "Score only the first this many questions.", lower_bound=1, flag_values=f)
    flags.DEFINE_integer("batch", 8, "Questions per forward pass.", lower_bound=1, flag_values=f)


if __name__ == "__main__":
    main()
