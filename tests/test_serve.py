"""jaxgpt serve: the slot programs against `sample`'s decoding, the engine's stop strings, the
OpenAI protocol's refusals, and (the slow set) the server itself through the official `openai`
client, raw HTTP for what a client library would not send, the command, and the chat page in
Chromium.

The models here have random weights: decoding equalities hold whatever the weights, and a random
model's distributions are flat, so a greedy token is decided by small margins: the strictest
case for a comparison of two ways of computing the same logits."""

import contextlib
import json
import math
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt.config import ModelConfig
from jaxgpt.data.conversations import chat_tokenizer
from jaxgpt.model.sampling import (
    SamplingConfig,
    decoding_model,
    filter_logits,
    filter_rows,
    generate,
    sample_rows,
    sample_token,
)
from jaxgpt.model.transformer import GPT, init_params
from jaxgpt.serve.engine import Engine, Finished, Generation, Piece, _Text
from jaxgpt.serve.protocol import ChatRequest, CompletionRequest, validation_error
from jaxgpt.serve.slots import prefill_lengths
from jaxgpt.tokenizers import CharTokenizer

# The first example of `jaxgpt serve --help`, which the command's test runs as written (in a folder
# holding a copy of a trained run as runs/tiny)
HELP_EXAMPLE = "python -m jaxgpt serve --workdir runs/tiny --port 0"

CHARS = "\n !',.?:;-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+="


def small_model(vocab_size: int, block_size: int = 64, **fields) -> tuple[ModelConfig, dict]:
    config = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, block_size=block_size, vocab_size=vocab_size)
    config = config.replace(position="rope", **fields)
    return config, init_params(config, jax.random.key(7))


@pytest.mark.parametrize("seed", range(4))
def test_each_rows_own_settings_filter_and_draw_as_the_one_setting_does_alone(seed):
    """filter_rows with rows of different temperature/top-k/top-p equals filter_logits for each
    row's settings, to the bit (the same operations in order); sample_rows draws what
    sample_token draws for that row alone with that row's key."""
    settings = [(0.0, None, 1.0), (0.7, None, 1.0), (1.0, 5, 1.0), (1.3, None, 0.6), (0.9, 12, 0.8), (1.0, 64, 1.0)]
    logits = jax.random.normal(jax.random.key(seed), (len(settings), 50)) * 3
    temperature = jnp.asarray([t for t, _, _ in settings], jnp.float32)
    top_k = jnp.asarray([k or 0 for _, k, _ in settings], jnp.int32)
    top_p = jnp.asarray([p for _, _, p in settings], jnp.float32)
    filtered = filter_rows(logits, temperature, top_k, top_p)
    keys = jax.random.split(jax.random.key(100 + seed), len(settings))
    drawn = sample_rows(logits, keys, temperature, top_k, top_p)
    for row, (t, k, p) in enumerate(settings):
        alone = SamplingConfig(t, k, p)
        if t:
            np.testing.assert_array_equal(filtered[row], filter_logits(logits[row : row + 1], alone)[0])
        assert int(drawn[row]) == int(sample_token(logits[row : row + 1], keys[row], alone)[0]), (row, alone)
    assert int(drawn[0]) == int(jnp.argmax(logits[0]))
    assert int((filtered[2] > -jnp.inf).sum()) == 5


def test_prompts_pad_to_a_few_lengths_each_four_times_the_last():
    assert prefill_lengths(1024) == (16, 64, 256, 1024)
    assert prefill_lengths(300) == (16, 64, 256, 300)
    assert prefill_lengths(16) == (16,) and prefill_lengths(8) == (8,)


def pieces_of(text: str, stops) -> tuple[list[str], str, bool]:
    """Feed text a character at a time as a generation's tokens: (pieces handed over, the final
    text, whether a stop string ended it)."""
    tokenizer = CharTokenizer(CHARS)
    t, pieces = _Text(tokenizer, tuple(stops)), []
    for token in tokenizer.encode(text):
        if t.add(token):
            break
        piece, _ = t.ready(final=False)
        t.sent += len(piece)
        pieces.append(piece)
    last, _ = t.ready(final=True)
    return [*pieces, last], t.text, t.stopped


