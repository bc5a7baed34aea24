"""`spark.read.format("capstan")`: Capstan's topics as a Spark DataFrame, read through the
brokers' own APIs, so it works wherever executors can reach the brokers (on Kubernetes
they cannot mount a broker's volume). docs/spark.md says why this shape.

The driver asks the controller (option `controller`, the clients' access point) which broker
groups and replicas there are, or takes `brokers` (host:port of standalone brokers), then
asks each chosen replica (`replicas`: `master`, the default, or `all`) for the topic's
queues and their offset bounds, and plans one partition per slice of at most
`offsetsPerPartition` offsets of one queue of one replica. Each executor task pulls its
slice from that replica itself (capstan.v1.Pull, answered by the replica and not passed on
to its master) and yields one row per record: where it is (group, replica, queue offset,
CommitLog offset), what it is (message id, keys, tag, properties, store time, body), and
whether its
body still matches the CRC stored with it. A record the broker could not read (its checks
failed) is a row with `readable` false and no body. `endOffsets` ("queue:offset,...") stops
the read of those queues at an offset (a compaction job reads exactly up to its cuts).

A slice is read whole or its task fails: a replica that stops answering records below the
end it reported (records not yet confirmed by its slaves) is waited for, up to
`stallSeconds` (default 30), and then the task fails naming the queue and offset.

Registered with `spark.dataSource.register(CapstanDataSource)`.
"""

from __future__ import annotations

import datetime
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    from capstan.common.queue_mapping import QueueMapping

SCHEMA = StructType(
    [
        StructField("broker_group", StringType(), False),
        StructField("replica", StringType(), False),
        StructField("master_replica", BooleanType(), False),
        StructField("topic", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("physical_offset", LongType(), True),
        StructField("message_id", StringType(), True),
        StructField("keys", StringType(), True),
        StructField("tag", StringType(), True),
        StructField("properties", MapType(StringType(), StringType()), True),
        StructField("store_time", TimestampType(), True),
        StructField("body_crc", LongType(), True),
        StructField("crc_ok", BooleanType(), True),
        StructField("readable", BooleanType(), False),
        StructField("body", BinaryType(), True),
    ]
)

DEFAULT_OFFSETS_PER_PARTITION = 100_000
PULL_BATCH = 512
CALL_TIMEOUT_S = 30.0
DEFAULT_STALL_S = 30.0
STALL_POLL_S = 0.05
ON_THE_REPLICA = (("x-capstan-forwarded", "1"),)
"""Metadata of a call the replica called answers itself, never passing it to its master."""


@dataclass(frozen=True)
class Replica:
    group: str
    address: str
    master: bool


@dataclass(frozen=True)
class QueueSlice(InputPartition):
    """One partition: offsets [start, end) of one queue of one replica."""

    replica: Replica
    topic: str
    queue_id: int
    start: int
    end: int
    stall_s: float = DEFAULT_STALL_S


def plan_slices(
    replica: Replica,
    topic: str,
    bounds: Sequence[tuple[int, int, int]],
    per_partition: int,
    end_offsets: dict[int, int] | None = None,
    stall_s: float = DEFAULT_STALL_S,
) -> list[QueueSlice]:
    """Slices of at most `per_partition` offsets covering each (queue_id, min, max) queue,
    stopping at `end_offsets` where it names the queue."""
    if per_partition < 1:
        raise ValueError("offsetsPerPartition must be at least 1")
    ends = end_offsets or {}
    return [
        QueueSlice(replica, topic, queue_id, start, min(top, start + per_partition), stall_s)
        for queue_id, low, high in bounds
        for top in [min(high, ends.get(queue_id, high))]
        for start in range(low, top, per_partition)
    ]


def parse_end_offsets(text: str) -> dict[int, int]:
    """`endOffsets`: "queue:offset" pairs joined by commas."""
    ends = {}
    for pair in filter(None, text.split(",")):
        queue, _, offset = pair.partition(":")
        if not (queue.strip().isdigit() and offset.strip().isdigit()):
            raise ValueError(f"option endOffsets: {pair!r} is not queue:offset")
        ends[int(queue)] = int(offset)
    return ends


@dataclass(frozen=True)
class ReadOptions:
    topic: str
    controller: str
    brokers: tuple[str, ...]
    all_replicas: bool
    per_partition: int
    end_offsets: dict[int, int]
    stall_s: float

    @classmethod
    def parse(cls, options: dict[str, str]) -> ReadOptions:
        # Spark hands options over with their names in lower case; accept either.
        options = {name.lower(): value for name, value in options.items()}
        topic = options.get("topic", "")
        if not topic:
            raise ValueError("option topic is required")
        controller = options.get("controller", "")
        brokers = tuple(b for b in options.get("brokers", "").split(",") if b)
        if bool(controller) == bool(brokers):
            raise ValueError("give one of the options controller or brokers")
        replicas = options.get("replicas", "master")
        if replicas not in ("master", "all"):
            raise ValueError(f"option replicas must be master or all, not {replicas!r}")
        per = options.get("offsetsperpartition", str(DEFAULT_OFFSETS_PER_PARTITION))
        if not per.isdigit() or int(per) < 1:
            raise ValueError(f"option offsetsPerPartition must be a positive number, not {per!r}")
        ends = parse_end_offsets(options.get("endoffsets", ""))
        stall = options.get("stallseconds", str(DEFAULT_STALL_S))
        try:
            stall_s = float(stall)
        except ValueError:
            raise ValueError(f"option stallSeconds must be a number, not {stall!r}") from None
        return cls(topic, controller, brokers, replicas == "all", int(per), ends, stall_s)


class CapstanDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "capstan"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return CapstanReader(ReadOptions.parse(dict(self.options)))


class CapstanReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        slices: list[QueueSlice] = []
        for replica in replicas(o):
            bounds = queue_bounds(replica.address, o.topic)
            slices.extend(
                plan_slices(replica, o.topic, bounds, o.per_partition, o.end_offsets, o.stall_s)
            )
        return slices

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueSlice):
            return  # a topic with no records plans no slices; Spark still runs one task
        yield from read_slice_batches(partition)


