"""How a Capstan server dials its peers (its master, the other replicas, the controller,
the brokers it fronts): over TLS when its own port is, trusting the cluster's CA, and
signed as the cluster (`capstan.cluster`, with the cluster's secret) when authentication
is on, for the calls only the cluster's own processes may make.

A call made on a client's behalf (a slave passing it to its master, the controller's fronts
asking each group) carries the client's own signature, and the client's address in
`x-capstan-forwarded-for`, vouched for by `x-capstan-forwarded-proof` (HMAC-SHA256 with the
cluster's secret of the address and the call's signed time): the callee judges a policy's
source addresses by the client, not by the process passing the call on, and no client can
claim another address.

The server's composition root configures this once at start (`configure`); the modules
that open peer channels ask `peer_security()` for it. A process that configured nothing
dials in plaintext and signs nothing, as before.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from capstan.common.errors import ConfigError
from capstan.common.passed_metadata import passed_metadata
from capstan.common.security_settings import TlsSettings
from capstan.security.signature import DATE_TIME, Credentials, signed_metadata
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


FORWARDED_FOR = "x-capstan-forwarded-for"
FORWARDED_PROOF = "x-capstan-forwarded-proof"
_FORWARDING_KEYS = frozenset({FORWARDED_FOR, FORWARDED_PROOF})


class ForgedForwarding(ValueError):
    """A call names a forwarded-for address without the cluster's proof of it."""


def source_address(peer: str) -> str | None:
    """The caller's IP address from a gRPC peer string (`ipv4:10.0.0.7:5123`,
    `ipv6:[fd00::1]:5123`); None for a Unix socket or anything else."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return None


def _proof(secret: str, source: str, date_time: str) -> str:
    message = f"{source}\n{date_time}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _value(metadata: Sequence[tuple[str, str | bytes]], key: str) -> str:
    for k, v in metadata:
        if k == key:
            return v.decode(errors="replace") if isinstance(v, bytes) else v
    return ""


def passed_on_behalf(
    context: Any, also_dropped: frozenset[str] = frozenset()
) -> list[tuple[str, Any]]:
    """The caller's metadata for a call this process makes on its behalf, with the caller's
    address vouched for as the cluster (when this process signs as the cluster and the
    call is signed); whatever forwarded-for entries the caller sent are dropped."""
    metadata: list[tuple[str, Any]] = passed_metadata(context, also_dropped | _FORWARDING_KEYS)
    identity = _configured.identity
    source = source_address(context.peer() or "")
    date_time = _value(metadata, DATE_TIME)
    if identity is None or source is None or not date_time:
        return metadata
    proof = _proof(identity.secret_key, source, date_time)
    return [*metadata, (FORWARDED_FOR, source), (FORWARDED_PROOF, proof)]


def forwarded_source(metadata: Sequence[tuple[str, str | bytes]], secret: str) -> str | None:
    """The client's address a peer vouches for in `metadata` (None when none is named);
    ForgedForwarding when the proof is missing or wrong."""
    source = _value(metadata, FORWARDED_FOR)
    if not source:
        return None
    wanted = _proof(secret, source, _value(metadata, DATE_TIME))
    if not hmac.compare_digest(wanted, _value(metadata, FORWARDED_PROOF)):
        raise ForgedForwarding(
            f"{FORWARDED_FOR} names {source[:64]!r} without the cluster's proof of it"
        )
    return source
