"""Generation with the KV cache: prefill the prompt in one pass, then one token per step.

`generate` compiles the whole decode loop (`lax.while_loop`) into one program; `generate_stream`
runs the same step from Python to hand each token over as it is made. Both draw step i's
randomness from fold_in(rng, i), so for one seed they produce the same tokens.

Sampling order is the usual one: temperature, then top-k, then top-p (nucleus; Holtzman et al.
2020). Temperature 0 is greedy decoding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.errors import UserError
from jaxgpt.model.transformer import GPT, init_cache


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """temperature: 0 is greedy; < 1 sharpens, > 1 flattens the distribution.
    top_k: keep only the k most likely tokens (None: all).
    top_p: keep the smallest set of most likely tokens whose probability reaches p (1: all)."""

    temperature: float = 0.8
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self):
        if self.temperature < 0:
            raise UserError(f"temperature={self.temperature} must be >= 0 (0 means greedy)")
        if self.top_k is not None and self.top_k <= 0:
            raise UserError(f"top_k={self.top_k} must be a positive number of tokens (leave it unset to keep all)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p={self.top_p} must be in (0, 1] (1 keeps every token)")


def filter_logits(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """Scaled logits (..., vocab) with the tokens top-k and top-p exclude set to -inf."""
    logits = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth_largest = jax.lax.top_k(logits, sampling.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    if sampling.top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_probs = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), order, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        # A token stays if the more likely tokens before it have not yet reached p: that is
        # the smallest prefix whose mass is >= p (the most likely token always stays).
        keep_sorted = mass_before < sampling.top_p
        keep = jnp.take_along_axis(keep_sorted, jnp.argsort(order, axis=-1), axis=-1)  # undo the sort
        logits = jnp.where(keep, logits, -jnp.inf)
    return logits


def sample_token(logits: jax.Array, rng: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """One token id per row of logits (batch, vocab)."""
    if sampling.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(rng, filter_logits(logits, sampling), axis=-1).astype(jnp.int32)


def filter_rows(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """`filter_logits` with each row's own settings, as arrays (rows,) a compiled program takes:
    a server's slots each serve their own request (top_k 0 keeps every token, top_p 1 too). The
    same operations in the same order, so a row's result equals filter_logits's for its
    settings (tests/test_serve.py); the sort is skipped where no row asks for top-k or top-p."""
    logits = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]

    def filtered(logits):
        vocab = logits.shape[-1]
        k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
        kth_largest = jnp.take_along_axis(-jnp.sort(-logits, axis=-1), (k - 1)[:, None], axis=-1)
        logits = jnp.where((top_k[:, None] > 0) & (logits < kth_largest), -jnp.inf, logits)
        order = jnp.argsort(-logits, axis=-1)
        sorted_probs = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), order, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep = jnp.take_along_axis(mass_before < top_p[:, None], jnp.argsort(order, axis=-1), axis=-1)
        return jnp.where(keep | (top_p[:, None] >= 1.0), logits, -jnp.inf)

    return jax.lax.cond(((top_k > 0) | (top_p < 1.0)).any(), filtered, lambda logits: logits, logits)


def sample_rows(logits: jax.Array, keys: jax.Array, temperature, top_k, top_p) -> jax.Array:
    """One token per row of logits (rows, vocab), row r drawn with keys[r] and its own settings:
    what `sample_token` draws for that row alone (temperature 0: the most likely token)."""
    filtered = filter_rows(logits, temperature, top_k, top_p)
    drawn = jax.vmap(lambda key, row: jax.random.categorical(key, row))(keys, filtered)
    return jnp.where(temperature == 0, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)


RELATIVE_POSITIONS = ("rope", "alibi", "none")  # attention depends on distances, not on where the window starts


def check_length(config: ModelConfig, prompt_len: int, max_new_tokens: int) -> None:
    """The prompt must fit the model's context (block_size) with room for a new token. New
    tokens may run past it only where positions are relative: the KV cache rolls (each token
    sees the last block_size), which a table of block_size absolute positions cannot follow."""
    if prompt_len < 1:
        raise UserError("the prompt has no tokens; give at least one (sample.py starts empty prompts from a newline)")
    if prompt_len >= config.block_size:
        raise UserError(
            f"the prompt is {prompt_len} tokens but the model's context (block_size) is {config.block_size}; "
            f"shorten it to at most {config.block_size - 1} tokens to leave room for new ones"
        )
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens={max_new_tokens} must be at least 1")
    if prompt_len + max_new_tokens > config.block_size and config.position not in RELATIVE_POSITIONS:
        room = config.block_size - prompt_len
        raise UserError(
            f"max_new_tokens={max_new_tokens} does not fit: after this {prompt_len}-token prompt the model's "
            f"{config.block_size}-token context has room for {room} more, and its {config.position} positions "
            f"stop there. Ask for at most {room} (or a shorter prompt); models with rope, alibi or none "
            "positions generate past it"
        )


def for_decoding(config: ModelConfig, tokens: int) -> ModelConfig:
    """`config` with a KV cache of `tokens` slots where a decode needs no more (a prompt and its
    new tokens), not block_size's: the same model wherever no parameter has block_size's length
    and no position reads it (not learned positions; not LongRoPE, whose factors follow it).
    Llama 3.2's 131,072 slots made every decoding step read a cache of that length."""
    keeps_its_size = config.position == "learned" or (config.rope_scaling and config.rope_scaling.kind == "longrope")
    if keeps_its_size or tokens >= config.block_size:
        return config
    return config.replace(block_size=tokens)


