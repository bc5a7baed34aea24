"""Every SDK consumer kind follows its broker group, not an address: the replica its
queues' pulls start on (the route's first) is killed -9 and never comes back, and the
push (concurrent and orderly) and lite pull consumers go on consuming on the other
replica, every acknowledged message consumed, each within seconds of its send."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.client.consumer.lite_pull_consumer import LitePullConsumer
from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumerOptions,
    ConsumeStatus,
)
from capstan.client.message import Message
from capstan.client.producer.producer import Producer
from tests.broker.replication.test_controlled_group import Cluster, start_cluster, stop_cluster
from tests.broker.replication.test_transactions_in_doubt import move_master_off
from tests.broker.v2_requests import METADATA, ack, ms, receive, v2_message
from tests.broker.v2_requests import send as v2_send
from tests.broker.v2_requests import stub as v2_stub
from tests.waiting import wait_until

CONSUMED_WITHIN_S = 10.0
"""The longest a message sent after the kill may wait from its acknowledged send to its
consumption. Before consumers followed their group, the killed replica's queues were
never consumed again; on a quiet machine the wait is about a second."""
OPTIONS = ConsumerOptions(consume_from_where=ConsumeFromWhere.FIRST_OFFSET)


class Consumed:
    """Bodies consumed, with when each was first seen."""

    def __init__(self) -> None:
        self.at: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def add(self, messages: Sequence[ReceivedMessage]) -> None:
        now = time.monotonic()
        with self._lock:
            for m in messages:
                self.at.setdefault(m.body, now)

    def has(self, bodies: Sequence[bytes]) -> bool:
        with self._lock:
            return all(b in self.at for b in bodies)


def push_consumer(address: str, consumed: Consumed, orderly: bool) -> Callable[[], None]:
    def listener(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        consumed.add(batch)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(address, "G", listener, orderly=orderly, options=OPTIONS)
    consumer.subscribe("T")
    consumer.start()
    return consumer.shutdown


def lite_pull_consumer(address: str, consumed: Consumed) -> Callable[[], None]:
    consumer = LitePullConsumer(address, "G", options=OPTIONS)
    consumer.subscribe("T")
    consumer.start()
    stopping = threading.Event()

    def poll_routine() -> None:
        while not stopping.is_set():
            consumed.add(consumer.poll(0.2))

    thread = threading.Thread(target=poll_routine, daemon=True)
    thread.start()

    def stop() -> None:
        stopping.set()
        thread.join(5)
        consumer.shutdown()

    return stop


START = {
    "push": lambda address, consumed: push_consumer(address, consumed, orderly=False),
    "orderly": lambda address, consumed: push_consumer(address, consumed, orderly=True),
    "lite_pull": lite_pull_consumer,
}


def send(producer: Producer, prefix: str, count: int) -> dict[bytes, float]:
    """Send `count` messages; when each send was acknowledged."""
    acked = {}
    for i in range(count):
        body = f"{prefix}-{i}".encode()
        producer.send(Message("T", body))
        acked[body] = time.monotonic()
    return acked


def first_routed(cluster: Cluster) -> int:
    """The broker id whose replica routes name first (they list replicas by broker id)."""
    return min(r.broker_id for r in cluster.info().replicas)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(START))
def test_a_consumer_goes_on_when_the_replica_it_pulled_from_is_gone_for_good(
    tmp_path: Path, kind: str
):
    cluster = start_cluster(tmp_path)
    stop_consumer = None
    try:
        cluster.ready("T", queues=4)
        address = cluster.controller.address
        with Producer(address, retry_window_s=20) as producer:
            consumed = Consumed()
            stop_consumer = START[kind](address, consumed)
            before = send(producer, "before", 40)
            wait_until(lambda: consumed.has(list(before)), 30, "the messages sent before")
            gone = cluster.by_id(first_routed(cluster))
            gone.kill9()  # and never started again, as a pod on a lost node
            after = send(producer, "after", 40)
            wait_until(
                lambda: consumed.has(list(after)),
                CONSUMED_WITHIN_S + 20,
                f"{kind}: the messages sent after {gone.address} was killed",
            )
        waits = {body: consumed.at[body] - acked for body, acked in after.items()}
        slowest = max(waits, key=lambda b: waits[b])
        assert waits[slowest] < CONSUMED_WITHIN_S, (slowest, waits[slowest])
    finally:
        if stop_consumer is not None:
            stop_consumer()
        stop_cluster(cluster)


STOPPED_CONSUMED_WITHIN_S = 8.0
"""A message sent while the replica the consumer's long poll waits on is stopped (SIGSTOP:
its connections stay open, nothing answers): the SDK's channels ping every 2 s while a
call is open and give a connection 1 s to answer, so the pull fails within 3 s and goes to
the other replica. Before, it waited out the pull's own deadline (15 s + 5 s)."""


