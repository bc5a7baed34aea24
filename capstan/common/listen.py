"""Listening sockets that fail in one line: which port, on which address, what it was for,
and why (in use, not an address of this machine, not permitted).

gRPC reports a failed bind only as "Failed to bind to address"; `probe` finds the cause by
binding the same address with a plain socket, the way the servers bind it (SO_REUSEADDR,
so a port in TIME_WAIT is not mistaken for a busy one).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from capstan.common.errors import CapstanError


class ListenError(CapstanError):
    """A server could not listen on the address and port it was given."""


def failure_message(exc: OSError, host: str, port: int, what: str) -> str:
    """`what` names the port's use, e.g. "gRPC" or "broker-a-1's HTTP"."""
    shown = host or "0.0.0.0"
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {shown!r} ({what} port {port}): no such host"
    if exc.errno == errno.EADDRINUSE:
        return f"{what} port {port} on {shown} is already in use"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {shown} ({what} port {port}): not an address of this machine"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{what} port {port} on {shown}: permission denied"
    return f"cannot listen on {shown}:{port} ({what} port): {exc.strerror or exc}"


def probe(host: str, port: int) -> OSError | None:
    """Bind and listen on `host:port` as a server would, then let go; the error, if any."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
            s.listen(1)
    except OSError as exc:
        return exc
    return None


@contextmanager
def listen_errors(host: str, port: int, what: str) -> Iterator[None]:
    """Turn an OSError raised while binding `host:port` into a ListenError naming it."""
    try:
        yield
    except OSError as exc:
        raise ListenError(failure_message(exc, host, port, what)) from None


def add_grpc_port(
    server: grpc.aio.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """`server.add_insecure_port` (`add_secure_port` with `credentials`), the port it
    bound (one picked when `port` is 0), or a ListenError with the cause. The address is
    tried with a plain socket first: a failed bind inside gRPC logs a line of its own to
    stderr and raises without the cause."""
    cause = probe(host, port)
    if cause is not None:
        raise ListenError(failure_message(cause, host, port, "gRPC"))
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is None:
            bound = int(server.add_insecure_port(target))
        else:
            bound = int(server.add_secure_port(target, credentials))
    except RuntimeError:
        bound = 0
    if not bound:  # taken between the probe and gRPC's own bind
        raise ListenError(f"cannot listen on {host or '0.0.0.0'}:{port} (gRPC port)")
    return bound