def decoding_model(config: ModelConfig, tokens: int | None = None) -> ModelConfig:
    """The model as the commands decode with it: the trained weights in float32 (no speed to win
    on a CPU, and greedy text exact), the attention kernel this backend runs outside training,
    and with `tokens`, a cache of that many slots (`for_decoding`)."""
    from jaxgpt.model.kernels import kernel_fallback

    config = config.replace(dtype="float32")
    config = config.replace(attention=kernel_fallback(config.attention, jax.default_backend(), training=False))
    return config if tokens is None else for_decoding(config, tokens)


def prefill(
    config: ModelConfig, params, prompt: jax.Array, rng: jax.Array, sampling: SamplingConfig, memory=None, cache=None
):
    """Run the prompt through the model in one call, filling a new KV cache (or continuing
    `cache`, which holds what came before it: a chat's earlier turns): (first sampled token
    (batch,), cache). An encoder–decoder is given its encoder's output, `memory` (`encode`),
    at every step: cross-attention reads it whole each time."""
    apply = partial(GPT(config).apply, decode=True, mutable=["cache"], **encoded(memory))
    cache = init_cache(config, prompt.shape[0]) if cache is None else cache
    logits, state = apply({"params": params, "cache": cache}, prompt)
    return sample_token(logits[:, -1], jax.random.fold_in(rng, 0), sampling), state["cache"]


def decode_step(
    config: ModelConfig, params, cache, token: jax.Array, rng: jax.Array, i, sampling: SamplingConfig, memory=None
):
    """Feed `token` (batch,), made at step i - 1, and sample step i's token."""
    apply = partial(GPT(config).apply, decode=True, mutable=["cache"], **encoded(memory))
    logits, state = apply({"params": params, "cache": cache}, token[:, None])
    return sample_token(logits[:, -1], jax.random.fold_in(rng, i), sampling), state["cache"]


def encode(config: ModelConfig, params, sources: jax.Array) -> jax.Array:
    """An encoder–decoder's encoder output for sources (batch, source seq): what every decoding
    step's cross-attention reads."""
    return GPT(config).apply({"params": params}, None, sources=sources, encode_only=True)


def encoded(memory) -> dict:
    return {} if memory is None else {"memory": memory}


