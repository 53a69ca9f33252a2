"""Serve a model over HTTP: python -m jaxgpt serve --workdir runs/tiny

Examples:
  python -m jaxgpt serve --workdir runs/tiny --port 0             # a free port, printed on start; Ctrl-C stops
  python -m jaxgpt serve --workdir runs/sft_arithmetic            # http://127.0.0.1:8000: chat at /
  python -m jaxgpt serve --init_from exported/tiny --slots 16 --api_key SECRET

Then, from another terminal:
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "The assert", "max_tokens": 40, "temperature": 0}'

An OpenAI-compatible API (/v1/completions, /v1/chat/completions for a run trained on
conversations, /v1/models; streaming by server-sent events) and a chat page at /. Requests are
decoded together, --slots at a time, a request joining at the next step and leaving when it ends
(jaxgpt/serve/). It binds 127.0.0.1 unless --host says otherwise; with --api_key (or the
JAXGPT_API_KEY variable) every API call must send it as a Bearer token. docs/serving.md says
how to call it from curl, the openai package and lm-eval.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from absl import flags

from jaxgpt import interrupts
from jaxgpt.commands import cli
from jaxgpt.errors import UserError

# A context to serve where --context is not given: what a request may fill. A model trained on
# more serves this much by default (each slot holds a KV cache of it; Llama 3.2's 131,072 would be
# gigabytes a slot).
DEFAULT_CONTEXT = 2048


def define_flags(f: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "Run directory written by train.py.", flag_values=f)
    flags.DEFINE_string("init_from", None, "Serve Hugging Face weights instead: a local folder.", flag_values=f)
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).", flag_values=f)
    flags.DEFINE_integer("port", 8000, "Port to listen on; 0 picks a free one (printed on start).", flag_values=f)
    flags.DEFINE_integer("slots", 8, "Requests decoded together, each with a KV cache of --context.", flag_values=f)
    flags.DEFINE_integer(
        "context", None, f"Tokens a request may fill (default: the model's, at most {DEFAULT_CONTEXT}).", flag_values=f
    )
    flags.DEFINE_string(
        "api_key", None, "Require this Bearer token (default: $JAXGPT_API_KEY, or none).", flag_values=f
    )
    flags.DEFINE_string("name", None, "The model's id in the API (default: the folder's name).", flag_values=f)


@cli.command(interrupted="stopped")
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line; Ctrl-C stops the server."""
    argv, f = cli.command_flags(argv)
    define_flags(f)
    cli.parse_flags(argv, __doc__, f)
    if not f.workdir and not f.init_from:
        cli.fail("no model given; pass --workdir DIR of a run trained with train.py, or --init_from FOLDER")
    if f.slots < 1:
        cli.fail(f"--slots={f.slots} must be at least 1")
    if not 0 <= f.port < 65536:
        cli.fail(f"--port={f.port} is not a port; give 0-65535 (0 picks a free one)")
    listening = _listen(f.host, f.port)  # before loading: a port in use is known at once

    from jaxgpt.commands.sample import load_model
    from jaxgpt.hardware import runtime
    from jaxgpt.model.sampling import decoding_model
    from jaxgpt.serve.app import Served, create_app
    from jaxgpt.serve.engine import Engine

    runtime.enable_compilation_cache()
    model, params, tokenizer, data = load_model(f.workdir, f.init_from, command="serve")
    cli.refuse_an_encoder_decoder(model, f.workdir or f.init_from, "serve continues a decoder's text")
    context = f.context or min(model.block_size, DEFAULT_CONTEXT)
    if not 2 <= context <= model.block_size:
        cli.fail(f"--context={context} must be in [2, {model.block_size}] (the model's block_size)")
    engine = Engine(decoding_model(model, context), params, tokenizer, slots=f.slots, progress=_note)
    folder = Path(f.workdir or f.init_from)
    name = f.name or folder.name or folder.resolve().name  # as given ("runs/tiny": tiny), a link's own name
    chat = data is not None and data.chat
    api_key = f.api_key or os.environ.get("JAXGPT_API_KEY") or None
    served = Served(engine, tokenizer, name, stop_id=tokenizer.eot_id, chat=chat, api_key=api_key)
    engine.start()
    host, port = listening.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    kind = "chat (its template)" if chat else "completions"
    started = (
        f"serving {name} ({model.n_layer} layers, {kind}, {context}-token context, {f.slots} slots) at "
        f"http://{shown}:{port}  (chat page /, API /v1{', API key required' if api_key else ''}); Ctrl-C stops"
    )
    try:
        _Server(started, create_app(served)).run(sockets=[listening])
    finally:
        engine.stop()
    print("stopped", flush=True)


def _note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as error:
        raise UserError(f"--host {host} is not an address this machine has: {error.strerror}") from None
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as error:
        listening.close()
        raise UserError(
            f"cannot listen on {host}:{port}: {error.strerror}; pick another --port (0: a free one)"
        ) from None
    return listening


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, printing `started` once it listens. Ctrl-C stops it cleanly (the
        requests in flight are let go, the engine stopped, exit 0): the SIGINT is counted as
        taken (jaxgpt/interrupts.py) so the command's watcher leaves it to uvicorn, and a second
        one ends the command at once."""

        def __init__(self, started: str, app):
            super().__init__(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5))
            self.announcement = started

        async def startup(self, sockets=None):
            await super().startup(sockets)
            print(self.announcement, flush=True)

        def handle_exit(self, sig, frame):
            if sig == signal.SIGINT and not self.should_exit:
                interrupts.take()
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # stopping is the command's: no signal raised again after

    return Server


def _Server(started: str, app):  # noqa: N802 (a class made on first use: uvicorn is imported late)
    return _server_class()(started, app)


if __name__ == "__main__":
    main()
