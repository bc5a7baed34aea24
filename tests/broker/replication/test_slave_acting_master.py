"""Slave-acting-master with real processes: a group of a master and two slaves without a
controller, plus a second group the acting master escapes to. With the master killed,
offsets, queue locks, pop and ack and delayed messages keep working through the slave with
the smallest id; new writes are refused; the returning master takes back what changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from capstan.v1 import replication_pb2 as rpb
from capstan.v1 import replication_pb2_grpc as rpb_grpc
from tests.broker.broker_process import BrokerProcess, open_channel
from tests.broker.replication.test_replication_stream import bodies, has_group
from tests.broker.v2_requests import METADATA, ack, now_ms, receive, send, stub, v2_message
from tests.waiting import wait_until

GROUP = "group-a"


@dataclass
class Brokers:
    master: BrokerProcess
    slave1: BrokerProcess
    slave2: BrokerProcess
    other: BrokerProcess
    """A standalone broker of another group: where the acting master escapes to."""


def acting_group(root: Path) -> Brokers:
    for name in ("m", "s1", "s2", "b"):
        (root / name).mkdir()
    other = BrokerProcess(root / "b", broker_name="group-b")
    master = BrokerProcess(root / "m", broker_name=GROUP)
    slave1 = BrokerProcess(root / "s1", broker_name=GROUP)
    slave2 = BrokerProcess(root / "s2", broker_name=GROUP)
    configure_acting_group([master, slave1, slave2], other)
    return Brokers(master, slave1, slave2, other)


def configure_acting_group(by_id: list[BrokerProcess], escape: BrokerProcess) -> None:
    """Make `by_id` one group without a controller, with slave-acting-master: broker id
    n is `by_id[n]`, id 0 the master; the acting master escapes to `escape`."""
    master = by_id[0]
    common = {
        "replicas": len(by_id),
        "peers": ",".join(f"{n}@{b.address}" for n, b in enumerate(by_id)),
        "slave_acting_master": True,
        "escape_addresses": escape.address,
        "heartbeat_interval_ms": 300,
        "peer_timeout_ms": 1500,
        "slave_ack_timeout_ms": 2000,
        "metadata_interval_ms": 200,
    }
    for n, b in enumerate(by_id):
        role = {"role": "master"} if n == 0 else {"role": "slave", "master_address": master.address}
        config = yaml.safe_load(b.config.read_text())
        config["replication"] = {**common, **role, "broker_id": n}
        b.config.write_text(yaml.safe_dump(config))


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Brokers]:
    brokers = acting_group(tmp_path)
    everyone = (brokers.other, brokers.master, brokers.slave1, brokers.slave2)
    try:
        for b in everyone:
            b.start()
        yield brokers
    finally:
        for b in reversed(everyone):
            b.stop()


def probe(b: BrokerProcess) -> rpb.ProbeReply:
    peers = rpb_grpc.ReplicaPeersStub(grpc.insecure_channel(b.address))  # type: ignore[no-untyped-call]
    return peers.Probe(rpb.ProbeRequest(broker_name=GROUP, broker_id=99), timeout=5)


def consumer(b: BrokerProcess, here: bool = False) -> c_grpc.ConsumerStub:
    return c_grpc.ConsumerStub(open_channel(b.address, here))  # type: ignore[no-untyped-call]


def commit(b: BrokerProcess, offset: int, queue_id: int = 0) -> None:
    consumer(b).CommitOffsets(
        c.CommitOffsetsRequest(
            group="G", offsets=[c.QueueOffset(topic="T", queue_id=queue_id, offset=offset)]
        ),
        timeout=10,
    )


def succeeds(call: Callable[[], object]) -> bool:
    try:
        call()
        return True
    except grpc.RpcError:
        return False


def committed(b: BrokerProcess, here: bool = True, queue_id: int = 0) -> int:
    reply = consumer(b, here).QueryOffset(
        c.QueryOffsetRequest(group="G", topic="T", queue_id=queue_id), timeout=10
    )
    return reply.offset if reply.found else -1


def lock(b: BrokerProcess, client: str, queue_id: int = 1) -> list[int]:
    reply = consumer(b).LockQueues(
        c.LockQueuesRequest(
            client_id=client, group="G", queues=[c.QueueRef(topic="T", queue_id=queue_id)]
        ),
        timeout=10,
    )
    return [q.queue_id for q in reply.locked]


def send_code(b: BrokerProcess, topic: str, body: bytes, **system: object) -> int:
    return send(stub(b.address), v2_message(topic, body, **system)).status.code


def end_transaction(b: BrokerProcess, prepared: svc.SendResultEntry) -> svc.EndTransactionResponse:
    return stub(b.address).EndTransaction(
        svc.EndTransactionRequest(
            topic=pb.Resource(name="X"),
            message_id=prepared.message_id,
            transaction_id=prepared.transaction_id,
            resolution=pb.COMMIT,
        ),
        metadata=METADATA,
        timeout=10,
    )


def route_permissions(b: BrokerProcess) -> set[int]:
    reply = stub(b.address).QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name="T")), metadata=METADATA, timeout=10
    )
    return {q.permission for q in reply.message_queues}


def test_with_the_master_down_the_smallest_slave_serves_its_duties_and_hands_them_back(
    group: Brokers,
):
    master, slave1, slave2, other = group.master, group.slave1, group.slave2, group.other
    for b in (master, other):
        b.create_topic("T", queues=4)
        b.create_topic("P", queues=2)
        b.create_topic("X", kind="TRANSACTION", queues=2)
        b.create_topic("D", kind="DELAY", queues=2)
        b.create_group("G")
    for slave in (slave1, slave2):
        wait_until(lambda s=slave: has_group(s, "G"), 10, "the group copied to the slaves")
    wait_until(lambda: send_code(master, "T", b"m-0") == pb.OK, 15, "a first replicated send")
    for i in range(1, 8):  # two per queue
        assert send_code(master, "T", f"m-{i}".encode()) == pb.OK
    for i in range(4):
        assert send_code(master, "P", f"p-{i}".encode()) == pb.OK
    half = v2_message("X", b"tx", message_type=pb.TRANSACTION)
    half.system_properties.orphaned_transaction_recovery_duration.FromSeconds(60)
    prepared = send(stub(master.address), half).entries[0]
    assert prepared.status.code == pb.OK
    due = now_ms() + 7000
    assert (
        send_code(master, "D", b"late", message_type=pb.DELAY, delivery_timestamp_ms=due) == pb.OK
    )
    # While the master answers, every replica passes master-only calls on to it.
    assert lock(slave2, "c1") == [1]  # held on the master, copied to the slaves
    commit(slave2, 1)
    assert committed(master) == 1
    assert sorted(route_permissions(slave2)) == [pb.READ_WRITE]
    # The master copies its state parts together, as they stand at each copy: once the
    # commit (made after the lock) is on slave 1, so is the lock.
    wait_until(lambda: committed(slave1) == 1, 10, "the offset and lock copied to slave 1")

    master.kill9()
    wait_until(lambda: probe(slave1).acting, 10, "slave 1 acting for the master")
    assert not probe(slave2).acting
    # Writes are refused and routes say so; reads, offsets and locks carry on.
    reply = send(stub(slave1.address), v2_message("T", b"refused"))
    assert reply.status.code == pb.HA_NOT_AVAILABLE and "acts for" in reply.status.message
    assert route_permissions(slave1) == {pb.READ}
    # Slave 2 passes calls on to the acting slave once it, too, misses the master.
    wait_until(lambda: succeeds(lambda: commit(slave2, 2)), 10, "a commit through slave 2")
    assert committed(slave1) == 2
    assert lock(slave1, "c2") == []  # c1's lock was copied before the master died
    assert lock(slave2, "c2", queue_id=2) == [2]
    status, popped = receive(stub(slave1.address), "G", "P", invisible_ms=2000)
    assert status.code == pb.OK
    assert sorted(m.body for m in popped) == [b"p-0", b"p-1", b"p-2", b"p-3"]
    for m in popped:
        if m.body != b"p-3":  # left unacknowledged
            handle = m.system_properties.receipt_handle
            assert ack(stub(slave1.address), "G", "P", handle).status.code == pb.OK
    # A commit is decided here, and its message stored on the other group.
    assert end_transaction(slave1, prepared).status.code == pb.OK
    # Stored there at once; readable once that broker has dispatched it to its queue.
    wait_until(lambda: bodies(other, "X", queues=2) == [b"tx"], 10, "the committed message")
    # The delayed message comes due while the master is down: it goes to the other group.
    wait_until(lambda: bodies(other, "D", queues=2) == [b"late"], 20, "the escaped delivery")

    master.start()
    wait_until(lambda: not probe(slave1).acting, 10, "slave 1 no longer acting")
    # The master took back the acting slave's offsets, locks and pop state.
    assert committed(master) == 2
    assert lock(master, "c2") == []
    assert lock(master, "c2", queue_id=2) == [2]
    sent: list[int] = []
    wait_until(
        lambda: (
            succeeds(lambda: sent.append(send_code(slave2, "P", b"again"))) and sent[-1] == pb.OK
        ),
        15,
        "writes again through slave 2",
    )
    wait_until(lambda: route_permissions(slave1) == {pb.READ_WRITE}, 10, "writable routes")
    redelivered: list[bytes] = []

    def only_the_unacked_one_returns() -> bool:
        _, again = receive(stub(master.address), "G", "P", invisible_ms=30000, wait_ms=500)
        redelivered.extend(m.body for m in again)
        return b"p-3" in redelivered

    wait_until(only_the_unacked_one_returns, 15, "the unacknowledged message again")
    assert sorted(redelivered) == [b"again", b"p-3"]
    # The master took the decision over: committing again stores nothing twice.
    again = end_transaction(master, prepared)
    assert again.status.code == pb.OK and again.status.message == "already decided"
    assert bodies(master, "X", queues=2) == []
    # The master's timer took the acting slave's progress: no second delivery here.
    assert bodies(master, "D", queues=2) == []
    assert bodies(other, "D", queues=2) == [b"late"]
