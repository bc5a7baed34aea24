"""The test kubelet's kube-proxy: each ClusterIP Service gets a stable virtual address and
its ports forward TCP connections to a ready pod, as kube-proxy's userspace mode did.

A connection is made to one backend, chosen when it opens (round robin over the ready pods)
and kept until either side closes it: established connections survive a pod turning
unready, and end when the pod's process goes, so clients reconnect, to the same stable
address, and reach a pod that is ready. Used by tests/kube/kubelet.py.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Backends = Callable[[], list[tuple[str, int]]]
"""The ready pods' (ip, port) for a Service port, asked at each new connection."""

_CHUNK = 64 * 1024


class PortForward:
    """Listens on (vip, port) and joins each connection to one backend."""

    def __init__(self, vip: str, port: int, backends: Backends) -> None:
        self.backends = backends
        self._turn = itertools.count()
        self._listener = socket.create_server((vip, port), reuse_port=False)
        self._listener.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._accept, name=f"proxy-{vip}:{port}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._join, args=(client,), daemon=True).start()

    def _join(self, client: socket.socket) -> None:
        ready = self.backends()
        upstream = None
        for _ in range(len(ready)):
            ip, port = ready[next(self._turn) % len(ready)]
            with contextlib.suppress(OSError):
                upstream = socket.create_connection((ip, port), timeout=2)
                break
        if upstream is None:  # no ready pod: refuse, as a Service without endpoints does
            client.close()
            return
        upstream.settimeout(None)
        pump = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        pump.start()
        _pump(client, upstream)
        pump.join()
        for s in (client, upstream):
            s.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until either side ends, then end both directions."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    for s in (source, sink):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
