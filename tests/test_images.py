"""Images through the engine (jaxgpt/data/images.py, model.patch_size in jaxgpt/model/transformer.py,
the class token's attention in jaxgpt/commands/attention_maps.py): patches against pixels placed
by hand, the three sources read alike and their bad files named, the pinned digits' bytes, the
patch projection against numpy, and (slow) a Vision Transformer that learns the digits through
train.py, resumes bit for bit and draws where its class token looks."""

import hashlib
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import ROOT, layout_run_config, train_losses, trained, users_environment

from jaxgpt.config import ConfigError, ModelConfig
from jaxgpt.config_files import base_config, resolve
from jaxgpt.data import images
from jaxgpt.errors import UserError
from jaxgpt.lab.capture import capture
from jaxgpt.model.transformer import init_params


def test_patches_are_cut_in_reading_order_each_row_by_row():
    """A 4 x 6 image of 2 channels whose pixel (r, c, k) holds 100 r + 10 c + k: in patches of 2,
    patch (i, j) (number 3 i + j) is pixels rows 2i..2i+1, columns 2j..2j+1, each pixel's
    channels together, the patch's rows one after the other."""
    r, c, k = np.meshgrid(np.arange(4), np.arange(6), np.arange(2), indexing="ij")
    image = (100 * r + 10 * c + k)[None]
    cut = images.patches(image, 2)
    assert cut.shape == (1, 6, 8)
    for i in range(2):
        for j in range(3):
            expected = [100 * (2 * i + dr) + 10 * (2 * j + dc) + ch for dr in (0, 1) for dc in (0, 1) for ch in (0, 1)]
            assert cut[0, 3 * i + j].tolist() == expected


def test_an_image_row_is_the_class_token_then_its_patches_scored_at_the_class_token_alone():
    pixels = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4, 1)
    labelled = images.LabelledImages(pixels, np.array([3, 7]), [str(i) for i in range(10)])
    rows = images.image_rows(labelled, np.array([1, -1]), 2)
    assert rows["inputs"].tolist() == [[0, 1, 1, 1, 1]] * 2
    assert rows["targets"][0].tolist() == [7, 0, 0, 0, 0]
    assert rows["weights"].tolist() == [[1, 0, 0, 0, 0], [0, 0, 0, 0, 0]]  # an empty row scores nothing
    assert not rows["pixels"][:, 0].any()  # the class token reads no pixels
    assert (rows["pixels"][0, 1:] == images.patches(pixels[1:2], 2)[0]).all()