class Answering(NamedTuple):
    """How an encoder–decoder is asked a question: the ids its encoder reads for a source text,
    the ids its decoder starts from, and the id that ends its answer. A run trained on pairs
    here frames them with its separator (jaxgpt/data/pairs.py); BART with its own tokens
    (jaxgpt/hf/bart.py)."""

    source: Callable[[str], list[int]]
    start: tuple[int, ...]
    stop: int


def _mask_finished(token: jax.Array, finished: jax.Array, eot_id: int | None) -> tuple[jax.Array, jax.Array]:
    """A row that has emitted eot_id keeps emitting it: (tokens, rows ended so far)."""
    if eot_id is None:
        return token, finished
    token = jnp.where(finished, eot_id, token)
    return token, finished | (token == eot_id)


@partial(jax.jit, static_argnames=("config", "max_new_tokens", "sampling", "eot_id"))
def generate(
    config: ModelConfig,
    params,
    prompt: jax.Array,
    rng: jax.Array,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    eot_id: int | None = None,
    memory: jax.Array | None = None,
) -> jax.Array:
    """prompt (batch, prompt_len) int32 -> (batch, max_new_tokens) new tokens, one compiled loop;
    an encoder–decoder's decoder given its encoder's output `memory` (`encode`).

    After a row emits eot_id the rest of it is eot_id (callers cut there); the loop ends early
    once every row has ended.
    """
    token, cache = prefill(config, params, prompt, rng, sampling, memory)

    def next_token(cache, token, i):
        return decode_step(config, params, cache, token, rng, i, sampling, memory)

    return _decode_loop(token, cache, next_token, max_new_tokens, eot_id)


def _decode_loop(token, cache, next_token, max_new_tokens: int, eot_id: int | None) -> jax.Array:
    """The first new tokens (rows,) and the cache after them -> (rows, max_new_tokens), each step
    next_token(cache, token, i) -> (token, cache), in one compiled loop that ends once every row
    has written eot_id (the rest of a row that has is eot_id)."""
    out = jnp.full((token.shape[0], max_new_tokens), 0 if eot_id is None else eot_id, jnp.int32).at[:, 0].set(token)
    _, finished = _mask_finished(token, jnp.zeros(token.shape, bool), eot_id)

    def keep_going(carry):
        i, _, _, _, finished = carry
        return (i < max_new_tokens) & ~finished.all()

    def step(carry):
        i, token, cache, out, finished = carry
        new, cache = next_token(cache, token, i)
        new, finished = _mask_finished(new, finished, eot_id)
        return i + 1, new, cache, out.at[:, i].set(new), finished

    return jax.lax.while_loop(keep_going, step, (jnp.int32(1), token, cache, out, finished))[3]


def generate_stream(config: ModelConfig, params, prompt: jax.Array, rng: jax.Array, **options) -> Iterator[jax.Array]:
    """The same tokens as `generate`, given its arguments, yielded one step (batch,) at a time
    as they are made."""
    max_new_tokens, eot_id, memory = options["max_new_tokens"], options.get("eot_id"), options.get("memory")
    sampling = options.get("sampling", SamplingConfig())
    assert set(options) <= {"max_new_tokens", "sampling", "eot_id", "memory"}, options
    first = jax.jit(prefill, static_argnames=("config", "sampling"))
    step = jax.jit(decode_step, static_argnames=("config", "sampling"), donate_argnums=(2,))
    token, cache = first(config, params, prompt, rng, sampling=sampling, memory=memory)
    finished = jnp.zeros(prompt.shape[0], bool)
    for i in range(max_new_tokens):
        if i:
            token, cache = step(config, params, cache, token, rng, i, sampling=sampling, memory=memory)
        token, finished = _mask_finished(token, finished, eot_id)
        yield token
        if eot_id is not None and bool(finished.all()):
            return


