"""Which parts of the model carry a behaviour: activation patching, its gradient approximation,
and direct logit attribution (the methods of Meng et al. 2022, Wang et al. 2022 and Nanda 2023,
as TransformerLens's tutorials teach them).

Two prompts that differ where it matters: a clean one, on which the model prefers `answer` to
`wrong` at its last token, and a corrupted one, on which it does not. The metric is the logit
difference logit(answer) - logit(wrong) at each prompt's last token. Patching copies one
activation from the clean run into the corrupted run and measures how much of the difference
comes back, normalised:

    restored = (patched - corrupted) / (clean - corrupted)      1: all of it, 0: none

per (layer, position) of the residual stream entering each block, of attention's and the MLP's
outputs, and per (layer, head) of each head's output before W_O (all positions). Each sweep is
one compiled program (jaxgpt.lab.activations.sweep). Attribution patching estimates the same
table from one forward and one backward pass on the corrupted prompt: the change in the metric
is about the gradient times the change in the activation (first-order Taylor), exact where the
metric is linear in the activation. Direct logit attribution splits the clean logit difference
into what each head, MLP and the embeddings write into the final residual stream, read through
the final norm with its scale frozen at the run's (exact: the parts sum to the difference).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.lab.activations import Edit, run_with_cache, run_with_interventions, sweep
from jaxgpt.model.transformer import head_weights, unstack_blocks

# What each sweep patches: the site in every block, and whether it is swept per position or per head.
SWEEPS = {
    "resid_pre": ("hook_resid_pre", "position"),
    "attn_out": ("hook_attn_out", "position"),
    "mlp_out": ("hook_mlp_out", "position"),
    "head_out": ("attn.hook_z", "head"),
}


class Prompts(NamedTuple):
    """A clean and a corrupted prompt as one batch of two rows (the clean first), padded to one
    length by the batch contract (`segments`: 1 on tokens, 0 on padding, which no token sees),
    each with the position of its last token, and the two answers compared there."""

    tokens: np.ndarray  # (2, t) int32
    inputs: dict  # {"segments": (2, t)} where the two differ in length, else {}
    last: np.ndarray  # (2,)
    answer: int
    wrong: int

    def row(self, i: int) -> tuple[np.ndarray, dict]:
        return self.tokens[i : i + 1], {k: v[i : i + 1] for k, v in self.inputs.items()}


def prompt_pair(clean, corrupted, answer: int, wrong: int) -> Prompts:
    """Prompts from two token lists (which may differ in length) and the two answers' ids."""
    lengths = [len(clean), len(corrupted)]
    t = max(lengths)
    tokens = np.zeros((2, t), np.int32)
    segments = np.zeros((2, t), np.int32)
    for row, seq in enumerate((clean, corrupted)):
        tokens[row, : len(seq)] = seq
        segments[row, : len(seq)] = 1
    inputs = {"segments": segments} if lengths[0] != lengths[1] else {}
    return Prompts(tokens, inputs, np.asarray(lengths) - 1, int(answer), int(wrong))


def logit_difference(logits: jax.Array, last, answer: int, wrong: int) -> jax.Array:
    """logit(answer) - logit(wrong) at each row's last token: (b,) from logits (b, t, vocab)."""
    at_last = logits[jnp.arange(logits.shape[0]), jnp.asarray(last)]
    return at_last[:, answer] - at_last[:, wrong]


class Patching(NamedTuple):
    """A patching table: the logit differences of the clean and corrupted runs, and per sweep
    the fraction restored, (n_layer, t) per position or (n_layer, n_head) per head."""

    clean: float
    corrupted: float
    restored: dict[str, np.ndarray]


def sweeps(config: ModelConfig) -> list[str]:
    """The sweeps a model has: an attention-only one has no MLP to patch."""
    return [kind for kind in SWEEPS if kind != "mlp_out" or config.mlp]


def _site(kind: str, layer: int) -> str:
    return f"blocks.{layer}.{SWEEPS[kind][0]}"


