"""HTTP for operators: /metrics (Prometheus), /healthz (alive), /readyz (serving)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# How long a request waits for the event loop to answer it before it gets a 503.
LOOP_ANSWER_S = 10.0
HANDSHAKE_S = 10.0
"""How long an HTTPS client may take over its handshake and request."""

Answer = tuple[int, bytes, str]
_TEXT = "text/plain; charset=utf-8"


class _Server(ThreadingHTTPServer):
    """With `tls`, each connection's handshake is made on its own thread (a client that
    never finishes it holds no other) and one that fails is closed without a word."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        tls: Callable[[], ssl.SSLContext] | None,
    ) -> None:
        self._tls = tls
        super().__init__(address, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self._tls is None:
            super().finish_request(request, client_address)
            return
        try:
            request.settimeout(HANDSHAKE_S)
            secured = self._tls().wrap_socket(request, server_side=True)
        except OSError:  # ssl.SSLError among them; the caller closes the plain socket
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            with contextlib.suppress(OSError):
                secured.shutdown(socket.SHUT_RDWR)
            secured.close()


class HttpEndpoints:
    """Requests arrive on this server's threads. With `loop`, the state they read (the
    collectors, healthy, ready) is read on that event loop, where it changes, never
    beside it: a scrape that walked a dict while the loop grew it failed mid-reply."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        loop: asyncio.AbstractEventLoop | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        """`tls`: serve HTTPS only, with the context it gives at each connection (e.g.
        capstan/security/tls.py's ReloadingSslContext.current)."""
        outer = self
        self._loop = loop

        def answer(path: str) -> Answer:
            if path == "/metrics":
                return 200, generate_latest(registry), CONTENT_TYPE_LATEST
            if path == "/healthz":
                ok = healthy()
                return (200, b"ok\n", _TEXT) if ok else (503, b"unhealthy\n", _TEXT)
            if path == "/readyz":
                ok = ready()
                return (200, b"ready\n", _TEXT) if ok else (503, b"not ready\n", _TEXT)
            return 404, b"not found\n", _TEXT

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    code, body, content_type = outer._on_loop(lambda: answer(path))
                except Exception as e:
                    log.exception("HTTP %s failed", path)
                    code, body, content_type = 500, f"error: {e}\n".encode(), _TEXT
                outer._reply(self, code, body, content_type)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = _Server((host, port), Handler, tls)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="http-endpoints", daemon=True
        )

    def _on_loop(self, read: Callable[[], Answer]) -> Answer:
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return read()
        done: concurrent.futures.Future[Answer] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(read())
            except Exception as e:  # noqa: BLE001 - the request that waits answers 500
                done.set_exception(e)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # closed since the check above
            return read()
        try:
            return done.result(timeout=LOOP_ANSWER_S)
        except concurrent.futures.TimeoutError:
            return 503, b"the server is too busy to answer\n", _TEXT

    @staticmethod
    def _reply(
        handler: BaseHTTPRequestHandler,
        code: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
    ) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
