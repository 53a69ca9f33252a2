"""The serving engine: one thread that owns the model and the slots, and decodes every admitted
request together (continuous batching), handing each request its tokens as they are made.

Requests wait in a queue; before each step the engine prefills waiting ones into free slots
(jaxgpt/serve/slots.py), then decodes one token for all slots in one compiled step, turns each
slot's token into text and ends a request at its stop token, a stop string, its max_tokens or
when its client has gone, freeing its slot for the next. Everything that touches the device runs
on this thread; the HTTP side (jaxgpt/serve/app.py) only queues `Generation`s and reads what
their `deliver` callbacks hand over.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.serve.slots import decode_slots, empty_slots, join_slot, prefill_lengths


class Busy(Exception):
    """The waiting queue is full: the client should retry later (HTTP 503)."""


@dataclasses.dataclass(frozen=True)
class Token:
    """A token of a response with its log-probability and the most likely alternatives (ids and
    log-probabilities, most likely first); logprob None for a prompt's first token."""

    id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class Piece:
    """New text of a response, and the tokens it is made of (with `logprobs` asked for)."""

    text: str
    tokens: tuple[Token, ...] = ()


@dataclasses.dataclass(frozen=True)
class Finished:
    reason: str  # "stop": a stop token or string; "length": max_tokens
    prompt_tokens: int
    completion_tokens: int


@dataclasses.dataclass
class Generation:
    """One sequence to generate (a choice of a response): what it reads, how it draws, where it
    stops, and `deliver`, called on the engine's thread with each Piece and then a Finished.

    echo: the first Piece holds the prompt's own tokens (its text, and with top_logprobs not
    None their log-probabilities: how a harness scores a multiple-choice ending).
    top_logprobs: None, no logprobs; k, each token's log-probability and its k likeliest
    alternatives (k <= slots.MOST_TOP_LOGPROBS)."""

    prompt: list[int]
    max_tokens: int
    deliver: Callable[[Piece | Finished], None]
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_ids: frozenset[int] = frozenset()
    stops: tuple[str, ...] = ()
    echo: bool = False
    top_logprobs: int | None = None
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)


