"""The HTTP side of `jaxgpt serve`: an OpenAI-compatible API (FastAPI) over the engine.

    GET  /                      the chat page (jaxgpt/serve/page.html)
    GET  /v1/models             the one model served
    POST /v1/completions        text or token ids in; echo and logprobs to score them
    POST /v1/chat/completions   a run trained on conversations, with its chat template
    GET  /health                slots busy and requests waiting

Each choice of a request is one `Generation` in the engine; its pieces come back through an
asyncio queue and leave as one JSON body or, with "stream": true, as server-sent events ending in
"data: [DONE]". A streaming client that goes away cancels its generations, so their slots are
free at the next step. Bad requests are answered with OpenAI's error object (protocol.py);
nothing a request holds is used as a path, a command or code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
from importlib import resources

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from jaxgpt.errors import UserError
from jaxgpt.serve.engine import Busy, Finished, Generation, Piece, Token
from jaxgpt.serve.protocol import ChatRequest, CompletionRequest, RequestError, validation_error

LARGEST_BODY = 4 * 2**20  # bytes: a full context of token ids as JSON is far less


@dataclasses.dataclass
class Served:
    """What the routes need: the engine, its tokenizer, and what the model is."""

    engine: object
    tokenizer: object
    name: str
    stop_id: int | None  # the token that ends a completion (end of text), if the vocabulary has one
    chat: bool = False  # trained on conversations: /v1/chat/completions answers
    api_key: str | None = None
    largest_body: int = LARGEST_BODY
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))


def create_app(served: Served) -> FastAPI:
    app = FastAPI(title="jaxgpt", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_Guard, served=served)

    @app.exception_handler(RequestError)
    async def _refused(_, error: RequestError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, error: RequestValidationError):
        refused = validation_error(error.errors())
        return JSONResponse(refused.body(), status_code=refused.status)

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return resources.files("jaxgpt.serve").joinpath("page.html").read_text()

    @app.get("/health")
    async def health():
        engine = served.engine
        return {"status": "ok", "model": served.name, "chat": served.chat, "context": engine.context,
                "slots": engine.slot_count, "busy_slots": engine.busy_slots(), "waiting": engine.waiting()}  # fmt: skip

    @app.get("/v1/models")
    async def models():
        card = {"id": served.name, "object": "model", "created": served.created, "owned_by": "jaxgpt"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        _check_model(served, body.model)
        prompts = [_prompt_ids(served, p) for p in body.prompts()]
        generations = []
        for ids in prompts:
            _check_fits(served, len(ids), body.max_tokens)
            stop_ids = frozenset() if served.stop_id is None else frozenset({served.stop_id})
            generations += _choices(body, ids, body.max_tokens, stop_ids, body.echo, body.logprobs)
        return await _respond(served, body, generations, _completion_chunk, _completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest):
        _check_model(served, body.model)
        return await _respond(served, body, _chat_generations(served, body), _chat_chunk, _chat_completion)

    return app


def _chat_generations(served: Served, body: ChatRequest) -> list:
    """The answers a chat request asks for, each read through the run's chat template; one
    RequestError line for a model without one, or messages it cannot read."""
    if not served.chat:
        raise RequestError(
            f"{served.name} was not trained on conversations, so it has no chat template to read messages "
            "with; use /v1/completions with a prompt, or serve a run fine-tuned on a chat source",
            "messages", code="chat_not_supported",
        )  # fmt: skip
    from jaxgpt.data.conversations import check_content, prompt_ids

    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        for m in messages:
            check_content(m["content"], f"a {m['role']} message")
        ids = prompt_ids(served.tokenizer, messages)
    except UserError as error:  # a template's marker in a message, a character the vocabulary lacks
        raise RequestError(f"messages: {error}", "messages") from None
    room = served.engine.context - len(ids)
    most = body.most_tokens or room
    _check_fits(served, len(ids), most, "max_tokens")
    top = (body.top_logprobs or 0) if body.logprobs else None
    # An answer ends at its end-of-turn token, or at any marker of the template: a model that
    # writes a role's marker has begun another turn, which an answer sent back could not hold.
    markers = frozenset(served.tokenizer.special_ids.values())
    return _choices(body, ids, most, markers, False, top)


class _Guard:
    """Before a request reaches a route: its API key (where the server has one; the page and
    /health are open), and its body's declared size, so an oversized body is refused unread
    (h11 holds a client to the length it declares; a POST must declare one)."""

    def __init__(self, app, served: Served):
        self.app, self.served = app, served

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            try:
                self._check(scope)
            except RequestError as error:
                return await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
        await self.app(scope, receive, send)

    def _check(self, scope) -> None:
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        if self.served.api_key is not None and scope["path"] not in ("/", "/health"):
            given = headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not secrets.compare_digest(given.encode(), self.served.api_key.encode()):
                raise RequestError(
                    "no valid API key: send the key the server was started with as 'Authorization: Bearer KEY'",
                    status=401, code="invalid_api_key",
                )  # fmt: skip
        if scope["method"] == "POST":
            declared = headers.get("content-length", "")
            if not declared.isdigit():
                raise RequestError("a POST must say its body's length (Content-Length)", status=411)
            if int(declared) > self.served.largest_body:
                raise RequestError(f"the request body is over {self.served.largest_body} bytes", status=413)


def _check_model(served: Served, model: str | None) -> None:
    if model is not None and model != served.name:
        raise RequestError(
            f"model {model!r} is not served here; this server serves {served.name!r} (GET /v1/models)",
            "model", status=404, code="model_not_found",
        )  # fmt: skip


def _prompt_ids(served: Served, prompt: str | list[int]) -> list[int]:
    from jaxgpt.tokenizers import separator_id

    if isinstance(prompt, str):
        try:
            return served.tokenizer.encode(prompt) if prompt else [separator_id(served.tokenizer)]
        except UserError as error:  # a character a char vocabulary lacks
            raise RequestError(f"prompt: {error}", "prompt") from None
    vocab = served.engine.config.vocab_size
    if not prompt or max(prompt) >= vocab:
        raise RequestError(f"prompt: token ids must be in [0, {vocab}) and not empty", "prompt")
    return list(prompt)


def _check_fits(served: Served, prompt_tokens: int, max_tokens: int, param: str = "max_tokens") -> None:
    context = served.engine.context
    if prompt_tokens > context:
        raise RequestError(
            f"the prompt is {prompt_tokens} tokens, over the model's context of {context}; shorten it", "prompt"
        )
    if prompt_tokens + max_tokens > context:
        raise RequestError(
            f"{param}={max_tokens} does not fit: after the {prompt_tokens}-token prompt the {context}-token context "
            f"has room for {context - prompt_tokens} more; ask for at most that",
            param,
        )


def _choices(body, ids, max_tokens, stop_ids, echo, top_logprobs) -> list[Generation]:
    """The body's n choices of one prompt; choice k draws as a request with seed + k would."""
    seed = body.seed if body.seed is not None else secrets.randbits(62)
    top_k = max(body.top_k, 0)
    return [
        Generation(
            list(ids), max_tokens, deliver=None, temperature=body.temperature, top_k=top_k, top_p=body.top_p,
            seed=seed + k, stop_ids=stop_ids, stops=body.stops, echo=echo, top_logprobs=top_logprobs,
        )
        for k in range(body.n)
    ]  # fmt: skip


