"""The Llama recipe at tiny size on the offline Python reference: grouped-query attention
(4 query heads sharing 2 key/value heads), RoPE, RMSNorm, SwiGLU, no biases, untied head.
Everything else is configs/tiny.py, so the two architectures compare directly."""

from configs import tiny


def get_config():
    config = tiny.get_config()
    config.model.update(
        n_kv_head=2, position="rope", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False
    )
    return config
