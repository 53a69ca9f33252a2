"""Labelled images, for a Vision Transformer (model.patch_size; model.objective=classification):
each image cut into square patches, read as a sequence as text is (Dosovitskiy et al. 2021).

    images:PATH.npz   arrays `images` (N, H, W) or (N, H, W, C) uint8 and `labels` (N,), ints
                      or names; optional `classes`, the names of labels 0, 1, ... (an int label
                      is the index of its class; names are sorted)
    images:DIR        a folder a class, holding that class's PNGs: DIR/cat/1.png, DIR/dog/7.png
                      (torchvision's ImageFolder); every image the same size, read as grey
                      where the first is grey, else as RGB (alpha dropped)
    builtin:digits    4,000 images of the ten digits, 16 x 16 grey, drawn in matplotlib's fonts
                      at random sizes, angles and shifts with noise (scripts/make_digits.py, from
                      a fixed seed; the file ships with jaxgpt, checked against DIGITS_SHA256)

A row of a batch is one image (jaxgpt/training/batch.py): position 0 the class token, then its
patches in reading order, left to right and top to bottom. The model reads two "tokens", the
class token (0) and "a patch here" (1, whose embedding is the patch projection's bias), and
beside them `pixels`, each position's patch as p x p x C bytes (zeros at the class token), which
it projects to d_model (jaxgpt/model/transformer.py, patch_embed). The class token's position
carries the image's class and weight 1, every patch weight 0: the classification objective
(jaxgpt/training/objectives.py) then reads the encoder's output at the class token, as BERT
reads [CLS]. The held-out images are a fixed draw of data.val_fraction of them (a folder lists
its classes in order, so its last images would all be one class).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path

import numpy as np

from jaxgpt.data.pairs import PairValidation
from jaxgpt.errors import UserError
from jaxgpt.tokenizers import CharTokenizer

DIGITS = Path(__file__).with_name("digits.npz")
DIGITS_SHA256 = "2bc1dd6cfdfa0082410a7aa01a8bd5547f1a8477d80592ad9ee5ec702d0135d6"
CLASS_TOKEN, PATCH_TOKEN = 0, 1
SPLIT_SEED = 0  # which images are held out: the same draw for every run of a source


@dataclasses.dataclass(frozen=True)
class LabelledImages:
    """Images (N, H, W, C) uint8, each of class classes[i] (an index into `names`)."""

    pixels: np.ndarray
    classes: np.ndarray
    names: list[str]

    def __len__(self) -> int:
        return len(self.classes)


def read_images(source: str) -> LabelledImages:
    """The labelled images of an image source; one line for a file or folder that is not one."""
    kind, _, rest = source.partition(":")
    if kind == "builtin":
        return _digits()
    path = Path(rest).expanduser()
    if path.is_dir():
        return _folder(path)
    if not path.is_file():
        raise UserError(f"data.source {source}: no such file or folder; give an .npz of images or a folder a class")
    return _npz(path.read_bytes(), str(path))


def _digits() -> LabelledImages:
    """builtin:digits, its bytes checked: a different file would train on different images."""
    raw = DIGITS.read_bytes()
    if (digest := hashlib.sha256(raw).hexdigest()) != DIGITS_SHA256:
        raise UserError(
            f"{DIGITS} is not the pinned digit set (sha256 {digest[:16]}..., expected {DIGITS_SHA256[:16]}...); "
            "restore it (git checkout jaxgpt/data/digits.npz, or reinstall jaxgpt)"
        )
    return _npz(raw, "builtin:digits")


def _npz(raw: bytes, where: str) -> LabelledImages:
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
            found = {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError) as error:
        raise UserError(f"{where} is not a NumPy .npz file ({error}); write one with np.savez") from None
    missing = {"images", "labels"} - set(found)
    if missing:
        named = " or ".join(sorted(missing))
        raise UserError(f"{where} has no array named {named}; write it with np.savez(path, images=..., labels=...)")
    images, labels = found["images"], found["labels"]
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) != len(labels) or labels.ndim != 1:
        raise UserError(
            f"{where}: images must be (N, H, W) or (N, H, W, C) uint8 beside labels (N,); found images "
            f"{images.shape} {images.dtype} and labels {labels.shape}"
        )
    pixels = images[..., None] if images.ndim == 3 else images
    if labels.dtype.kind in "iu":
        names = [str(name) for name in found["classes"]] if "classes" in found else None
        count = len(names) if names else int(labels.max()) + 1
        if labels.min() < 0 or labels.max() >= count:
            raise UserError(f"{where}: labels run {labels.min()}..{labels.max()}, and {count} classes are named")
        return _checked(LabelledImages(pixels, labels.astype(np.int64), names or [str(i) for i in range(count)]), where)
    names = sorted({str(label) for label in labels})
    index = {name: i for i, name in enumerate(names)}
    return _checked(LabelledImages(pixels, np.asarray([index[str(x)] for x in labels], np.int64), names), where)


def _folder(path: Path) -> LabelledImages:
    from PIL import Image  # matplotlib's own dependency: always there

    names = sorted(d.name for d in path.iterdir() if d.is_dir())
    pixels, classes, mode = [], [], None
    for i, name in enumerate(names):
        for file in sorted((path / name).glob("*.png")):
            with Image.open(file) as image:
                mode = mode or ("L" if image.mode in ("1", "L", "I", "I;16") else "RGB")
                grid = np.asarray(image.convert(mode), np.uint8)
                pixels.append(grid.reshape(image.height, image.width, 1 if mode == "L" else 3))
            classes.append(i)
            if pixels[-1].shape != pixels[0].shape:
                raise UserError(
                    f"{file} is {pixels[-1].shape[1]} x {pixels[-1].shape[0]} pixels and the first image "
                    f"{pixels[0].shape[1]} x {pixels[0].shape[0]}; resize the images to one size"
                )
    if not pixels:
        raise UserError(f"{path} holds no PNG in a folder of its own; put each class's images in DIR/<class>/*.png")
    return _checked(LabelledImages(np.stack(pixels), np.asarray(classes, np.int64), names), str(path))


def _checked(images: LabelledImages, where: str) -> LabelledImages:
    if len(set(images.classes.tolist())) < 2:
        raise UserError(f"{where} has images of {len(set(images.classes.tolist()))} class; a classifier needs 2")
    return images


def held_out(count: int, fraction: float) -> np.ndarray:
    """Which of `count` images are held out (a bool mask): a fixed draw of `fraction` of them."""
    mask = np.zeros(count, bool)
    mask[np.random.default_rng(SPLIT_SEED).permutation(count)[: max(1, round(count * fraction))]] = True
    return mask


def patches(pixels: np.ndarray, size: int) -> np.ndarray:
    """Images (N, H, W, C) as their patches (N, H/size x W/size, size x size x C), in reading
    order, each patch's pixels row by row."""
    n, h, w, c = pixels.shape
    grid = pixels.reshape(n, h // size, size, w // size, size, c).transpose(0, 1, 3, 2, 4, 5)
    return grid.reshape(n, (h // size) * (w // size), size * size * c)


def check_fits(images: LabelledImages, model) -> None:
    """One line where the images cannot be the model's sequences: their side not a whole number of
    patches, their channels not model.channels, or block_size not a class token and their patches."""
    _, h, w, c = images.pixels.shape
    p = model.patch_size
    if h % p or w % p:
        raise UserError(f"the images are {w} x {h} pixels, not a whole number of {p} x {p} patches; choose "
                        f"model.patch_size dividing both")  # fmt: skip
    if c != model.channels:
        raise UserError(f"the images have {c} channel(s) and model.channels={model.channels}; set it to {c}")
    count = (h // p) * (w // p)
    if model.block_size != 1 + count:
        raise UserError(
            f"model.block_size={model.block_size}, but {w} x {h} images in {p} x {p} patches make {count} patches "
            f"and a class token: set --config.model.block_size={1 + count}"
        )


def image_rows(images: LabelledImages, chosen: np.ndarray, patch_size: int) -> dict[str, np.ndarray]:
    """The batch contract's rows for images `chosen` (indices; -1 an empty row of weight 0)."""
    cut = patches(images.pixels[np.maximum(chosen, 0)], patch_size)
    rows, seq = len(chosen), cut.shape[1] + 1
    pixels = np.zeros((rows, seq, cut.shape[2]), np.uint8)
    pixels[:, 1:] = cut
    inputs = np.full((rows, seq), PATCH_TOKEN, np.int32)
    inputs[:, 0] = CLASS_TOKEN
    targets, weights = np.zeros((rows, seq), np.int32), np.zeros((rows, seq), np.float32)
    targets[:, 0] = images.classes[np.maximum(chosen, 0)]
    weights[:, 0] = chosen >= 0
    return {"inputs": inputs, "targets": targets, "weights": weights, "pixels": pixels}


@dataclasses.dataclass(frozen=True)
class TrainImages:
    """The training images, batches drawn from them by (seed, stream, step): row r of batch
    `index` is drawn from (seed, stream, index, r) alone, so every process builds its own rows
    and a resumed run the same batches."""

    images: LabelledImages

    def batch(self, run, mesh, index: int, stream: int) -> dict:
        from jaxgpt.sharding import global_batch

        def rows(start: int, stop: int) -> dict:
            drawn = (np.random.default_rng([run.train.seed, stream, index, r]) for r in range(start, stop))
            chosen = [rng.integers(len(self.images)) for rng in drawn]
            return image_rows(self.images, np.asarray(chosen), run.model.patch_size)

        return global_batch(mesh, rows, run.train.batch_size)


@dataclasses.dataclass(frozen=True)
class ImageValidation(PairValidation):
    kind: str = "images"

    def describe(self) -> str:
        of = f"{self.examples:,} of the {self.held_out:,}" if self.held_out > self.examples else f"{self.examples:,}"
        return f"validation: {of} held-out images, each scored on its class at the class token"


@dataclasses.dataclass(frozen=True)
class ImageSet:
    """A prepared image source, as data.prepare hands it to the trainer: its images (read at each
    start: no cache to go stale), the held-out mask, and the two-symbol tokenizer of its
    sequences ("c" the class token, "p" a patch), which the run records as any run does."""

    images: LabelledImages
    val: np.ndarray  # bool (N,): held out
    tokenizer: CharTokenizer = CharTokenizer("cp")

    def damage(self, wait: bool = False) -> None:
        return None  # read whole at each start, the builtin set checked against its digest

    def split(self, validation: bool) -> LabelledImages:
        mask = self.val if validation else ~self.val
        return LabelledImages(self.images.pixels[mask], self.images.classes[mask], self.images.names)


def prepare(config) -> ImageSet:
    """An image source read whole, its held-out images chosen (data.val_fraction)."""
    images = read_images(config.source)
    return ImageSet(images, held_out(len(images), config.val_fraction))


def batch_sources(dataset: ImageSet, run) -> tuple[TrainImages, ImageValidation]:
    """(what training batches are drawn from, the fixed validation batches) of an image source."""
    check_fits(dataset.images, run.model)
    t, val = run.train, dataset.split(validation=True)
    count = min(t.eval_batches * t.batch_size, -(-len(val) // t.batch_size) * t.batch_size)
    chosen = np.full(count, -1)
    chosen[: min(count, len(val))] = np.arange(min(count, len(val)))
    rows = image_rows(val, chosen, run.model.patch_size)
    scored = int(rows["weights"].sum())
    pixel_bytes = int(rows["pixels"][:scored].size)
    validation = ImageValidation(rows, t.batch_size, scored, scored, pixel_bytes, held_out=len(val))
    return TrainImages(dataset.split(validation=False)), validation
