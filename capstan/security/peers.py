"""How a Capstan server dials its peers (its master, the other replicas, the controller,
the brokers it fronts): over TLS when its own port is, trusting the cluster's CA, and
signed as the cluster (`capstan.cluster`, with the cluster's secret) when authentication
is on, for the calls only the cluster's own processes may make.

The server's composition root configures this once at start (`configure`); the modules
that open peer channels ask `peer_security()` for it. A process that configured nothing
dials in plaintext and signs nothing, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from capstan.common.errors import ConfigError
from capstan.common.security_settings import TlsSettings
from capstan.security.signature import Credentials, signed_metadata
from capstan.security.tls import channel_credentials

CLUSTER_ACCESS_KEY = "capstan.cluster"
"""The access key the cluster's own processes sign with (no user may take this name: a
user name has no room for it in the table, which the guard never consults for it)."""


def read_cluster_secret(path: Path) -> str:
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the cluster secret {path}: {exc.strerror}") from None
    if len(secret) < 16:
        raise ConfigError(f"the cluster secret in {path} must be at least 16 characters")
    return secret


class _AioSigning(
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Signs every call of an aio channel afresh with the cluster's identity."""

    def __init__(self, identity: Credentials) -> None:
        self._identity = identity

    def _signed(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        for key, value in signed_metadata(self._identity):
            metadata.add(key, value)
        return details._replace(metadata=metadata)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._signed(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._signed(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._signed(details), requests)

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._signed(details), requests)


@dataclass(frozen=True)
class PeerSecurity:
    ca_file: Path | None = None
    """The CA peers' certificates are checked against; None: plaintext."""
    identity: Credentials | None = None
    """The cluster's keys, signing calls made as the cluster; None: unsigned."""

    def signature(self) -> list[tuple[str, str]]:
        """Fresh metadata signing one call as the cluster (none when unsigned). grpc.aio's
        interceptors do not reach a streaming call driven by `write`, so those pass it."""
        return signed_metadata(self.identity) if self.identity is not None else []

    def channel(
        self, address: str, options: list[tuple[str, Any]], as_cluster: bool = True
    ) -> grpc.aio.Channel:
        """An aio channel to `address`; its unary calls signed as the cluster unless
        `as_cluster` is false (a call made on a client's behalf carries the client's own
        signature); streaming calls pass `signature()` themselves."""
        interceptors = (
            [_AioSigning(self.identity)] if as_cluster and self.identity is not None else None
        )
        if self.ca_file is None:
            return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
        return grpc.aio.secure_channel(
            address, channel_credentials(self.ca_file), options=options, interceptors=interceptors
        )


_configured = PeerSecurity()


def configure(tls: TlsSettings, cluster_secret_file: str = "") -> PeerSecurity:
    """Dial peers as `tls` says and, with `cluster_secret_file`, sign as the cluster, from
    now on, in this process."""
    global _configured
    identity = None
    if cluster_secret_file:
        secret = read_cluster_secret(Path(cluster_secret_file).expanduser())
        identity = Credentials(CLUSTER_ACCESS_KEY, secret)
    ca = Path(tls.ca_file).expanduser() if tls.enabled else None
    _configured = PeerSecurity(ca, identity)
    return _configured


def peer_security() -> PeerSecurity:
    return _configured


def dial_peer(address: str, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
    """A channel for calls this process makes as the cluster (replication, the
    controller, probes of the other replicas), as configured when it is opened."""
    return _configured.channel(address, options)


def dial_for_client(address: str, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
    """A channel for calls made on a client's behalf, which carry its own signature."""
    return _configured.channel(address, options, as_cluster=False)
