"""One entry point for every command: `jaxgpt COMMAND [FLAGS]` (the console script) and
`python -m jaxgpt COMMAND [FLAGS]`. Each command is its own module here, with its own flags and
`--help`; this only finds it by name. `jaxgpt` alone lists them."""

from __future__ import annotations

import importlib
import sys

from jaxgpt.commands.cli import USAGE_ERROR, run_as_the_process

# command -> (module in jaxgpt.commands, what it does)
COMMANDS = {
    "train": ("train", "train a model, or resume one (also python train.py)"),
    "sample": ("sample", "write text with a trained run's model (also python sample.py)"),
    "chat": ("chat", "chat with a run fine-tuned on conversations (a chat source)"),
    "serve": ("serve", "serve a model over HTTP: an OpenAI-compatible API and a chat page"),
    "check": ("check", "pre-flight checks of a config; --target compiles it for a TPU slice"),
    "compare": ("compare", "train variants of a config side by side and tabulate them"),
    "tokenizer": ("tokenizer", "train a byte-level BPE tokenizer on your own text"),
    "prepare": ("prepare", "tokenize and cache a config's corpus before training"),
    "evaluate": ("evaluate", "loss against position and context length; heads removed"),
    "plot": ("plot", "draw runs' training curves"),
    "timeline": ("timeline", "a run's loss and train.lab's measures over training, as one page"),
    "attention-maps": ("attention_maps", "draw what every attention head looks at"),
    "logit-lens": ("logit_lens", "what the model would predict after each layer"),
    "inspect": ("inspect_model", "every architectural choice of a model, each beside the docs that explain it"),
    "activations": ("activations", "list a model's named activation sites, or print and save some (.npz)"),
    "patch": ("patch", "which layers, positions and heads carry a prediction (activation patching)"),
    "fill": ("fill", "fill in [MASK] blanks with an encoder (model.objective=masked)"),
    "seq2seq": ("seq2seq", "retired: says how an encoder-decoder trains now (train.py, configs/seq2seq_*.py)"),
    "hellaswag": ("hellaswag", "score a model on multiple-choice questions"),
    "export": ("export", "write a run as a Hugging Face folder (transformers, TransformerLens)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "usage: jaxgpt COMMAND [FLAGS]   (jaxgpt COMMAND --help for its flags and examples)\n\n" + "\n".join(lines)


def command_module(name: str) -> str:
    """The module of the command `name` (attention_maps is accepted for attention-maps); one
    line and exit 2 for a name that is none, with the nearest if there is one."""
    import difflib

    name = name.replace("_", "-")
    if name in COMMANDS:
        return f"jaxgpt.commands.{COMMANDS[name][0]}"
    near = difflib.get_close_matches(name, COMMANDS, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    print(f"error: unknown command {name!r}; {hint}commands: {', '.join(COMMANDS)}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0 if len(sys.argv) >= 2 else USAGE_ERROR)
    module = importlib.import_module(command_module(sys.argv[1]))
    sys.argv = [f"jaxgpt {sys.argv[1]}", *sys.argv[2:]]  # what the command's --help and errors show
    run_as_the_process(module.main)
