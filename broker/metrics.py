"""The broker's Prometheus metrics, named after RocketMQ 5's where one exists.

Each broker owns a registry (tests run several brokers in one process). Gauges that are
cheap to compute at scrape time (consumer lag, topic count) come from a collector that
asks the broker when scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)


@dataclass(frozen=True, slots=True)
class GroupLag:
    group: str
    topic: str
    lag: int
    inflight: int


@dataclass(frozen=True, slots=True)
class GroupMembersGauge:
    group: str
    members: int
    inconsistent: bool


@dataclass(frozen=True, slots=True)
class BrokerGauges:
    """What the scrape-time collector reads from the broker."""

    topics: int
    groups: int
    producers: int
    consumers: int
    lags: list[GroupLag]
    pending_delayed: int
    pending_half: int
    group_members: list[GroupMembersGauge]
    commitlog_max_offset: int
    dispatch_behind_bytes: int
    long_polls_suspended: int
    replication: ReplicationGauge | None = None
    commitlog_bytes: int = 0
    """CommitLog bytes kept on disk (its end minus the oldest kept offset)."""
    disk_used_ratio: float = 0.0
    """How full the store's file system is (what retention compares)."""
    disk_max_used_ratio: float = 1.0
    """The store's disk_max_used_ratio setting."""


@dataclass(frozen=True, slots=True)
class ReplicationGauge:
    """This broker's place in its replica group (None when standalone)."""

    is_master: bool
    master_epoch: int
    sync_state_set_size: int  # 0 when no controller keeps one
    acks_waiting: int
    confirm_offset: int
    slave_lag_bytes: dict[int, int]  # master: per following slave id
    acting_master: bool = False  # a slave serving the master-only duties (no controller)
    min_in_sync_replicas: int = 0  # the setting: fewer in sync and writes are refused
    damaged_records: int = 0  # a slave's records that fail their checks, not mended yet


class _BeforeScrape(Collector):
    """Runs `prepare` at the start of each scrape; serves nothing itself."""

    def __init__(self, prepare: Callable[[], None]) -> None:
        self._prepare = prepare

    def collect(self) -> Iterable[Metric]:
        self._prepare()
        return ()

    def describe(self) -> Iterable[Metric]:
        return ()


