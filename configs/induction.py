"""Where induction heads form: a 2-layer, 4-head RoPE model on builtin:repeated-random, random
strings of 4 to 16 letters repeated (jaxgpt/data/sources.py). After the first period of each
string, copying is the only way to predict, so the model learns it; then

    python -m jaxgpt evaluate --workdir runs/induction --induction

prints each head's induction score (docs/lab.md, section 3 measures this run). Two layers are
the fewest that can do it: a first-layer head marks each letter with its predecessor, and a
second-layer head matches the current letter against those marks."""

from jaxgpt.config_files import base_config


def get_config():
    config = base_config()
    config.data.source = "builtin:repeated-random"
    config.data.tokenizer = "char"
    config.model.n_layer = 2
    config.model.n_head = 4
    config.model.d_model = 64
    config.model.position = "rope"
    config.model.block_size = 32  # up to two whole periods of the longest strings in a window
    config.train.steps = 1500
    config.train.batch_size = 32
    config.train.lr = 1e-3
    config.train.min_lr = 1e-4
    config.train.warmup_steps = 50
    config.train.eval_every = 250
    config.train.eval_batches = 20
    config.train.log_every = 50
    config.train.checkpoint_every = 500
    return config
