"""gRPC channels to brokers, and how a client names itself on them.

One channel per "host:port" (plaintext, or TLS trusting one CA), shared by every stub and
thread of a client (a gRPC channel multiplexes calls over its connection and is
thread-safe). Clients identify
themselves on every call with the `x-mq-client-id` metadata the broker keys its sessions by.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
import threading
import time
from pathlib import Path

import grpc

from capstan.client.signing import signed_channel
from capstan.common.channel_pool import DNS_MIN_INTERVAL_MS
from capstan.common.grpc_keepalive import CLIENT_OPTIONS
from capstan.common.grpc_limits import MESSAGE_SIZE_OPTIONS
from capstan.security.signature import Credentials
from capstan.security.tls import channel_credentials

CLIENT_ID_METADATA = "x-mq-client-id"

MAX_RECONNECT_BACKOFF_MS = 1_000
"""Longest wait between attempts to reconnect to a broker that is down, in milliseconds.
gRPC's default (2 minutes) would leave a restarted broker unused for far too long, and 5 s
(this said until session 39) left a consumer failing over onto a replica just restarted
failing for seconds more. An attempt a second at a broker that is down is a connect."""

_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    *MESSAGE_SIZE_OPTIONS,  # as large as the broker's own limit
    *CLIENT_OPTIONS,  # a server that stops answering is noticed within about 3 s
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    # A broker's pod replaced on Kubernetes keeps its name, not its address: look the name
    # up again a second after a connection fails, not gRPC's 30 s.
    ("grpc.dns_min_time_between_resolutions_ms", DNS_MIN_INTERVAL_MS),
    # The SDK decides itself whether and where to retry (another broker, not the same one).
    ("grpc.enable_retries", 0),
]

_client_counter = itertools.count()


def new_client_id() -> str:
    """A client id unique across hosts, processes and clients of one process, in the shape
    RocketMQ clients use: host@pid@counter@random."""
    host = socket.gethostname() or "localhost"
    stamp = format(time.time_ns() // 1_000_000, "x")
    return f"{host}@{os.getpid()}@{next(_client_counter)}@{stamp}{secrets.token_hex(4)}"


def call_metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    """The metadata every call of a client carries."""
    return ((CLIENT_ID_METADATA, client_id), ("x-mq-language", "PYTHON"))


class ChannelPool:
    """One channel per broker address, created on first use; thread-safe. With
    `credentials`, every call on its channels is signed (signing.py); with `ca_file`, the
    channels are TLS, trusting that CA alone."""

    def __init__(
        self, credentials: Credentials | None = None, ca_file: str | Path | None = None
    ) -> None:
        self._credentials = credentials
        self._tls = channel_credentials(Path(ca_file)) if ca_file else None
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._closed = False

    def get(self, address: str) -> grpc.Channel:
        """The channel to "host:port" (connecting lazily, on its first call)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the channel pool is closed")
            channel = self._channels.get(address)
            if channel is None:
                if self._tls is None:
                    raw = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
                else:
                    raw = grpc.secure_channel(address, self._tls, options=_CHANNEL_OPTIONS)
                channel = signed_channel(raw, self._credentials)
                self._channels[address] = channel
            return channel

    def close(self) -> None:
        """Close every channel; calls still running on them end with CANCELLED."""
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
