"""Write the pinned digit images `builtin:digits` reads (jaxgpt/data/digits.npz): the ten digits
rendered in the fonts matplotlib ships (DejaVu, STIX, Computer Modern; upright, bold, slanted) at
random sizes, angles and shifts, with pixel noise, from one fixed seed.

    python scripts/make_digits.py            # rewrites jaxgpt/data/digits.npz, prints its sha256

The file's bytes depend only on the seed and on matplotlib's fonts and rasteriser, which
requirements.txt pins: the zip's entries carry a fixed date, so the same versions write the same
bytes everywhere (tests/test_images.py writes it again and compares). A new matplotlib may
rasterise a glyph's edge differently: then this writes another file, and DIGITS_SHA256
(jaxgpt/data/images.py) says which one a run reads.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import zipfile
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

SIDE = 16  # pixels a side, as the model reads them
SUPERSAMPLE = 4  # drawn at 4x, then each 4 x 4 block averaged: smooth edges at 16 pixels
PER_DIGIT = 400  # images of each digit: 4,000 in all
SEED = 0
FONTS = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "STIXGeneral.ttf", "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf", "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf", "cmb10.ttf",
)  # fmt: skip
OUT = Path(__file__).resolve().parents[1] / "jaxgpt" / "data" / "digits.npz"


def render(digit: int, font: Path, size: float, angle: float, dx: float, dy: float) -> np.ndarray:
    """One digit, white on black, as (SIDE, SIDE) floats in [0, 1]."""
    big = SIDE * SUPERSAMPLE
    figure = Figure(figsize=(1, 1), dpi=big, facecolor="black")
    canvas = FigureCanvasAgg(figure)
    figure.text(0.5 + dx, 0.5 + dy, str(digit), color="white", ha="center", va="center", rotation=angle,
                fontproperties=FontProperties(fname=font, size=size))  # fmt: skip
    canvas.draw()
    grey = np.asarray(canvas.buffer_rgba())[..., 0].astype(np.float64) / 255
    return grey.reshape(SIDE, SUPERSAMPLE, SIDE, SUPERSAMPLE).mean(axis=(1, 3))


def digits(seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, SIDE, SIDE) uint8, labels (N,) int64), in a random order."""
    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for digit in range(10):
        for _ in range(PER_DIGIT):
            font = fonts / FONTS[int(rng.integers(len(FONTS)))]
            size = rng.uniform(44, 68)  # points at 64 dpi: a digit 45-70% of the side high
            angle, dx, dy = rng.uniform(-15, 15), rng.uniform(-0.08, 0.08), rng.uniform(-0.08, 0.08)
            image = render(digit, font, size, angle, dx, dy) + rng.normal(0, 0.05, (SIDE, SIDE))
            images.append(np.clip(np.round(image * 255), 0, 255).astype(np.uint8))
            labels.append(digit)
    order = rng.permutation(len(images))
    return np.stack(images)[order], np.asarray(labels, np.int64)[order]


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz numpy reads (np.load), its zip entries dated 1980-01-01 so the bytes depend on
    the arrays alone (np.savez dates them now)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            entry = io.BytesIO()
            np.lib.format.write_array(entry, np.ascontiguousarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), entry.getvalue(),
                             compress_type=zipfile.ZIP_DEFLATED)  # fmt: skip
    return out.getvalue()


def digits_file() -> bytes:
    images, labels = digits()
    names = np.asarray([str(d) for d in range(10)])
    return npz_bytes({"images": images, "labels": labels, "classes": names})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write it (default {OUT})")
    written = digits_file()
    out = parser.parse_args().out
    out.write_bytes(written)
    print(f"wrote {out}: {len(written):,} bytes, sha256 {hashlib.sha256(written).hexdigest()}")


if __name__ == "__main__":
    main()
