"""Fine-tune OpenAI's GPT-2 small (124M) from the Hugging Face weights on the built-in Python
reference, with the GPT-2 BPE. Needs the Hub once for the weights and tiktoken's BPE file (or
--config.train.init_from=/path/to/gpt2 and TIKTOKEN_CACHE_DIR offline); a GPU job, though a
few steps run on a CPU."""

from jaxgpt.config_files import base_config


def get_config():
    config = base_config()
    config.data.source = "builtin:python-docs"
    config.data.tokenizer = "gpt2"
    # GPT-2 small's shape, which fine-tuning reads from the weights anyway (jaxgpt/job/pretrained.py):
    # written here for what compiles this config without them (check --target for a TPU).
    config.model.update(n_layer=12, n_head=12, d_model=768, block_size=1024, dropout=0.0)
    config.train.update(
        init_from="gpt2",
        steps=500,
        batch_size=8,
        lr=3e-5,
        min_lr=3e-6,
        warmup_steps=50,
        weight_decay=0.0,
        eval_every=100,
        eval_batches=10,
        log_every=10,
        checkpoint_every=250,
    )
    return config
