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
    # No rematerialisation (the base config's remat="none"): at this size a step's activations fit
    # in the cache, and recomputing GELU's tanh, the softmax's exp and the norms in the backward
    # pass (remat="dots") cost 3-6% of the step on a Zen 3 and a Zen 4 (docs/benchmarks.md).
    # Microbatches are left to the run (train.microbatches=0): it picks the fewest whose step
    # fits this machine's cache, and prints its choice.
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
