"""Decoding: what the KV cache buys, and what grouped-query and multi-query attention buy it.

    python bench/decode.py [--config configs/tiny.py] [--config.model.n_layer=8 ...]
        [--contexts 128,512,1024,2048,4096] [--out bench/results/decode.json] [--cached_only]

The model is the config's (random weights, float32 as sample.py decodes; --vocab sets the
vocabulary a data-derived config leaves open). Two tables:

1. The cache against recomputing. "cached" is jaxgpt.model.sampling.generate: one prefill, then one
   token per step against the static cache, the loop compiled. "recompute" is nanoGPT's way:
   each new token runs the whole model over everything so far; to avoid compiling every
   length its context is zero-padded to the next multiple of 128 (causality keeps the padding
   invisible), which costs it at most 127 extra positions per step. A 16-token prompt, greedy.
2. Multi-head, grouped-query (n_head / 2 key/value heads) and multi-query attention, at each
   context length C (block_size = C): the cache's bytes per sequence, and decode tokens/s at
   batch 1 and 8 over the last 64 tokens of the context (a prompt of C - 64 tokens prefilled
   untimed, then 64 decode steps in one compiled loop). The cache is read whole at every
   step, so its size is the decode loop's memory traffic.

Compile time excluded; the CPU is named in the table and the JSON.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import flags  # noqa: E402

from jaxgpt.commands import cli  # noqa: E402  (imports jax without starting it)

CONFIG = cli.define_config_flag()
VOCAB = flags.DEFINE_integer("vocab", 96, "vocabulary size where the config leaves it to the data (96: characters)")
CONTEXTS = flags.DEFINE_list("contexts", ["128", "512", "1024", "2048", "4096"], "context lengths for table 2")
OUT = flags.DEFINE_string("out", "bench/results/decode.json", "JSON to write")
CACHED_ONLY = flags.DEFINE_bool("cached_only", False, "print one JSON line: cached tokens/s (for bench/suite.py)")

PROMPT = 16
BUCKET = 128
NEW = 64  # tokens decoded per timing in table 2


def timed(fn, repeats: int = 3) -> float:
    """Seconds of the fastest of `repeats` calls after a first (compiling) one: the least
    disturbed by whatever else the machine is doing."""
    fn().block_until_ready()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn().block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def cached(model, params, prompt, new_tokens: int) -> float:
    import jax

    from jaxgpt.model.sampling import SamplingConfig, generate

    greedy = SamplingConfig(temperature=0.0)
    return timed(lambda: generate(model, params, prompt, jax.random.key(0), max_new_tokens=new_tokens, sampling=greedy))


def recompute(model, params, prompt, new_tokens: int) -> float:
    import jax
    import jax.numpy as jnp

    from jaxgpt.model.transformer import GPT

    forward = jax.jit(lambda p, t: GPT(model).apply({"params": p}, t))
    batch, length = prompt.shape
    for size in range(BUCKET, length + new_tokens + BUCKET, BUCKET):  # compile every bucket first
        forward(params, jnp.zeros((batch, size), jnp.int32)).block_until_ready()
    tokens = jnp.zeros((batch, length + new_tokens), jnp.int32).at[:, :length].set(prompt)
    start = time.perf_counter()
    for t in range(length, length + new_tokens):
        padded = tokens[:, : BUCKET * math.ceil(t / BUCKET)]
        next_token = jnp.argmax(forward(params, padded)[:, t - 1], axis=-1)
        tokens = tokens.at[:, t].set(next_token)
    tokens.block_until_ready()
    return time.perf_counter() - start


def weights(model):
    import jax

    from jaxgpt.model.transformer import init_params

    return jax.jit(init_params, static_argnums=0)(model, jax.random.key(0))


def cache_against_recompute(model, say) -> list[dict]:
    import jax.numpy as jnp

    model = model.replace(block_size=max(model.block_size, BUCKET * math.ceil((PROMPT + 1024) / BUCKET)))
    params = weights(model)
    rows = []
    say(f"{'batch':>5} {'new tokens':>10} {'cached tok/s':>13} {'recompute tok/s':>16} {'speedup':>8}")
    for batch, new_tokens in ((1, 256), (1, 1024), (8, 256)):  # recompute at 8 x 1024 alone takes minutes
        prompt = jnp.ones((batch, PROMPT), jnp.int32)
        fast, slow = cached(model, params, prompt, new_tokens), recompute(model, params, prompt, new_tokens)
        row = dict(batch=batch, new_tokens=new_tokens, cached_tokens_per_sec=batch * new_tokens / fast)
        row |= dict(recompute_tokens_per_sec=batch * new_tokens / slow, speedup=slow / fast)
        rows.append(row)
        say(
            f"{batch:>5} {new_tokens:>10} {row['cached_tokens_per_sec']:>13,.0f} "
            f"{row['recompute_tokens_per_sec']:>16,.0f} {row['speedup']:>7.1f}x"
        )
    return rows


def decode_seconds(model, params, batch: int) -> float:
    """Seconds for the last NEW tokens of a full context, one compiled loop of decode steps
    over a cache the prompt (block_size - NEW tokens) was prefilled into; prefill not timed."""
    import jax
    import jax.numpy as jnp

    from jaxgpt.model.sampling import SamplingConfig, decode_step, prefill

    greedy, rng = SamplingConfig(temperature=0.0), jax.random.key(0)
    prompt = jnp.ones((batch, model.block_size - NEW), jnp.int32)
    token, cache = jax.jit(prefill, static_argnums=(0, 4))(model, params, prompt, rng, greedy)

    @jax.jit
    def decode(params, cache, token):
        def step(i, carry):
            return decode_step(model, params, carry[1], carry[0], rng, i, greedy)

        return jax.lax.fori_loop(1, NEW + 1, step, (token, cache))[0]

    return timed(lambda: decode(params, cache, token))


def attention_variants(model) -> dict[str, int]:
    """name -> n_kv_head: every head its own keys and values, half as many, one for all."""
    variants = {"MHA": model.n_head}
    if model.n_head % 2 == 0 and model.n_head > 2:
        variants["GQA"] = model.n_head // 2
    variants["MQA"] = 1
    return variants


def key_value_heads_by_context(model, contexts: list[int], say) -> list[dict]:

    from jaxgpt.model.kv_cache import cache_bytes

    rows = []
    say(f"{'attention':>9} {'kv heads':>8} {'context':>7} {'cache MiB':>9} {'tok/s b=1':>10} {'tok/s b=8':>10}")
    for name, kv_heads in attention_variants(model).items():
        for context in contexts:
            variant = model.replace(n_kv_head=kv_heads, block_size=context)
            params = weights(variant)
            row = dict(attention=name, n_kv_head=kv_heads, context=context)
            row["cache_bytes_per_sequence"] = cache_bytes(variant, context)
            for batch in (1, 8):
                row[f"decode_tokens_per_sec_batch_{batch}"] = batch * NEW / decode_seconds(variant, params, batch)
            rows.append(row)
            say(
                f"{name:>9} {kv_heads:>8} {context:>7} {row['cache_bytes_per_sequence'] / 2**20:>9.2f} "
                f"{row['decode_tokens_per_sec_batch_1']:>10,.0f} {row['decode_tokens_per_sec_batch_8']:>10,.0f}"
            )
    return rows


def shipped(name: str):
    """A shipped config's ConfigDict, for when no --config is given."""
    import runpy

    return runpy.run_path(cli.shipped_config(f"configs/{name}.py"))["get_config"]()


