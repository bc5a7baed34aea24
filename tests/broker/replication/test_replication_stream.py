"""A master and a slave as real broker processes, roles fixed in their configs (no
controller): the slave copies the CommitLog, topics, groups and offsets; a write is
acknowledged only once the slave holds it; without its slave a two-replica master refuses
writes (or, with enable_auto_in_sync_replicas, goes on alone), and the slave catches up."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from tests.broker.broker_process import BrokerProcess, free_port, open_channel
from tests.broker.test_batch_pull import pull, puller
from tests.broker.v2_requests import send, stub, v2_message
from tests.waiting import wait_until


def pair(root: Path, **master_replication: Any) -> tuple[BrokerProcess, BrokerProcess]:
    for name in ("master", "slave"):
        (root / name).mkdir()
    master = BrokerProcess(
        root / "master",
        broker_name="group-a",
        replication={"role": "master", "replicas": 2, "slave_ack_timeout_ms": 1500}
        | master_replication,
    )
    slave = BrokerProcess(
        root / "slave",
        broker_name="group-a",
        replication={
            "role": "slave",
            "broker_id": 1,
            "replicas": 2,
            "master_address": master.address,
        },
    )
    return master, slave


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    master, slave = pair(tmp_path)
    master.start()
    slave.start()
    try:
        yield master, slave
    finally:
        slave.stop()
        master.stop()


def bodies(b: BrokerProcess, topic: str, queues: int = 4, here: bool = False) -> list[bytes]:
    """Every message of `topic`, read from `b` (with `here`, from its own copy)."""
    p = puller(b.address, here)
    found = []
    for q in range(queues):
        offset = 0
        while True:  # a page at a time: a queue may hold more than one pull answers
            page = pull(p, offset, 1000, topic=topic, queue_id=q)
            if not page.messages:
                break
            found += [m.body for m in page.messages]
            offset = page.next_begin_offset
    return sorted(found)


def scrape(b: BrokerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{b.http_port}/metrics", timeout=5) as r:
        return r.read().decode()


def has_group(b: BrokerProcess, group: str) -> bool:
    """Whether `b` itself knows `group` (and so the topics created before it)."""
    s = c_grpc.ConsumerStub(open_channel(b.address, here=True))  # type: ignore[no-untyped-call]
    try:
        s.QueryOffset(c.QueryOffsetRequest(group=group, topic="T", queue_id=0), timeout=5)
        return True
    except grpc.RpcError:
        return False


def code_of_send(b: BrokerProcess, topic: str, body: bytes) -> int:
    reply = send(stub(b.address), v2_message(topic, body))
    return reply.status.code


def test_the_slave_holds_every_acknowledged_message_and_the_metadata(brokers):
    master, slave = brokers
    master.create_topic("T", queues=4)
    master.create_group("G")
    s = stub(master.address)
    wait_until(lambda: has_group(slave, "G"), 10, "the topic and group on the slave")
    wait_until(lambda: code_of_send(master, "T", b"first") == pb.OK, 10, "a first send")
    sent = [b"first"]
    for i in range(200):
        body = f"m-{i}".encode() * 40
        assert send(s, v2_message("T", body)).status.code == pb.OK
        sent.append(body)
    # Acknowledged means the slave has it; it serves it once the master's confirm offset,
    # which rides on the next chunk or beat, says every copy has it.
    wait_until(lambda: bodies(slave, "T") == sorted(sent), 5, "every message on the slave")
    consumer = c_grpc.ConsumerStub(grpc.insecure_channel(master.address))  # type: ignore[no-untyped-call]
    consumer.CommitOffsets(
        c.CommitOffsetsRequest(group="G", offsets=[c.QueueOffset(topic="T", queue_id=0, offset=7)])
    )
    on_slave = c_grpc.ConsumerStub(grpc.insecure_channel(slave.address))  # type: ignore[no-untyped-call]

    def offset_copied() -> bool:
        reply = on_slave.QueryOffset(c.QueryOffsetRequest(group="G", topic="T", queue_id=0))
        return reply.found and reply.offset == 7

    wait_until(offset_copied, 5, "the committed offset on the slave")
    assert slave.queue_ends("T") == master.queue_ends("T")
    master_metrics = scrape(master)
    assert 'capstan_replica_slave_lag_bytes{cluster="group-a"' in master_metrics
    assert 'slave_id="1"} 0.0' in master_metrics  # acknowledged everything
    assert "capstan_replica_is_master{" in master_metrics
    assert "capstan_replica_acks_waiting{" in master_metrics
    assert [
        line.split()[-1] for line in scrape(slave).splitlines()
        if line.startswith("capstan_replica_is_master{")
    ] == ["0.0"]  # fmt: skip
    # The slave refuses writes and names its master.
    reply = send(stub(slave.address), v2_message("T", b"to the slave"))
    assert reply.status.code == pb.HA_NOT_AVAILABLE
    assert "slave" in reply.status.message and master.address in reply.status.message


def test_without_its_slave_a_two_replica_master_refuses_writes_until_it_returns(brokers):
    master, slave = brokers
    master.create_topic("T", queues=4)
    master.create_group("G")
    wait_until(lambda: has_group(slave, "G"), 10, "the topic and group on the slave")
    wait_until(lambda: code_of_send(master, "T", b"a") == pb.OK, 10, "a first send")
    slave.kill9()
    wait_until(
        lambda: code_of_send(master, "T", b"refused") == pb.HA_NOT_AVAILABLE,
        10,
        "the master to notice its slave is gone",
    )
    slave.start()
    wait_until(lambda: code_of_send(master, "T", b"b") == pb.OK, 15, "writes to resume")
    # The slave holds "b" once it is acknowledged, and serves it once the master's confirm
    # offset (on the next chunk or beat) says every copy has it.
    wait_until(lambda: bodies(slave, "T") == bodies(master, "T"), 5, "the slave to serve it")
    assert b"b" in bodies(master, "T")
    assert b"refused" not in bodies(master, "T")


def test_with_auto_in_sync_replicas_the_master_goes_on_alone_and_the_slave_catches_up(
    tmp_path: Path,
):
    master, slave = pair(tmp_path, enable_auto_in_sync_replicas=True)
    master.start()
    try:
        master.create_topic("T", queues=4)
        master.create_group("G")
        s = stub(master.address)
        for i in range(50):
            assert send(s, v2_message("T", f"alone-{i}".encode())).status.code == pb.OK
        slave.start()
        wait_until(lambda: has_group(slave, "G"), 10, "the topic and group on the slave")
        wait_until(lambda: len(bodies(slave, "T")) == 50, 15, "the slave to catch up")
        for i in range(50):
            assert send(s, v2_message("T", f"together-{i}".encode())).status.code == pb.OK
        # Each write waited for the slave's copy; the slave serves the last one once the
        # master's next beat tells it the confirm offset moved past it.
        wait_until(
            lambda: bodies(slave, "T") == bodies(master, "T"), 5, "the same messages on both"
        )
    finally:
        slave.stop()
        master.stop()


def test_a_slave_of_another_group_or_segment_size_is_refused(tmp_path: Path):
    master, _ = pair(tmp_path)
    (tmp_path / "stranger").mkdir()
    stranger = BrokerProcess(
        tmp_path / "stranger",
        broker_name="group-b",
        replication={"role": "slave", "broker_id": 1, "master_address": master.address},
    )
    master.start()
    stranger.start()
    try:
        wait_until(
            lambda: "serves group 'group-a', not 'group-b'" in stranger.log.read_text(),
            10,
            "the refusal in the stranger's log",
        )
        assert code_of_send(master, "T", b"x") != pb.OK  # still no slave of its own
    finally:
        stranger.stop()
        master.stop()
    assert free_port() > 0