class _Text:
    """A generation's text so far, and how much of it may be handed over: the end is held back
    while it could be the start of a stop string, or is half of a character whose bytes span
    two tokens (decoded as U+FFFD until the rest arrives)."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.offsets: list[int] = []  # where each token's text starts
        self.text, self.sent, self.tokens_sent, self.stopped = "", 0, 0, False

    def add(self, token: int) -> bool:
        """Add a token; True when a stop string has appeared (the text is cut before it)."""
        self.offsets.append(len(self.text))
        self.ids.append(token)
        self.text = self.tokenizer.decode(self.ids)
        for stop in self.stops:
            at = self.text.find(stop, max(0, self.sent - len(stop)))
            if at >= 0:
                self.text, self.stopped = self.text[:at], True
                return True
        return False

    def ready(self, final: bool) -> tuple[str, int]:
        """(the text not yet handed over that may be, how many tokens the text handed over
        so far then makes: those whose text starts before its end; at the end all of them,
        unless a stop string cut some off)."""
        end = len(self.text)
        if not final:
            held = 1 if self.text.endswith("\ufffd") else 0
            for stop in self.stops:
                held = max(held, next((n for n in range(len(stop) - 1, 0, -1) if self.text.endswith(stop[:n])), 0))
            end = max(self.sent, end - held)
        if final and not self.stopped:
            return self.text[self.sent :], len(self.ids)
        return self.text[self.sent : end], sum(1 for offset in self.offsets if offset < end)


@dataclasses.dataclass
class _Running:
    generation: Generation
    text: _Text
    drawn: list[Token]
    made: int = 0


class Engine:
    """Serves Generations on `slots` slots of a decoder (`config` already made for decoding:
    float32, block_size the context a request may fill). `start()` compiles every program
    (showing each on `progress`) and starts the thread; `stop()` ends it."""

    def __init__(self, config, params, tokenizer, slots: int = 8, max_waiting: int = 1024, progress=print):
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self.slot_count, self.max_waiting, self.progress = slots, max_waiting, progress
        self.context = config.block_size
        self.lengths = prefill_lengths(self.context)
        self._slots = empty_slots(config, slots)
        self._running: dict[int, _Running] = {}
        self._waiting: collections.deque[Generation] = collections.deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="jaxgpt-engine", daemon=True)
        self.steps = 0  # decoding steps taken, for the benchmark's count of tokens per step

    # --- the HTTP side's calls (any thread) ---
    def submit(self, generations: list[Generation]) -> None:
        """Queue generations together (a response's choices), or raise Busy."""
        with self._wake:
            if len(self._waiting) + len(generations) > self.max_waiting:
                raise Busy(f"{len(self._waiting)} requests are waiting; try again shortly")
            self._waiting.extend(generations)
            self._wake.notify()

    def busy_slots(self) -> int:
        return len(self._running)

    def waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> None:
        started = time.perf_counter()
        for length in self.lengths:
            self.progress(f"compiling the prefill of {length}-token prompts")
            self._join(0, [0], length, 0, 1.0, 0, 1.0)
        self.progress(f"compiling the decoding step of {self.slot_count} slots")
        self._slots, drawn = decode_slots(self.config, self.params, self._slots)
        jax.block_until_ready(drawn)
        self.progress(f"compiled {len(self.lengths) + 1} programs in {time.perf_counter() - started:.1f} s")
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()

    # --- the engine's thread ---
    def _serve(self) -> None:
        """Admit, step, hand over, in a loop. A step is dispatched before the last one's tokens
        are handed over (JAX runs it meanwhile), so the host's share of a step overlaps the
        device's; a step's token for a slot whose request ended or changed since it was
        dispatched is dropped (the slot's next request is prefilled afresh)."""
        handed_over = None  # the last step dispatched: (its Drawn, the requests it was dispatched for)
        while True:
            with self._wake:
                while not (self._stopping or self._waiting or self._running or handed_over):
                    self._wake.wait()
                if self._stopping:
                    break
                admitted = []
                while self._waiting and len(self._running) + len(admitted) < self.slot_count:
                    admitted.append(self._waiting.popleft())
            for generation in admitted:
                self._admit(generation)
            self._drop_cancelled()
            dispatched = None
            if self._running:
                self._slots, drawn = decode_slots(self.config, self.params, self._slots)
                dispatched = (drawn, dict(self._running))
                self.steps += 1
            if handed_over:
                self._hand_over_step(*handed_over)
            handed_over = dispatched
        for running in self._running.values():
            running.generation.cancelled.set()

    def _free_slot(self) -> int:
        return next(slot for slot in range(self.slot_count) if slot not in self._running)

    def _join(self, slot, prompt, length, seed, temperature, top_k, top_p):
        padded = np.zeros((1, length), np.int32)
        padded[0, : len(prompt)] = prompt
        self._slots, first, prompt_read = join_slot(
            self.config, self.params, self._slots, jnp.int32(slot), jnp.asarray(padded), jnp.int32(len(prompt)),
            jax.random.key(seed), jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p),
        )  # fmt: skip
        return jax.device_get((first, prompt_read))

    def _admit(self, g: Generation) -> None:
        if g.cancelled.is_set():
            return
        slot = self._free_slot()
        length = next(n for n in self.lengths if n >= len(g.prompt))
        first, prompt_read = self._join(slot, g.prompt, length, g.seed, g.temperature, g.top_k, g.top_p)
        running = _Running(g, _Text(self.tokenizer, g.stops), [])
        if g.echo:
            echoed = [Token(g.prompt[0], None)] + [
                _token(prompt_read, i, g.top_logprobs) for i in range(len(g.prompt) - 1)
            ]
            g.deliver(Piece(self.tokenizer.decode(g.prompt), tuple(echoed) if g.top_logprobs is not None else ()))
        self._running[slot] = running
        if g.max_tokens == 0:
            self._finish(slot, "length")
        else:
            self._take(slot, _token(first, None, g.top_logprobs))

    def _drop_cancelled(self) -> None:
        for slot in [slot for slot, r in self._running.items() if r.generation.cancelled.is_set()]:
            del self._running[slot]

    def _hand_over_step(self, drawn, dispatched_for: dict) -> None:
        drawn = jax.device_get(drawn)
        for slot, running in dispatched_for.items():
            if self._running.get(slot) is running:
                self._take(slot, _token(drawn, slot, running.generation.top_logprobs))

    def _take(self, slot: int, token: Token) -> None:
        """A running generation's next token: hand over what text it completes, or end it."""
        running = self._running[slot]
        g = running.generation
        if token.id in g.stop_ids:
            return self._finish(slot, "stop")
        running.made += 1
        running.drawn.append(token)
        stopped = running.text.add(token.id)
        if stopped or running.made >= g.max_tokens:
            return self._finish(slot, "stop" if stopped else "length")
        self._hand_over(running, final=False)

    def _hand_over(self, running: _Running, final: bool) -> None:
        text, tokens = running.text.ready(final)
        sent = running.text.tokens_sent
        if text or tokens > sent:
            logprobs = running.generation.top_logprobs is not None
            running.generation.deliver(Piece(text, tuple(running.drawn[sent:tokens]) if logprobs else ()))
        running.text.sent += len(text)
        running.text.tokens_sent = max(sent, tokens)

    def _finish(self, slot: int, reason: str) -> None:
        running = self._running.pop(slot)
        self._hand_over(running, final=True)
        g = running.generation
        g.deliver(Finished(reason, len(g.prompt), running.made))


def _token(drawn, row, top: int | None) -> Token:
    """The Token of `drawn`'s row (None: drawn holds one position)."""
    pick = (lambda a: a) if row is None else (lambda a: a[row])  # noqa: E731
    ids, logprobs = pick(drawn.top_ids), pick(drawn.top_logprobs)
    alternatives = tuple(zip(ids[:top].tolist(), logprobs[:top].tolist(), strict=True)) if top else ()
    return Token(int(pick(drawn.token)), float(pick(drawn.logprob)), alternatives)
