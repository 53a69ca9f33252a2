"""The position-wise layers of a block: normalisation and the MLP."""

from __future__ import annotations

import math
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model.products import compute_dtype, dot_general_for
from jaxgpt.model.sites import site


def dtypes(config: ModelConfig) -> dict:
    """The dtype keywords of every flax layer: compute in config.dtype, keep parameters in
    config.param_dtype (float32 under bfloat16 training)."""
    return dict(dtype=compute_dtype(config), param_dtype=jnp.dtype(config.param_dtype))


def projection_keywords(config: ModelConfig) -> dict:
    """dtypes' keywords, and for a Dense or DenseGeneral the product it computes with
    (jaxgpt/model/products.py: bfloat16 on a CPU at the bfloat16 units' speed)."""
    return dtypes(config) | dot_general_for(config)


def residual_output_init(c: ModelConfig):
    """The init of a projection that writes into the residual stream (attention's and the MLP's
    last): GPT-2 scales it by 1/sqrt(2 * n_layer) so the stream's variance does not grow with
    depth; zero_init_residual starts it at zero, every block the identity."""
    if c.zero_init_residual:
        return nn.initializers.zeros
    return nn.initializers.normal(c.init_std / math.sqrt(2 * c.n_layer))


def make_norm(config: ModelConfig, name: str) -> nn.Module:
    """LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019), unit scale at init.

    Both reduce in float32 even under bfloat16 compute (flax's default), since a mean of
    squares over hundreds of features overflows bfloat16's precision long before its range.
    """
    common = dict(epsilon=config.norm_eps, name=name, **dtypes(config))
    if config.norm == "rmsnorm":
        return nn.RMSNorm(**common)
    if config.norm == "none":  # the ablation: no normalisation, no parameters
        return lambda x: x
    return nn.LayerNorm(use_bias=config.bias, **common)


class MLP(nn.Module):
    """Two-layer feed-forward network, or its gated SwiGLU and GeGLU forms (Shazeer 2020).

    GELU/ReLU/ReLU²: down(act(up(x))). SwiGLU / GeGLU: down(act(gate(x)) * up(x)), act silu
    (Llama) or the tanh GELU (Gemma), with gate and up made by one matmul. The down projection
    writes into the residual stream, so it is initialised as attention's output projection is
    (residual_output_init).
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        c = self.config
        dense = dict(use_bias=c.bias, **projection_keywords(c))
        if c.activation in GATES:
            gate_up = nn.DenseGeneral(
                name="up", features=(2, c.mlp_hidden), kernel_init=nn.initializers.normal(c.init_std), **dense
            )(x)
            gate, up = site(self, "hook_pre", gate_up[..., 0, :]), site(self, "hook_pre_linear", gate_up[..., 1, :])
            h = GATES[c.activation](gate) * up  # (b, t, hidden)
        else:
            h = nn.Dense(name="up", features=c.mlp_hidden, kernel_init=nn.initializers.normal(c.init_std), **dense)(x)
            h = ACTIVATION_FUNCTIONS[c.activation](site(self, "hook_pre", h))
        h = site(self, "hook_post", h)
        return nn.Dense(name="down", features=c.d_model, kernel_init=residual_output_init(c), **dense)(h)


GATES = {"swiglu": nn.silu, "geglu": partial(jax.nn.gelu, approximate=True)}  # a gated MLP's act(gate)

ACTIVATION_FUNCTIONS = {
    "gelu": partial(jax.nn.gelu, approximate=True),  # GPT-2's GELU: the tanh approximation (Hendrycks & Gimpel 2016)
    "gelu_exact": partial(jax.nn.gelu, approximate=False),  # x * Phi(x), with erf
    "relu": jax.nn.relu,
    "relu2": lambda h: jnp.square(jax.nn.relu(h)),  # Primer (So et al. 2021); modded-nanogpt's MLP
}