def test_a_stop_string_is_never_streamed_even_in_part_and_ends_the_text_before_it():
    pieces, text, stopped = pieces_of("ab\nQ: cd\nA: ef", ["\nA:"])
    assert stopped and text == "ab\nQ: cd" and "".join(pieces) == text
    assert all("\n" not in piece or piece == "\nQ: cd" or piece.startswith("\n") for piece in pieces)
    assert "A" not in "".join(pieces)
    # a prefix of a stop that turns out not to be one is handed over once it is not
    pieces, text, stopped = pieces_of("x\nAy", ["\nA:"])
    assert not stopped and "".join(pieces) == "x\nAy" == text
    assert pieces[1:3] == ["", ""]  # "\n" and "\nA" held back while they could start "\nA:"


def test_half_a_character_is_held_back_until_its_other_bytes_come():
    from jaxgpt.tokenizers import ByteTokenizer

    t = _Text(ByteTokenizer(), ())
    handed = []
    for byte in "né".encode():
        t.add(byte)
        piece, _ = t.ready(final=False)
        t.sent += len(piece)
        handed.append(piece)
    assert handed == ["n", "", "é"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "hi", "temperature": math.nan}, "temperature"),
        ({"prompt": "hi", "temperature": 2.5}, "temperature"),
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 0}, None),  # allowed with echo alone: a model-level complaint
        ({"prompt": "hi", "stop": [f"s{i}" for i in range(100)]}, "stop"),
        ({"prompt": "hi", "stop": [""]}, "stop"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "n": 0}, "n"),
        ({"prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "hi", "frequency_penalty": 0.5}, "frequency_penalty"),
        ({"prompt": "hi", "best_of": 3}, None),
        ({"prompt": "hi", "tempreature": 0.5}, "tempreature"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"temperature": 0}, "prompt"),
    ],
)
def test_a_bad_completion_request_is_refused_naming_its_field(body, param):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate(body)
    refused = validation_error(caught.value.errors())
    assert refused.status == 400 and refused.param == param, refused.message
    assert refused.body()["error"]["type"] == "invalid_request_error" and refused.message


def test_a_bad_chat_request_is_refused_naming_its_field():
    from pydantic import ValidationError

    for body, param in [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 50}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "hi"}], "tools": []}, "tools"),
    ]:
        with pytest.raises(ValidationError) as caught:
            ChatRequest.model_validate(body)
        assert validation_error(caught.value.errors()).param == param, body


def collect(engine: Engine, generations: list[Generation], timeout: float = 60) -> list[tuple[str, list, Finished]]:
    """Submit generations and wait for each: (text, tokens, Finished)."""
    results = [["", [], None] for _ in generations]
    done = threading.Semaphore(0)

    def deliverer(i):
        def deliver(event):
            if isinstance(event, Piece):
                results[i][0] += event.text
                results[i][1] += event.tokens
            else:
                results[i][2] = event
                done.release()

        return deliver

    for i, g in enumerate(generations):
        g.deliver = deliverer(i)
    engine.submit(generations)
    for _ in generations:
        assert done.acquire(timeout=timeout)
    return [tuple(r) for r in results]


@pytest.fixture(scope="module")
def engine():
    """Four slots of a random 2-layer model over a 64-token context, serving one test after another."""
    tokenizer = CharTokenizer(CHARS)
    config, params = small_model(tokenizer.vocab_size)
    served = Engine(decoding_model(config, 64), params, tokenizer, slots=4, progress=lambda _: None)
    served.start()
    yield served, config, params, tokenizer
    served.stop()


def test_requests_decoded_together_get_the_tokens_sample_gets_alone(engine):
    """Seven requests on four slots (three wait and join as others leave; prompts in two prefill
    lengths), greedy and seeded: each request's tokens are `generate`'s for it alone (one row,
    a cache of its own length): the slot a request gets and who shares the step change nothing."""
    served, config, params, tokenizer = engine
    asks = [  # prompt, temperature, top_k, top_p, seed
        ("ROMEO:", 0.0, 0, 1.0, 0), ("a", 0.0, 0, 1.0, 0), ("The quick brown fox jumps over it", 0.0, 0, 1.0, 0),
        ("ROMEO:", 0.9, 0, 1.0, 3), ("b", 1.0, 8, 1.0, 5), ("hello there", 1.2, 0, 0.7, 11), ("x", 0.0, 0, 1.0, 0),
    ]  # fmt: skip
    lengths = [20, 25, 12, 18, 30, 9, 40]
    generations = [
        Generation(tokenizer.encode(p), n, None, temperature=t, top_k=k, top_p=tp, seed=s)
        for (p, t, k, tp, s), n in zip(asks, lengths, strict=True)
    ]
    results = collect(served, generations)
    for (prompt, t, k, tp, seed), n, (text, _, finished) in zip(asks, lengths, results, strict=True):
        ids = tokenizer.encode(prompt)
        alone = generate(
            decoding_model(config, len(ids) + n), params, jnp.asarray([ids], jnp.int32), jax.random.key(seed),
            max_new_tokens=n, sampling=SamplingConfig(t, k or None, tp),
        )[0].tolist()  # fmt: skip
        assert text == tokenizer.decode(alone), prompt
        assert finished == Finished("length", len(ids), n)
    assert served.busy_slots() == 0


