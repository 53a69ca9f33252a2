"""Named activations of one prompt, listed or saved (jaxgpt/lab/activations.py):
python -m jaxgpt activations --workdir DIR --prompt TEXT [--names NAME,...] [--out FILE.npz]

Examples:
  python -m jaxgpt activations --workdir runs/tiny --prompt "if x is None: x = x + 1"
  python -m jaxgpt activations --workdir runs/tiny --prompt "if x is None:" \\
      --names blocks.0.attn.hook_pattern,blocks.1.attn.hook_z --out acts.npz

Without --names: every site the model has, in the order the forward pass reaches it, with its
shape on this prompt (TransformerLens's names: blocks.L.hook_resid_pre, blocks.L.attn.hook_z,
...). With --names: those activations, from one forward pass in float32, each listed with its
shape, mean and largest magnitude, and with --out saved as one .npz array per name (beside the
prompt's token ids, "tokens"), for numpy.load. An encoder–decoder reads the prompt as its source
(with the end of source its training gave it) and its start token as the decoder's input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from absl import flags

from jaxgpt.commands import cli, inspected
from jaxgpt.errors import UserError
from jaxgpt.lab.activations import run_with_cache, site_shapes


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    f = inspected.parse_flags(argv, __doc__, _define_flags)
    config, params, tokenizer, source = inspected.load_model(f)
    ids = inspected.prompt_ids(tokenizer, f.prompt, config)[None]
    tokens, inputs = ids, {}
    if config.encoder_layers:  # the prompt is the source, as trained (with its ends); the decoder reads its start
        asked = inspected.answering(tokenizer, f.init_from)
        ids = np.asarray([asked.source(f.prompt)])[:, : config.block_size]
        tokens, inputs = np.asarray([asked.start], np.int32), {"sources": ids}
    shapes = site_shapes(config, tokens, **inputs)
    if not f.names:
        print(f"{len(shapes)} sites ({source}, {ids.shape[1]} tokens); --names picks some to print and save")
        for name, shape in shapes.items():
            print(f"  {name:<40} {tuple(shape)}")
        return
    names = [name.strip() for name in f.names.split(",") if name.strip()]
    unknown = [name for name in names if name not in shapes]
    if unknown:
        near = _nearest(unknown[0], list(shapes))
        raise UserError(f"no site named {unknown[0]} in this model{near}; leave out --names to list its sites")
    _, cache = run_with_cache(config, params, tokens, names, **inputs)
    print(f"{len(names)} activations ({source}, {ids.shape[1]} tokens)")
    arrays = {name: np.asarray(cache[name]) for name in names}
    for name, array in arrays.items():
        finite = array[np.isfinite(array)]
        print(f"  {name:<40} {str(array.shape):<18} mean {finite.mean():+.4f}  max |x| {np.abs(finite).max():.4f}")
    if f.out:
        out = Path(f.out)
        if out.suffix != ".npz":
            raise UserError(f"--out {out} does not end in .npz; numpy.savez writes one array per name to a .npz file")
        with cli.writing(out):
            np.savez(out, tokens=ids[0], **arrays)
        print(f"wrote {out} (numpy.load it: one array per name, and the prompt's ids as tokens)")


def _nearest(name: str, names: list[str]) -> str:
    import difflib

    near = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def _define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_string("names", None, "Sites to print and save, comma-separated (default: list all).", flag_values=f)
    flags.DEFINE_string("out", None, "Save the named activations to this .npz file.", flag_values=f)


if __name__ == "__main__":
    main()
