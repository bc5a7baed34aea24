"""`capstan bench fifo [--quick]`: official SimpleConsumers drain a FIFO topic whose few
message groups leave most of its queues empty, and, in the same run, a NORMAL topic of
the same size with its messages in the same queues.

One broker process (ASYNC_FLUSH), 8 queues per topic, 3 message groups in 3 different
queues (5 queues stay empty), 1 KiB bodies. Each topic is filled first, then one
rocketmq-python-client SimpleConsumer (long polling 1 s, the shortest it can ask for)
receives 32 at a time and acknowledges each batch (8 acks in flight) before the
next receive, until every message is in or a time limit passes. The official client aims
each receive at the next queue of the route in turn, so a broker that serves only the
named queue of a FIFO receive makes 5 receives of 8 wait out their long polling.

Prints a table, then one line of JSON with the figures (the last line of output).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.bench.broker_bench import BrokerProcess
from capstan.client.admin import BlockingAdminClient
from capstan.client.producer.producer import QUEUE_ID_METADATA
from capstan.v1 import admin_pb2

QUEUES = 8
MESSAGE_GROUPS = 3
RECEIVE_BATCH = 32
SEND_BATCH = 64
ACK_THREADS = 8
LONG_POLLING_S = 1
INVISIBLE_S = 30
BODY_BYTES = 1024
TIMEOUT_S = 30.0
FIFO_TOPIC, NORMAL_TOPIC = "BenchFifo", "BenchNormal"
FIFO_GROUP, NORMAL_GROUP = "bench-fifo", "bench-normal"


@dataclass(frozen=True)
class Sizes:
    messages: int
    """Per topic."""
    limit_s: float
    """A drain stops here even when messages are left (the rate counts what came in)."""


QUICK = Sizes(messages=3_000, limit_s=20.0)
FULL = Sizes(messages=30_000, limit_s=120.0)


@dataclass
class Drain:
    """What one consumer saw while draining a topic."""

    seconds: float = 0.0
    receives: int = 0
    empty_receives: int = 0
    deliveries: int = 0
    seen: dict[str, list[int]] = field(default_factory=dict)
    """Per message group, the sequence numbers in the order they were delivered."""

    @property
    def distinct(self) -> int:
        return sum(len(set(s)) for s in self.seen.values())

    @property
    def in_order(self) -> bool:
        return all(s == sorted(s) and len(s) == len(set(s)) for s in self.seen.values())

    @property
    def msgs_per_s(self) -> float:
        return self.distinct / self.seconds if self.seconds > 0 else 0.0


def message_groups(count: int) -> list[tuple[str, int]]:
    """`count` message group names and their queues (the broker's crc32 rule), one group
    per queue, so exactly `count` queues hold messages."""
    found: dict[int, str] = {}
    names = (f"order-{n}" for n in range(10_000))
    while len(found) < count:
        name = next(names)
        found.setdefault(zlib.crc32(name.encode()) % QUEUES, name)
    return [(name, queue) for queue, name in sorted(found.items())]


def _body(group: str, seq: int) -> bytes:
    head = f"{group}:{seq:08d}:".encode()
    return head + b"x" * (BODY_BYTES - len(head))


def _parse(body: bytes) -> tuple[str, int]:
    group, seq, _ = body.split(b":", 2)
    return group.decode(), int(seq)


def _ids(prefix: str) -> Iterator[str]:
    n = 0
    while True:
        yield f"{prefix}{n:026X}"
        n += 1


def _create(address: str) -> None:
    with BlockingAdminClient(address, timeout_s=TIMEOUT_S) as admin:
        for name, kind in ((FIFO_TOPIC, admin_pb2.FIFO), (NORMAL_TOPIC, admin_pb2.NORMAL)):
            admin.create_topic(
                admin_pb2.Topic(
                    name=name, type=kind, read_queue_nums=QUEUES, write_queue_nums=QUEUES
                )
            )
        admin.create_group(admin_pb2.Group(name=FIFO_GROUP, fifo=True))
        admin.create_group(admin_pb2.Group(name=NORMAL_GROUP))


def fill(address: str, groups: list[tuple[str, int]], per_group: int) -> None:
    """FIFO messages carry their message group; the NORMAL ones are sent to the same
    queue as that group's FIFO messages, so both topics have the same empty queues."""
    stub = svc_grpc.MessagingServiceStub(grpc.insecure_channel(address))
    ids = _ids("F1F0")
    for name, queue in groups:
        for start in range(0, per_group, SEND_BATCH):
            seqs = range(start, min(start + SEND_BATCH, per_group))
            for topic, kind in ((FIFO_TOPIC, pb.FIFO), (NORMAL_TOPIC, pb.NORMAL)):
                messages = [_v2_message(topic, kind, name, s, next(ids)) for s in seqs]
                reply = stub.SendMessage(
                    svc.SendMessageRequest(messages=messages),
                    metadata=[(QUEUE_ID_METADATA, str(queue))],
                    timeout=TIMEOUT_S,
                )
                if reply.status.code != pb.OK:
                    raise RuntimeError(f"filling {topic} failed: {reply.status.message}")


def _v2_message(topic: str, kind: int, group: str, seq: int, message_id: str) -> pb.Message:
    sp = pb.SystemProperties(message_id=message_id, message_type=kind)
    if kind == pb.FIFO:
        sp.message_group = group
    return pb.Message(topic=pb.Resource(name=topic), system_properties=sp, body=_body(group, seq))


def drain(address: str, group: str, topic: str, total: int, limit_s: float) -> Drain:
    """Receive and acknowledge until `total` distinct messages came in or `limit_s` ran out."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    config = ClientConfiguration(address, Credentials(), request_timeout=10)
    consumer = SimpleConsumer(
        config, group, {topic: FilterExpression("*")}, await_duration=LONG_POLLING_S
    )
    consumer.startup()
    result = Drain()
    # The client's ack_async returns nothing to wait on; threads keep the acks in flight.
    acks = ThreadPoolExecutor(ACK_THREADS, thread_name_prefix="bench-ack")
    try:
        start = time.perf_counter()
        while result.distinct < total and time.perf_counter() - start < limit_s:
            got = consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
            result.receives += 1
            result.empty_receives += not got
            result.deliveries += len(got)
            for m in got:
                name, seq = _parse(m.body)
                result.seen.setdefault(name, []).append(seq)
            list(acks.map(consumer.ack, got))
        result.seconds = time.perf_counter() - start
    finally:
        acks.shutdown()
        consumer.shutdown()
    return result


def _figures(kind: str, d: Drain, total: int) -> dict[str, float | int | bool]:
    return {
        f"{kind}_msgs_per_s": d.msgs_per_s,
        f"{kind}_received": d.distinct,
        f"{kind}_drained": d.distinct == total,
        f"{kind}_receives": d.receives,
        f"{kind}_empty_receives": d.empty_receives,
        f"{kind}_duplicates": d.deliveries - d.distinct,
        f"{kind}_in_order": d.in_order,
    }


def main(quick: bool = False, directory: str | None = None) -> None:
    sizes = QUICK if quick else FULL
    groups = message_groups(MESSAGE_GROUPS)
    per_group = sizes.messages // len(groups)
    total = per_group * len(groups)
    root = pathlib.Path(tempfile.mkdtemp(prefix="capstan-fifo-bench-", dir=directory))
    broker = BrokerProcess(root / "broker", "ASYNC_FLUSH")
    figures: dict[str, float | int | bool] = {}
    try:
        address = broker.start()
        _create(address)
        queues = ", ".join(f"{name} -> queue {queue}" for name, queue in groups)
        print(f"  filling both topics with {total} messages each ({queues}) ...", flush=True)
        fill(address, groups, per_group)
        for kind, group, topic in (
            ("fifo", FIFO_GROUP, FIFO_TOPIC),
            ("normal", NORMAL_GROUP, NORMAL_TOPIC),
        ):
            print(f"  running: SimpleConsumer drains {topic} ({kind.upper()}) ...", flush=True)
            drained = drain(address, group, topic, total, sizes.limit_s)
            figures.update(_figures(kind, drained, total))
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    normal = float(figures["normal_msgs_per_s"]) or 1.0
    figures["ratio_fifo_to_normal"] = float(figures["fifo_msgs_per_s"]) / normal
    _print_table(figures)
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}
    print(json.dumps({"benchmark": "fifo", "quick": quick, "messages": total, **rounded}))


def _print_table(f: dict[str, float | int | bool]) -> None:
    print()
    print(f"{'figure':28} {'FIFO':>10} {'NORMAL':>10}")
    for label, key in (
        ("msgs/s", "msgs_per_s"),
        ("received", "received"),
        ("receives", "receives"),
        ("empty receives", "empty_receives"),
        ("duplicates", "duplicates"),
        ("in order per message group", "in_order"),
    ):
        cells = [_cell(f[f"{kind}_{key}"]) for kind in ("fifo", "normal")]
        print(f"{label:28} {cells[0]:>10} {cells[1]:>10}")
    print(f"{'FIFO / NORMAL':28} {f['ratio_fifo_to_normal']:>10.2f}")


def _cell(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,.0f}" if isinstance(value, float) else f"{value:,}"


if __name__ == "__main__":
    import sys

    main(quick="--quick" in sys.argv)
