"""Dates written many ways, normalised to ISO 8601 by a small decoder-only model: "3rd of March,
2021" -> "2021-03-03". Text pairs (jaxgpt/data/pairs.py): each example is the date, a tab and its
ISO form, several packed into a row, the loss on the ISO form alone. Generated offline from a
fixed seed; learns on a CPU in a few minutes."""

from jaxgpt.config_files import base_config


def get_config():
    config = base_config()
    config.data.source = "builtin:dates"
    config.data.tokenizer = "char"
    config.model.n_layer = 2
    config.model.n_head = 4
    config.model.d_model = 128
    config.model.block_size = 128  # three or four examples a row
    config.model.position = "rope"  # each example starts at position 0 again: relative positions fit
    config.model.dropout = 0.0
    config.model.remat = "dots"
    config.train.steps = 1000
    config.train.batch_size = 16
    config.train.lr = 3e-3
    config.train.min_lr = 3e-4
    config.train.warmup_steps = 50
    config.train.eval_every = 200
    config.train.eval_batches = 10
    config.train.log_every = 50
    config.train.checkpoint_every = 500
    return config
