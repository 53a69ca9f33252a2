"""Write a trained run as a Hugging Face folder: python -m jaxgpt export --workdir DIR --out FOLDER [--step N]

Examples:
  python -m jaxgpt export --workdir runs/tiny --out exported/tiny
  python -m jaxgpt export --workdir runs/llama_tiny --out exported/llama_tiny --step 1000
  python -m jaxgpt export --workdir runs/tiny --out exported/tiny_tokenizer --tokenizer_only

The folder holds config.json and model.safetensors, which transformers loads (and with it
TransformerLens, or any tool that reads such a folder). The family follows the model: GPT-2
(learned positions, LayerNorm, GELU), Llama, Mistral or Qwen2 (RoPE, RMSNorm, SwiGLU; a sliding
window; query, key and value biases), Mixtral (a mixture of experts), BERT (a masked-token
encoder) or BART (an encoder–decoder, whose answers start and end at the pair separator). A model
with a switch none of them has is refused in one line naming it, before anything is read or
written. The weights are written as float32, scanned layers one block a layer, as transformers
keeps them; a run with low-rank adapters (model.lora_rank) has them merged into the weights they
sit beside, so the folder is an ordinary model of the base's shape.

The run's tokenizer goes beside them twice: as Hugging Face's tokenizer.json and
tokenizer_config.json, which transformers' AutoTokenizer reads as the same ids (char and byte
vocabularies, a trained BPE, tiktoken's, the chat template's markers: jaxgpt/hf/tokenizer.py), and
as jaxgpt_tokenizer.json, jaxgpt's own record of it, which `--init_from FOLDER` reads. With
--tokenizer_only, the two Hugging Face files alone, for any run whatever its model: what a tool
that tokenizes on its side (lm-eval against `jaxgpt serve`, docs/serving.md) is pointed at.
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
    from jaxgpt.hf.tokenizer import save_hugging_face_tokenizer
    from jaxgpt.model.lora import merge
    from jaxgpt.tokenizers import save_tokenizer

    argv, f = cli.command_flags(argv)
    flags.DEFINE_string("workdir", None, "A train.py run.", flag_values=f)
    flags.DEFINE_string("out", None, "The folder to write: new, or empty.", flag_values=f)
    flags.DEFINE_integer("step", None, "A kept checkpoint's step (default: the newest).", flag_values=f)
    flags.DEFINE_bool("tokenizer_only", False, "Write the tokenizer's Hugging Face files alone.", flag_values=f)
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
    if f.tokenizer_only:
        return _write_tokenizer(workdir, out, model.block_size)
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
        save_hugging_face_tokenizer(tokenizer, staging, config.block_size)
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
    print(f"  and the run's {tokenizer.name} tokenizer: tokenizer.json, tokenizer_config.json and {TOKENIZER_FILE}")


def _write_tokenizer(workdir: Path, out: Path, context: int) -> None:
    from jaxgpt.hf.tokenizer import save_hugging_face_tokenizer
    from jaxgpt.tokenizers import load_tokenizer

    kept = workdir / "tokenizer.json"
    if not kept.is_file():
        raise UserError(f"no tokenizer.json in {workdir}; --workdir names a run train.py has started")
    tokenizer = load_tokenizer(kept)
    out.mkdir(parents=True, exist_ok=True)
    written = save_hugging_face_tokenizer(tokenizer, out, context)
    print(f"wrote {out}: the run's {tokenizer.name} tokenizer as {' and '.join(written)} (Hugging Face's)")


if __name__ == "__main__":
    main()