def _baselines(config: ModelConfig, params, prompts: Prompts, names: list[str]):
    """The clean run's activations at `names`, and both runs' logit differences."""
    logits, clean = run_with_cache(config, params, prompts.tokens[:1], names, **prompts.row(0)[1])
    clean_diff = logit_difference(logits, prompts.last[:1], prompts.answer, prompts.wrong)[0]
    tokens, inputs = prompts.row(1)
    corrupted = run_with_interventions(config, params, tokens, {}, **inputs)
    corrupted_diff = logit_difference(corrupted, prompts.last[1:], prompts.answer, prompts.wrong)[0]
    return clean, float(clean_diff), float(corrupted_diff)


def logit_differences(config: ModelConfig, params, prompts: Prompts) -> tuple[float, float]:
    """The clean and the corrupted run's logit differences: what the tables are normalised by
    (equal, there is nothing to restore)."""
    return _baselines(config, params, prompts, [])[1:]


def activation_patching(config: ModelConfig, params, prompts: Prompts, kinds=None, batch_size: int = 16) -> Patching:
    """Patch each clean activation into the corrupted run, one at a time (see the module's
    docstring); `kinds`: which of SWEEPS (default all the model has)."""
    kinds = kinds or sweeps(config)
    layers, t = config.n_layer, prompts.tokens.shape[1]
    names = [_site(kind, layer) for kind in kinds for layer in range(layers)]
    clean, clean_diff, corrupted_diff = _baselines(config, params, prompts, names)
    tokens, inputs = prompts.row(1)

    def restored_fraction(logits):
        diff = logit_difference(logits, prompts.last[1:], prompts.answer, prompts.wrong)[0]
        return (diff - corrupted_diff) / (clean_diff - corrupted_diff)

    restored = {}
    for kind in kinds:
        per = t if SWEEPS[kind][1] == "position" else config.n_head

        def make_edits(i, kind=kind, per=per):
            layer, index = i // per, i % per
            edits = {}
            for l in range(layers):  # noqa: E741
                chosen = ((jnp.arange(per) == index) & (layer == l)).astype(jnp.float32)
                mask = chosen[None, :, None] if SWEEPS[kind][1] == "position" else chosen[None, None, :, None]
                edits[_site(kind, l)] = Edit(mask, clean[_site(kind, l)])
            return edits

        table = sweep(restored_fraction, config, params, tokens, make_edits, layers * per, batch_size, **inputs)
        restored[kind] = np.asarray(table).reshape(layers, per)
    return Patching(clean_diff, corrupted_diff, restored)


def attribution_patching(config: ModelConfig, params, prompts: Prompts, kinds=None) -> Patching:
    """The activation patching table estimated to first order: for each activation, the
    gradient of the corrupted run's logit difference with respect to it times (clean -
    corrupted), summed over its features (and, per head, its positions): one backward pass for
    every sweep (Nanda 2023, "Attribution Patching")."""
    kinds = kinds or sweeps(config)
    names = [_site(kind, layer) for kind in kinds for layer in range(config.n_layer)]
    clean, clean_diff, corrupted_diff = _baselines(config, params, prompts, names)
    tokens, inputs = prompts.row(1)
    _, corrupted = run_with_cache(config, params, tokens, names, **inputs)

    def corrupted_difference(adds):
        edits = {name: Edit(add=add) for name, add in adds.items()}
        logits = run_with_interventions(config, params, tokens, edits, **inputs)
        return logit_difference(logits, prompts.last[1:], prompts.answer, prompts.wrong)[0]

    gradients = jax.grad(corrupted_difference)({name: jnp.zeros_like(a) for name, a in corrupted.items()})
    restored = {}
    for kind in kinds:
        rows = []
        for layer in range(config.n_layer):
            name = _site(kind, layer)
            change = (clean[name] - corrupted[name]) * gradients[name]  # (1, t, D) or (1, t, H, d)
            rows.append(change[0].sum(-1) if SWEEPS[kind][1] == "position" else change[0].sum((0, 2)))
        restored[kind] = np.asarray(jnp.stack(rows)) / (clean_diff - corrupted_diff)
    return Patching(clean_diff, corrupted_diff, restored)


