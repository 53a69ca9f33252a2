"""What the inspecting tools reach for inside an attention layer, and nothing else does: the
scores and weights it records for `jaxgpt.lab.capture` (Flax's "intermediates" collection, only
when the caller asks for it), and the mask `jaxgpt.commands.evaluate` removes heads with (the
"head_mask" collection, only when given). Training and sampling pass neither, and the layer's
program is then exactly the one without these lines.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig


def head_mask(config: ModelConfig, keep: jax.Array) -> dict:
    """The "head_mask" collection that multiplies each attention head's output by keep
    (n_layer, n_head): 1 keeps a head, 0 removes it (Michel et al. 2019's head ablation).
    Query head h of a layer is key/value group h // group_size, member h % group_size. Its
    tree follows the model's: one stacked entry under scan_layers, a block_i each otherwise."""
    keep = jnp.asarray(keep, jnp.float32).reshape(config.n_layer, config.n_kv_head, config.group_size)
    if config.scan_layers:
        return {"blocks": {"attn": {"keep": keep}}}
    return {f"block_{i}": {"attn": {"keep": keep[i]}} for i in range(config.n_layer)}


def without_removed_heads(layer, y: jnp.ndarray) -> jnp.ndarray:
    """The heads' outputs y (b, t, k, g, d), those the head mask removes zeroed."""
    if not layer.has_variable("head_mask", "keep"):
        return y
    return y * layer.get_variable("head_mask", "keep")[:, :, None].astype(y.dtype)


def record_attention(layer, scores) -> None:
    """Sow the pre-softmax scores `scores()` and their softmax, when capture asks for them."""
    if layer.is_mutable_collection("intermediates"):
        scores = scores()
        layer.sow("intermediates", "attention_scores", scores)
        layer.sow("intermediates", "attention_weights", jax.nn.softmax(scores, axis=-1))