class _ScrapeCollector(Collector):
    def __init__(self, read: Callable[[], BrokerGauges], cluster: str, node: str) -> None:
        self._read = read
        self._labels = {"cluster": cluster, "node_id": node}

    def collect(self) -> Iterable[Metric]:
        g = self._read()
        base, values = list(self._labels), list(self._labels.values())
        for name, doc, value in (
            ("rocketmq_topic_number", "Topics on this broker", g.topics),
            ("rocketmq_consumer_group_number", "Consumer groups on this broker", g.groups),
            ("rocketmq_producer_connections", "Producers with a live session", g.producers),
            ("rocketmq_consumer_connections", "Consumers with a live session", g.consumers),
            ("rocketmq_timer_enqueue_messages", "Delayed messages not yet due", g.pending_delayed),
            ("capstan_transaction_half_messages", "Undecided half messages", g.pending_half),
            ("capstan_commitlog_max_offset_bytes", "End of the CommitLog", g.commitlog_max_offset),
            (
                "capstan_dispatch_behind_bytes",
                "CommitLog bytes not yet in consume queues",
                g.dispatch_behind_bytes,
            ),
            (
                "capstan_long_polls_suspended",
                "Receives and pulls waiting for a message (long polling)",
                g.long_polls_suspended,
            ),
            ("rocketmq_storage_size", "CommitLog bytes kept on disk", g.commitlog_bytes),
            (
                "capstan_store_disk_used_ratio",
                "How full the store's file system is, 0 to 1",
                g.disk_used_ratio,
            ),
            (
                "capstan_store_disk_max_used_ratio",
                "Above this, retention deletes the oldest files and sends are refused",
                g.disk_max_used_ratio,
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=base)
            family.add_metric(values, value)
            yield family
        lag = GaugeMetricFamily(
            "rocketmq_consumer_lag_messages",
            "Messages a group has not consumed yet, per topic",
            labels=[*base, "consumer_group", "topic"],
        )
        inflight = GaugeMetricFamily(
            "rocketmq_consumer_inflight_messages",
            "Messages delivered to a group and not yet acknowledged",
            labels=[*base, "consumer_group", "topic"],
        )
        for item in g.lags:
            lag.add_metric([*values, item.group, item.topic], item.lag)
            inflight.add_metric([*values, item.group, item.topic], item.inflight)
        yield lag
        yield inflight
        members = GaugeMetricFamily(
            "capstan_consumer_group_members",
            "SDK consumers in a group (from their heartbeats)",
            labels=[*base, "consumer_group"],
        )
        inconsistent = GaugeMetricFamily(
            "capstan_consumer_subscription_inconsistent",
            "1 when members of a group subscribe differently",
            labels=[*base, "consumer_group"],
        )
        for group in g.group_members:
            members.add_metric([*values, group.group], group.members)
            inconsistent.add_metric([*values, group.group], int(group.inconsistent))
        yield members
        yield inconsistent
        if g.replication is not None:
            yield from _replication_families(g.replication, base, values)


def _replication_families(
    r: ReplicationGauge, base: list[str], values: list[str]
) -> Iterable[Metric]:
    for name, doc, value in (
        (
            "capstan_replica_is_master",
            "1 while this broker is its group's master",
            int(r.is_master),
        ),
        (
            "capstan_replica_acting_master",
            "1 while this slave acts for its absent master (slave-acting-master)",
            int(r.acting_master),
        ),
        ("capstan_replica_master_epoch", "The master epoch this broker knows", r.master_epoch),
        (
            "capstan_replica_sync_state_set_size",
            "Brokers in the group's SyncStateSet, the master included (0: no controller)",
            r.sync_state_set_size,
        ),
        ("capstan_replica_acks_waiting", "Writes waiting for their copies", r.acks_waiting),
        ("capstan_replica_confirm_offset_bytes", "What consumers may read up to", r.confirm_offset),
        (
            "capstan_replica_damaged_records",
            "Records of this broker's CommitLog found failing their checks and not mended "
            "yet (a slave fetches them again from its master and is out of the SyncStateSet "
            "meanwhile)",
            r.damaged_records,
        ),
        (
            "capstan_replica_min_in_sync_replicas",
            "Brokers that must be in sync for a write (the setting; 0: no minimum)",
            r.min_in_sync_replicas,
        ),
    ):
        family = GaugeMetricFamily(name, doc, labels=base)
        family.add_metric(values, value)
        yield family
    lag = GaugeMetricFamily(
        "capstan_replica_slave_lag_bytes",
        "CommitLog bytes a following slave has not acknowledged yet (on the master)",
        labels=[*base, "slave_id"],
    )
    for slave_id, behind in sorted(r.slave_lag_bytes.items()):
        lag.add_metric([*values, str(slave_id)], behind)
    yield lag


AUTH_FAILURE_REASONS = (
    "missing",
    "malformed",
    "unknown_user",
    "disabled_user",
    "wrong_signature",
    "expired",
    "forbidden",
)


class BrokerMetrics:
    """Counters and histograms updated on the request paths."""

    def __init__(self, cluster: str, node: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._cluster, self._node = cluster, node
        # First in the registry, so what it prepares is in the same scrape's counters.
        self._groups: Callable[[], Iterable[str]] = list
        self.registry.register(_BeforeScrape(lambda: self.know_groups(self._groups())))
        labels = ["topic"]
        self.messages_in = Counter(
            "rocketmq_messages_in", "Messages stored", labels, registry=self.registry
        )
        self.messages_out = Counter(
            "rocketmq_messages_out", "Messages delivered", labels, registry=self.registry
        )
        self.bytes_in = Counter(
            "rocketmq_throughput_in", "Body bytes stored", labels, registry=self.registry
        )
        self.bytes_out = Counter(
            "rocketmq_throughput_out", "Body bytes delivered", labels, registry=self.registry
        )
        self.rpc_latency = Histogram(
            "rocketmq_rpc_latency",
            "Time to answer a request, in seconds",
            ["protocol_type", "request_code", "response_code"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        # Labelled children, looked up once: `labels()` takes a lock and checks its
        # arguments on every call, and these two run on every send.
        self._rpc_children: dict[tuple[str, str, int], Histogram] = {}
        self._in_children: dict[str, tuple[Counter, Counter]] = {}
        self.redeliveries = Counter(
            "capstan_pop_redeliveries",
            "Messages delivered again after their invisible time ran out",
            ["consumer_group"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "rocketmq_send_to_dlq_messages",
            "Messages moved to a dead-letter topic",
            ["consumer_group"],
            registry=self.registry,
        )
        self.send_backs = Counter(
            "capstan_consumer_send_back_messages",
            "Failed messages a consumer sent back for retry (or to the dead-letter topic)",
            ["consumer_group"],
            registry=self.registry,
        )
        self.subscription_conflicts = Counter(
            "capstan_consumer_subscription_conflicts",
            "Times members of a group were found subscribing differently",
            ["consumer_group"],
            registry=self.registry,
        )
        self.put_failures = Counter(
            "capstan_put_failures",
            "Writes not acknowledged as stored and copied, by outcome (FLUSH_DISK_TIMEOUT, "
            "FLUSH_SLAVE_TIMEOUT, IN_SYNC_REPLICAS_NOT_ENOUGH, ...)",
            ["status"],
            registry=self.registry,
        )
        # Every outcome an alert watches is a series from the start, at 0: rate() and
        # increase() then see its first failure, and a query finds it before anything fails.
        for status in ("FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "IN_SYNC_REPLICAS_NOT_ENOUGH"):
            self.put_failures.labels(status)
        self._known_groups: set[str] = set()
        self.transaction_checks = Counter(
            "capstan_transaction_checks",
            "Check-back commands sent to producers, by where the producer was connected "
            "(local: this broker; replica: another replica of the group passed it on)",
            ["via"],
            registry=self.registry,
        )
        for via in ("local", "replica"):
            self.transaction_checks.labels(via)
        self.auth_failures = Counter(
            "capstan_auth_failures",
            "Calls refused by authentication (missing, malformed, unknown_user, disabled_user, "
            "wrong_signature, expired) or by authorization (forbidden)",
            ["reason"],
            registry=self.registry,
        )
        for reason in AUTH_FAILURE_REASONS:
            self.auth_failures.labels(reason)
        self.replica_healed = Counter(
            "capstan_replica_healed_records",
            "Damaged records of this slave's CommitLog written over with the master's copy",
            registry=self.registry,
        )
        self.replica_scrubbed = Counter(
            "capstan_replica_scrubbed_bytes",
            "CommitLog bytes this slave's scrub has checked",
            registry=self.registry,
        )

    def know_groups(self, groups: Iterable[str]) -> None:
        """Give each consumer group its per-group counters at 0 (see put_failures)."""
        for group in groups:
            if group not in self._known_groups:
                self._known_groups.add(group)
                for counter in (self.redeliveries, self.dead_letters, self.send_backs):
                    counter.labels(group)

    def watch(
        self, read: Callable[[], BrokerGauges], groups: Callable[[], Iterable[str]] = list
    ) -> None:
        """Serve `read()`'s gauges at each scrape, and counters for each of `groups()`."""
        self._groups = groups
        self.registry.register(_ScrapeCollector(read, self._cluster, self._node))

    def observe_rpc(self, protocol: str, request: str, code: int, seconds: float) -> None:
        key = (protocol, request, code)
        histogram = self._rpc_children.get(key)
        if histogram is None:
            histogram = self.rpc_latency.labels(protocol, request, str(code))
            self._rpc_children[key] = histogram
        histogram.observe(seconds)

    def count_in(self, topic: str, messages: int, body_bytes: int) -> None:
        counters = self._in_children.get(topic)
        if counters is None:
            counters = self._in_children[topic] = (
                self.messages_in.labels(topic),
                self.bytes_in.labels(topic),
            )
        counters[0].inc(messages)
        counters[1].inc(body_bytes)

    def count_out(self, topic: str, messages: int, body_bytes: int) -> None:
        self.messages_out.labels(topic).inc(messages)
        self.bytes_out.labels(topic).inc(body_bytes)
