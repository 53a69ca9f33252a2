"""The lab inside the training loop: what the heads and layers do, measured at every evaluation
(train.lab), so a run's metrics show when a circuit forms (Olsson et al. 2022: induction heads
appear in a phase change, as the in-context loss falls).

Each measure is a small function of one forward pass over a fixed probe made once a run, and all
the asked-for measures are one compiled program (`Watch.measure`), run beside evaluation:

  induction       per head, on random tokens repeated twice: the attention each token of the
                  second copy pays to the token after its first occurrence (1: a perfect
                  induction head; jaxgpt/lab/capture.py's induction_scores)
  previous_token  per head, on the same tokens: the attention each query pays to the token
                  just before it (1: a previous-token head)
  entropy         per head, on held-out text: the attention pattern's entropy in nats, averaged
                  over queries (near ln t at init, when every key weighs alike; falls as heads
                  specialise)
  logit_lens      per layer, on held-out text: the next-token loss of the residual stream read
                  out through the final norm and head before block 0 and after each block
  dla             per head, on the repeated tokens' second copy: its direct logit attribution
                  to the token that comes next (what it writes, through the final norm held at
                  the last stream's scale, onto that token's unembedding minus the mean one)
  norms           per layer, on held-out text: the residual stream's mean L2 norm at each layer
                  boundary
  probe           per layer, on held-out text: a linear probe's balanced accuracy (0.5: chance)
                  at telling from the residual stream at each layer boundary whether the token
                  there appeared earlier in its window; fitted in closed form (ridge regression
                  onto +-1, its sign the guess) on half the probe's rows, scored on the others

Beside them, always: every head's attention pattern on the text probe's first PATTERN_TOKENS
tokens ("lab_pattern", with those tokens' ids as "lab_pattern_tokens"), small enough to keep at
each evaluation, for the timeline's step slider (jaxgpt/lab/timeline.py).

The probes come from the run's seed and its validation split, so a resumed run measures the
same prompts and continues the same curves. The record holds each measure as lists
("lab_induction": a list per layer of a value per head), and TensorBoard one scalar per head or
layer ("lab/induction/block_1/head_3").
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.config.run import LAB_MEASURES, lab_measures
from jaxgpt.lab.capture import attention_site, repeated_random_tokens
from jaxgpt.model.sites import CACHE
from jaxgpt.model.transformer import GPT, head_weights, unstack_blocks

ON_REPEATS = LAB_MEASURES[:3]  # read on random tokens repeated twice
ON_TEXT = LAB_MEASURES[3:]  # read on held-out text
PROBE_TASK_ROWS = 32  # windows of held-out text the linear probe is fitted (even rows) and scored (odd) on
RIDGE = 1e-2  # the probe's ridge, times the mean of its features' squares
PROBE_ROWS = 4  # sequences a probe holds
MAX_HALF = 32  # the repeated probe's half, at most (block_size // 2 below it)
PATTERN_TOKENS = 16  # of the text probe's first row, whose attention patterns each evaluation keeps


def refusal(run) -> str | None:
    """Why a run (a RunConfig) cannot take train.lab's measures, or None."""
    from jaxgpt.lab.patching import attribution_refusal

    if not run.train.lab:
        return None
    m = run.model
    if m.objective != "next_token" or not m.causal or m.encoder_layers or run.data.examples:
        return (
            f"train.lab={run.train.lab!r} reads a causal next-token decoder's attention on plain text; this run "
            "trains another kind of model or reads packed examples: set train.lab=''"
        )
    if "dla" in lab_measures(run.train.lab) and (why := attribution_refusal(m)):
        return f"train.lab asks for dla, and {why}; leave dla out"
    return None


