"""jaxgpt's built-in corpus as nanoGPT reads a dataset, so nanoGPT's own train.py trains on the
very tokens train.py does: the side-by-side runs of docs/benchmarks.md and docs/speedrun.md.

    python bench/nanogpt_data.py PATH/TO/nanoGPT [--name jaxgpt_builtin]

writes, in the nanoGPT checkout, data/NAME/train.bin and val.bin (jaxgpt's prepared train and
validation split, uint16 as nanoGPT memory-maps them) and meta.pkl (the vocabulary size, which
nanoGPT's train.py reads from it), then prints nanoGPT's README CPU recipe on that data. Nothing
is downloaded: the corpus ships with jaxgpt (char-level, 103 symbols).
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxgpt import data  # noqa: E402
from jaxgpt.config import DataConfig  # noqa: E402

# nanoGPT's README, its CPU run of the Shakespeare-char config, word for word (the data aside).
README_CPU_RECIPE = (
    "config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1 "
    "--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 "
    "--lr_decay_iters=2000 --dropout=0.0"
)


def write_dataset(nanogpt: Path, name: str) -> None:
    """jaxgpt's prepared train and validation split as nanoGPT's dataset `name` in the checkout
    `nanogpt` (data/NAME/train.bin, val.bin, meta.pkl); one line and an exit where the folder is
    not a nanoGPT checkout."""
    if not (nanogpt / "train.py").is_file():
        raise SystemExit(f"error: {nanogpt} has no train.py; give the folder of a nanoGPT checkout")
    dataset = data.prepare(DataConfig(), progress=False)
    if dataset.train.dtype != np.uint16:
        raise SystemExit(f"error: the corpus's tokens are {dataset.train.dtype}; nanoGPT reads uint16 only")
    folder = nanogpt / "data" / name
    folder.mkdir(parents=True, exist_ok=True)
    np.asarray(dataset.train).tofile(folder / "train.bin")
    np.asarray(dataset.val).tofile(folder / "val.bin")
    vocab = dataset.tokenizer.vocab_size
    with open(folder / "meta.pkl", "wb") as file:
        pickle.dump({"vocab_size": vocab}, file)
    print(f"wrote {folder}: {dataset.train.size:,} train and {dataset.val.size:,} val tokens, vocabulary {vocab}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nanogpt", type=Path, help="a nanoGPT checkout (its train.py at the top)")
    parser.add_argument("--name", default="jaxgpt_builtin", help="the dataset's folder under data/")
    args = parser.parse_args()
    write_dataset(args.nanogpt, args.name)
    print(f"nanoGPT's CPU recipe on it: cd {args.nanogpt} && python train.py {README_CPU_RECIPE} --dataset={args.name}")


if __name__ == "__main__":
    main()
