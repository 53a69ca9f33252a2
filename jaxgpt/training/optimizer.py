"""AdamW (or Muon for the blocks' matrices) with warmup and a cosine or linear decay, global-norm clipping,
and weight decay on matrices only."""

from __future__ import annotations

import dataclasses
import math

import jax
import optax
import optax.contrib

from jaxgpt.config import TrainConfig


def learning_rate_schedule(train: TrainConfig) -> optax.Schedule:
    """Linear warmup from 0 to lr over warmup_steps, then down to min_lr at decay_steps
    (train.steps when 0), then min_lr (optax holds the end value past decay_steps). Down by a
    cosine, or with cooldown_steps, held at lr and then straight down over the last
    cooldown_steps (warmup-stable-decay)."""
    end = train.decay_steps or train.steps
    if not train.cooldown_steps:
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=train.lr,
            warmup_steps=train.warmup_steps,
            decay_steps=end,
            end_value=train.min_lr,
        )
    stable_until = end - train.cooldown_steps
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, train.lr, train.warmup_steps),
            optax.constant_schedule(train.lr),
            optax.linear_schedule(train.lr, train.min_lr, train.cooldown_steps),
        ],
        boundaries=[train.warmup_steps, stable_until],
    )


# jaxgpt/model/moe.py's expert weights: one matrix per expert, stacked (experts, d_in, ..., d_out)
EXPERT_KERNELS = ("experts_up", "experts_down")


def weight_decay_mask(params, decay_embeddings: bool = False):
    """True for the parameters weight decay applies to: every matmul kernel (the experts' too), and the
    embeddings only if asked. Decided by name, not by ndim, because scanned layers give norm
    scales and biases a leading layer axis that makes them look like matrices."""

    def decays(path, _):
        name = path[-1].key
        return name == "kernel" or name in EXPERT_KERNELS or (name == "embedding" and decay_embeddings)

    return jax.tree_util.tree_map_with_path(decays, params)


def muon_dimensions(params):
    """Which axes of each parameter Muon treats as a matrix's input (reduction) and output;
    None hands a parameter to AdamW. Only the blocks' kernels are Muon's: attention's fused
    qkv (d_model -> kv heads x (group + 2) x head_dim), its output (heads -> d_model), and the
    MLP's up and down. Under scan_layers their leading layer axis is a batch axis: each layer's
    matrix is orthogonalised on its own."""
    from optax.contrib import MuonDimensionNumbers

    def dims(path, leaf):
        names = [getattr(p, "key", "") for p in path]
        layer = 1 if names[0] == "blocks" else 0  # scanned: axis 0 is the layer
        if names[-1] in EXPERT_KERNELS:  # the expert axis is a batch axis: each expert's matrix on its own
            return MuonDimensionNumbers(layer + 1, tuple(range(layer + 2, leaf.ndim)))
        if names[-1] != "kernel" or not any(n == "blocks" or n.startswith("block_") for n in names):
            return None
        if names[-2] == "out":  # (heads..., d_model): every axis but the last is input
            return MuonDimensionNumbers(tuple(range(layer, leaf.ndim - 1)), leaf.ndim - 1)
        return MuonDimensionNumbers(layer, tuple(range(layer + 1, leaf.ndim)))  # (d_in, outputs...)

    return jax.tree_util.tree_map_with_path(dims, params)


def make_optimizer(
    train: TrainConfig, schedule: optax.Schedule | None = None, adapters=None
) -> optax.GradientTransformation:
    """train's optimizer, stepping its learning rate by `schedule` (default: the run's). Given
    `adapters`, the ModelConfig of a model with low-rank adapters (jaxgpt/model/lora.py), it
    updates what that model trains alone (`lora.trains`), clipping by those gradients' norm;
    every other parameter gets no update and no state."""
    update = _optimizer(train, schedule or learning_rate_schedule(train))
    if adapters is not None:
        from jaxgpt.model.lora import adapter_labels

        frozen = optax.set_to_zero()
        return optax.multi_transform({"adapter": update, "frozen": frozen}, adapter_labels(adapters))
    return update


def _optimizer(train: TrainConfig, schedule: optax.Schedule) -> optax.GradientTransformation:
    if train.optimizer == "muon":
        muon, momentum = optax.contrib.muon, train.muon_momentum
        if train.muon_momentum_warmup:  # optax's Muon takes its momentum as a number: fed one each step
            muon = optax.inject_hyperparams(muon, static_args="muon_weight_dimension_numbers")
            momentum = optax.linear_schedule(train.muon_momentum_start, train.muon_momentum, train.muon_momentum_warmup)
        update = muon(
            lambda step: schedule(step) * (train.muon_lr / train.lr),
            beta=momentum,
            weight_decay=train.weight_decay,
            adam_b1=train.beta1,
            adam_b2=train.beta2,
            adam_learning_rate=schedule,
            muon_weight_dimension_numbers=muon_dimensions,
        )
    else:
        update = optax.adamw(
            schedule,
            b1=train.beta1,
            b2=train.beta2,
            weight_decay=train.weight_decay,
            mask=lambda params: weight_decay_mask(params, train.decay_embeddings),
        )
    if train.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(train.grad_clip), update)
    return update


def schedule_change_note(saved_train: dict, train: TrainConfig, step: int) -> str | None:
    """Raising train.steps moves the end of the decay (the cosine's, or the cooldown's): a run
    past its decay's start would continue at a higher learning rate than it had. Say so, and
    how to avoid it. `saved_train`: the train fields a checkpoint's record holds."""
    saved_values = {
        k: saved_train.get(k, 0) for k in ("steps", "decay_steps", "cooldown_steps", "warmup_steps", "lr", "min_lr")
    }
    saved = dataclasses.replace(train, **saved_values)
    before = float(learning_rate_schedule(saved)(step))
    now = float(learning_rate_schedule(train)(step))
    if math.isclose(before, now, rel_tol=1e-3):
        return None
    return (
        f"note: the learning rate at step {step} is now {now:.3g} (the run was at {before:.3g}): the new "
        f"train settings move the schedule. To continue a finished decay at min_lr instead, add "
        f"--config.train.decay_steps={saved.decay_steps or saved.steps}"
    )