class LogitAttribution(NamedTuple):
    """The clean logit difference split into what each part writes into the residual stream,
    read through the final norm with its scale frozen: the parts sum to `total`."""

    total: float  # the logit difference itself
    embeddings: float  # the stream entering the first block
    heads: np.ndarray  # (n_layer, n_head)
    attention_bias: np.ndarray  # (n_layer,): the output projection's bias (0 without biases)
    mlp: np.ndarray  # (n_layer,): what each MLP (or the experts) writes
    constant: float  # the final norm's bias and the LM head's per-token bias


def attribution_refusal(c: ModelConfig) -> str | None:
    """Why direct logit attribution cannot split this model's logits, or None: it needs the
    final stream read through a norm and a linear head, and the stream a sum of the parts."""
    lacking = (
        f"a model whose blocks norm what they write (norm_position={c.norm_position!r})" * (c.norm_position != "pre")
        or "a head transform (head_transform)" * bool(c.head_transform)
        or "a soft cap on the logits (logit_softcap)" * bool(c.logit_softcap)
        or "blocks without residual connections (residual=False)" * (not c.residual)
        or "an encoder–decoder (encoder_layers)" * bool(c.encoder_layers)
    )
    return f"direct logit attribution needs a linear readout of a sum of parts; {lacking} has none" if lacking else None


def direct_logit_attribution(config: ModelConfig, params, tokens, last: int, answer: int, wrong: int):
    """Direct logit attribution (Elhage et al. 2021) of one prompt (1, t) at position `last`,
    for a pre-norm decoder with a linear readout (no head transform, no soft cap)."""
    c = config
    refusal = attribution_refusal(c)
    if refusal:
        raise ValueError(refusal)
    names = ["blocks.0.hook_resid_pre", f"blocks.{c.n_layer - 1}.hook_resid_post"]
    names += [f"blocks.{layer}.attn.hook_z" for layer in range(c.n_layer)]
    names += [f"blocks.{layer}.hook_mlp_out" for layer in range(c.n_layer) if c.mlp]
    logits, cache = run_with_cache(c, params, tokens, names)
    total = float(logit_difference(logits, [last], answer, wrong)[0])
    plain = unstack_blocks(params) if c.scan_layers else params
    weights = head_weights(c, plain)
    unembed = weights["embedding"].T if "embedding" in weights else weights["kernel"]  # (D, vocab)
    direction = jnp.asarray(unembed[:, answer] - unembed[:, wrong], jnp.float32)
    stream = cache[names[1]][0, last]
    norm = plain.get("norm_f", {})
    scale = norm.get("scale", jnp.ones_like(stream))
    if c.norm == "layernorm":
        sigma = jnp.sqrt(jnp.var(stream) + c.norm_eps)
        read = lambda part: float(jnp.dot(direction, scale * (part - part.mean()) / sigma))  # noqa: E731
    elif c.norm == "rmsnorm":
        rms = jnp.sqrt(jnp.mean(jnp.square(stream)) + c.norm_eps)
        read = lambda part: float(jnp.dot(direction, scale * part / rms))  # noqa: E731
    else:
        read = lambda part: float(jnp.dot(direction, part))  # noqa: E731
    heads = np.zeros((c.n_layer, c.n_head))
    bias = np.zeros(c.n_layer)
    mlp = np.zeros(c.n_layer)
    for layer in range(c.n_layer):
        out = plain[f"block_{layer}"]["attn"]["out"]
        w_o = out["kernel"].reshape(c.n_head, c.head_dim, c.d_model)
        z = cache[f"blocks.{layer}.attn.hook_z"][0, last]  # (H, d)
        for h in range(c.n_head):
            heads[layer, h] = read(z[h] @ w_o[h])
        if "bias" in out:
            bias[layer] = read(out["bias"])
        if c.mlp:
            mlp[layer] = read(cache[f"blocks.{layer}.hook_mlp_out"][0, last])
    constant = float(jnp.dot(direction, norm["bias"])) if "bias" in norm else 0.0
    if c.has_logits_bias:
        constant += float(weights["bias"][answer] - weights["bias"][wrong])
    embeddings = read(cache[names[0]][0, last])
    return LogitAttribution(total, embeddings, heads, bias, mlp, constant)
