"""The broker's settings: one frozen dataclass per subsystem, loaded from one YAML file.

Every key of the YAML file is a field below, nested by section (`store:`, `pop:`,
`timer:`, `transaction:`, `consumer_groups:`,
`replication:`, `auth:`, `tls:`); an unknown key is an error that names it.
docs/broker.md lists them all with their defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from capstan.common.security_settings import AuthSettings, TlsSettings
from capstan.common.settings import load_settings_file, settings_from_yaml
from capstan.common.store_settings import StoreSettings
from capstan.common.zone import zone_problem

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class PopSettings:
    """Receive/ack consumption (the official clients' ReceiveMessage)."""

    min_invisible_ms: int = 10_000
    """Shortest invisible duration a receive may ask for, in milliseconds. Default 10,000
    (RocketMQ's). ChangeInvisibleDuration may go down to 0."""

    max_invisible_ms: int = 12 * HOUR_MS
    """Longest invisible duration, in milliseconds. Default 12 hours."""

    auto_renew_invisible_ms: int = 60_000
    """Invisible duration for receives that ask the broker to choose (PushConsumer's
    auto_renew), in milliseconds. Default 60,000."""

    max_long_polling_ms: int = 20_000
    """Longest a receive waits for a message, in milliseconds. Default 20,000."""

    min_long_polling_ms: int = 0
    """Shortest accepted long-polling timeout, in milliseconds. Default 0."""

    max_batch_size: int = 32
    """Most messages one receive returns. Default 32."""

    journal_sync_interval_ms: int = 1_000
    """How often the pop journal (in-flight handles and acks) is fsynced, in milliseconds.
    Every change is written to the file at once, so it survives a killed broker; the fsync
    bounds what a machine crash can lose. Default 1,000."""

    journal_compact_bytes: int = 64 * 1024 * 1024
    """The journal is rewritten as a snapshot once it grows past this, in bytes.
    Default 64 MiB."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_invisible_ms <= self.max_invisible_ms:
            raise ValueError("need 0 <= min_invisible_ms <= max_invisible_ms")
        if not self.min_invisible_ms <= self.auto_renew_invisible_ms <= self.max_invisible_ms:
            raise ValueError("auto_renew_invisible_ms must lie within the invisible range")
        if not 0 <= self.min_long_polling_ms <= self.max_long_polling_ms:
            raise ValueError("need 0 <= min_long_polling_ms <= max_long_polling_ms")
        if self.max_batch_size < 1 or self.journal_sync_interval_ms < 1:
            raise ValueError("max_batch_size and journal_sync_interval_ms must be positive")


@dataclass(frozen=True)
class TimerSettings:
    """Delayed delivery (DELAY messages and retry back-off levels)."""

    max_delay_ms: int = 24 * HOUR_MS
    """Furthest in the future a delivery time may be, in milliseconds. Default 1 day."""

    progress_interval_ms: int = 1_000
    """How often the timer records how far it has delivered, in milliseconds. Default 1,000."""

    def __post_init__(self) -> None:
        if self.max_delay_ms < 1 or self.progress_interval_ms < 1:
            raise ValueError("timer settings must be positive")


@dataclass(frozen=True)
class TransactionSettings:
    """Half messages and the check-back to producers."""

    check_timeout_ms: int = 6_000
    """How old an undecided half message must be before its producer is asked about it,
    in milliseconds. Default 6,000. A message's own recovery duration overrides it."""

    check_interval_ms: int = 30_000
    """How often undecided half messages are checked, in milliseconds. Default 30,000."""

    max_checks: int = 15
    """How many times a producer is asked before the half message is moved to
    TRANS_CHECK_MAX_TIME_TOPIC. Default 15."""

    def __post_init__(self) -> None:
        if self.check_timeout_ms < 0 or self.check_interval_ms < 1 or self.max_checks < 1:
            raise ValueError("transaction settings out of range")


@dataclass(frozen=True)
class ConsumerGroupSettings:
    """Members of the SDK's consumer groups and their queue locks (capstan.v1.Consumer)."""

    member_expiry_s: float = 30.0
    """A consumer that has not sent a heartbeat for this long leaves its group, in seconds,
    and its queue locks are released. Default 30 (the SDK beats every 5 s)."""

    queue_lock_expiry_s: float = 60.0
    """An orderly consumer's queue lock lapses this long after its last renewal, in
    seconds. Default 60 (RocketMQ's; the SDK renews every 20 s)."""

    def __post_init__(self) -> None:
        if self.member_expiry_s <= 0 or self.queue_lock_expiry_s <= 0:
            raise ValueError("consumer group expiry times must be positive")


@dataclass(frozen=True)
class ReplicationSettings:
    """Copies of this broker group's CommitLog on other brokers (docs/controller.md).

    With `controller_address` the controller decides: the broker registers, heartbeats,
    and is told whether it leads the group or which master to follow. Without one the
    roles are fixed here: `role: master` serves writes and streams its CommitLog to the
    slaves that follow it; `role: slave` follows `master_address`. The acknowledgement
    keys keep RocketMQ's names; left at 0 they take Capstan's safe defaults for `replicas`
    brokers."""

    controller_address: str = ""
    """host:port of the controller's gRPC port, several separated by commas (every
    controller replica). When set, the controller assigns the broker id and the role, and
    `role`, `broker_id` and `master_address` must be left out. Default empty (no
    controller)."""

    heartbeat_interval_ms: int = 1_000
    """How often the broker heartbeats to the controller (and, as master, reviews its
    SyncStateSet), in milliseconds. Default 1,000."""

    handover_timeout_ms: int = 5_000
    """With a controller: how long a master told to stop (SIGTERM) may spend handing its
    leadership to a caught-up SyncStateSet member before it stops anyway, in milliseconds;
    calls wait meanwhile and then go to the new master. A slave told to stop leaves the
    SyncStateSet within the same bound. 0 turns both off (the group has no master until the
    controller misses this broker's heartbeats). Default 5,000."""

    role: str = "standalone"
    """standalone (no replication), master or slave; without a controller only. Default
    standalone."""

    broker_id: int = 0
    """This broker's id within its group (RocketMQ's brokerId: 0 for the master without a
    controller). Default 0."""

    master_address: str = ""
    """host:port of the master's gRPC port; a slave's only. Default empty."""

    replicas: int = 1
    """Brokers in the group, the master included; sets the safe acknowledgement defaults.
    Default 1."""

    in_sync_replicas: int = 0
    """Copies a write needs, the master's included (RocketMQ's inSyncReplicas). 0: as many
    as `replicas`, or `min_in_sync_replicas` when acknowledging by quorum. Default 0."""

    min_in_sync_replicas: int = 0
    """Fewest in-sync brokers, the master included, for a write to be accepted at all; below
    it writes get IN_SYNC_REPLICAS_NOT_ENOUGH. 0: a majority for 3 or more replicas, 1 for
    fewer. Default 0."""

    all_ack_in_sync_state_set: bool | None = None
    """With a controller: true, a write waits for every SyncStateSet member; false, for
    `in_sync_replicas` of them, whichever they are (acknowledgement by quorum,
    docs/controller.md). Unset: every member for fewer than 3 replicas, by quorum for 3 or
    more. Default unset."""

    enable_auto_in_sync_replicas: bool = False
    """Without a controller: lower the copies needed to the slaves connected and in sync,
    never below min_in_sync_replicas. Default false (a write waits for in_sync_replicas)."""

    ha_max_gap_not_in_sync_bytes: int = 256 * 1024 * 1024
    """A slave lagging by at most this many bytes counts as in sync. Default 256 MiB."""

    slave_ack_timeout_ms: int = 3_000
    """How long a write waits for its copies before FLUSH_SLAVE_TIMEOUT, in milliseconds.
    Default 3,000."""

    ha_max_time_slave_not_catchup_ms: int = 15_000
    """A slave that has not caught up with the master for this long leaves the
    SyncStateSet, in milliseconds. Default 15,000."""

    hung_replica_routed_ms: int = 0
    """How long routes keep naming a replica the controller counts down whose address
    accepts connections but serves nothing (a stopped or hung process), in milliseconds.
    The official clients refresh routes every 30 s and keep their channel on one replica.
    0 leaves it out at once, so clients whose channel sits on it move off at their next
    refresh (a replica whose address refuses connections stays named; one that does not
    answer at all is left out at once either way). A longer hold keeps a briefly stopped
    replica in the routes taken meanwhile: a client whose route left it out has a channel
    with the other replicas only until its next refresh, and a kill of those then fails
    its sends until that refresh. The cost is that clients on a hung replica wait for it
    for as long. Default 0."""

    slave_stall_ms: int = 1_000
    """A SyncStateSet member that acknowledges nothing for this long while the master
    holds bytes sent to it (stopped, hung, cut off: not merely slow) leaves the set at once
    where min_in_sync_replicas allows; where it does not, writes fail at once with
    IN_SYNC_REPLICAS_NOT_ENOUGH naming it until it answers again. In milliseconds; 0 leaves
    it to ha_max_time_slave_not_catchup_ms. Default 1,000."""

    slave_ack_after_fsync: bool = False
    """A slave acknowledges bytes only once fsynced, not once written. Default false."""

    scrub_bytes_per_s: int = 1024 * 1024
    """As a slave: how many CommitLog bytes a second the scrub reads to check every stored
    record's CRCs; a damaged record is fetched again from the master (and the slave leaves
    the SyncStateSet until it has). 0 turns the scrub off (a damaged record a read meets is
    still mended). Default 1 MiB/s (a pass over 84 GiB a day)."""

    chunk_bytes: int = 1024 * 1024
    """About how many bytes of CommitLog one LogChunk carries. Default 1 MiB."""

    metadata_interval_ms: int = 500
    """How often the master checks its topics, groups and offsets for changes to send, in
    milliseconds. Default 500."""

    peers: str = ""
    """Without a controller: every broker of the group as `id@host:port`, separated by
    commas (the same list in each broker's config; a broker skips its own id). Brokers
    probe each other, a slave passes calls on to the master while it answers, and routes
    name every replica. Default empty (a slave knows only `master_address`)."""

    slave_acting_master: bool = False
    """Without a controller: while the master is gone, the live slave with the smallest id
    serves the master-only duties (offset commits, queue locks, pop and ack, the timer and
    transaction checks, sending their re-deliveries to `escape_addresses`) while refusing
    new writes; the returning master takes back what it changed before serving (RocketMQ's
    enableSlaveActingMaster). Needs `peers`. Default false."""

    peer_timeout_ms: int = 6_000
    """A peer that has not answered a probe for this long counts as gone, in milliseconds.
    Probes go out every `heartbeat_interval_ms`. Default 6,000."""

    escape_addresses: str = ""
    """host:port of brokers in other groups, separated by commas, where an acting master
    stores what it may not store itself (due delayed messages, committed transactions, dead
    letters); the first master that takes a message keeps it. Default empty (they wait
    until the master returns)."""

    def __post_init__(self) -> None:
        if self.role not in ("standalone", "master", "slave"):
            raise ValueError(f"role must be standalone, master or slave, not {self.role!r}")
        if self.controller_address and (
            self.role != "standalone" or self.broker_id or self.master_address
        ):
            raise ValueError(
                "with controller_address the controller assigns role, broker_id and "
                "master_address; leave them out"
            )
        if self.heartbeat_interval_ms < 1:
            raise ValueError("heartbeat_interval_ms must be positive")
        if self.handover_timeout_ms < 0:
            raise ValueError("handover_timeout_ms must not be negative")
        if self.role == "slave" and not self.master_address:
            raise ValueError("a slave needs master_address")
        if self.broker_id < 0 or self.replicas < 1:
            raise ValueError("broker_id must be >= 0 and replicas >= 1")
        if self.in_sync_replicas < 0 or self.min_in_sync_replicas < 0:
            raise ValueError("in_sync_replicas and min_in_sync_replicas must be >= 0")
        if self.scrub_bytes_per_s < 0:
            raise ValueError("scrub_bytes_per_s must not be negative (0 turns the scrub off)")
        if min(self.slave_ack_timeout_ms, self.chunk_bytes, self.metadata_interval_ms) < 1:
            raise ValueError("timeouts, intervals and chunk_bytes must be positive")
        if self.ha_max_time_slave_not_catchup_ms < 1 or self.ha_max_gap_not_in_sync_bytes < 0:
            raise ValueError("ha_max_time_slave_not_catchup_ms must be positive")
        if self.slave_stall_ms < 0:
            raise ValueError("slave_stall_ms must not be negative")
        if self.hung_replica_routed_ms < 0:
            raise ValueError("hung_replica_routed_ms must not be negative")
        peers = self.peer_addresses  # raises on a malformed entry
        if (self.peers or self.escape_addresses) and self.controller_address:
            raise ValueError("peers and escape_addresses are for groups without a controller")
        if self.slave_acting_master and (self.role == "standalone" or not peers):
            raise ValueError("slave_acting_master needs a master or slave role and peers")
        if self.peer_timeout_ms < 1:
            raise ValueError("peer_timeout_ms must be positive")

    @property
    def enabled(self) -> bool:
        return self.role != "standalone" or self.controlled

    @property
    def controlled(self) -> bool:
        """Whether the controller assigns this broker's role."""
        return bool(self.controller_address)

    @property
    def controller_addresses(self) -> list[str]:
        return [a.strip() for a in self.controller_address.split(",") if a.strip()]

    @property
    def peer_addresses(self) -> dict[int, str]:
        """`peers` as broker id -> host:port."""
        found: dict[int, str] = {}
        for entry in (e.strip() for e in self.peers.split(",")):
            if not entry:
                continue
            ident, at, address = entry.partition("@")
            host, colon, port = address.rpartition(":")
            if not (at and ident.isdigit() and host and colon and port.isdigit()):
                raise ValueError(f"peers entry {entry!r} is not id@host:port")
            if int(ident) in found:
                raise ValueError(f"peers names broker id {ident} twice")
            found[int(ident)] = address
        return found

    @property
    def escape_address_list(self) -> list[str]:
        return [a.strip() for a in self.escape_addresses.split(",") if a.strip()]


@dataclass(frozen=True)
class BrokerSettings:
    """One broker process."""

    broker_name: str = "broker-a"
    """Name of the broker group, as clients see it in routes. Default broker-a."""

    data_dir: str = "capstan-data"
    """Directory of the store and the broker's state files. Default ./capstan-data."""

    listen_host: str = "0.0.0.0"
    """Address the gRPC and HTTP servers bind. Default 0.0.0.0."""

    grpc_port: int = 8081
    """gRPC port (RocketMQ v2 clients, capstan.v1 admin). 0 picks a free port. Default 8081."""

    http_port: int = 9100
    """HTTP port for /metrics, /healthz and /readyz; -1 disables it. Default 9100."""

    advertised_host: str = ""
    """Host put in routes when a client did not say how it reached us. Default: the host the
    client connected to, else 127.0.0.1."""

    route_endpoint: str = ""
    """host:port that routes name for this broker's group instead of its replicas' own
    addresses: a Kubernetes Service in front of the replicas, say (any replica serves a
    client; a slave passes writes on to its master). A client that says how it reached the
    broker (the official clients send their access point) is routed back that way instead,
    so one that came through a NodePort, a port-forward or a load balancer stays on it.
    Default empty: the replicas."""

    zone: str = ""
    """The zone (rack) this broker runs in, reported to the controller and shown by
    `capstan cluster status`. Default empty: unknown, or read from `zone_file`."""

    zone_file: str = ""
    """A file holding the zone, read at every heartbeat (a BrokerGroup with
    `spec.rack` mounts one the operator fills from the node's topology label). Used while
    `zone` is empty. Default empty: none."""

    auto_create_topic: bool = False
    """Create unknown topics on first send. Default false."""

    auto_create_group: bool = False
    """Create unknown consumer groups on first use. Default false."""

    default_queue_nums: int = 8
    """Queues of an auto-created topic. Default 8."""

    max_message_body_bytes: int = 4 * 1024 * 1024
    """Largest accepted body, in bytes (also the store's limit). Default 4 MiB."""

    max_pull_long_polling_ms: int = 15_000
    """Longest a PullMessage waits for a message, in milliseconds. Default 15,000."""

    shutdown_grace_s: float = 10.0
    """On SIGTERM, how long running calls may finish before they are cancelled, in
    seconds. Default 10."""

    shutdown_delay_s: float = 0.0
    """On SIGTERM, how long the broker keeps taking connections and calls after it has
    stepped aside and turned not ready, counted from the signal, in seconds: the time a
    Service or load balancer takes to stop sending it new connections (a pod being deleted
    leaves its Service's endpoints at once, but kube-proxy applies that a moment later, and a
    connection it sends to a closed port is refused). Default 0; the operator sets 3."""

    store: StoreSettings = field(default_factory=StoreSettings)
    pop: PopSettings = field(default_factory=PopSettings)
    timer: TimerSettings = field(default_factory=TimerSettings)
    transaction: TransactionSettings = field(default_factory=TransactionSettings)
    consumer_groups: ConsumerGroupSettings = field(default_factory=ConsumerGroupSettings)
    replication: ReplicationSettings = field(default_factory=ReplicationSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)

    def __post_init__(self) -> None:
        if not 0 <= self.grpc_port <= 65535 or not -1 <= self.http_port <= 65535:
            raise ValueError("ports must be within 0..65535 (http_port -1 disables HTTP)")
        if self.default_queue_nums < 1:
            raise ValueError("default_queue_nums must be positive")
        problem = zone_problem(self.zone)
        if problem:
            raise ValueError(problem)
        if self.max_message_body_bytes > self.store.max_message_bytes:
            raise ValueError("max_message_body_bytes may not exceed store.max_message_bytes")

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()


def broker_settings_from_yaml(text: str, where: str = "config") -> BrokerSettings:
    """Parse a broker config document; errors name the offending key."""
    return settings_from_yaml(BrokerSettings, text, where)


def load_broker_settings(path: Path | None, overrides: Sequence[str] = ()) -> BrokerSettings:
    """The settings in the file at `path` (None: the defaults), with `--set` overrides."""
    return load_settings_file(BrokerSettings, path, "broker config", overrides)
