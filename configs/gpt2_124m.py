"""GPT-2 small (124M) on FineWeb-edu's 10B-token sample, streamed from the Hub, with the GPT-2
BPE. For a GPU or TPU: bfloat16 compute, 64 x 1024 tokens per step. The recipe,
from preparing the data to the HellaSwag score: docs/gpt2_124m.md."""

from jaxgpt.config_files import base_config


def get_config():
    config = base_config()
    config.data.source = "hf:HuggingFaceFW/fineweb-edu:sample-10BT"
    config.data.tokenizer = "gpt2"
    config.data.val_fraction = 0.005
    # The first 1.5B tokens (3 GB on disk): the 20,000 steps below read 1.31B, the last 0.5% is
    # validation. data.max_tokens=0 prepares all 10B (20 GB).
    config.data.max_tokens = 1_500_000_000
    config.model.update(n_layer=12, n_head=12, d_model=768, block_size=1024, dropout=0.0)
    # The fastest measured on a GPU (an H200, docs/benchmarks.md): cuDNN's flash attention
    # (dot_product asks for it by name there; a TPU or CPU runs XLA's attention), nothing
    # recomputed in the backward pass, layers unrolled: 126.5 ms a step, 518k tokens/s, 44.8% MFU,
    # against 306.4 ms with XLA's attention, remat=dots and scanned layers. It also fits a v5e-8
    # (9.81 GiB of 16 a chip: python -m jaxgpt check --config configs/gpt2_124m.py --target tpu-v5e-8).
    config.model.update(attention="dot_product", remat="none", scan_layers=False)
    # 50,257 tokens padded to 50,304 = 64 * 786: matmuls tile evenly on GPUs and TPUs.
    config.model.vocab_size = 50304
    config.train.update(
        steps=20000,
        batch_size=64,
        microbatches=1,
        lr=6e-4,
        min_lr=6e-5,
        warmup_steps=700,
        weight_decay=0.1,
        dtype="bfloat16",
        eval_every=500,
        eval_batches=20,
        log_every=20,
        checkpoint_every=1000,
    )
    return config
