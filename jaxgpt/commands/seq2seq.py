"""Train an encoder–decoder on a digit task, decode it, and draw its cross-attention:
python -m jaxgpt seq2seq [--task reverse|sort] [--length 8] [--steps 400] [--maps PNG] [--workdir DIR]

Examples:
  python -m jaxgpt seq2seq --task reverse --workdir runs/reverse --maps runs/reverse/cross_attention.png
  python -m jaxgpt seq2seq --task sort --length 12 --steps 1500
  python -m jaxgpt seq2seq --task reverse --position sinusoidal --scale_embeddings

The original Transformer's shape (jaxgpt/encoder_decoder.py) on a task generated on the spot
(jaxgpt/seq2seq_tasks.py): the encoder reads --length digits, the decoder writes the answer. It is
trained with teacher forcing on fresh examples every step, then decodes --examples held-out
sources greedily with its caches (the source encoded once, the cross-attention's keys and
values computed at the first step, the self-attention's KV cache growing a digit a step), and
prints the share of answers right in full and of digits right, and a few answers. --maps draws
the cross-attention of every decoder layer and head on the first held-out example: for
reverse, output digit i reads source digit length - 1 - i, an anti-diagonal.
--workdir saves the model, and `python -m jaxgpt attention-maps --workdir DIR --prompt DIGITS` then
draws its cross-attention on any source.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from absl import flags

from jaxgpt.commands import cli
from jaxgpt.errors import UserError


def define_flags(f: flags.FlagValues) -> None:
    from jaxgpt import seq2seq_tasks as tasks

    flags.DEFINE_enum("task", "reverse", tasks.TASKS, "What the decoder writes from the source digits.", flag_values=f)
    flags.DEFINE_integer("length", 8, "Digits in each source and answer.", flag_values=f)
    flags.DEFINE_integer("steps", 400, "Optimizer steps.", flag_values=f)
    flags.DEFINE_integer("batch_size", 64, "Examples per step.", flag_values=f)
    flags.DEFINE_float("lr", 3e-3, "Peak learning rate (AdamW, warmup then cosine to a tenth).", flag_values=f)
    flags.DEFINE_integer("n_layer", 2, "Blocks in the encoder, and in the decoder.", flag_values=f)
    flags.DEFINE_integer("n_head", 4, "Attention heads.", flag_values=f)
    flags.DEFINE_integer("d_model", 64, "Residual width.", flag_values=f)
    flags.DEFINE_enum("position", "learned", ["learned", "sinusoidal", "rope", "none"], "Positions.", flag_values=f)
    flags.DEFINE_bool("scale_embeddings", False, "Embeddings times sqrt(d_model), as the paper.", flag_values=f)
    flags.DEFINE_integer("seed", 0, "Initialisation and examples.", flag_values=f)
    flags.DEFINE_integer("examples", 1000, "Held-out examples decoded for the accuracy.", flag_values=f)
    flags.DEFINE_string("maps", None, "PNG to draw the cross-attention maps in.", flag_values=f)
    flags.DEFINE_string(
        "workdir",
        None,
        "Save the trained model here, for attention-maps --workdir (default: not saved).",
        flag_values=f,
    )


def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    cli.run(lambda: _seq2seq(argv))


def _seq2seq(argv: list[str] | None) -> None:
    argv, f = cli.command_flags(argv)
    define_flags(f)
    cli.parse_flags(argv, __doc__, f)
    for name in ("length", "steps", "batch_size", "examples"):
        if getattr(f, name) < 1:
            raise UserError(f"--{name} {getattr(f, name)}: must be at least 1")
    import jax

    from jaxgpt import seq2seq_tasks as tasks
    from jaxgpt.config import ModelConfig
    from jaxgpt.model import count_params

    config = ModelConfig(
        vocab_size=tasks.VOCAB,
        block_size=f.length,
        n_layer=f.n_layer,
        n_head=f.n_head,
        d_model=f.d_model,
        position=f.position,
        scale_embeddings=f.scale_embeddings,
    )
    started = time.perf_counter()
    shapes = jax.eval_shape(lambda: tasks.init(config, f.seed, f.length))  # counted, not allocated
    print(
        f"encoder-decoder: {f.n_layer} + {f.n_layer} blocks, {f.n_head} heads, d_model {f.d_model}, {f.position} "
        f"positions; {count_params(shapes):,} parameters; task {f.task}, {f.length} digits"
    )

    def report(step, loss):
        print(
            f"step {step}/{f.steps}: teacher-forced loss {loss:.4f}, {time.perf_counter() - started:.0f} s", flush=True
        )

    params = tasks.train(
        config, f.task, steps=f.steps, length=f.length, batch_size=f.batch_size, lr=f.lr, seed=f.seed, report=report
    )
    if f.workdir:
        tasks.save(Path(f.workdir), config, f.task, params)
        print(f"saved to {f.workdir}: python -m jaxgpt attention-maps --workdir {f.workdir} --prompt DIGITS")
    source, target = tasks.held_out(f.task, f.length, f.examples, f.seed)
    decoded = np.asarray(tasks.greedy_decode(config, params, source, f.length))
    score = tasks.accuracy(decoded, target)
    print(
        f"held-out accuracy, greedy decoding with the caches: {score.sequences:.1%} of {f.examples:,} answers right "
        f"in full, {score.tokens:.1%} of digits"
    )
    text = lambda row: "".join(map(str, row))  # noqa: E731
    for i in range(min(5, f.examples)):
        mark = "right" if (decoded[i] == target[i]).all() else f"wrong (answer {text(target[i])})"
        print(f"  {text(source[i])} -> {text(decoded[i])}  {mark}")
    if f.maps:
        from jaxgpt.commands.attention_maps import draw_cross_attention

        out = draw_cross_attention(config, params, source[0], decoded[0], Path(f.maps))
        print(f"wrote {out}: decoder positions (rows, reading BOS then the answer) by source digits (columns)")


if __name__ == "__main__":
    main()
