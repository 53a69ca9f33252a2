"""Low-rank adapters (LoRA; Hu et al. 2021): fine-tune a few small matrices beside a frozen model.

A projection x W (W: d_in x d_out) gets two matrices beside it, A (d_in x r) and B (r x d_out),
with r (model.lora_rank) much smaller than either:

    y = x W + (alpha / r) (x A) B

B starts at zero, so the adapted model starts as the base model, exactly; A starts random
(normal, 1/sqrt(d_in)), so B's first gradients are not zero. Training changes A and B alone
(jaxgpt/training/optimizer.py gives the base weights no update and no optimizer state, and
jaxgpt/training/train_step.py no gradient), which is what makes an imported model of a few
hundred million parameters fine-tune in a laptop's memory: Adam keeps two moments of each
trained number, and the adapters are a few percent of them. Merged (`merge`), W + (alpha / r) A B
is an ordinary model of the base's shape, computing what the adapted one does.

Tokens the fine-tuning adds (a chat template's, jaxgpt/data/conversations.py) start as rows alike
(the mean of the trained ones): frozen, the model could not tell them apart, nor predict one
rather than another. model.lora_embeddings trains the token embedding (and an untied head) in
full beside the adapters, as PEFT's "modules_to_save" does; measured in docs/lab.md section 14.

The adapted projections are model.lora_targets, by module name: qkv and out (attention), up and
down (the MLP; SwiGLU's fused gate-and-up is one `up`). A and B live in the projection's own
module, named lora_a and lora_b beside its kernel, added by a method interceptor (`adapting`)
so that the layers' code writes plain projections: the base's parameters keep their names, so a
base checkpoint or Hugging Face weights fill them as before (jaxgpt/job/resume.py), and the
adapters keep their fresh initialisation.
"""

from __future__ import annotations

import contextlib
import functools
import math
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model.products import compute_dtype

ADAPTER_PARAMS = ("lora_a", "lora_b")


def lora_delta(module: nn.Module, x: jnp.ndarray, in_axes: tuple[int, ...], features: tuple[int, ...], config):
    """(alpha / r) (x A) B for the projection `module` of x's `in_axes` onto `features`, its
    A and B made in the module as lora_a (*in, r) and lora_b (r, *features)."""
    rank, dtype = config.lora_rank, compute_dtype(config)
    in_shape = tuple(x.shape[a] for a in in_axes)
    fan_in = math.prod(in_shape)
    a = module.param("lora_a", nn.initializers.normal(1 / math.sqrt(fan_in)), (*in_shape, rank), config.param_dtype)
    b = module.param("lora_b", nn.initializers.zeros, (rank, *features), config.param_dtype)
    n_in = len(in_axes)
    xa = jax.lax.dot_general(x.astype(dtype), a.astype(dtype), ((in_axes, tuple(range(n_in))), ((), ())))
    return (config.lora_alpha / rank) * jnp.tensordot(xa, b.astype(dtype), axes=1)


def _axes(axis, ndim: int) -> tuple[int, ...]:
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim for a in axis)


def adapting(config: ModelConfig):
    """A context in which every projection config.lora_targets names (an nn.Dense or
    nn.DenseGeneral of that name: attention's qkv and out, cross-attention's q and kv, the MLP's
    up and down) adds its adapter to what it computes (`lora_delta`). The model's layers write
    plain projections; GPT.__call__ runs inside this context. Nothing where the model has none."""
    if not config.lora_rank:
        return contextlib.nullcontext()
    return nn.intercept_methods(partial(_adapted, config))


def adapted(method):
    """`method` of a module with a config (GPT.__call__) run inside `adapting(self.config)`."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with adapting(self.config):
            return method(self, *args, **kwargs)

    return call


def _adapted(config: ModelConfig, next_fun, args, kwargs, context):
    """A flax method interceptor: an adapted projection's output plus its adapter."""
    y = next_fun(*args, **kwargs)
    module = context.module
    if context.method_name != "__call__" or type(module) not in (nn.Dense, nn.DenseGeneral):
        return y
    if module.name not in config.adapted:
        return y
    x = args[0]
    if isinstance(module, nn.DenseGeneral):
        features = (module.features,) if isinstance(module.features, int) else tuple(module.features)
        in_axes = _axes(module.axis, x.ndim)
    else:
        features, in_axes = (module.features,), (x.ndim - 1,)
    return y + lora_delta(module, x, in_axes, features, config).astype(y.dtype)