@pytest.mark.slow
def test_a_push_consumer_moves_off_a_stopped_replica_its_pull_waited_on(tmp_path: Path):
    # Writes need the master's copy alone, so sends are acknowledged at once while the
    # slave is stopped, and the slave leaves the SyncStateSet 1.5 s after it stopped
    # (reads end at what every member holds): what is measured is the consumer's wait.
    cluster = start_cluster(
        tmp_path,
        all_ack_in_sync_state_set=False,
        in_sync_replicas=1,
        ha_max_time_slave_not_catchup_ms=1500,
    )
    stop_consumer = None
    first = None
    try:
        cluster.ready("T", queues=1)
        first = cluster.by_id(first_routed(cluster))
        move_master_off(cluster, first, None)  # the consumer pulls from a slave
        address = cluster.controller.address
        with Producer(address, retry_window_s=30) as producer:
            consumed = Consumed()
            stop_consumer = START["push"](address, consumed)
            before = send(producer, "before", 5)
            wait_until(lambda: consumed.has(list(before)), 30, "the messages sent before")
            time.sleep(1)  # the next pull is waiting on the slave, long polling
            assert first.proc is not None
            os.kill(first.proc.pid, signal.SIGSTOP)
            try:
                after = send(producer, "after", 5)
                wait_until(
                    lambda: consumed.has(list(after)),
                    STOPPED_CONSUMED_WITHIN_S + 10,
                    "the messages sent while the slave was stopped",
                )
                waits = [consumed.at[body] - acked for body, acked in after.items()]
            finally:
                os.kill(first.proc.pid, signal.SIGCONT)
        assert max(waits) < STOPPED_CONSUMED_WITHIN_S, waits
    finally:
        if stop_consumer is not None:
            stop_consumer()
        stop_cluster(cluster)


def filled(address: str, count: int) -> Any:
    """A v2 stub of the broker at `address`, once `count` messages m0, m1, ... are sent to
    topic T there."""
    at = v2_stub(address)
    for n in range(count):
        assert v2_send(at, v2_message("T", f"m{n}".encode())).status.code == v2.OK
    return at


def test_a_promoted_slave_neither_hands_out_again_nor_forgets_an_ack_just_answered(
    tmp_path: Path,
):
    """Receives and acks are answered once the in-sync slave holds the pop state they
    changed: a master killed right after answering leaves its successor handing out what
    was neither received nor acknowledged, and, a second after the promotion, what was
    received in the master's last second (the answer may have died with it); never what
    was acknowledged, nor what was received earlier and is still invisible."""
    cluster = start_cluster(tmp_path)
    try:
        master, _ = cluster.ready(queues=1)
        at_master = filled(master.address, 30)
        _, acked = receive(at_master, "G", "T", batch=10, invisible_ms=3000)
        for m in acked:
            assert ack(at_master, "G", "T", m.system_properties.receipt_handle).status.code == v2.OK
        _, held = receive(at_master, "G", "T", batch=10, invisible_ms=60_000)
        time.sleep(2)  # held out of the master's last second
        _, last = receive(at_master, "G", "T", batch=5, invisible_ms=60_000)
        assert len(acked) == len(held) == 10 and len(last) == 5
        master.kill9()
        wait_until(
            lambda: cluster.info().master_address not in ("", master.address), 15, "a new master"
        )
        promoted_at = time.monotonic()
        at_new = v2_stub(cluster.master().address)
        got: dict[bytes, float] = {}
        deadline = time.monotonic() + 5  # past the acknowledged ones' 3-s invisible time
        while time.monotonic() < deadline:
            try:
                _, messages = receive(at_new, "G", "T", batch=32, invisible_ms=60_000, wait_ms=1000)
            except grpc.RpcError as exc:
                # The controller named it master a moment before it heard so itself: it
                # still passes the call to the dead master. A client tries again.
                assert exc.code() is grpc.StatusCode.UNAVAILABLE, exc
                time.sleep(0.1)
                continue
            got.update((m.body, time.monotonic() - promoted_at) for m in messages)
        assert sorted(got) == sorted(f"m{n}".encode() for n in range(20, 30))
        assert all(got[m.body] < 3.0 for m in last), got
    finally:
        stop_cluster(cluster)


