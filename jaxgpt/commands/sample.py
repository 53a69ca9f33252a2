"""Sample from a trained run: python sample.py --workdir runs/tiny --prompt "The assert statement"

Examples:
  python sample.py --workdir runs/tiny --prompt "The assert statement"
  python sample.py --workdir runs/tiny --num_samples 3 --temperature 0.6 --top_k 20
  python sample.py --workdir runs/tiny --prompt "for" --temperature 0      # greedy: the same text every time
  python sample.py --workdir runs/dates --prompt "3rd of March, 2021" --temperature 0   # a pairs run answers

Loads the newest checkpoint of the workdir with its config and tokenizer; a thin shell over
jaxgpt.model.sampling.generate. A run trained on text pairs (data.source pairs:PATH or builtin:dates)
reads the prompt as a source and prints it, a tab and its answer, which ends at the separator. A
run trained on conversations (a chat source) reads it as a user's message: it prints the
template it read and the answer, which ends at the end-of-turn token (`jaxgpt chat` goes on).
"""

from pathlib import Path

from absl import flags

from jaxgpt.commands import cli
from jaxgpt.errors import warn

# New tokens when --max_new_tokens is not given: a page to read at a glance, and at most a few
# seconds' decoding on a laptop, whatever the model's context (Llama 3.2's 131,072 positions once
# meant minutes of silence)
DEFAULT_NEW_TOKENS = 256


def define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "Run directory written by train.py.", flag_values=f)
    flags.DEFINE_string(
        "init_from",
        None,
        "Sample from Hugging Face weights instead: a local directory, or a Hub name such as gpt2.",
        flag_values=f,
    )
    flags.DEFINE_string(
        "prompt", "", "Text to continue (empty: start from a newline or end-of-text token).", flag_values=f
    )
    flags.DEFINE_string("prompt_file", None, "Read the prompt from this file instead.", flag_values=f)
    flags.DEFINE_integer(
        "max_new_tokens",
        None,
        f"Tokens to generate (default: the room the context has, at most {DEFAULT_NEW_TOKENS}).",
        flag_values=f,
    )
    define_sampling_flags(f)
    flags.DEFINE_integer("num_samples", 1, "Samples, decoded together as one batch.", flag_values=f)
    flags.DEFINE_integer("seed", 0, "Random seed: the same seed gives the same text.", flag_values=f)
    flags.DEFINE_bool("stream", False, "Print tokens as they are generated (first sample).", flag_values=f)


def define_sampling_flags(f: flags.FlagValues) -> None:
    """--temperature, --top_k, --top_p: how each token is drawn (sample and chat)."""
    flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 is greedy.", flag_values=f)
    flags.DEFINE_integer("top_k", None, "Keep only the k most likely tokens.", flag_values=f)
    flags.DEFINE_float("top_p", 1.0, "Keep the smallest set of tokens with probability >= p.", flag_values=f)