async def _respond(served: Served, body, generations: list[Generation], chunk, whole):
    """Queue the generations and answer with their results: a body when all have finished, or
    server-sent events as their pieces come."""
    loop, events = asyncio.get_running_loop(), asyncio.Queue()
    for index, g in enumerate(generations):
        g.deliver = lambda event, index=index: loop.call_soon_threadsafe(events.put_nowait, (index, event))
    try:
        served.engine.submit(generations)
    except Busy as error:
        raise RequestError(f"the server is busy: {error}", status=503, code="server_busy") from None
    reply_id = f"{'chatcmpl' if chunk is _chat_chunk else 'cmpl'}-{secrets.token_hex(12)}"
    head = {"id": reply_id, "created": int(time.time()), "model": served.name}

    async def ready():
        """Lists of (choice, event) as they come: all that waits at once, so a stream behind the
        engine catches up in one write rather than one per token."""
        finished = 0
        try:
            while finished < len(generations):
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                finished += sum(isinstance(event, Finished) for _, event in batch)
                yield batch
        finally:
            for g in generations:  # a client that went away frees the slots
                g.cancelled.set()

    if not body.stream:
        results = [_Result() for _ in generations]
        async for batch in ready():
            for index, event in batch:
                results[index].add(event)
        return whole(served, head, results, generations[0].top_logprobs is not None, body.n)

    async def stream():
        usage = _Usage(body.n)
        if chunk is _chat_chunk:
            for index in range(len(generations)):
                yield _event(head, "chat.completion.chunk", [_chat_delta(index, {"role": "assistant", "content": ""})])
        async for batch in ready():
            for index, event in batch:
                usage.add(index, event)
            yield "".join(_event(head, *chunk(served, index, event)) for index, event in batch)
        if body.include_usage:
            yield _event(head, *chunk(served, None, None), usage=usage.body())
        yield "data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _event(head: dict, kind: str, choices: list, usage=None) -> str:
    return f"data: {json.dumps(head | {'object': kind, 'choices': choices} | ({'usage': usage} if usage else {}))}\n\n"