def test_a_stopped_slave_costs_receives_and_acks_one_pause_not_one_each(tmp_path: Path):
    """A stopped slave holds up the first receive or ack for the stall rule's second; the
    next ones do not wait for it until it catches up again."""
    cluster = start_cluster(tmp_path)
    try:
        master, slave = cluster.ready(queues=1)
        at_master = filled(master.address, 10)
        os.kill(slave.proc.pid, signal.SIGSTOP)
        try:
            took = []
            for _ in range(10):
                began = time.monotonic()
                _, got = receive(at_master, "G", "T", batch=1, invisible_ms=60_000)
                assert len(got) == 1
                handle = got[0].system_properties.receipt_handle
                assert ack(at_master, "G", "T", handle).status.code == v2.OK
                took.append(time.monotonic() - began)
        finally:
            os.kill(slave.proc.pid, signal.SIGCONT)
        # The first call waits for the slave's copy up to the stall rule's second; later
        # ones do not wait for it until it catches up again.
        assert sum(took) < 3.0, [round(t, 2) for t in took]
    finally:
        stop_cluster(cluster)


def test_a_receive_cancelled_before_its_answer_gives_its_messages_back_at_once(
    tmp_path: Path,
):
    """A receive whose client goes away while the master waits for a stopped slave's copy
    of the pop state reached nobody: its message is handed out by the next receive, as the
    same delivery attempt, not after its 60-s invisible time."""
    cluster = start_cluster(tmp_path)
    try:
        master, slave = cluster.ready(queues=1)
        at_master = filled(master.address, 3)
        request = svc.ReceiveMessageRequest(
            group=v2.Resource(name="G"),
            message_queue=v2.MessageQueue(topic=v2.Resource(name="T"), id=-1),
            filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
            batch_size=1,
            invisible_duration=ms(60_000),
            long_polling_timeout=ms(1000),
        )
        os.kill(slave.proc.pid, signal.SIGSTOP)
        try:
            call = at_master.ReceiveMessage(request, metadata=METADATA, timeout=10)
            # The master waits up to half a second for the stopped slave before it answers.
            threading.Timer(0.25, call.cancel).start()
            with pytest.raises(grpc.RpcError) as cut:
                list(call)
            assert cut.value.code() is grpc.StatusCode.CANCELLED
            _, again = receive(at_master, "G", "T", batch=1, invisible_ms=60_000)
        finally:
            os.kill(slave.proc.pid, signal.SIGCONT)
        assert [m.body for m in again] == [b"m0"]
        assert again[0].system_properties.delivery_attempt == 1
    finally:
        stop_cluster(cluster)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_group_after_receives_and_acks_keeps_its_stream_quiet(tmp_path: Path):
    """Each receive and ack sends the slave a Metadata message and waits for its ack; the
    acks that follow (every beat's) must not wake the stream for more beats: once idle,
    master and slave spend next to no CPU (seen: a third of a core each, beating)."""
    cluster = start_cluster(tmp_path)
    try:
        master, slave = cluster.ready(queues=1)
        at_master = filled(master.address, 5)
        _, got = receive(at_master, "G", "T", batch=5, invisible_ms=60_000)
        for m in got:
            assert ack(at_master, "G", "T", m.system_properties.receipt_handle).status.code == v2.OK
        time.sleep(1)
        assert master.proc is not None and slave.proc is not None
        before = {p.pid: cpu_seconds(p.pid) for p in (master.proc, slave.proc)}
        time.sleep(3)
        spent = {pid: cpu_seconds(pid) - at for pid, at in before.items()}
        assert all(s < 0.6 for s in spent.values()), spent  # 3 s idle: well under 20% each
    finally:
        stop_cluster(cluster)