def main() -> None:
    cli.parse_flags(sys.argv, usage=__doc__)
    config = CONFIG.value if CONFIG.value is not None else shipped("tiny")
    from jaxgpt.config_files import resolve
    from jaxgpt.hardware import runtime
    from jaxgpt.hardware.peak_flops import cpu_model

    runtime.enable_compilation_cache()
    import jax
    import jax.numpy as jnp

    run = resolve(config, vocab_size=config.model.get("vocab_size") or VOCAB.value)
    model = run.model.replace(dtype="float32", scan_layers=False, remat="none")
    if CACHED_ONLY.value:
        long_enough = model.replace(block_size=max(model.block_size, PROMPT + 256))
        params = weights(long_enough)
        rates = {
            f"batch_{b}": b * 256 / cached(long_enough, params, jnp.ones((b, PROMPT), jnp.int32), 256) for b in (1, 8)
        }
        print(json.dumps({"new_tokens": 256, "tokens_per_sec": rates}))
        return
    device = jax.devices()[0]
    machine = cpu_model() if device.platform == "cpu" else device.device_kind
    print(f"{machine}; model {model.n_layer} layers x {model.d_model} wide, {model.n_head} heads, float32")
    contexts = sorted(int(c) for c in CONTEXTS.value)
    result = {
        "device": machine,
        "model": model.to_dict(),
        "cache_against_recompute": cache_against_recompute(model, print),
        "key_value_heads": key_value_heads_by_context(model, contexts, print),
    }
    Path(OUT.value).parent.mkdir(parents=True, exist_ok=True)
    Path(OUT.value).write_text(json.dumps(result, indent=2))
    print(f"wrote {OUT.value}")


if __name__ == "__main__":
    main()
