"""A mixture of experts in place of the MLP: a router sends each token to `top_k` of `experts`
expert MLPs and mixes their outputs (config.MixtureOfExperts says where each rule comes from).

Each sequence of the batch is one routing group (GShard's groups), so what a token meets does
not depend on how the batch is split into microbatches or over devices. Per sequence:

    router      logits = x W_r (float32); p = softmax(logits); the top_k experts by p, their
                weights p renormalised over the chosen ones (Mixtral) or p itself (Switch)
    queues      the t * top_k assignments in priority order (every token's first choice, then
                every second choice; earlier tokens first) take the next free row of their
                expert's buffer of `capacity` rows; those past the end are dropped
    experts     each expert's MLP on its buffer, all experts (and sequences) as one batched
                matmul: (batch, experts, capacity, d_model) -> the same shape
    combine     each token's output is the sum over its kept assignments of weight x the
                expert's output row; a shared expert, if any, is added for every token

The buffers have a fixed shape, so the layer compiles to dense batched matmuls: a capacity of
ceil(capacity_factor * t * top_k / experts) rows per expert, or t when dropless (no expert can
receive a token twice). The router's two losses, and what a learner wants to see of it (the
load per expert, the dropped fraction), are sown into the "router" collection: train_step adds
the losses to the objective; nothing is kept when the collection is not mutable.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model.layers import ACTIVATION_FUNCTIONS, MLP, residual_output_init
from jaxgpt.sharding import experts_split, rows_split


def capacity(config: ModelConfig, tokens: int) -> int:
    """Rows of each expert's buffer for a routing group (a sequence) of `tokens` tokens."""
    m = config.moe
    if not m.capacity_factor:
        return tokens
    return min(tokens, math.ceil(m.capacity_factor * tokens * m.top_k / m.experts))


def route(logits: jnp.ndarray, top_k: int, renormalize: bool = True) -> tuple[jnp.ndarray, jnp.ndarray]:
    """For router logits (..., experts): the chosen experts (..., top_k), most probable first,
    and their weights: the softmax probabilities, renormalised over the chosen (Mixtral) or
    as they are (Switch Transformer). Renormalised, one chosen expert's weight is exactly 1, so
    at top_k=1 the task's loss gives the router no gradient; as they are, it does."""
    chosen_p, chosen = jax.lax.top_k(jax.nn.softmax(logits), top_k)
    return chosen, chosen_p / chosen_p.sum(-1, keepdims=True) if renormalize else chosen_p


def queue_positions(chosen: jnp.ndarray, experts: int) -> jnp.ndarray:
    """For one group's assignments chosen (t, top_k), each one's row in its expert's queue
    (t, top_k): the number of assignments to the same expert ahead of it in priority order (all
    first choices, then all second choices, ...; earlier tokens first within each)."""
    by_priority = chosen.T.reshape(-1)  # (top_k * t,): slot-major
    one_hot = jax.nn.one_hot(by_priority, experts, dtype=jnp.int32)
    ahead = jnp.cumsum(one_hot, axis=0) - one_hot  # assignments to each expert before this one
    rows = jnp.take_along_axis(ahead, by_priority[:, None], axis=1)[:, 0]
    return rows.reshape(chosen.shape[1], chosen.shape[0]).T


def buffer_slots(chosen: jnp.ndarray, experts: int, rows: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """For one group's assignments (t, top_k): each one's row in the experts' buffers laid end
    to end (experts * rows), and whether it was kept. The dropped ones all point at one spare
    row past the end, which is cut off before the experts run and reads back as zeros."""
    position = queue_positions(chosen, experts)
    kept = position < rows
    return jnp.where(kept, chosen * rows + position, experts * rows), kept


def router_losses(logits: jnp.ndarray, chosen: jnp.ndarray, experts: int) -> dict[str, jnp.ndarray]:
    """For a batch of groups, logits (batch, t, experts) and chosen (batch, t, top_k): the
    load-balancing loss (Switch Transformer: experts x sum_e f_e P_e in each group, f_e the
    fraction of its assignments to expert e and P_e its mean router probability, averaged over
    the groups), the z-loss (ST-MoE: the mean of logsumexp(logits)^2), the load f_e averaged
    over the groups, and the router's mean entropy in nats (ln experts: undecided; 0: certain)."""
    load = jax.nn.one_hot(chosen, experts, dtype=jnp.float32).mean((1, 2))  # (batch, experts), each row sums to 1
    probabilities = jax.nn.softmax(logits)
    mean_probability = probabilities.mean(1)
    return {
        "entropy": -jnp.mean(jnp.sum(probabilities * jax.nn.log_softmax(logits), axis=-1)),
        "aux_loss": jnp.mean(experts * jnp.sum(load * mean_probability, axis=-1)),
        "z_loss": jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1))),
        "load": load.mean(0),
    }


