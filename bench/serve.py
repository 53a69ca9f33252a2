"""Serving: what continuous batching buys, through HTTP on loopback.

    python bench/serve.py [--config configs/tiny.py] [--config.model.n_layer=8 ...]
        [--requests 32] [--prompt_tokens 32] [--max_tokens 64] [--clients 1,4,16] [--slots 16]
        [--rounds 3] [--max_seconds 900] [--out bench/results/serve.json]

The config's model with random weights (as sample.py decodes: float32) is served by jaxgpt's
engine and app under uvicorn, in this process, on a free 127.0.0.1 port; clients are threads
posting to /v1/completions with "stream": true, as a chat page does. Every request has a prompt of
--prompt_tokens token ids, asks for --max_tokens tokens at temperature 0.8 with its own seed, and
has no stop, so each makes exactly --max_tokens.

Two servers run side by side: the baseline, one slot with the requests sent one at a time (what
a server without batching does), and one of --slots slots at each count of concurrent clients in
--clients, the same requests shared among them. A round measures every row in turn, and --rounds
rounds interleave them, so a change in the machine's load between rows moves every row of a
round alike. Per row: aggregate tokens/s (all tokens made over the wall time from the first
request sent to the last answer's end), the median and the slowest time to first token, and
tokens per decoding step (how full the batch ran), each the median over the rounds; the ratio is
the median over the rounds of that row's tokens/s over the same round's baseline, with the
rounds' range. Compile time is excluded (the engines compile every program before their servers
listen). The run stops early at --max_seconds, saying so. The CPU is named in the table and the
JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import flags  # noqa: E402

from jaxgpt.commands import cli  # noqa: E402  (imports jax without starting it)

CONFIG = cli.define_config_flag()
VOCAB = flags.DEFINE_integer("vocab", 96, "vocabulary size where the config leaves it to the data (96: characters)")
REQUESTS = flags.DEFINE_integer("requests", 32, "requests in each row")
PROMPT_TOKENS = flags.DEFINE_integer("prompt_tokens", 32, "tokens in each prompt")
MAX_TOKENS = flags.DEFINE_integer("max_tokens", 64, "tokens each request makes")
CLIENTS = flags.DEFINE_list("clients", ["1", "4", "16"], "concurrent clients, a row each")
SLOTS = flags.DEFINE_integer("slots", 16, "slots of the batched server")
ROUNDS = flags.DEFINE_integer("rounds", 3, "rounds of every row, interleaved")
MAX_SECONDS = flags.DEFINE_float("max_seconds", 900, "stop after this long, with the rounds measured so far")
OUT = flags.DEFINE_string("out", "bench/results/serve.json", "JSON to write")


def serve(model, params, tokenizer, slots: int):
    """(base URL, engine, stop function) of an in-process server of `slots` slots."""
    from jaxgpt.serve.app import Background, Served
    from jaxgpt.serve.engine import Engine

    engine = Engine(model, params, tokenizer, slots=slots, progress=lambda _: None)
    engine.start()
    server = Background(Served(engine, tokenizer, "bench", stop_id=None))

    def stop():
        server.stop()
        engine.stop()

    return server.url, engine, stop


def one_request(url: str, prompt: list[int], seed: int, max_tokens: int, started: float) -> dict:
    """Stream one completion: its tokens and the seconds to its first and last piece."""
    import httpx2 as httpx

    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "seed": seed, "stream": True}
    sent = time.perf_counter()
    first, text = None, ""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice["text"]:
                first = first or time.perf_counter()
                text += choice["text"]
    done = time.perf_counter()
    return {"ttft_s": first - sent, "end_s": done - started, "tokens": len(text)}  # a character a token (below)


def clients_run(url: str, prompts: list[list[int]], clients: int, max_tokens: int, deadline_s: float) -> list[dict]:
    """The requests shared among `clients` threads, each sending its share one after another
    (run in a process of its own: the clients' parsing does not share the server's interpreter)."""
    started = time.perf_counter()
    deadline = started + deadline_s

    def client(k: int) -> list[dict]:
        return [
            one_request(url, prompts[i], i, max_tokens, started)
            for i in range(k, len(prompts), clients)
            if time.perf_counter() < deadline
        ]

    with ThreadPoolExecutor(clients) as pool:
        return [r for share in pool.map(client, range(clients)) for r in share]


def measure(url: str, engine, prompts: list[list[int]], clients: int, deadline: float) -> dict | None:
    import multiprocessing

    steps_before = engine.steps
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        left = deadline - time.perf_counter()
        results = pool.apply(clients_run, (url, prompts, clients, MAX_TOKENS.value, left))
    if len(results) < len(prompts):
        return None
    wall = max(r["end_s"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    ttfts = [r["ttft_s"] for r in results]
    steps = engine.steps - steps_before
    return {
        "clients": clients,
        "requests": len(results),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_sec": tokens / wall,
        "ttft_median_s": statistics.median(ttfts),
        "ttft_max_s": max(ttfts),
        "decode_steps": steps,
        "tokens_per_step": (tokens - len(results)) / max(steps, 1),  # each request's first token is its prefill's
    }


def main() -> None:
    cli.parse_flags(sys.argv, usage=__doc__)
    import runpy

    config = CONFIG.value or runpy.run_path(cli.shipped_config("configs/tiny.py"))["get_config"]()
    from jaxgpt.config_files import resolve
    from jaxgpt.hardware import runtime
    from jaxgpt.hardware.peak_flops import cpu_model, cpuinfo

    runtime.configure()
    runtime.enable_compilation_cache()
    import jax
    import numpy as np

    from jaxgpt.model.sampling import decoding_model
    from jaxgpt.model.transformer import init_params
    from jaxgpt.tokenizers import CharTokenizer

    run = resolve(config, vocab_size=config.model.get("vocab_size") or VOCAB.value)
    context = PROMPT_TOKENS.value + MAX_TOKENS.value
    if context > run.model.block_size and run.model.position == "learned":
        cli.fail(f"--prompt_tokens + --max_tokens = {context} is over the model's {run.model.block_size} positions")
    model = decoding_model(run.model.replace(block_size=max(run.model.block_size, context), scan_layers=False), context)
    params = jax.jit(init_params, static_argnums=0)(model, jax.random.key(0))
    tokenizer = CharTokenizer("".join(chr(32 + i) for i in range(model.vocab_size)))  # a text for each id
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, model.vocab_size, PROMPT_TOKENS.value).tolist() for _ in range(REQUESTS.value)]
    info = cpuinfo()
    cpu = f"{cpu_model()} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    print(f"{cpu}, {jax.device_count()} CPU devices; model {model.n_layer} layers x {model.d_model} wide, "
          f"vocabulary {model.vocab_size}, float32; {REQUESTS.value} requests of {PROMPT_TOKENS.value} prompt tokens "
          f"making {MAX_TOKENS.value} each, streamed over loopback HTTP")  # fmt: skip
    deadline = time.perf_counter() + MAX_SECONDS.value
    plan = [(1, 1)] + [(SLOTS.value, int(c)) for c in CLIENTS.value]  # (slots, clients) a row
    servers = {slots: serve(model, params, tokenizer, slots) for slots in (1, SLOTS.value)}
    rounds: list[list[dict]] = []
    try:
        while len(rounds) < ROUNDS.value:
            measured = [measure(*servers[slots][:2], prompts, clients, deadline) for slots, clients in plan]
            if None in measured:
                print(f"stopped at --max_seconds={MAX_SECONDS.value:g} after {len(rounds)} rounds")
                break
            rounds.append(measured)
    finally:
        for _, _, stop in servers.values():
            stop()
    rows = []
    for k, (slots, clients) in enumerate(plan):
        of_row = [measured[k] for measured in rounds]
        ratios = [measured[k]["tokens_per_sec"] / measured[0]["tokens_per_sec"] for measured in rounds]
        row = {"slots": slots, "clients": clients, "baseline": k == 0, "rounds": of_row}
        for key in ("tokens_per_sec", "ttft_median_s", "ttft_max_s", "tokens_per_step"):
            row[key] = statistics.median(r[key] for r in of_row)
        row |= {"ratio_to_baseline": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}
        rows.append(row)
    print(f"{'server':<24}{'clients':>8}{'tokens/s':>10}{'ratio':>7}{'(rounds)':>14}{'TTFT median':>13}{'TTFT max':>10}"
          f"{'tokens/step':>13}")  # fmt: skip
    for r in rows:
        name = "one slot, one at a time" if r["baseline"] else f"{r['slots']} slots"
        spread = f"{r['ratio_range'][0]:.1f}-{r['ratio_range'][1]:.1f}x"
        ttft = f"{r['ttft_median_s'] * 1000:>11.0f}ms{r['ttft_max_s'] * 1000:>8.0f}ms"
        print(f"{name:<24}{r['clients']:>8}{r['tokens_per_sec']:>10,.0f}{r['ratio_to_baseline']:>6.1f}x{spread:>14}"
              f"{ttft}{r['tokens_per_step']:>13.1f}")  # fmt: skip
    result = {"device": cpu, "model": model.to_dict(), "requests": REQUESTS.value,
              "prompt_tokens": PROMPT_TOKENS.value, "max_tokens": MAX_TOKENS.value, "rounds": len(rounds),
              "rows": rows}  # fmt: skip
    Path(OUT.value).parent.mkdir(parents=True, exist_ok=True)
    Path(OUT.value).write_text(json.dumps(result, indent=2))
    print(f"wrote {OUT.value}")


if __name__ == "__main__":
    main()
