"""A mixture of experts in place of the MLP: a router sends each token to `top_k` of `experts`
expert MLPs and mixes their outputs (config.MixtureOfExperts says where each rule comes from).

Each sequence of the batch is one routing group (GShard's groups), so what a token meets does
not depend on how the batch is split into microbatches or over devices. Per sequence:

    router      logits = x W_r (float32); p = softmax(logits); the top_k experts by p, their
                weights p renormalised over the chosen (Mixtral) or p itself (Switch)
    queues      the t * top_k assignments in priority order (every token's first choice, then
                every second choice; earlier tokens first), sorted by expert with that order
                kept: each expert's queue is a run of the sorted list, and the first `capacity`
                of it fill the expert's buffer rows; the rest are dropped
    experts     each expert's MLP on its buffer, all experts (and sequences) as one batched
                matmul over (experts, batch, capacity, d_model), the expert axis outermost
    combine     each token's output is the sum over its kept assignments of weight x the
                expert's output row; a shared expert, if any, is added for every token

The buffers have a fixed shape, so the layer compiles to dense batched matmuls: a capacity of
ceil(capacity_factor * t * top_k / experts) rows per expert, or t when dropless (no expert can
receive a token twice). Filling them is a gather (each row reads its token) and combining a
gather (each assignment reads its row): the activations are never scattered and no one-hot
table of queues is built, whose temporaries made a CPU step choose twice the microbatches
(docs/benchmarks.md, "A mixture of experts"). The router's two losses, and what a
learner wants to see of it (the load per expert, the dropped fraction), are sown into the
"router" collection: train_step adds the losses to the objective; nothing is kept when the
collection is not mutable.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model.layers import ACTIVATION_FUNCTIONS, GATES, MLP, residual_output_init
from jaxgpt.model.products import compute_dtype
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


class Dispatch(NamedTuple):
    """One routing group's assignments placed in its experts' buffers (experts, rows)."""

    source: jnp.ndarray  # (experts, rows): the token each buffer row holds
    filled: jnp.ndarray  # (experts, rows): whether the row holds one (an expert's queue may be shorter)
    slot: jnp.ndarray  # (t, top_k): each assignment's row in the buffers flattened, experts * rows if dropped
    kept: jnp.ndarray  # (t, top_k): whether the assignment found a row


def dispatch(chosen: jnp.ndarray, experts: int, rows: int) -> Dispatch:
    """Place one group's assignments chosen (t, top_k) in `experts` buffers of `rows` rows: the
    assignments in priority order (all first choices, then all second choices, ...; earlier
    tokens first within each), stably sorted by expert, so each expert's queue is a run of the
    sorted list in priority order, starting where the experts before it end; an assignment's row
    is its place in its run, and those past `rows` are dropped."""
    t, top_k = chosen.shape
    by_priority = chosen.T.reshape(-1)  # (top_k * t,): slot-major
    order = jnp.argsort(by_priority, stable=True)  # the assignments, expert by expert
    counts = jnp.bincount(by_priority, length=experts)
    starts = jnp.cumsum(counts) - counts  # where each expert's run begins in `order`
    row = jnp.arange(rows)
    source = order[jnp.minimum(starts[:, None] + row, t * top_k - 1)] % t  # assignment j * t + i is token i's
    place = jnp.zeros_like(order).at[order].set(jnp.arange(t * top_k))  # each assignment's place in `order`
    position = place - starts[by_priority]
    kept = position < rows
    slot = jnp.where(kept, by_priority * rows + position, experts * rows)
    return Dispatch(source, row < counts[:, None], slot.reshape(top_k, t).T, kept.reshape(top_k, t).T)


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
        placed = jax.vmap(dispatch, in_axes=(0, None, None))(chosen, m.experts, rows)  # one group per sequence

        def fill(tokens, source, filled):  # one group's buffers (experts, rows, d)
            return jnp.where(filled[..., None], tokens[source], 0)

        def read(outputs, slot):  # each of one group's assignments' output row, zeros where dropped
            rows_and_spare = jnp.concatenate([outputs.reshape(-1, d), jnp.zeros((1, d), outputs.dtype)])
            return rows_and_spare[slot]

        # expert-major (experts, batch, rows, d): the experts' matmuls batch over their leading axis
        # with no transposes; on a mesh with an expert axis, rows travel to their experts' devices and back
        buffers = jax.vmap(fill, out_axes=1)(x, placed.source, placed.filled)
        outputs = rows_split(self._experts(experts_split(buffers)))
        picked = jax.vmap(read, in_axes=(1, 0))(outputs, placed.slot)  # (batch, t, top_k, d)
        kept = placed.kept
        mixed = jnp.einsum("btk,btkd->btd", (weights * kept).astype(picked.dtype), picked)
        if m.shared_experts:
            shared = c.replace(mlp_hidden=m.shared_experts * c.expert_hidden, moe=None)
            mixed = mixed + MLP(shared, name="shared")(x)
        self.sow("router", "dropped", jnp.mean(~kept))  # a count over a count: exactly 0 when none is
        for name, value in router_losses(logits, chosen, m.experts).items():
            self.sow("router", name, value)
        return mixed

    def _experts(self, buffers: jnp.ndarray) -> jnp.ndarray:
        """Every expert's MLP on its own buffer: (experts, batch, rows, d) -> the same shape; the
        MLP of jaxgpt/layers.py with a leading expert axis on each weight."""
        c, m = self.config, self.config.moe
        d, hidden = c.d_model, c.expert_hidden
        param_dtype, dtype = jnp.dtype(c.param_dtype), compute_dtype(c)
        gated = c.activation in GATES
        up_shape = (m.experts, d, 2, hidden) if gated else (m.experts, d, hidden)
        # the normal initialisers ignore fan-in, so each expert's matrix is drawn as the MLP's is
        up = self.param("experts_up", nn.initializers.normal(c.init_std), up_shape, param_dtype)
        down = self.param("experts_down", residual_output_init(c), (m.experts, hidden, d), param_dtype)
        h = jnp.einsum("ebrd,ed...->ebr...", buffers.astype(dtype), up.astype(dtype))
        if c.bias:  # each expert's bias, (experts, 1, ...) as saved, over its batch and rows
            up_bias = self.param("experts_up_bias", nn.initializers.zeros, (m.experts, 1, *up_shape[2:]), param_dtype)
            h = h + up_bias[:, None]
        h = GATES[c.activation](h[..., 0, :]) * h[..., 1, :] if gated else ACTIVATION_FUNCTIONS[c.activation](h)
        y = jnp.einsum("ebrh,ehd->ebrd", h, down.astype(dtype))
        if c.bias:
            y = y + self.param("experts_down_bias", nn.initializers.zeros, (m.experts, 1, d), param_dtype)[:, None]
        return y
