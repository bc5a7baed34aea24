"""HTTP for operators: /metrics (Prometheus), /healthz (alive), /readyz (serving)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class HttpEndpoints:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    outer._reply(self, 200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = healthy()
                    outer._reply(self, 200 if ok else 503, b"ok\n" if ok else b"unhealthy\n")
                elif path == "/readyz":
                    ok = ready()
                    outer._reply(self, 200 if ok else 503, b"ready\n" if ok else b"not ready\n")
                else:
                    outer._reply(self, 404, b"not found\n")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="http-endpoints", daemon=True
        )

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
