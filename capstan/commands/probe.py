"""What answers at an address: the Capstan controller, a Capstan broker, another gRPC
server, an HTTP/1 server (a metrics port), a TLS server, or nothing.

The CLI asks only after a call has failed, to say in one line what it reached. gRPC
servers are told apart by the services they list through standard server reflection
(every Capstan server serves it: capstan.common.grpc_services); what is not gRPC is told
by what it answers to a plain HTTP/1.1 request, to which a gRPC server sends its HTTP/2
SETTINGS frame instead.
"""

from __future__ import annotations

import enum
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from grpc_reflection.v1alpha import reflection_pb2 as rpb
from grpc_reflection.v1alpha import reflection_pb2_grpc as rpb_grpc

from capstan.common.grpc_services import CONTROLLER, HEALTH, PULL, REFLECTION

PROBE_TIMEOUT_S = 1.0
"""How long a probe waits to connect, and then for the first bytes of an answer."""

_HTTP1_REQUEST = b"GET / HTTP/1.1\r\nHost: capstan\r\nConnection: close\r\n\r\n"
_FRAME_HEADER_BYTES = 9
_FRAME_TYPE_AT = 3
_SETTINGS_FRAME = 0x4
_TLS_RECORD_TYPES = frozenset({0x15, 0x16})  # alert, handshake
_DRAIN_BYTES = 1 << 20


class Transport(enum.Enum):
    NOTHING = "nothing listens"
    UNKNOWN_HOST = "the host name does not resolve"
    GRPC = "HTTP/2 (gRPC)"
    HTTP1 = "HTTP/1"
    TLS = "TLS"
    OTHER = "something else"


@dataclass(frozen=True)
class Probe:
    transport: Transport
    detail: str = ""
    """The connect error, an HTTP/1 server's version (`HTTP/1.0`), or what else it sent."""


def probe_transport(host: str, port: int) -> Probe:
    """Connect to host:port, send an HTTP/1.1 request, and classify the first answer."""
    try:
        sock = socket.create_connection((host, port), PROBE_TIMEOUT_S)
    except socket.gaierror as exc:
        return Probe(Transport.UNKNOWN_HOST, str(exc.strerror))
    except OSError as exc:
        return Probe(Transport.NOTHING, str(exc.strerror or exc))
    with sock:
        try:
            sock.sendall(_HTTP1_REQUEST)
            first = sock.recv(64)
            probe = classify(first)
            if probe.transport is Transport.HTTP1:
                _drain(sock)
        except OSError as exc:
            return Probe(Transport.OTHER, f"the connection failed: {exc.strerror or exc}")
    return probe


def _drain(sock: socket.socket) -> None:
    """Read an HTTP/1 answer to its end (it closes: we asked so), so that the server does
    not log a reset connection; at most `_DRAIN_BYTES`."""
    left = _DRAIN_BYTES
    try:
        while left > 0 and (chunk := sock.recv(min(left, 65536))):
            left -= len(chunk)
    except OSError:
        pass  # a server that keeps the connection open: what it sent is enough


def accepts_connections(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def classify(first: bytes) -> Probe:
    """What a server is, from the first bytes it sent back to an HTTP/1.1 request."""
    if first.startswith(b"HTTP/"):
        return Probe(Transport.HTTP1, first.split(b" ", 1)[0].decode("ascii", "replace"))
    if len(first) >= _FRAME_HEADER_BYTES and first[_FRAME_TYPE_AT] == _SETTINGS_FRAME:
        return Probe(Transport.GRPC)
    if first and first[0] in _TLS_RECORD_TYPES:
        return Probe(Transport.TLS)
    if not first:
        # A gRPC port serving TLS closes a plaintext request this way.
        return Probe(
            Transport.OTHER,
            "it closed the connection without a word: a TLS port? give its CA with --ca "
            "or CAPSTAN_CA",
        )
    return Probe(Transport.OTHER, f"it answered {first[:16]!r}")


def listed_services(channel: grpc.Channel, timeout_s: float = 2.0) -> frozenset[str] | None:
    """The services a gRPC server lists through reflection; None when it does not say."""
    stub = rpb_grpc.ServerReflectionStub(channel)
    request = rpb.ServerReflectionRequest(list_services="")
    try:
        for reply in stub.ServerReflectionInfo(iter([request]), timeout=timeout_s):
            return frozenset(s.name for s in reply.list_services_response.service)
    except grpc.RpcError:
        return None
    return None


def describe(services: Iterable[str]) -> str:
    """Which server lists `services`: "a Capstan controller", "a Capstan broker", or
    "a gRPC server serving …"."""
    listed = frozenset(services)
    if CONTROLLER in listed:
        return "a Capstan controller"
    if PULL in listed:
        return "a Capstan broker"
    own = sorted(listed - {REFLECTION, HEALTH})
    return f"a gRPC server serving {', '.join(own)}" if own else "a gRPC server with no service"
