"""The controller's settings, loaded from one YAML file (`capstan controller --config F`);
every key is in docs/controller.md and an unknown key is an error naming it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from capstan.common.security_settings import TlsSettings
from capstan.common.settings import load_settings_file


@dataclass(frozen=True)
class StateSettings:
    """Where the controller keeps its state (one JSON document and a leader lease)."""

    backend: str = "file"
    """file (one controller, `capstan up`) or kubernetes (several replicas). Default file."""

    directory: str = "capstan-controller"
    """The file backend's directory. Default ./capstan-controller."""

    namespace: str = "default"
    """The Kubernetes backend's namespace. Default default."""

    name: str = "capstan-controller"
    """The Kubernetes backend's ConfigMap name (the Lease is `<name>-leader`). Default
    capstan-controller."""

    def __post_init__(self) -> None:
        if self.backend not in ("file", "kubernetes"):
            raise ValueError(f"state.backend must be file or kubernetes, not {self.backend!r}")


@dataclass(frozen=True)
class ControllerAuthSettings:
    """Who may make the controller's changes when the cluster has authentication on."""

    enabled: bool = False
    """Admit RegisterBroker, BrokerHeartbeat, AlterSyncStateSet and ElectMaster only when
    signed with the cluster's identity (`cluster_secret_file`); GetReplicaInfo and
    GetClusterStatus stay readable by anyone who reaches the port (they show the groups'
    shape, no data). Admin calls and routes are checked by the brokers they go to, with
    the caller's own signature. Default false."""

    cluster_secret_file: str = ""
    """The cluster's secret (the brokers' `auth.cluster_secret_file`). Required with
    `enabled`."""

    max_clock_skew_s: float = 900.0
    """How far a signed time may be from this clock, in seconds. Default 900."""

    def __post_init__(self) -> None:
        if self.enabled and not self.cluster_secret_file:
            raise ValueError("auth.enabled needs auth.cluster_secret_file")


@dataclass(frozen=True)
class ControllerSettings:
    """One controller process."""

    controller_id: str = ""
    """This replica's name in the leader lease; a controller started again under the name
    that holds the lease leads at once. Default: host name, listen host and gRPC port (the
    port can be bound by one process at a time), or host name and process id with port 0."""

    listen_host: str = "0.0.0.0"
    """Address the gRPC and HTTP servers bind. Default 0.0.0.0."""

    grpc_port: int = 9876
    """gRPC port (capstan.v1.Controller). 0 picks a free port. Default 9876."""

    http_port: int = 9101
    """HTTP port for /metrics, /healthz and /readyz; -1 disables it. Default 9101."""

    broker_timeout_ms: int = 6_000
    """A broker whose heartbeats stop for this long counts as dead; a dead master is
    replaced, in milliseconds. Default 6,000 (brokers beat every second)."""

    probe_lost_masters: bool = True
    """When a slave's heartbeat says its stream from the master broke (refused or reset),
    probe the master's health at once and elect if it is refused or answers NOT_SERVING,
    rather than wait `broker_timeout_ms` for its heartbeats to lapse. Default true."""

    silent_master_ms: int = 2_000
    """With `probe_lost_masters`: a master a slave reports silent or cut off, that answers
    no probe in time and has not sent a heartbeat for this long, is replaced now (a stopped
    or hung process) rather than after `broker_timeout_ms`; 0 leaves such a master to the
    heartbeat timeout (as does a value of `broker_timeout_ms` or more). A live master beats
    every second and answers a probe in milliseconds, so only a process stalled this long
    is replaced, in milliseconds. Default 2,000."""

    check_interval_ms: int = 1_000
    """How often the leader looks for groups without a live master, in milliseconds.
    Default 1,000."""

    lease_duration_s: float = 10.0
    """How long the leader's lease lasts without renewal, in seconds; it renews every third
    of it. Default 10."""

    unclean_election: bool = False
    """Let a replica outside the SyncStateSet become master when no member can (it may lack
    acknowledged messages). Default false."""

    state: StateSettings = field(default_factory=StateSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    auth: ControllerAuthSettings = field(default_factory=ControllerAuthSettings)

    def __post_init__(self) -> None:
        if not 0 <= self.grpc_port <= 65535 or not -1 <= self.http_port <= 65535:
            raise ValueError("ports must be within 0..65535 (http_port -1 disables HTTP)")
        if self.broker_timeout_ms < 1 or self.check_interval_ms < 1:
            raise ValueError("broker_timeout_ms and check_interval_ms must be positive")
        if self.silent_master_ms < 0:
            raise ValueError("silent_master_ms must not be negative")
        if self.lease_duration_s <= 0:
            raise ValueError("lease_duration_s must be positive")


def load_controller_settings(
    path: Path | None, overrides: Sequence[str] = ()
) -> ControllerSettings:
    """The settings in the file at `path` (None: the defaults), with `--set` overrides."""
    return load_settings_file(ControllerSettings, path, "controller config", overrides)