class NoLeader(RuntimeError):
    """None of the controller's addresses leads: its view of the brokers is not to be read."""


def replicas(o: ReadOptions) -> list[Replica]:
    """The replicas to read: from the controller's view of every group, or the brokers."""
    from capstan.client.admin import BlockingControllerClient
    from capstan.security.credentials import client_access
    from capstan.spark.job_arguments import controller_addresses

    if o.brokers:
        return [Replica(address, address, True) for address in o.brokers]
    with BlockingControllerClient(
        controller_addresses(o.controller), timeout_s=CALL_TIMEOUT_S, **client_access()
    ) as controller:
        status = controller.cluster_status()
    if not status.leader:
        # A follower's view has every broker not alive: reading it would read nothing.
        raise NoLeader(
            f"no controller leads at {o.controller} (controller {status.controller_id} "
            "follows); try again once one does"
        )
    found = []
    for group in status.groups:
        for r in group.replicas:
            master = r.broker_id == group.master_id
            if (master or o.all_replicas) and r.alive:
                found.append(Replica(group.group, r.address, master))
    return found


def queue_bounds(address: str, topic: str) -> list[tuple[int, int, int]]:
    """(queue_id, min offset, max offset) of each queue of `topic` on the broker itself."""
    from capstan.client.admin import BlockingAdminClient
    from capstan.security.credentials import client_access

    with BlockingAdminClient(
        address, timeout_s=CALL_TIMEOUT_S, metadata=ON_THE_REPLICA, **client_access()
    ) as admin:
        reply = admin.describe_topic(topic)
    return [(q.queue_id, q.min_offset, q.max_offset) for q in reply.topic.queues]


def queue_mapping(address: str, topic: str) -> QueueMapping | None:
    """The mapping of static topic `topic` as the broker holds it; None for another topic.
    A static topic's offsets are logic offsets everywhere a client sees them."""
    from capstan.client.admin import BlockingAdminClient
    from capstan.client.errors import NotFound
    from capstan.client.queue_mapping_wire import mapping_from_wire
    from capstan.security.credentials import client_access

    with BlockingAdminClient(
        address, timeout_s=CALL_TIMEOUT_S, metadata=ON_THE_REPLICA, **client_access()
    ) as admin:
        try:
            return mapping_from_wire(admin.get_queue_mapping(topic).mapping)
        except NotFound:
            return None


def read_slice(s: QueueSlice) -> Iterator[tuple[Any, ...]]:
    """The rows of a slice, one tuple per record (SCHEMA's columns)."""
    for batch in _pulled(s):
        yield from batch.rows()


