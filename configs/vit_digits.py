"""A Vision Transformer (Dosovitskiy et al. 2021) classifying builtin:digits: 4,000 images of the
ten digits, 16 x 16 grey, drawn in matplotlib's fonts at random sizes, angles and shifts with
noise (jaxgpt/data/images.py; scripts/make_digits.py writes them from a fixed seed). Each image
is cut into 16 patches of 4 x 4 pixels, each projected to d_model as a token is embedded, after
a class token whose output the classifier reads (model.patch_size; learned positions, an
encoder: causal=False). Its evaluations report val_accuracy and the confusion matrix, and
`python -m jaxgpt attention-maps --workdir out/vit_digits --image 0` draws where the class
token looks. Your own images: --config.data.source=images:PATH.npz, or images:DIR with a folder
of PNGs a class (model.block_size 1 + the patches an image has, model.channels 3 for RGB).
"""

from configs import tiny


def get_config():
    config = tiny.get_config()
    config.data.source = "builtin:digits"
    config.data.val_fraction = 0.2  # 800 held-out images
    config.model.objective = "classification"
    config.model.patch_size = 4
    config.model.block_size = 17  # the class token and (16 / 4)^2 patches
    config.model.causal = False  # every patch reads every other, as the class token reads them all
    config.model.position = "learned"
    config.model.n_layer = 4
    config.model.d_model = 64
    config.train.batch_size = 32
    config.train.steps = 1500
    config.train.lr = 3e-3
    config.train.min_lr = 2e-4
    config.train.warmup_steps = 50
    config.train.eval_every = 250
    config.train.eval_batches = 25  # 25 x 32 rows hold all 800 held-out images
    config.train.log_every = 50
    config.train.checkpoint_every = 500
    return config
