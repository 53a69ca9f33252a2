"""Decoding speed: the KV-cache loop against recomputing the whole context for every token.

    python bench/decode.py [--out bench/results/decode.json] [--cached_only]

"cached" is jaxgpt.sampling.generate: one prefill, then one token per step against the static
cache, the loop compiled. "recompute" is nanoGPT's way: each new token runs the full model over
everything so far. To avoid compiling every length, its context is zero-padded up to the next
multiple of 128 (causality keeps the padding invisible); that costs it at most 127 extra
positions per step. Greedy decoding, float32, a 16-token prompt; compile time excluded.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxgpt.config import ModelConfig  # noqa: E402
from jaxgpt.model import GPT, init_params  # noqa: E402
from jaxgpt.sampling import SamplingConfig, _prefill, generate  # noqa: E402

CONFIG = ModelConfig(vocab_size=96, block_size=1152, n_layer=4, n_head=4, d_model=128)  # tiny's shape
PROMPT = 16
BUCKET = 128
GREEDY = SamplingConfig(temperature=0.0)


def cached(params, prompt, new_tokens: int) -> float:
    run = lambda: generate(CONFIG, params, prompt, jax.random.key(0), max_new_tokens=new_tokens, sampling=GREEDY)  # noqa: E731
    run().block_until_ready()  # compile
    start = time.perf_counter()
    run().block_until_ready()
    return time.perf_counter() - start


def recompute(params, prompt, new_tokens: int) -> float:
    forward = jax.jit(lambda p, t: GPT(CONFIG).apply({"params": p}, t))
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


def prefill_ms(params, prompt_len: int) -> float:
    prompt = jnp.ones((1, prompt_len), jnp.int32)
    fn = jax.jit(_prefill, static_argnames=("config", "sampling"))
    fn(CONFIG, params, prompt, jax.random.key(0), sampling=GREEDY)[0].block_until_ready()
    start = time.perf_counter()
    fn(CONFIG, params, prompt, jax.random.key(0), sampling=GREEDY)[0].block_until_ready()
    return 1000 * (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/decode.json")
    parser.add_argument(
        "--cached_only", action="store_true", help="print one JSON line: cached tokens/s (for suite.py)"
    )
    args = parser.parse_args()
    params = jax.jit(init_params, static_argnums=0)(CONFIG, jax.random.key(0))
    if args.cached_only:
        rates = {
            f"batch_{batch}": batch * 256 / cached(params, jnp.ones((batch, PROMPT), jnp.int32), 256)
            for batch in (1, 8)
        }
        print(json.dumps({"new_tokens": 256, "tokens_per_sec": rates}))
        return
    rows = []
    print(f"{'batch':>5} {'new tokens':>10} {'cached tok/s':>13} {'recompute tok/s':>16} {'speedup':>8}")
    for batch in (1, 8):
        for new_tokens in (256, 1024):
            prompt = jnp.ones((batch, PROMPT), jnp.int32)
            fast, slow = cached(params, prompt, new_tokens), recompute(params, prompt, new_tokens)
            row = {
                "batch": batch,
                "new_tokens": new_tokens,
                "cached_tokens_per_sec": batch * new_tokens / fast,
                "recompute_tokens_per_sec": batch * new_tokens / slow,
                "speedup": slow / fast,
            }
            rows.append(row)
            print(
                f"{batch:>5} {new_tokens:>10} {row['cached_tokens_per_sec']:>13,.0f} "
                f"{row['recompute_tokens_per_sec']:>16,.0f} {row['speedup']:>7.1f}x"
            )
    prefill = {n: prefill_ms(params, n) for n in (16, 256, 1024)}
    print("prefill (batch 1): " + ", ".join(f"{n} tokens {ms:.1f} ms" for n, ms in prefill.items()))
    result = {"device": jax.devices()[0].device_kind, "model": CONFIG.to_dict(), "rows": rows, "prefill_ms": prefill}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