def answer_each(config: ModelConfig, params, prompts, samples: int, rng: jax.Array, *, most_rows: int, **options):
    """Each prompt (a 1-d array of ids; their lengths may differ) answered `samples` times
    (`options`: max_new_tokens, sampling, eot_id; pad_to, the length every prompt is padded
    to, default the longest given; rows_on, where a call's rows go, a sharding of their leading
    axis, default the default device): a list of (samples, max_new_tokens) arrays, one a prompt, in
    the prompts' order, each row cut as `generate`'s are.

    The prompts' rows go through `generate_rows` together, padded on the right to one length, in
    calls of `most_rows` rows (the last padded with copies): one compiled program serves prompts
    of every length, and a batch of many short prompts costs a few calls, not one a length.
    Sample j of prompt i draws from fold_in(fold_in(rng, i), j), so what a prompt's answers are
    does not depend on which prompts are asked with it or how the rows are split into calls."""
    pad_to = options.pop("pad_to", None) or max(len(p) for p in prompts)
    rows_on = options.pop("rows_on", None)
    rows = [(i, j) for i in range(len(prompts)) for j in range(samples)]
    ids = np.zeros((len(rows), pad_to), np.int32)
    lengths = np.zeros(len(rows), np.int32)
    for r, (i, _) in enumerate(rows):
        ids[r, : len(prompts[i])], lengths[r] = prompts[i], len(prompts[i])
    keys = jax.vmap(lambda i, j: jax.random.fold_in(jax.random.fold_in(rng, i), j))(
        jnp.asarray([i for i, _ in rows]), jnp.asarray([j for _, j in rows])
    )
    new = []
    for first in range(0, len(rows), most_rows):
        take = np.arange(first, first + most_rows) % len(rows)  # the last call padded with rows from the start
        placed = (jax.device_put(rows, rows_on) for rows in (ids[take], lengths[take], keys[take]))
        out = generate_rows(config, params, *placed, **options)
        new.append(np.asarray(out)[: len(rows) - first])
    return list(np.concatenate(new).reshape(len(prompts), samples, -1))


@partial(jax.jit, static_argnames=("config", "max_new_tokens", "sampling", "eot_id"))
def generate_rows(
    config: ModelConfig,
    params,
    prompts: jax.Array,
    lengths: jax.Array,
    keys: jax.Array,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    eot_id: int | None = None,
) -> jax.Array:
    """prompts (rows, padded length) int32, row r's first lengths[r] tokens its prompt, and a key
    a row -> (rows, max_new_tokens) new tokens, one compiled loop, as `generate` would give each
    row alone (step i of row r drawing from fold_in(keys[r], i)). Each row is a one-row decode
    with a KV cache of its own, vmapped, as the server's slots are (jaxgpt/serve/slots.py): its
    prompt prefilled with the padding after it (causal attention keeps the padding out of every
    real position), its cache's position then set to its length, so that its first new token's
    keys overwrite the padding's."""

    def prefill_row(prompt, length, key):
        fresh = init_cache(config, 1)
        logits, state = GPT(config).apply(
            {"params": params, "cache": fresh}, prompt[None], decode=True, mutable=["cache"]
        )
        last = jax.lax.dynamic_index_in_dim(logits[0], length - 1, keepdims=True)
        return sample_token(last, jax.random.fold_in(key, 0), sampling)[0], dict(state["cache"], index=length)

    def decode_row(cache, token, key, i):
        logits, state = GPT(config).apply({"params": params, "cache": cache}, token[None, None], decode=True,
                                          mutable=["cache"])  # fmt: skip
        return sample_token(logits[:, -1], jax.random.fold_in(key, i), sampling)[0], state["cache"]

    token, cache = jax.vmap(prefill_row)(prompts, lengths, keys)

    def next_token(cache, token, i):
        return jax.vmap(decode_row, in_axes=(0, 0, 0, None))(cache, token, keys, i)

    return _decode_loop(token, cache, next_token, max_new_tokens, eot_id)