class MixtureOfExpertsLayer(nn.Module):
    """The MoE feed-forward layer: (batch, seq, d_model) -> (batch, seq, d_model)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        c, m = self.config, self.config.moe
        batch, t, d = x.shape
        router = nn.Dense(
            m.experts, use_bias=False, kernel_init=nn.initializers.normal(c.init_std), name="router",
            dtype=jnp.float32, param_dtype=jnp.dtype(c.param_dtype),
        )  # fmt: skip
        logits = router(x.astype(jnp.float32))  # routing in float32 under any compute dtype
        chosen, weights = route(logits, m.top_k, m.renormalize)  # (batch, t, top_k)
        self.sow("intermediates", "experts", chosen)  # for jaxgpt.lab.capture; nothing unless capturing
        self.sow("intermediates", "expert_weights", weights)
        rows = capacity(c, t)
        slot, kept = jax.vmap(buffer_slots, in_axes=(0, None, None))(chosen, m.experts, rows)
        token_of = jnp.repeat(jnp.arange(t), m.top_k)  # the token of each (t, top_k) assignment, flattened

        def fill(tokens, slots):  # one group's buffers, the spare row last
            return jnp.zeros((m.experts * rows + 1, d), tokens.dtype).at[slots.reshape(-1)].set(tokens[token_of])

        buffers = jax.vmap(fill)(x, slot)[:, :-1].reshape(batch, m.experts, rows, d)
        # on a mesh with an expert axis, each device's rows go to the devices of their experts and back
        outputs = rows_split(self._experts(experts_split(buffers))).reshape(batch, m.experts * rows, d)
        outputs = jnp.concatenate([outputs, jnp.zeros((batch, 1, d), outputs.dtype)], axis=1)  # the spare row
        picked = jnp.take_along_axis(outputs, slot.reshape(batch, -1, 1), axis=1).reshape(batch, t, m.top_k, d)
        mixed = jnp.einsum("btk,btkd->btd", (weights * kept).astype(picked.dtype), picked)
        if m.shared_experts:
            shared = c.replace(mlp_hidden=m.shared_experts * c.expert_hidden, moe=None)
            mixed = mixed + MLP(shared, name="shared")(x)
        self.sow("router", "dropped", jnp.mean(~kept))  # a count over a count: exactly 0 when none is
        for name, value in router_losses(logits, chosen, m.experts).items():
            self.sow("router", name, value)
        return mixed

    def _experts(self, buffers: jnp.ndarray) -> jnp.ndarray:
        """Every expert's MLP on its own buffer: (batch, experts, rows, d) -> the same shape; the
        MLP of jaxgpt/layers.py with a leading expert axis on each weight."""
        c, m = self.config, self.config.moe
        d, hidden = c.d_model, c.expert_hidden
        param_dtype, dtype = jnp.dtype(c.param_dtype), jnp.dtype(c.dtype)
        gated = c.activation == "swiglu"
        up_shape = (m.experts, d, 2, hidden) if gated else (m.experts, d, hidden)
        # the normal initialisers ignore fan-in, so each expert's matrix is drawn as the MLP's is
        up = self.param("experts_up", nn.initializers.normal(c.init_std), up_shape, param_dtype)
        down = self.param("experts_down", residual_output_init(c), (m.experts, hidden, d), param_dtype)
        h = jnp.einsum("berd,ed...->ber...", buffers.astype(dtype), up.astype(dtype))
        if c.bias:
            h = h + self.param("experts_up_bias", nn.initializers.zeros, (m.experts, 1, *up_shape[2:]), param_dtype)
        h = nn.silu(h[..., 0, :]) * h[..., 1, :] if gated else ACTIVATION_FUNCTIONS[c.activation](h)
        y = jnp.einsum("berh,ehd->berd", h, down.astype(dtype))
        if c.bias:
            y = y + self.param("experts_down_bias", nn.initializers.zeros, (m.experts, 1, d), param_dtype)
        return y
