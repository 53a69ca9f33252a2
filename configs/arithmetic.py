"""The base model of the chat path (docs/lab.md "From a base model to one that answers"): a
byte-level decoder that reads sums written out ("37 + 45 = 82" a line, builtin:arithmetic) and
learns to add numbers up to 99. It knows no chat template; configs/sft_arithmetic.py teaches it
one. Made offline from a seed; trains on a CPU in a few minutes."""

from jaxgpt.config_files import base_config


def get_config():
    config = base_config()
    config.data.source = "builtin:arithmetic"
    config.data.tokenizer = "byte"  # any text a user types later encodes, and the chat's tokens go after it
    config.model.n_layer = 4
    config.model.n_head = 4
    config.model.d_model = 128
    config.model.block_size = 128
    # Llama's recipe (RoPE, RMSNorm, SwiGLU, no biases): a sum reads the same wherever it starts, and
    # `jaxgpt export` writes a folder transformers reads (on the 2-core EPYC: val loss 0.734
    # at step 2000; RoPE with LayerNorm and GELU 0.740, learned positions 0.787)
    config.model.position = "rope"
    config.model.norm = "rmsnorm"
    config.model.activation = "swiglu"
    config.model.bias = False
    config.model.dropout = 0.0
    config.model.remat = "dots"
    config.train.steps = 2000
    config.train.batch_size = 16
    config.train.lr = 3e-3
    config.train.min_lr = 3e-4
    config.train.warmup_steps = 50
    config.train.eval_every = 250
    config.train.eval_batches = 10
    config.train.log_every = 50
    config.train.checkpoint_every = 500
    return config
