"""One gRPC channel per peer address, opened on first use and closed together.

Brokers and the controller keep talking to the same few peers (controllers, masters,
replicas); a channel per address reconnects by itself, at most `RECONNECT_BACKOFF_MS`
apart, so a peer that comes back is reached again within seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from capstan.common.grpc_limits import MESSAGE_SIZE_OPTIONS

RECONNECT_BACKOFF_MS = 1000
"""The longest a channel waits between attempts to reach a peer that was down (gRPC's
default grows to 120 s; 2 s here left brokers a second or two late to a controller that
had started again after a power loss)."""
DNS_MIN_INTERVAL_MS = 1000
"""How soon a channel may look a name up again (gRPC's default is 30 s): on Kubernetes a
replaced pod keeps its name but not its address, and the channel re-resolves only after a
connection fails."""
CONNECT_TIMEOUT_MS = 1000
"""How long one attempt to connect (TCP, TLS, HTTP/2) may take before it counts as failed
(gRPC's `min_reconnect_backoff_ms`, 20 s by default). A replaced pod's old address often
answers nothing at all, not even a refusal: a channel that looked the name up while the
old pod was going kept trying that address for 20 s, and every call passed on to the new
master on that name waited out its deadline (the e2e story's kill -9 of a master after a
deleted master pod: 6-9 s without an acknowledged send). Failing the attempt after a
second makes the channel look the name up again and reach the pod where it is now."""
CONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ("grpc.dns_min_time_between_resolutions_ms", DNS_MIN_INTERVAL_MS),
]
"""What every channel to a peer by name needs, pooled or not."""
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    *MESSAGE_SIZE_OPTIONS,
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    *CONNECT_OPTIONS,
]
QUICK_RECONNECT_BACKOFF_MS = 250
"""The cap for a channel to a peer whose return others wait on: a broker's to its
controllers. A group whose master died with the controller elects only once a slave's
heartbeat reaches the controller again, and at the 1-s cap that came up to a second after
the controller listened (`capstan bench failover`'s master-and-controller kill: 2.7 s of
failed sends, against 1.5 s)."""
QUICK_RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    *MESSAGE_SIZE_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", QUICK_RECONNECT_BACKOFF_MS),
    *CONNECT_OPTIONS,
]


Dial = Callable[[str, list[tuple[str, Any]]], grpc.aio.Channel]
"""Opens a channel to an address with options (capstan.security.peers: TLS, the
cluster's signature)."""


def plaintext(address: str, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=options)


class ChannelPool:
    """Use from one event loop. `dial` opens each channel (default: plaintext) with
    `options` (default: CHANNEL_OPTIONS)."""

    def __init__(
        self, dial: Dial = plaintext, options: list[tuple[str, Any]] | None = None
    ) -> None:
        self._dial = dial
        self._options = CHANNEL_OPTIONS if options is None else options
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._dial(address, self._options)
        return channel

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
