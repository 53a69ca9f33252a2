"""Write a trained run as a Hugging Face folder: python -m jaxgpt export --workdir DIR --out FOLDER [--step N]

Examples:
  python -m jaxgpt export --workdir runs/tiny --out exported/tiny
  python -m jaxgpt export --workdir runs/llama_tiny --out exported/llama_tiny --step 1000

The folder holds config.json and model.safetensors, which transformers loads (and with it
TransformerLens, or any tool that reads such a folder). The family follows the model: GPT-2
(learned positions, LayerNorm, GELU), Llama, Mistral or Qwen2 (RoPE, RMSNorm, SwiGLU; a sliding
window; query, key and value biases), Mixtral (a mixture of experts), BERT (a masked-token
encoder) or BART (an encoder–decoder, whose answers start and end at the pair separator). A model
with a switch none of them has is refused in one line naming it, before anything is read or
written. The weights are written as float32, scanned layers one block a layer, as transformers
keeps them; a run with low-rank adapters (model.lora_rank) has them merged into the weights they
sit beside, so the folder is an ordinary model of the base's shape.

The run's own tokenizer goes beside them as jaxgpt_tokenizer.json (jaxgpt's format; a
tokenizer.json there would be read as Hugging Face's). A run on the GPT-2 BPE needs none:
transformers' "gpt2" tokenizer is the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from absl import flags

from jaxgpt.commands import cli, inspected
from jaxgpt.errors import UserError

TOKENIZER_FILE = "jaxgpt_tokenizer.json"


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    from safetensors import SafetensorError

    from jaxgpt.config import run_config_from_dict
    from jaxgpt.hf import family_of, save_pretrained
    from jaxgpt.hf.convert import FAMILIES
    from jaxgpt.model.lora import merge
    from jaxgpt.tokenizers import save_tokenizer

    argv, f = cli.command_flags(argv)
    flags.DEFINE_string("workdir", None, "A train.py run.", flag_values=f)
    flags.DEFINE_string("out", None, "The folder to write: new, or empty.", flag_values=f)
    flags.DEFINE_integer("step", None, "A kept checkpoint's step (default: the newest).", flag_values=f)
    cli.parse_flags(argv, __doc__, f)
    cli.require(f, "workdir", what="the run to export")
    cli.require(f, "out", what="the folder to write the Hugging Face files to")
    workdir, out = Path(f.workdir), Path(f.out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty folder; name a new one (nothing is overwritten)")
    saved = workdir / "config.json"
    if not saved.is_file():
        raise UserError(f"no config.json in {workdir}; --workdir names a run train.py has started")
    model = run_config_from_dict(json.loads(saved.read_text())).model
    family = family_of(model.replace(lora_rank=0))  # refused before reading weights (adapters merge into any)
    config, params, tokenizer, source = inspected.load(workdir, step=f.step)
    config, params = merge(config, params)  # low-rank adapters folded into the weights they sit beside
    special_tokens = None
    if config.encoder_layers:  # a pairs run: answers start and end at the pair separator
        from jaxgpt.tokenizers import separator_id

        separator = separator_id(tokenizer)
        special_tokens = {"decoder_start_token_id": separator, "eos_token_id": separator}
    # Written beside the destination, then renamed into place: a failure leaves no half folder.
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save_pretrained(config, params, staging, special_tokens)
        save_tokenizer(tokenizer, staging / TOKENIZER_FILE)
    except (OSError, SafetensorError) as error:  # a full disk, a folder not writable: nothing half-written stays
        shutil.rmtree(staging, ignore_errors=True)
        # safetensors' writer reports the OS's error in its own: "Error while serializing: I/O error: No space ..."
        why = error.strerror if isinstance(error, OSError) else str(error).removeprefix("Error while serializing: ")
        raise UserError(f"cannot write {out} ({why}); free some space or choose another --out") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()  # empty, checked above
    staging.rename(out)
    print(f"wrote {out}: {FAMILIES[family].architecture} from {workdir} ({source}), config.json, model.safetensors")
    print(f"  and {TOKENIZER_FILE} (the run's {tokenizer.name} tokenizer, jaxgpt's format)")


if __name__ == "__main__":
    main()
