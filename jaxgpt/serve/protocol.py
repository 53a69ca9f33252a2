"""The OpenAI API's request bodies as the server reads them, and the error object it answers
bad ones with.

Every field a request may carry is declared, with its bounds; anything else is refused (an
unknown field is usually a typo, or a feature this server does not have, and silently ignoring
it would answer another question than the one asked). Fields of the API that this server does
not implement (penalties, logit_bias, best_of, suffix) are accepted only at the values that
mean "off", so clients that always send them still work. A refusal is HTTP 400 with
{"error": {"message", "type", "param", "code"}}, param naming the field.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MOST_CHOICES = 16  # n: choices per prompt
MOST_STOPS = 16  # stop strings per request (OpenAI allows 4)
LONGEST_STOP = 256  # characters
MOST_TOP_LOGPROBS = 20


class RequestError(Exception):
    """A request this server refuses: HTTP `status` with the OpenAI error object."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _finite(value: float, name: str, low: float, high: float) -> float:
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], not {value}")
    return value


class _Request(BaseModel):
    """What completions and chat completions share: how tokens are drawn and where they stop."""

    model_config = ConfigDict(extra="forbid", strict=False)

    model: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = Field(0, ge=-1)  # not OpenAI's, but vLLM's and most servers': -1 or 0 keeps every token
    n: int = Field(1, ge=1, le=MOST_CHOICES)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value):
        return _finite(value, "temperature", 0.0, 2.0)

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value):
        if math.isfinite(value) and value == 0:
            raise ValueError("top_p must be in (0, 1]; 0 would keep no token (use temperature 0 for greedy)")
        return _finite(value, "top_p", 0.0, 1.0)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MOST_STOPS:
            raise ValueError(f"at most {MOST_STOPS} stop strings, not {len(stops)}")
        if any(not s or len(s) > LONGEST_STOP for s in stops):
            raise ValueError(f"each stop string must have 1 to {LONGEST_STOP} characters")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value):
        if value != 0:
            raise ValueError("this server has no repetition penalties; leave it 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        if value:
            raise ValueError("this server does not bias logits; leave it empty")
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, value):
        if value is not None and (
            set(value) - {"include_usage"} or not isinstance(value.get("include_usage", False), bool)
        ):
            raise ValueError('stream_options takes only {"include_usage": true|false}')
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(_Request):
    """POST /v1/completions. prompt: text, texts, token ids, or lists of token ids (what
    lm-eval's local-completions sends); each prompt is answered by n choices."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MOST_TOP_LOGPROBS)
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _fits(self):
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported; leave it unset (or equal to n)")
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported; leave it unset")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens=0 makes nothing; it is allowed only with echo (to score a prompt)")
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]
        if not p:
            raise RequestError("prompt is an empty list; give text or token ids", "prompt")
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str | list[dict]
    name: str | None = None

    def text(self) -> str:
        """The content as text: a string, or OpenAI's parts, each {"type": "text", "text": ...}."""
        if isinstance(self.content, str):
            return self.content
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in self.content):
            raise RequestError("messages: only text content parts are read by this model", "messages")
        return "".join(part["text"] for part in self.content)


class ChatRequest(_Request):
    """POST /v1/chat/completions, for a run trained on conversations."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MOST_TOP_LOGPROBS)

    @property
    def most_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# What a field that takes several forms must be: pydantic's complaint about one of the forms
# (prompt.str: "Input should be a valid string") would mislead a client that sent another.
FORMS = {
    "prompt": "text, a list of texts, a list of token ids (integers >= 0), or a list of such lists",
    "stop": "a string or a list of strings",
    "messages": 'a list of {"role": "system"|"user"|"assistant", "content": text}',
}


def validation_error(errors: list[dict]) -> RequestError:
    """pydantic's first complaint as one OpenAI error naming the field (the request's own,
    top-level field; the message says where inside it)."""
    error = errors[0]
    where = [str(part) for part in error.get("loc", ()) if part != "body"]
    if error.get("type") == "json_invalid":
        return RequestError(f"the request body is not valid JSON: {error.get('msg')}", None)
    if not where:
        return RequestError(str(error.get("msg", "invalid request")).removeprefix("Value error, "), None)
    field = where[0]
    if error.get("type") == "extra_forbidden":
        return RequestError(f"unknown field {where[-1]!r}; this server reads the fields of the OpenAI API", where[-1])
    if error.get("type") == "missing":
        return RequestError(f"{'.'.join(where)} is required", field)
    if field in FORMS and error.get("type") != "value_error":
        return RequestError(f"{field} must be {FORMS[field]}", field)
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    return RequestError(f"{'.'.join(where)}: {message}", field)