def _png_folder(root, grey: bool):
    from PIL import Image

    rng = np.random.default_rng(0)
    made = {}
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (8, 8) if grey else (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
            made[(name, i)] = pixels
    return made


def test_a_folder_of_pngs_and_an_npz_read_as_the_same_images(tmp_path):
    """PNGs a class in a folder (grey, or RGB) and the same pixels in an .npz with names for
    labels, or ints with `classes`: the same images, classes and names; PNG is lossless."""
    for grey in (True, False):
        folder = tmp_path / ("grey" if grey else "rgb")
        made = _png_folder(folder, grey)
        read = images.read_images(f"images:{folder}")
        assert read.names == ["cat", "dog"] and read.classes.tolist() == [0, 0, 0, 1, 1, 1]
        expected = np.stack([made[key] for key in sorted(made)]).reshape(6, 8, 8, 1 if grey else 3)
        assert (read.pixels == expected).all()
        named = tmp_path / f"named-{grey}.npz"
        np.savez(named, images=expected.squeeze(-1) if grey else expected, labels=np.array(["cat"] * 3 + ["dog"] * 3))
        by_index = tmp_path / f"index-{grey}.npz"
        np.savez(by_index, images=expected, labels=np.array([0] * 3 + [1] * 3), classes=np.array(["cat", "dog"]))
        for npz in (named, by_index):
            again = images.read_images(f"images:{npz}")
            assert (again.pixels == read.pixels).all() and again.names == read.names
            assert (again.classes == read.classes).all()


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"images": np.zeros((4, 8, 8), np.uint8)}, "has no array named labels"),
        ({"images": np.zeros((4, 8, 8), np.float32), "labels": np.arange(4) % 2}, "must be .* uint8"),
        ({"images": np.zeros((4, 8, 8), np.uint8), "labels": np.zeros(4, int)}, "has images of 1 class"),
        ({"images": np.zeros((4, 8, 8), np.uint8), "labels": np.arange(4), "classes": np.array(["a", "b"])},
         r"labels run 0\.\.3, and 2 classes are named"),
    ],
)  # fmt: skip
def test_a_bad_npz_is_named_in_one_line(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(UserError, match=message):
        images.read_images(f"images:{path}")


def test_bad_folders_and_paths_are_named_in_one_line(tmp_path):
    from PIL import Image

    with pytest.raises(UserError, match="no such file or folder"):
        images.read_images(f"images:{tmp_path / 'missing'}")
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(UserError, match=r"holds no PNG in a folder of its own"):
        images.read_images(f"images:{tmp_path / 'empty'}")
    for name, side in (("a", 8), ("b", 6)):
        (tmp_path / "sizes" / name).mkdir(parents=True)
        Image.fromarray(np.zeros((side, side), np.uint8)).save(tmp_path / "sizes" / name / "0.png")
    with pytest.raises(UserError, match=r"is 6 x 6 pixels and the first image 8 x 8; resize"):
        images.read_images(f"images:{tmp_path / 'sizes'}")
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(UserError, match="is not a NumPy .npz file"):
        images.read_images(f"images:{tmp_path / 'text.npz'}")


def test_the_pinned_digits_are_the_file_their_digest_names_and_a_changed_byte_is_refused(tmp_path, monkeypatch):
    """builtin:digits: 4,000 16 x 16 grey images, 400 of each digit, the file's sha256 the pinned
    one; a copy with one byte changed is refused in one line naming the fix."""
    raw = images.DIGITS.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == images.DIGITS_SHA256
    digits = images.read_images("builtin:digits")
    assert digits.pixels.shape == (4000, 16, 16, 1) and digits.names == [str(d) for d in range(10)]
    assert np.bincount(digits.classes).tolist() == [400] * 10
    changed = bytearray(raw)
    changed[len(raw) // 2] ^= 1
    (tmp_path / "digits.npz").write_bytes(bytes(changed))
    monkeypatch.setattr(images, "DIGITS", tmp_path / "digits.npz")
    with pytest.raises(UserError, match=r"is not the pinned digit set .*; restore it"):
        images.read_images("builtin:digits")


def test_the_held_out_images_are_a_fixed_draw_of_the_fraction():
    mask = images.held_out(1000, 0.2)
    assert mask.sum() == 200 and (mask == images.held_out(1000, 0.2)).all()
    assert 0 < mask[:500].sum() < 200  # spread over the file, not its tail


def vit_config(**changes) -> ModelConfig:
    fields = dict(vocab_size=2, block_size=5, n_layer=2, n_head=2, d_model=16, patch_size=2, channels=3,
                  objective="classification", classes=4, causal=False, position="learned")  # fmt: skip
    return ModelConfig(**(fields | changes))


def test_what_the_first_block_reads_is_the_token_s_embedding_plus_the_projected_patch_and_its_position():
    """Against numpy: the residual stream before block 0 is wte[token] + (pixels / 255) @ W + wpe[t],
    the class token (pixels 0) its own embedding and position alone."""
    config = vit_config()
    params = init_params(config, jax.random.key(0))
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (1, 4, 4, 3), dtype=np.uint8)
    row = images.image_rows(images.LabelledImages(pixels, np.array([2]), list("abcd")), np.array([0]), 2)
    captured = capture(config, params, row["inputs"], {"pixels": row["pixels"]})
    p = jax.tree.map(np.asarray, params)
    expected = (p["wte"]["embedding"][row["inputs"][0]] + (row["pixels"][0] / 255.0) @ p["patch_embed"]["kernel"]
                + p["wpe"]["embedding"][:5])  # fmt: skip
    np.testing.assert_allclose(captured.residual[0, 0], expected, rtol=1e-5, atol=1e-6)
    assert captured.logits.shape == (1, 5, 4) and captured.logit_lens.shape[-1] == 0  # classes; no lens


def test_a_command_given_a_prompt_for_a_model_of_images_says_what_it_reads_instead():
    """activations, patch, logit-lens and attention-maps read a prompt through prompt_ids: for a
    ViT one line naming --image, not a traceback from the model's missing pixels."""
    from jaxgpt.commands.inspected import prompt_ids
    from jaxgpt.tokenizers import CharTokenizer

    with pytest.raises(UserError, match=r"reads images \(model.patch_size\), not a prompt: .* --image N"):
        prompt_ids(CharTokenizer("cp"), "cp", vit_config())


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(causal=True), "patch_size.*gives a Vision Transformer, an encoder that classifies"),
        (dict(objective="next_token", classes=0), "patch_size.*gives a Vision Transformer"),
        (dict(channels=2), "channels.*1 \\(grey\\) or 3 \\(RGB\\)"),
    ],
)
def test_a_vision_transformer_that_cannot_be_is_refused_at_config_time(changes, message):
    with pytest.raises(ConfigError, match=message):
        vit_config(**changes)


def test_images_and_patches_go_together_and_the_block_size_names_its_fix():
    config = base_config()
    config.data.source = "builtin:digits"
    config.model.update(objective="classification", causal=False)
    with pytest.raises(ConfigError, match=r"images are read in patches .* set both or neither"):
        resolve(config)
    config.model.update(patch_size=4, block_size=16)
    digits = images.read_images("builtin:digits")
    with pytest.raises(UserError, match=r"make 16 patches and a class token: set --config.model.block_size=17"):
        images.check_fits(digits, resolve(config).model)
    config.model.update(patch_size=3, block_size=16)
    with pytest.raises(UserError, match="not a whole number of 3 x 3 patches"):
        images.check_fits(digits, resolve(config).model)


