"""The original Transformer's shape, an encoder–decoder (model.encoder_layers), learning to
sort strings of 4 to 12 digits ("31415" -> "11345"): each output digit depends on the whole
source, so no single source position answers it, and the cross-attention spreads out. Text pairs generated offline (jaxgpt/data/pairs.py), several
packed into each row, the loss on the answers; trained, checkpointed and resumed by train.py
like any run."""

from jaxgpt.config_files import base_config


def get_config():
    config = base_config()
    config.data.source = "builtin:sort"
    config.data.tokenizer = "char"
    config.model.encoder_layers = 2
    config.model.n_layer = 2  # the decoder's blocks
    config.model.n_head = 4
    config.model.d_model = 64
    config.model.block_size = 64  # four or more examples a row, on each side
    config.model.position = "learned"  # as the paper (sinusoidal); each side has its own table
    config.model.dropout = 0.0
    config.train.steps = 1200
    config.train.batch_size = 16
    config.train.lr = 3e-3
    config.train.min_lr = 3e-4
    config.train.warmup_steps = 50
    config.train.eval_every = 400
    config.train.eval_batches = 10
    config.train.log_every = 50
    config.train.checkpoint_every = 600
    return config