def test_echo_reports_each_prompt_tokens_log_probability_under_one_forward_pass(engine):
    """echo with logprobs: the prompt's tokens, the first with none, each next one's
    log-probability equal to a plain forward pass's log-softmax (float32: the padded prefill and
    the unpadded pass sum in other orders, a few ulps of values near 4), and the top
    alternatives sorted, the chosen one among them when it is the likeliest."""
    served, config, params, tokenizer = engine
    ids = tokenizer.encode("To be, or not to be")
    [(text, tokens, finished)] = collect(served, [Generation(ids, 0, None, echo=True, top_logprobs=3)])
    assert text == "To be, or not to be" and finished.completion_tokens == 0
    logprobs = jax.nn.log_softmax(GPT(config).apply({"params": params}, jnp.asarray([ids]))[0], axis=-1)
    assert [t.id for t in tokens] == ids and tokens[0].logprob is None
    expected = [float(logprobs[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    np.testing.assert_allclose([t.logprob for t in tokens[1:]], expected, rtol=0, atol=2e-6)
    for i, t in enumerate(tokens[1:]):
        values = [lp for _, lp in t.top]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert t.top[0][0] == int(jnp.argmax(logprobs[i]))


def test_a_stop_string_and_a_cancelled_request_free_their_slots(engine):
    served, _, _, tokenizer = engine
    ids = tokenizer.encode("ROMEO:")
    [(free_text, _, _)] = collect(served, [Generation(ids, 30, None, temperature=0.0)])
    stop = free_text[5:7]
    [(text, _, finished)] = collect(served, [Generation(ids, 30, None, temperature=0.0, stops=(stop,))])
    assert finished.reason == "stop" and text == free_text[: free_text.index(stop)]
    g = Generation(ids, 50, lambda event: None, temperature=0.0)
    served.submit([g])
    g.cancelled.set()
    deadline = time.monotonic() + 10
    while served.busy_slots() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.busy_slots() == 0


# --- the server, through real clients (the slow set) ---


@contextlib.contextmanager
def running_server(served):
    """`served` behind uvicorn on a free loopback port, in this process (so a test can see its
    engine): yields the base URL, stops the server after."""
    from jaxgpt.serve.app import Background

    server = Background(served)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chat_server():
    """A random model of a char vocabulary with the chat template's markers, served as a chat
    run on four slots, with an API key."""
    from jaxgpt.serve.app import Served

    tokenizer = chat_tokenizer(CharTokenizer(CHARS))
    config, params = small_model(tokenizer.vocab_size)
    engine = Engine(decoding_model(config, 64), params, tokenizer, slots=4, progress=lambda _: None)
    engine.start()
    served = Served(engine, tokenizer, "tiny-chat", stop_id=None, chat=True, api_key="sesame")
    with running_server(served) as url:
        yield url, served, config, params
    engine.stop()


def client(url: str, key: str = "sesame"):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.mark.slow
def test_the_openai_client_chats_streams_and_gets_n_seeded_choices_and_logprobs(chat_server):
    """The official client: a greedy chat answer equals greedy decoding of the template's prompt;
    the stream's pieces join to the same answer; n=3 choices with a seed are the answers of
    seeds s, s+1, s+2 asked one at a time; logprobs name each answer token with its alternatives."""
    from jaxgpt.data.conversations import prompt_ids

    url, served, config, params = chat_server
    openai_client = client(url)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 2 + 2?"}]
    reply = openai_client.chat.completions.create(model="tiny-chat", messages=messages, temperature=0, max_tokens=12)
    ids = prompt_ids(served.tokenizer, messages)
    made = generate(
        decoding_model(config, len(ids) + 12), params, jnp.asarray([ids], jnp.int32), jax.random.key(0),
        max_new_tokens=12, sampling=SamplingConfig(0.0),
    )[0].tolist()  # fmt: skip
    markers = set(served.tokenizer.special_ids.values())  # an answer ends at the first (app.py)
    made = made[: next((i for i, token in enumerate(made) if token in markers), len(made))]
    answer = served.tokenizer.decode(made)
    assert reply.choices[0].message.content == answer and reply.choices[0].message.role == "assistant"
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == len(made)

    stream = openai_client.chat.completions.create(
        model="tiny-chat", messages=messages, temperature=0, max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens

    asked = dict(model="tiny-chat", messages=messages, temperature=1.0, max_tokens=10, seed=40)
    together = openai_client.chat.completions.create(n=3, **asked)
    alone = [openai_client.chat.completions.create(**(asked | {"seed": 40 + k})) for k in range(3)]
    assert [c.message.content for c in together.choices] == [a.choices[0].message.content for a in alone]
    assert len({c.message.content for c in together.choices}) > 1  # a random model's flat distributions

    scored = openai_client.chat.completions.create(
        model="tiny-chat", messages=messages, temperature=0, max_tokens=5, logprobs=True, top_logprobs=2
    )
    content = scored.choices[0].logprobs.content
    assert "".join(t.token for t in content) == scored.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 2 and t.logprob <= 0 and t.token == t.top_logprobs[0].token  # greedy


@pytest.mark.slow
def test_completions_take_token_ids_and_score_them_as_a_forward_pass_does(chat_server):
    """What lm-eval sends: prompts as lists of token ids, echo, logprobs=1, max_tokens=1;
    token_logprobs after the first are the forward pass's log-softmax of each next token."""
    url, served, config, params = chat_server
    tokenizer = served.tokenizer
    prompts = [tokenizer.encode("To be, or not"), tokenizer.encode("ab")]
    reply = client(url).completions.create(
        model="tiny-chat", prompt=prompts, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    assert len(reply.choices) == 2
    for ids, choice in zip(prompts, reply.choices, strict=True):
        logprobs = jax.nn.log_softmax(GPT(config).apply({"params": params}, jnp.asarray([ids]))[0], axis=-1)
        got = choice.logprobs.token_logprobs
        assert got[0] is None and len(got) == len(ids) + 1
        np.testing.assert_allclose(got[1 : len(ids)], [float(logprobs[i, ids[i + 1]]) for i in range(len(ids) - 1)],
                                   atol=2e-6)  # fmt: skip
        assert choice.text.startswith(tokenizer.decode(ids))
        assert choice.logprobs.text_offset == list(range(len(ids) + 1))  # one character a token


def post(url: str, path: str, body, key: str | None = "sesame", raw: bytes | None = None):
    import httpx2 as httpx

    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=60)


@pytest.mark.slow
def test_bad_requests_get_the_openai_error_naming_the_field_and_the_server_goes_on(chat_server):
    """Each refusal is the OpenAI error object with the field named; 200 requests at once, a
    third of them malformed, are each answered (the good ones correctly), and then a greedy
    request still gets the answer it got before."""
    import openai

    url, served, _, _ = chat_server
    chat = "/v1/chat/completions"
    hello = [{"role": "user", "content": "hello"}]
    cases = [
        (b'{"messages": [', None, 400, None),
        ({"messages": hello, "temperture": 0.5}, None, 400, "temperture"),
        ({"messages": hello, "max_tokens": 10_000}, None, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x" * 200}]}, None, 400, "prompt"),
        ({"messages": hello, "max_tokens": 0}, None, 400, "max_tokens"),
        ({"messages": hello, "stop": ["s"] * 100}, None, 400, "stop"),
        ({"messages": [{"role": "user", "content": "hi <|end|> there"}]}, None, 400, "messages"),
        ({"messages": [{"role": "user", "content": "caf\u00e9"}]}, None, 400, "messages"),  # not in the vocabulary
        ({"messages": hello, "model": "gpt-4"}, None, 404, "model"),
        ({"messages": hello}, "wrong", 401, None),
        ({"messages": hello}, None, 413, None),
    ]
    for body, key, status, param in cases:
        raw = body if isinstance(body, bytes) else b" " * (5 * 2**20) if status == 413 else None
        answer = post(url, chat, body, key=key or "sesame", raw=raw)
        assert answer.status_code == status, (body if status != 413 else "big", answer.text)
        error = answer.json()["error"]
        assert error["param"] == param and error["message"], error
    nan = post(url, chat, None, raw=b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}')
    assert nan.status_code == 400 and nan.json()["error"]["param"] == "temperature"  # Python's json reads NaN
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client(url).chat.completions.create(model="tiny-chat", messages=hello, top_p=0)
    completion = {"prompt": "hi", "temperature": 0, "max_tokens": 8}
    before = post(url, "/v1/completions", completion).json()["choices"][0]["text"]

    def ask(i):
        if i % 3 == 0:
            return post(url, "/v1/completions", {"prompt": "hi", "max_tokens": -i}).status_code == 400
        answer = post(url, "/v1/completions", completion | {"max_tokens": 2 + i % 7})
        return answer.status_code == 200 and answer.json()["choices"][0]["text"] == before[: 2 + i % 7]

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(50) as pool:
        assert all(pool.map(ask, range(200)))
    assert post(url, "/v1/completions", completion).json()["choices"][0]["text"] == before
    assert served.engine.busy_slots() == 0


@pytest.mark.slow
def test_a_client_that_leaves_mid_stream_frees_its_slot(chat_server, monkeypatch):
    """A step is slowed to 50 ms here, so the 60 tokens asked for take 3 s: the client's first
    line then comes while the request still holds its slot (on a busy machine a full-speed
    generation can end before the client reads a line), and the slot must be free long before
    the 60th step."""
    import httpx2 as httpx

    import jaxgpt.serve.engine as engine_module

    decode = engine_module.decode_slots

    def slow_decode(*args):
        time.sleep(0.05)
        return decode(*args)

    monkeypatch.setattr(engine_module, "decode_slots", slow_decode)
    url, served, _, _ = chat_server
    body = {"prompt": "a", "max_tokens": 60, "temperature": 0.8, "stream": True}
    headers = {"Authorization": "Bearer sesame"}
    steps = served.engine.steps
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as answer:
        first = next(answer.iter_lines())
        assert first.startswith("data: ")
        assert served.engine.busy_slots() == 1
    deadline = time.monotonic() + 10
    while served.engine.busy_slots() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served.engine.busy_slots() == 0
    assert served.engine.steps - steps < 40, "the slot was held until the generation all but ended"


@pytest.mark.slow
def test_the_command_prints_its_address_serves_the_run_and_stops_cleanly_on_ctrl_c(trained_small_run, tmp_path):
    """The --help's first example, run as written beside a copy of a trained run: one line with
    the address (a free port) once it listens; the run's greedy completion equals
    `sample.py --temperature 0`'s text; chat is refused naming why (the run has no template); a
    second server on that port is one line and exit 2; SIGINT stops the first with "stopped", exit 0."""
    import os
    import queue
    import shlex
    import shutil
    import signal
    import subprocess
    import sys

    import httpx2 as httpx
    from conftest import ROOT, run_script

    shutil.copytree(trained_small_run, tmp_path / "runs" / "tiny")
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    command = [sys.executable, *shlex.split(HELP_EXAMPLE)[1:]]
    server = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    try:
        line = lines.get(timeout=120)
        assert line.startswith("serving tiny ") and " at http://127.0.0.1:" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"
        body = {"prompt": "The ", "max_tokens": 12, "temperature": 0}
        served = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        sampled = run_script("sample.py", "--workdir", str(trained_small_run), "--prompt", "The ",
                             "--max_new_tokens", "12", "--temperature", "0")  # fmt: skip
        assert sampled.returncode == 0, sampled.stderr
        assert sampled.stdout == f"The {served}\n"
        chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and chat.json()["error"]["code"] == "chat_not_supported"  # not a chat run
        port = url.rsplit(":", 1)[1]
        taken = run_script("jaxgpt", "serve", "--workdir", str(trained_small_run), "--port", port)
        assert taken.returncode == 2 and taken.stderr.count("\n") == 1 and f"127.0.0.1:{port}" in taken.stderr
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
        assert lines.get(timeout=5) == "stopped\n"
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