class Watch:
    """The probes and the compiled measures of one run."""

    def __init__(self, config: ModelConfig, lab: str, seed: int, validation_tokens: np.ndarray):
        self.names = lab_measures(lab)
        self.config = config.replace(scan_layers=False, dtype="float32", remat="none", attention="xla")
        half = min(config.block_size // 2, MAX_HALF)
        self.repeats = repeated_random_tokens(config.vocab_size, half, PROBE_ROWS, seed=seed)
        t = config.block_size
        rows = max(1, min(PROBE_ROWS, (len(validation_tokens) - 1) // t))
        window = np.asarray(validation_tokens[: rows * t + 1], np.int32)
        self.text = window[:-1].reshape(rows, t)
        self.targets = window[1:].reshape(rows, t)
        rows = max(2, min(PROBE_TASK_ROWS, len(validation_tokens) // t))
        self.probe_text = np.resize(np.asarray(validation_tokens[: rows * t], np.int32), (rows, t))
        self._measure = jax.jit(partial(measure, self.config, self.names, config.scan_layers))

    def measure(self, params) -> dict:
        """The record's entries: each measure as nested lists of floats."""
        values = jax.device_get(self._measure(params, self.repeats, self.text, self.targets, self.probe_text))
        record = {f"lab_{name}": np.asarray(values[name], np.float64).tolist() for name in self.names}
        k = values["pattern"].shape[-1]
        return record | {
            "lab_pattern": np.round(np.asarray(values["pattern"], np.float64), 4).tolist(),
            "lab_pattern_tokens": self.text[0, :k].tolist(),
        }


def measure(config: ModelConfig, names: tuple[str, ...], scanned: bool, params, repeats, text, targets, probe_text):
    """Every measure in `names` from one forward pass a probe (unscanned, float32)."""
    params = unstack_blocks(params) if scanned else params
    out = {}
    if set(names) & set(ON_REPEATS):
        _, state = GPT(config).apply({"params": params}, repeats, mutable=[CACHE])
        sites = state[CACHE]
        pattern = attention_site(config, sites, "hook_pattern")  # (L, b, H, t, t)
        half = repeats.shape[1] // 2
        if "induction" in names:
            queries = jnp.arange(half, 2 * half)
            out["induction"] = pattern[..., queries, queries - half + 1].mean(axis=(1, -1))
        if "previous_token" in names:
            queries = jnp.arange(1, 2 * half)
            out["previous_token"] = pattern[..., queries, queries - 1].mean(axis=(1, -1))
        if "dla" in names:
            out["dla"] = direct_logit_attribution(config, params, sites, repeats)
    _, state = GPT(config).apply({"params": params}, text, mutable=["intermediates", CACHE])
    pattern = attention_site(config, state[CACHE], "hook_pattern")  # (L, b, H, t, t)
    k = min(PATTERN_TOKENS, text.shape[1])
    out["pattern"] = pattern[:, 0, :, :k, :k]
    if set(names) & set(ON_TEXT):
        if "entropy" in names:
            out["entropy"] = -jax.scipy.special.xlogy(pattern, pattern).sum(-1).mean(axis=(1, -1))
        if "logit_lens" in names:
            lens = state["intermediates"]["logit_lens"][0]  # (L + 1, b, t, vocab)
            picked = jnp.take_along_axis(jax.nn.log_softmax(lens, -1), targets[None, ..., None], -1)
            out["logit_lens"] = -picked.mean(axis=(1, 2, 3))
        if "norms" in names:
            residual = state["intermediates"]["residual"][0]  # (L + 1, b, t, d)
            out["norms"] = jnp.linalg.norm(residual, axis=-1).mean(axis=(1, 2))
    if "probe" in names:
        _, state = GPT(config).apply({"params": params}, probe_text, mutable=["intermediates"])
        out["probe"] = jax.vmap(partial(probe_accuracy, labels=seen_before(probe_text)))(
            state["intermediates"]["residual"][0]
        )
    return out


def seen_before(tokens: jnp.ndarray) -> jnp.ndarray:
    """(b, t) bool: whether each token appeared earlier in its row (the probe's label)."""
    t = tokens.shape[1]
    same = tokens[:, :, None] == tokens[:, None, :]  # (b, query, key)
    return jnp.any(same & (jnp.arange(t)[None, :] < jnp.arange(t)[:, None]), axis=-1)


def probe_accuracy(features: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    """A linear probe of `labels` (b, t) from `features` (b, t, d), positions after the first:
    ridge regression onto +-1 (with a bias) fitted on the even rows, its sign scored on the odd
    ones; the balanced accuracy (the mean of the two classes' recalls: 0.5 is chance whatever
    the classes' shares)."""
    x = jnp.concatenate([features[:, 1:], jnp.ones_like(features[:, 1:, :1])], -1).astype(jnp.float32)
    y = jnp.where(labels[:, 1:], 1.0, -1.0)
    fit_x, fit_y = x[0::2].reshape(-1, x.shape[-1]), y[0::2].reshape(-1)
    gram = fit_x.T @ fit_x
    ridge = RIDGE * jnp.trace(gram) / gram.shape[0]
    w = jnp.linalg.solve(gram + ridge * jnp.eye(gram.shape[0]), fit_x.T @ fit_y)
    guess, truth = (x[1::2] @ w).reshape(-1) > 0, y[1::2].reshape(-1) > 0
    recall = lambda cls: jnp.sum((guess == cls) & (truth == cls)) / jnp.maximum(1, jnp.sum(truth == cls))  # noqa: E731
    return (recall(True) + recall(False)) / 2


def direct_logit_attribution(config: ModelConfig, params, sites, repeats) -> jnp.ndarray:
    """(L, H): each head's write onto the logit of the token that comes next, over the second
    copy's positions, read through the final norm at the last stream's scale (the norm's
    division frozen, as jaxgpt/lab/patching.py's direct_logit_attribution does), against the
    mean token's unembedding."""
    c = config
    half = repeats.shape[1] // 2
    positions = jnp.arange(half, 2 * half - 1)  # whose next token is known: the second copy's
    nxt = repeats[:, positions + 1]  # (b, q)
    weights = head_weights(c, params)
    unembed = weights["embedding"].T if "embedding" in weights else weights["kernel"]  # (D, vocab)
    direction = unembed[:, nxt] - unembed.mean(axis=1)[:, None, None]  # (D, b, q)
    stream = sites[f"block_{c.n_layer - 1}"]["hook_resid_post"][0][:, positions]  # (b, q, D)
    scale = params.get("norm_f", {}).get("scale", jnp.ones(c.d_model))
    if c.norm == "layernorm":
        divisor = jnp.sqrt(jnp.var(stream, -1, keepdims=True) + c.norm_eps)
    elif c.norm == "rmsnorm":
        divisor = jnp.sqrt(jnp.mean(jnp.square(stream), -1, keepdims=True) + c.norm_eps)
    else:
        divisor = jnp.ones_like(stream[..., :1])
    heads = []
    for layer in range(c.n_layer):
        w_o = params[f"block_{layer}"]["attn"]["out"]["kernel"].reshape(c.n_head, c.head_dim, c.d_model)
        z = sites[f"block_{layer}"]["attn"]["hook_z"][0][:, positions]  # (b, q, H, d)
        written = jnp.einsum("bqhd,hdD->bqhD", z, w_o)
        if c.norm == "layernorm":
            written = written - written.mean(-1, keepdims=True)
        read = written * scale / divisor[:, :, None]
        heads.append(jnp.einsum("bqhD,Dbq->h", read, direction) / (nxt.size))
    return jnp.stack(heads)