@pytest.mark.slow  # 14 s: the step compiled twice (the check's loss, the overfit run)
def test_check_holds_a_fresh_vision_transformer_to_ln_classes_and_it_overfits_a_batch():
    """jaxgpt check on a small ViT of the digits: the initial loss against ln 10 = 2.303, a uniform
    guess over the classes (against ln 2, the two tokens it reads, it failed: 2.27 is 227% off),
    and one batch learnt in 40 steps, through the step a run trains with (the pixels travel)."""
    from conftest import small_run_config

    from jaxgpt.commands.preflight import run_checks

    config = small_run_config()
    config.data.source = "builtin:digits"
    config.model.update(objective="classification", causal=False, patch_size=4, block_size=17, position="learned")
    rows = {row.name: row for row in run_checks(config, overfit_steps=40)}
    assert rows["initial loss"].passed and "vs ln(10) = 2.303" in rows["initial loss"].detail
    assert rows["overfit one batch"].passed, rows["overfit one batch"].detail


def test_a_vision_transformer_sharded_over_data_fsdp_and_tensor_trains_like_one_device(tmp_path):
    """The patch projection and the pixels sharded by the mesh's rules (2 x 2 x 2 over 8 CPU
    devices): 10 steps' losses those of one device to float32 re-association (rtol 1e-5, as
    tests/test_sharding.py argues; a wrong split moves them by > 1e-2)."""

    def vit(mesh: dict):
        config = layout_run_config(mesh)
        config.data.source = "builtin:digits"
        config.model.update(objective="classification", causal=False, patch_size=4, block_size=17, position="learned")
        return config

    one = trained(tmp_path / "one", vit(dict(data=1)))
    meshed = trained(tmp_path / "mesh", vit(dict(data=2, fsdp=2, tensor=2)))
    np.testing.assert_allclose(train_losses(meshed), train_losses(one), rtol=1e-5)


@pytest.mark.slow
def test_the_digit_script_writes_the_pinned_bytes_again():
    """scripts/make_digits.py run afresh (about 10 s) writes exactly the file that ships: the
    same seed, fonts and matplotlib give the same bytes (matplotlib is pinned in requirements.txt)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_digits
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert hashlib.sha256(make_digits.digits_file()).hexdigest() == images.DIGITS_SHA256


@pytest.mark.slow
def test_a_vision_transformer_learns_the_digits_resumes_bit_for_bit_and_draws_its_class_token(tmp_path):
    """configs/vit_digits.py for 300 steps through train.py, stopped at 150 and resumed: the
    losses of the uninterrupted run to the bit, the held-out accuracy at least 3 x chance (10%
    over 800 images: 30% is more than 20 standard deviations of a guess's 1.1%), the confusion
    matrix's counts the held-out images; then attention-maps --image draws the class token,
    whose weights over the sequence sum to 1 in every head."""
    common = ["--config", "configs/vit_digits.py", "--config.train.steps=300", "--config.train.eval_every=150",
              "--config.train.checkpoint_every=150", "--config.train.log_every=10"]  # fmt: skip

    def train(workdir, *more):
        subprocess.run([sys.executable, "train.py", *common, "--workdir", str(workdir), *more], cwd=ROOT, check=True,
                       env=users_environment(JAXGPT_CACHE=str(tmp_path / "cache")), capture_output=True)  # fmt: skip
        return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]

    whole = train(tmp_path / "whole")
    train(tmp_path / "resumed", "--stop_at", "150")
    resumed = train(tmp_path / "resumed")
    losses = [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in whole]
    assert [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in resumed] == losses
    last = whole[-1]
    assert last["val_accuracy"] >= 0.3, last["val_accuracy"]
    assert np.asarray(last["val_confusion"]).sum() == 800

    from jaxgpt.commands.attention_maps import class_token_maps
    from jaxgpt.commands.inspected import load

    config, params, _, _ = load(tmp_path / "whole")
    held = images.read_images("builtin:digits")
    row = images.image_rows(held, np.array([0]), config.patch_size)
    weights, probabilities = class_token_maps(config, params, row)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)  # a softmax row, float32
    assert weights.shape == (4, 4, 17) and abs(probabilities.sum() - 1) < 1e-9
    command = [sys.executable, "-m", "jaxgpt", "attention-maps", "--workdir", str(tmp_path / "whole"), "--image", "3"]
    drawn = subprocess.run(command, cwd=ROOT, env=users_environment(), capture_output=True, text=True)
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert "held-out image 3 of builtin:digits: class" in drawn.stdout
    assert (tmp_path / "whole" / "attention_image_3.png").stat().st_size > 10_000
