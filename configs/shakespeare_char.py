"""nanoGPT's baby GPT on tiny Shakespeare, character level: 6 layers, 6 heads, 384 wide, 256
context, dropout 0.2. Needs the Hub once (or a local copy: --config.data.source=text:input.txt).
A GPU run of 5000 steps reaches val loss ~1.47 in nanoGPT; on 2 CPU cores each step is ~10 s."""

from jaxgpt.config_files import base_config


def get_config():
    config = base_config()
    config.data.source = "hf:karpathy/tiny_shakespeare"
    config.data.tokenizer = "char"
    config.model.update(n_layer=6, n_head=6, d_model=384, block_size=256, dropout=0.2)
    config.train.update(
        steps=5000,
        batch_size=64,
        lr=1e-3,
        min_lr=1e-4,
        warmup_steps=100,
        beta2=0.99,  # few tokens per step: a shorter second-moment memory helps (nanoGPT)
        eval_every=250,
        eval_batches=20,
        log_every=10,
        checkpoint_every=500,
    )
    return config
