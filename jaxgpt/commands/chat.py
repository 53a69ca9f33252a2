"""Chat with a run fine-tuned on conversations: python -m jaxgpt chat --workdir runs/sft_arithmetic

Examples:
  python -m jaxgpt chat --workdir runs/sft_arithmetic                    # type a message, Enter; Ctrl-D ends
  python -m jaxgpt chat --workdir runs/sft_arithmetic --temperature 0 < questions.txt   # a line a turn

Each message you type is a user turn of one conversation, written with the chat template the run
was trained on (jaxgpt/data/conversations.py); the model's answer is printed as it is made and
ends at its end-of-turn token. The KV cache is kept from turn to turn, so each turn feeds only
its own tokens. Where stdin is not a terminal, each line read is a turn and its answer one line
of output (a line break the model writes shown as \\n, a backslash as \\\\), then the command
exits. "/reset" starts a new conversation; one that fills the model's context is started afresh,
with a note on stderr. A message the model cannot read (longer than its context, or spelling one
of the template's markers) is refused in one line: on a terminal the conversation goes on, piped
the command ends (its answers would no longer be a line each).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from absl import flags

from jaxgpt.commands import cli
from jaxgpt.commands.sample import define_sampling_flags, sampling_of
from jaxgpt.errors import UserError, warn


def define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "Run directory of a run trained on conversations.", flag_values=f)
    flags.DEFINE_string("system", "", "A system message to start each conversation with.", flag_values=f)
    flags.DEFINE_integer(
        "max_new_tokens", None, "Most tokens in one answer (default: what the context has room for).", flag_values=f
    )
    define_sampling_flags(f)
    flags.DEFINE_integer("seed", 0, "Random seed: the same seed and messages give the same answers.", flag_values=f)


class ChatSession:
    """One conversation with a model, its KV cache kept between turns: a turn feeds the tokens
    not yet in the cache (the last answer's end-of-turn token, the user's message, the
    assistant's marker) and decodes the answer a token at a time. Turn t draws its randomness
    from fold_in(key(seed), t)."""

    def __init__(self, config, params, tokenizer, sampling, seed: int = 0, system: str = "", max_new_tokens=None):
        import jax

        from jaxgpt.model.sampling import decode_step, prefill

        self.config, self.params, self.tokenizer, self.sampling = config, params, tokenizer, sampling
        self.seed, self.system, self.max_new_tokens = seed, system, max_new_tokens
        self._prefill = jax.jit(prefill, static_argnames=("config", "sampling"))
        self._step = jax.jit(decode_step, static_argnames=("config", "sampling"), donate_argnums=(2,))
        self.turns = 0
        self.answer_ids: list[int] = []  # the last answer's tokens
        self.reset()

    def reset(self) -> None:
        """Start a new conversation: nothing in the cache."""
        self.cache, self.used, self.unfed = None, 0, []

    def turn_ids(self, message: str, afresh: bool = False) -> list[int]:
        """The tokens this turn feeds: what the cache lacks, the message, the assistant's marker
        (`afresh`: as the first turn of a new conversation would)."""
        from jaxgpt.data.conversations import prompt_ids

        first = afresh or self.cache is None
        messages = ([{"role": "system", "content": self.system}] if first and self.system else []) + [
            {"role": "user", "content": message}
        ]
        return ([] if afresh else self.unfed) + prompt_ids(self.tokenizer, messages, first=first)

    def reply(self, message: str, note=warn) -> Iterator[str]:
        """The answer to `message`, a piece of text at a time as its tokens are made."""
        import jax
        import jax.numpy as jnp

        from jaxgpt.data.conversations import END, check_content, end_of_turn

        check_content(message, "the message")
        context = self.config.block_size
        if (alone := len(self.turn_ids(message, afresh=True))) >= context:  # refused before the conversation changes
            raise UserError(
                f"the message is {alone} tokens with the template's, and the model's context is {context}; "
                "write a shorter one"
            )
        ids = self.turn_ids(message)
        if self.cache is not None and self.used + len(ids) >= context:
            note(f"the conversation filled the model's {context}-token context; starting a new one")
            self.reset()
            ids = self.turn_ids(message)
        room = context - self.used - len(ids)
        most = min(self.max_new_tokens or room, room)
        rng = jax.random.fold_in(jax.random.key(self.seed), self.turns)
        self.turns += 1
        stop = end_of_turn(self.tokenizer)
        token, self.cache = self._prefill(
            self.config, self.params, jnp.asarray([ids], jnp.int32), rng, sampling=self.sampling, cache=self.cache
        )
        self.used += len(ids)
        made, shown = [], ""
        for i in range(most):
            if i:
                token, self.cache = self._step(
                    self.config, self.params, self.cache, token, rng, i, sampling=self.sampling
                )
                self.used += 1
            if int(token[0]) == stop:
                break
            made.append(int(token[0]))
            text = self.tokenizer.decode(made)
            if not text.endswith("\ufffd"):  # a character whose bytes are not all made yet waits for them
                yield text[len(shown) :]
                shown = text
        else:
            note(f"the answer was cut at {most} tokens{'' if self.max_new_tokens else ', the end of the context'}")
        self.answer_ids = made
        # The last token made is not in the cache yet; an answer that was cut is closed as if it had ended.
        self.unfed = [int(token[0])] + ([] if int(token[0]) == stop else [self.tokenizer.special_ids[END]])
        if rest := self.tokenizer.decode(made)[len(shown) :]:
            yield rest


def chat_model(workdir: Path):
    """(model config for decoding, parameters, tokenizer, step) of a run trained on conversations."""

    from jaxgpt.config import MeshConfig
    from jaxgpt.hardware import runtime
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.model.sampling import decoding_model
    from jaxgpt.sharding import make_mesh

    mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=-1), runtime.mesh_devices())
    run, params, tokenizer, step = load_latest(workdir, mesh, warn=warn)
    if not run.data.chat:
        raise UserError(
            f"{workdir} was trained on data.source={run.data.source!r}, not on conversations, so it knows no chat "
            "template; fine-tune it with a chat source (configs/sft_arithmetic.py), or write with sample.py"
        )
    return decoding_model(run.model), params, tokenizer, step


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """What it does: chat with a run fine-tuned on conversations, the KV cache kept across turns."""
    argv, f = cli.command_flags(argv)
    define_flags(f)
    cli.parse_flags(argv, __doc__, f)
    cli.require(f, "workdir", what="the run to chat with: a train.py run trained on a chat source")

    from jaxgpt.hardware import runtime

    if f.max_new_tokens is not None and f.max_new_tokens < 1:
        cli.fail(f"max_new_tokens={f.max_new_tokens} must be at least 1")
    from jaxgpt.data.conversations import check_content

    check_content(f.system, "--system")  # as a user's message is: its text would open a turn of its own
    runtime.enable_compilation_cache()
    model, params, tokenizer, step = chat_model(Path(f.workdir))
    sampling = sampling_of(f)
    session = ChatSession(model, params, tokenizer, sampling, f.seed, f.system, f.max_new_tokens)
    interactive = sys.stdin.isatty()
    if interactive:
        say = f"chatting with {f.workdir} (step {step}); /reset starts a new conversation, Ctrl-D ends"
        print(say, file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        message = line.strip()
        if not message:
            continue
        if message == "/reset":
            session.reset()
            continue
        try:
            for piece in session.reply(message):
                # Piped, an answer is one line whatever it holds: its line breaks written as \n, \r.
                shown = piece if interactive else piece.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
                print(shown, end="", flush=True)
        except UserError as error:
            if not interactive:
                raise
            print(f"error: {error}; the conversation goes on", file=sys.stderr)  # refused before it changed
            continue
        print(flush=True)


if __name__ == "__main__":
    main()