def read_slice_batches(s: QueueSlice) -> Iterator[Any]:
    """The rows of a slice as Arrow record batches, one per pull: what Spark's Python data
    source takes without converting row by row."""
    import pyarrow as pa

    schema = arrow_schema()
    for batch in _pulled(s):
        yield pa.RecordBatch.from_arrays(batch.columns(schema), schema=schema)


def arrow_schema() -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


@dataclass
class _Pulled:
    """One pull's worth of a slice: its readable messages and unreadable offsets."""

    where: tuple[str, str, bool, str, int]
    messages: list[Any]
    unreadable: list[int]

    def rows(self) -> Iterator[tuple[Any, ...]]:
        for bad in self.unreadable:
            yield (*self.where, bad, *([None] * 8), False, None)
        for m in self.messages:
            stored = datetime.datetime.fromtimestamp(m.store_timestamp_ms / 1000, tz=datetime.UTC)
            yield (
                *self.where,
                m.queue_offset,
                m.commit_log_offset,
                m.message_id,
                m.properties.get("KEYS"),
                m.properties.get("TAGS"),
                dict(m.properties),
                stored,
                m.body_crc,
                zlib.crc32(m.body) == m.body_crc,
                True,
                bytes(m.body),
            )

    def columns(self, schema: Any) -> list[Any]:
        import pyarrow as pa

        ms = self.messages
        bad = self.unreadable
        n = len(ms) + len(bad)
        none = [None] * len(bad)
        group, replica, master, topic, queue_id = self.where
        bodies = [bytes(m.body) for m in ms]
        values: list[list[Any]] = [
            [group] * n,
            [replica] * n,
            [master] * n,
            [topic] * n,
            [queue_id] * n,
            bad + [m.queue_offset for m in ms],
            none + [m.commit_log_offset for m in ms],
            none + [m.message_id for m in ms],
            none + [m.properties.get("KEYS") for m in ms],
            none + [m.properties.get("TAGS") for m in ms],
            none + [list(m.properties.items()) for m in ms],
            none + [m.store_timestamp_ms * 1000 for m in ms],
            none + [m.body_crc for m in ms],
            none + [zlib.crc32(b) == m.body_crc for b, m in zip(bodies, ms, strict=True)],
            [False] * len(bad) + [True] * len(ms),
            none + bodies,
        ]
        return [pa.array(v, type=f.type) for v, f in zip(values, schema, strict=True)]


def _pulled(s: QueueSlice) -> Iterator[_Pulled]:
    """Pull a slice whole, in order: each reply's records below the slice's end."""
    import time

    from capstan.client.admin import BlockingPullClient
    from capstan.security.credentials import client_access
    from capstan.v1 import pull_pb2 as ppb

    where = (s.replica.group, s.replica.address, s.replica.master, s.topic, s.queue_id)
    offset = s.start
    stalled_since: float | None = None
    with BlockingPullClient(
        s.replica.address,
        timeout_s=CALL_TIMEOUT_S,
        retry_s=0,
        metadata=ON_THE_REPLICA,
        **client_access(),
    ) as pull:
        while offset < s.end:
            reply = pull.pull_messages(
                ppb.PullMessagesRequest(
                    topic=s.topic,
                    queue_id=s.queue_id,
                    offset=offset,
                    max_messages=min(PULL_BATCH, s.end - offset),
                )
            )
            unreadable = [b for b in reply.unreadable_offsets if offset <= b < s.end]
            messages = [m for m in reply.messages if m.queue_offset < s.end]
            if messages or unreadable:
                yield _Pulled(where, messages, unreadable)
            if reply.next_begin_offset > offset:
                offset = reply.next_begin_offset
                stalled_since = None
                continue
            # Nothing readable at offset yet, below the end the replica reported.
            now = time.monotonic()
            stalled_since = now if stalled_since is None else stalled_since
            if now - stalled_since > s.stall_s:
                raise RuntimeError(
                    f"{s.replica.address} answers nothing at {s.topic} queue {s.queue_id} "
                    f"offset {offset} (below {s.end}, the end it reported) for "
                    f"{s.stall_s:.0f} s: its slaves may not hold those records yet"
                )
            time.sleep(STALL_POLL_S)