def sampling_of(f: flags.FlagValues):
    """The SamplingConfig those flags give."""
    from jaxgpt.model.sampling import SamplingConfig

    return SamplingConfig(f.temperature, f.top_k, f.top_p)


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point (jaxgpt sample): bad input exits 2 with one line."""
    argv, f = cli.command_flags(argv)
    define_flags(f)
    cli.parse_flags(argv, __doc__, f)
    prompt = _prompt(f)

    import jax
    import jax.numpy as jnp

    from jaxgpt.hardware import runtime
    from jaxgpt.model.sampling import check_length, decoding_model
    from jaxgpt.tokenizers import separator_id

    runtime.enable_compilation_cache()
    model_config, params, tokenizer, data = load_model(f.workdir, f.init_from)
    pairs, chat = data is not None and data.pairs, data is not None and data.chat
    memory = None  # an encoder–decoder's encoded source
    if chat:  # a run fine-tuned on conversations reads the prompt as a user's message, and answers it
        from jaxgpt.data.conversations import check_content, end_of_turn, prompt_ids

        check_content(prompt, "the prompt")
        ids, stop = prompt_ids(tokenizer, [{"role": "user", "content": prompt}]), end_of_turn(tokenizer)
    elif model_config.encoder_layers:  # the encoder reads the prompt as a source; the decoder answers it
        from jaxgpt.commands.inspected import answering
        from jaxgpt.model.sampling import encode

        if not prompt:
            cli.fail(f"{f.workdir or f.init_from} is an encoder–decoder; give the source to answer with --prompt")
        asked = answering(tokenizer, f.init_from)
        source = asked.source(prompt)
        if len(source) > model_config.block_size:
            cli.fail(f"the source is {len(source)} tokens with its ends; give at most {model_config.block_size}")
        sources = jnp.asarray([source] * f.num_samples, jnp.int32)
        memory = encode(model_config, params, sources)
        ids, stop = list(asked.start), asked.stop
    elif pairs:  # a run trained on text pairs answers the prompt as a source, and stops at its end
        from jaxgpt.data.pairs import prompt_ids

        if not prompt:
            cli.fail(f"{f.workdir} was trained on text pairs; give the source to answer with --prompt")
        ids, stop = prompt_ids(tokenizer, prompt), separator_id(tokenizer)
    else:
        ids = tokenizer.encode(prompt) if prompt else [separator_id(tokenizer)]
        stop = tokenizer.eot_id
    max_new_tokens = f.max_new_tokens or min(model_config.block_size - len(ids), DEFAULT_NEW_TOKENS)
    check_length(model_config, len(ids), max_new_tokens)
    model = decoding_model(model_config, len(ids) + max_new_tokens)
    sampling = sampling_of(f)
    tokens = jnp.asarray([ids] * f.num_samples, jnp.int32)
    args = dict(max_new_tokens=max_new_tokens, sampling=sampling, eot_id=stop, memory=memory)
    shown = f"{prompt.strip()}\t" if pairs or memory is not None else tokenizer.decode(ids[1:]) if chat else prompt
    _print_samples(f, shown, tokenizer, model, params, tokens, jax.random.key(f.seed), **args)


def _prompt(f: flags.FlagValues) -> str:
    """The prompt the flags give, once they are known to describe a sample that can be made."""
    if not f.workdir and not f.init_from:
        cli.fail("no model given; pass --workdir DIR of a run trained with train.py, or --init_from gpt2 (or a path)")
    if f.num_samples < 1:
        cli.fail(f"num_samples={f.num_samples} must be at least 1")
    if not f.prompt_file:
        return f.prompt
    try:
        return Path(f.prompt_file).read_text()
    except OSError as error:
        cli.fail(f"cannot read --prompt_file {f.prompt_file}: {error.strerror}")


def load_model(workdir: str | None, init_from: str | None, command: str = "sample"):
    """(model config, parameters, tokenizer, the run's data config or None) of the workdir's
    newest checkpoint or the Hugging Face weights, the parameters split over every device's
    share of the heads and MLP width: decoding is one token at a time, so the model is split
    rather than a batch of a few prompts (on one device, that device)."""
    import jax

    from jaxgpt.config import MeshConfig
    from jaxgpt.hardware import runtime
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.sharding import make_mesh, shardings_like

    mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=-1), runtime.mesh_devices())
    if not init_from:
        run, params, tokenizer, _ = load_latest(Path(workdir), mesh, warn=warn)
        cli.refuse_unless_served(run.model, "sample", workdir, f"it has no continuation to {command}")
        return run.model, params, tokenizer, run.data
    from jaxgpt.hf import load_pretrained, pretrained_tokenizer

    model_config, params, family = load_pretrained(init_from)
    params = jax.device_put(params, shardings_like(params, mesh))
    return model_config, params, pretrained_tokenizer(init_from, family), None


def _print_samples(f: flags.FlagValues, prompt: str, tokenizer, model, params, tokens, rng, **args) -> None:
    """Each sample after its prompt, cut at the end-of-text token (a pairs run's: the
    separator); with --stream, the first sample token by token as it is made."""
    from jaxgpt.model.sampling import generate, generate_stream

    if f.stream:
        print(prompt, end="", flush=True)
        for token in generate_stream(model, params, tokens, rng, **args):
            if int(token[0]) == args["eot_id"]:
                break
            print(tokenizer.decode([int(token[0])]), end="", flush=True)
        print()
        return
    for i, row in enumerate(generate(model, params, tokens, rng, **args).tolist()):
        if f.num_samples > 1:
            print(f"--- sample {i + 1}")
        made = row[: row.index(args["eot_id"])] if args["eot_id"] in row else row
        print(prompt + tokenizer.decode(made))


if __name__ == "__main__":
    main()
