"""Authentication and TLS settings, shared by the broker and the controller."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AuthSettings:
    """Who may call: the RocketMQ 5 request signature, users and ACL policies."""

    enabled: bool = False
    """Check every client call's signature against the broker's users and their policies.
    Default false (open, for local development)."""

    max_clock_skew_s: float = 900.0
    """How far a call's signed time may be from the broker's clock, either way, in seconds.
    Default 900."""

    init_user_file: str = ""
    """A JSON file `{"access_key": ..., "secret_key": ...}` naming the first super user: it
    is created at start when no user of that name exists. Default empty: none."""

    cluster_secret_file: str = ""
    """A file holding the cluster's secret, shared by its brokers, controllers and
    operator: they sign their calls to each other with it (as the access key
    `capstan.cluster`), and replication and the controller's broker-facing calls admit no
    one else. Required with `enabled`."""

    def __post_init__(self) -> None:
        if not 0 < self.max_clock_skew_s <= 86_400:
            raise ValueError("auth.max_clock_skew_s must be within (0, 86400] seconds")
        if self.enabled and not self.cluster_secret_file:
            raise ValueError("auth.enabled needs auth.cluster_secret_file (the cluster's identity)")


@dataclass(frozen=True)
class TlsSettings:
    """TLS on the process's gRPC port and on the channels it opens to its peers."""

    enabled: bool = False
    """Serve gRPC over TLS only (a plaintext client is refused) and dial peers over TLS.
    Default false."""

    cert_file: str = ""
    """PEM certificate chain of this process. Re-read when it changes: new connections
    get the new certificate, open ones go on with the old. Required with `enabled`."""

    key_file: str = ""
    """PEM private key of `cert_file`, re-read with it. Required with `enabled`."""

    ca_file: str = ""
    """PEM certificates of the CA that signs the peers' certificates (brokers and
    controllers this process calls). Required with `enabled`."""

    metrics: bool = False
    """Serve the HTTP endpoints (/metrics, /healthz, /readyz) over HTTPS too, with the
    same certificate, re-read the same way. Needs `enabled`. Default false: plain HTTP, as
    a scraper and the kubelet's probes expect unless told otherwise."""

    def __post_init__(self) -> None:
        if self.metrics and not self.enabled:
            raise ValueError("tls.metrics needs tls.enabled (the certificate it serves)")
        if self.enabled and not (self.cert_file and self.key_file and self.ca_file):
            raise ValueError("tls.enabled needs tls.cert_file, tls.key_file and tls.ca_file")
