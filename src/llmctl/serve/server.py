"""`llmctl serve`: load the model, start its engine thread, and serve the app with uvicorn until
SIGINT or SIGTERM.

The socket is bound before the model loads, so a port in use or a host that is not this
machine's is one line at once rather than after the load. On a signal the server stops taking
connections, the engine thread ends what is in flight (those requests are answered 503, a stream
with an error event), and `serve` returns the signal: stopping is how a server ends, not a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from llmctl.errors import UsageError

try:
    import uvicorn
except ImportError as e:  # an optional dependency: the `serve` extra
    raise UsageError(f"llmctl serve needs uvicorn and starlette: pip install 'llmctl[serve]' ({e})") from e

GRACE_S = 5  # seconds open connections get to finish after a stop signal, before they are closed


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: a free port, which on_ready's URL names
    name: str | None = None  # the model's name in the API; None: the path as given
    weights: str = "auto"  # auto (a checkpoint's EMA weights where it has them), ema or raw
    device: str = "auto"
    max_rows: int = 256  # sequences decoding at once at most (the engine's; vLLM's --max-num-seqs)
    kv_tokens: int = 0  # the KV pool's budget in tokens; 0: a quarter of the memory, at most 2^18
    dtype: str = "auto"  # the weights' precision while generating (EngineConfig.dtype)


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as e:
        raise UsageError(f"--host {host}: not an address to listen on ({e})") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise UsageError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from e
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(path: str | Path, cfg: ServeConfig, on_ready: Callable[[str, str], None],
          log: Callable[[str], None] = lambda message: None) -> int | None:
    """Serve the model at `path` until a stop signal; on_ready(name, url) once it takes requests.
    Returns the signal that stopped it."""
    from llmctl.model.generate import Engine, EngineConfig
    from llmctl.serve.app import build_app
    from llmctl.serve.model import load_served
    from llmctl.serve.worker import EngineWorker

    sock = bind(cfg.host, cfg.port)
    worker = None
    try:
        served = load_served(path, cfg.name or str(path), cfg.weights, cfg.device)
        engine = Engine.for_vocab(served.model, served.vocab, chat=served.chat is not None,
                                  config=EngineConfig(max_rows=cfg.max_rows, kv_tokens=cfg.kv_tokens, dtype=cfg.dtype))
        worker = EngineWorker(engine, log)
        worker.start()
        config = uvicorn.Config(build_app(served, worker, log), log_config=None, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=GRACE_S)
        server = Server(config, worker, lambda: on_ready(served.name, url_of(sock)))
        asyncio.run(server.serve(sockets=[sock]))
        return server.signal
    finally:
        if worker is not None:
            worker.close()
        sock.close()


class Server(uvicorn.Server):
    """uvicorn's server, which says when it takes requests, ends the engine's work first when it
    stops, and returns the stop signal instead of raising it again after shutting down (uvicorn
    re-raises it for the default handler: a KeyboardInterrupt, or death by SIGTERM)."""

    def __init__(self, config, worker, on_ready: Callable[[], None]):
        super().__init__(config)
        self.worker, self.on_ready = worker, on_ready
        self.signal: int | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            self.on_ready()

    async def shutdown(self, sockets=None) -> None:
        self.worker.close()  # requests in flight are answered (503) before their connections are waited on
        await super().shutdown(sockets=sockets)

    def handle_exit(self, sig, frame) -> None:
        self.signal = self.signal or sig
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