# The token embedding and the LM head's own weights (an untied head, a bias per token), by path.
TOKEN_TABLES = (("wte", "embedding"), ("lm_head", "kernel"), ("head_bias",))


def is_adapter(path) -> bool:
    """Whether a parameter's path (jax.tree_util key path) ends in an adapter matrix."""
    return getattr(path[-1], "key", None) in ADAPTER_PARAMS


def trains(config: ModelConfig, path) -> bool:
    """Whether an adapted model trains this parameter: the adapters, and with
    model.lora_embeddings the token tables (TOKEN_TABLES)."""
    names = tuple(getattr(k, "key", None) for k in path)
    return is_adapter(path) or (config.lora_embeddings and any(names[-len(t) :] == t for t in TOKEN_TABLES))


def adapter_labels(config: ModelConfig):
    """params -> "adapter" for each parameter `trains` names, "frozen" for every other."""
    return lambda params: jax.tree_util.tree_map_with_path(
        lambda path, _: "adapter" if trains(config, path) else "frozen", params
    )


def split(config: ModelConfig, params) -> tuple:
    """(what the step differentiates, what it keeps fixed): for an adapted model two trees of
    params' structure, each with None where the other holds the parameter, so no gradient of a
    frozen weight is computed, stored, summed over microbatches or copied between cores; for
    any other model (params, None). `params` may be shapes."""
    if not config.lora_rank:
        return params, None
    trained = jax.tree_util.tree_map_with_path(lambda path, p: p if trains(config, path) else None, params)
    fixed = jax.tree_util.tree_map_with_path(lambda path, p: None if trains(config, path) else p, params)
    return trained, fixed


def joined(trained, fixed):
    """`split`'s two trees as the one they came from."""
    return jax.tree.map(lambda t, f: f if t is None else t, trained, fixed, is_leaf=lambda x: x is None)


def merge(config: ModelConfig, params: dict) -> tuple[ModelConfig, dict]:
    """(the base model's config, its parameters with each adapter folded into its kernel:
    W + (alpha / r) A B): an ordinary model computing what the adapted one computes."""
    if not config.lora_rank:
        return config, params
    scale = config.lora_alpha / config.lora_rank

    def fold(tree):
        if not isinstance(tree, dict):
            return tree
        if "lora_a" in tree:
            kernel, a, b = tree["kernel"], tree["lora_a"], tree["lora_b"]
            lead = a.ndim + b.ndim - 2 - kernel.ndim  # a scanned layer axis, when there is one
            layers = math.prod(kernel.shape[:lead])
            a2 = a.reshape(layers, -1, a.shape[-1])
            b2 = b.reshape(layers, b.shape[lead], -1)
            delta = jnp.einsum("lir,lro->lio", a2.astype(jnp.float32), b2.astype(jnp.float32)).reshape(kernel.shape)
            merged = {k: v for k, v in tree.items() if k not in ADAPTER_PARAMS}
            merged["kernel"] = (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)
            return merged
        return {k: fold(v) for k, v in tree.items()}

    return config.replace(lora_rank=0), fold(params)


def with_fresh_adapters(loaded: dict, fresh: dict) -> dict:
    """`loaded` (a base model's parameters) with the adapter matrices of `fresh` (an adapted
    model's initialisation) added where the adapted model has them."""
    if not isinstance(fresh, dict):
        return loaded
    out = dict(loaded)
    for key, value in fresh.items():
        if key in ADAPTER_PARAMS:
            out[key] = value
        elif key in loaded:
            out[key] = with_fresh_adapters(loaded[key], value)
    return out
