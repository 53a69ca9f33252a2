"""A character-level model of the Python language reference: trains in a few minutes on a
laptop CPU, offline (the text ships with CPython)."""

from jaxgpt.config_files import base_config


def get_config():
    config = base_config()
    config.data.source = "builtin:python-docs"
    config.data.tokenizer = "char"
    config.model.n_layer = 4
    config.model.n_head = 4
    config.model.d_model = 128
    config.model.block_size = 128  # room to sample a few lines; the benchmark keeps nanoGPT's 64
    config.model.dropout = 0.0
    # Keep matmul outputs for the backward pass and recompute the cheap elementwise ones: on a
    # CPU the step is bound by memory traffic, and this measured faster on every CPU tried
    # (docs/benchmarks.md). Microbatches are left to the run (train.microbatches=0): it picks
    # the fewest whose step fits this machine's cache, and prints its choice.
    config.model.remat = "dots"
    config.train.steps = 2000
    config.train.batch_size = 12
    config.train.lr = 2e-3
    config.train.min_lr = 2e-4
    config.train.warmup_steps = 100
    config.train.eval_every = 250
    config.train.eval_batches = 20
    config.train.log_every = 50
    config.train.checkpoint_every = 500
    return config
