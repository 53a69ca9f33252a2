"""A character-level model of the Python language reference: trains in a few minutes on a
laptop CPU, offline (the text ships with CPython)."""

from jaxgpt.config import base_config


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
    # CPU the step is bound by memory traffic, and this measured 1.5x faster (docs/benchmarks.md).
    config.model.remat = "dots"
    config.train.steps = 2000
    config.train.batch_size = 12
    # Three microbatches of 4 rows (2 per core): the step's working set then fits the CPU's
    # cache, 1.7x faster at this context length on 2 cores; the same update up to float32
    # summation order (docs/benchmarks.md). At 64 tokens one microbatch already fits.
    config.train.microbatches = 3
    config.train.lr = 2e-3
    config.train.min_lr = 2e-4
    config.train.warmup_steps = 100
    config.train.eval_every = 250
    config.train.eval_batches = 20
    config.train.log_every = 50
    config.train.checkpoint_every = 500
    return config
