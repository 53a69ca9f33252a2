"""The position-wise layers of a block: normalisation and the MLP."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig


def make_norm(config: ModelConfig, name: str) -> nn.Module:
    """LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019), unit scale at init.

    Both reduce in float32 even under bfloat16 compute (flax's default), since a mean of
    squares over hundreds of features overflows bfloat16's precision long before its range.
    """
    common = dict(
        epsilon=config.norm_eps, dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype), name=name
    )
    if config.norm == "rmsnorm":
        return nn.RMSNorm(**common)
    return nn.LayerNorm(use_bias=config.bias, **common)


class MLP(nn.Module):
    """Two-layer feed-forward network, or its gated SwiGLU form (Shazeer 2020).

    GELU/ReLU: down(act(up(x))). SwiGLU: down(silu(gate(x)) * up(x)), with gate and up made by
    one matmul. The down projection writes into the residual stream, so its init is scaled
    by 1/sqrt(2 * n_layer) as GPT-2 does.
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        c = self.config
        dense = dict(use_bias=c.bias, dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype))
        if c.activation == "swiglu":
            gate_up = nn.DenseGeneral(
                (2, c.mlp_hidden), kernel_init=nn.initializers.normal(c.init_std), name="up", **dense
            )(x)
            h = nn.silu(gate_up[..., 0, :]) * gate_up[..., 1, :]  # (b, t, hidden)
        else:
            h = nn.Dense(c.mlp_hidden, kernel_init=nn.initializers.normal(c.init_std), name="up", **dense)(x)
            # GPT-2's GELU is the tanh approximation (Hendrycks & Gimpel 2016).
            h = jax.nn.gelu(h, approximate=True) if c.activation == "gelu" else jax.nn.relu(h)
        down_init = nn.initializers.normal(c.init_std / math.sqrt(2 * c.n_layer))
        return nn.Dense(c.d_model, kernel_init=down_init, name="down", **dense)(h)