class _Usage:
    """Tokens read and made, a prompt counted once whatever its number of choices (as OpenAI does)."""

    def __init__(self, n: int):
        self.n, self.prompt, self.completion = n, 0, 0

    def add(self, index: int, event) -> None:
        if isinstance(event, Finished):
            self.prompt += event.prompt_tokens if index % self.n == 0 else 0
            self.completion += event.completion_tokens

    def body(self) -> dict:
        return {"prompt_tokens": self.prompt, "completion_tokens": self.completion,
                "total_tokens": self.prompt + self.completion}  # fmt: skip


class _Result:
    """A choice's pieces gathered: its text, its tokens, how it finished."""

    def __init__(self):
        self.text, self.tokens, self.finished = "", [], None

    def add(self, event) -> None:
        if isinstance(event, Piece):
            self.text += event.text
            self.tokens += event.tokens
        else:
            self.finished = event


def _usage(results: list[_Result], n: int) -> dict:
    usage = _Usage(n)
    for index, r in enumerate(results):
        usage.add(index, r.finished)
    return usage.body()


def _piece_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def _legacy_logprobs(tokenizer, tokens: list[Token], start: int = 0) -> dict:
    """Completions' logprobs: tokens, token_logprobs, top_logprobs and text_offset, per token."""
    texts = [_piece_text(tokenizer, t.id) for t in tokens]
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    tops = [None if t.logprob is None else {_piece_text(tokenizer, i): lp for i, lp in t.top} for t in tokens]
    return {"tokens": texts, "token_logprobs": [t.logprob for t in tokens], "top_logprobs": tops,
            "text_offset": offsets}  # fmt: skip


def _completion_chunk(served: Served, index, event):
    if index is None:
        return "text_completion", []
    choice = {"index": index, "text": "", "logprobs": None, "finish_reason": None}
    if isinstance(event, Piece):
        choice["text"] = event.text
        if event.tokens:
            choice["logprobs"] = _legacy_logprobs(served.tokenizer, list(event.tokens))
    else:
        choice["finish_reason"] = event.reason
    return "text_completion", [choice]


def _completion(served: Served, head: dict, results: list[_Result], logprobs: bool, n: int) -> dict:
    choices = [
        {"index": index, "text": r.text, "finish_reason": r.finished.reason,
         "logprobs": _legacy_logprobs(served.tokenizer, r.tokens) if logprobs else None}
        for index, r in enumerate(results)
    ]  # fmt: skip
    return head | {"object": "text_completion", "choices": choices, "usage": _usage(results, n)}


def _chat_logprobs(tokenizer, tokens) -> dict:
    def entry(token_id, logprob):
        text = _piece_text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [entry(t.id, t.logprob) | {"top_logprobs": [entry(i, lp) for i, lp in t.top]} for t in tokens]}


def _chat_delta(index: int, delta: dict, finish_reason=None, logprobs=None) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def _chat_chunk(served: Served, index, event):
    if index is None:
        return "chat.completion.chunk", []
    if isinstance(event, Piece):
        logprobs = _chat_logprobs(served.tokenizer, event.tokens) if event.tokens else None
        return "chat.completion.chunk", [_chat_delta(index, {"content": event.text}, logprobs=logprobs)]
    return "chat.completion.chunk", [_chat_delta(index, {}, finish_reason=event.reason)]


def _chat_completion(served: Served, head: dict, results: list[_Result], logprobs: bool, n: int) -> dict:
    choices = [
        {"index": index, "message": {"role": "assistant", "content": r.text},
         "logprobs": _chat_logprobs(served.tokenizer, r.tokens) if logprobs else None,
         "finish_reason": r.finished.reason}
        for index, r in enumerate(results)
    ]  # fmt: skip
    return head | {"object": "chat.completion", "choices": choices, "usage": _usage(results, n)}


class Background:
    """`served` behind uvicorn on a thread of this process (a notebook's, a test's, a
    benchmark's), listening on `host`:`port` (0: a free port); `url` is its address, `stop()`
    ends it (not the engine, which is the caller's)."""

    def __init__(self, served: Served, host: str = "127.0.0.1", port: int = 0):
        import socket
        import threading

        import uvicorn

        listening = socket.socket()
        listening.bind((host, port))
        self.url = f"http://{host}:{listening.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(create_app(served), log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [listening]}, daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join()
