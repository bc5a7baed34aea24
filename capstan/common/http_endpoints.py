"""HTTP for operators: /metrics (Prometheus), /healthz (alive), /readyz (serving)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# How long a request waits for the event loop to answer it before it gets a 503.
LOOP_ANSWER_S = 10.0

Answer = tuple[int, bytes, str]
_TEXT = "text/plain; charset=utf-8"


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
    ) -> None:
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

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
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
