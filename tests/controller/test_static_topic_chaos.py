"""Static topics through crashes: every logic queue of a FIFO topic moves to a newly used
group while the official FIFO producer keeps sending, one move with the old group's master
killed (kill -9) in the middle, another with the controller killed in the middle. The
official FIFO consumer then reads every acknowledged message, each message group in order,
with each logic queue's offsets continuous across its move."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from capstan.client.queue_mapping_wire import mapping_from_wire
from capstan.v1 import admin_pb2 as pb
from tests.broker.test_official_client import message
from tests.broker.test_pull_api import pull
from tests.broker.v2_requests import stub as v2_stub
from tests.controller.test_admin_front import TwoGroups, start_two_groups
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

TOPIC = "Journal"
QUEUES = 4
ACCOUNTS = [f"account-{n}" for n in range(16)]


@pytest.fixture
def cluster(tmp_path) -> Iterator[TwoGroups]:  # type: ignore[no-untyped-def]
    c = start_two_groups(tmp_path, {"group-a": 2, "group-b": 1})
    try:
        yield c
    finally:
        c.stop()


class FifoSender:
    """The official FIFO producer in a thread, sending each account's next message until
    it is acknowledged (as an application retries), so an account's acknowledged messages
    are in the order sent."""

    def __init__(self, config: ClientConfiguration) -> None:
        self.acked: dict[str, list[int]] = {a: [] for a in ACCOUNTS}
        self.failures = 0
        self._config = config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FifoSender:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def wait_for(self, count: int, timeout_s: float) -> None:
        wait_until(lambda: self.total >= count, timeout_s, f"{count} acknowledged sends")

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def _run(self) -> None:
        producer = Producer(self._config, (TOPIC,))
        producer.startup()
        try:
            step = 0
            while not self._stop.is_set():
                for account in ACCOUNTS:
                    body = f"{account}/{step}".encode()
                    while not self._stop.is_set():
                        try:
                            producer.send(message(TOPIC, body, message_group=account))
                        except Exception:  # noqa: BLE001 - a send refused mid-move is retried
                            self.failures += 1
                            time.sleep(0.1)
                            continue
                        self.acked[account].append(step)
                        break
                step += 1
        finally:
            producer.shutdown()


def remap_in_background(cluster: TwoGroups, queue: int) -> threading.Thread:
    def run() -> None:
        request = pb.RemapRequest(topic=TOPIC, queue_id=queue, group="group-b")
        try:
            cluster.admin().RemapStaticQueue(request, timeout=10)
        except grpc.RpcError:
            pass  # cut short by the crash; the controller finishes it

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def leader_of(cluster: TwoGroups, queue: int) -> str:
    try:
        reply = cluster.admin().GetQueueMapping(pb.QueueMappingRequest(topic=TOPIC), timeout=5)
    except grpc.RpcError:
        return ""
    leader = mapping_from_wire(reply.mapping).leader(queue)
    return leader.group if leader.takes_writes else ""


def moved(cluster: TwoGroups, queue: int, timeout_s: float) -> None:
    wait_until(lambda: leader_of(cluster, queue) == "group-b", timeout_s, f"queue {queue} moved")


def logic_offsets(cluster: TwoGroups, queue: int) -> list[int]:
    """Logic queue `queue` read whole with the pull API: group-a's item, then group-b's."""
    found = []
    for group in ("group-a", "group-b"):
        s = v2_stub(cluster.master(group).address)
        offset = 0
        while True:
            _, messages, next_offset = pull(s, TOPIC, queue, offset, group="JournalReaders")
            if not messages:
                break
            found += [m.system_properties.queue_offset for m in messages]
            offset = next_offset
    return found


def test_fifo_order_and_every_acknowledged_message_survive_crashes_mid_remap(cluster):
    admin = cluster.admin()
    fifo = pb.Topic(name=TOPIC, type=pb.FIFO, write_queue_nums=QUEUES)
    admin.CreateStaticTopic(pb.StaticTopicRequest(topic=fifo, groups=["group-a"]), timeout=15)
    admin.CreateGroup(pb.Group(name="JournalReaders", fifo=True), timeout=10)
    config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=5)
    with FifoSender(config) as sender:
        sender.wait_for(100, 60)
        admin.RemapStaticQueue(
            pb.RemapRequest(topic=TOPIC, queue_id=0, group="group-b"), timeout=15
        )
        sender.wait_for(sender.total + 50, 60)
        # Queue 1: group-a's master stops answering as the move seals the queue, then dies.
        old_master = cluster.master("group-a")
        assert old_master.proc is not None
        os.kill(old_master.proc.pid, signal.SIGSTOP)
        mover = remap_in_background(cluster, 1)
        time.sleep(0.5)
        old_master.kill9()
        mover.join(30)
        wait_until(
            lambda: (
                cluster.controller.group("group-a").master_address not in ("", old_master.address)
            ),
            30,
            "group-a's slave elected",
        )
        moved(cluster, 1, 60)
        sender.wait_for(sender.total + 50, 60)
        # Queue 2: the controller dies in the middle of the move; the restarted one
        # finishes it by itself.
        mover = remap_in_background(cluster, 2)
        time.sleep(0.3)
        cluster.controller.kill9()
        mover.join(30)
        cluster.controller.start()
        moved(cluster, 2, 60)
        admin.RemapStaticQueue(
            pb.RemapRequest(topic=TOPIC, queue_id=3, group="group-b"), timeout=30
        )
        sender.wait_for(sender.total + 50, 60)
    acked = {a: list(steps) for a, steps in sender.acked.items()}
    old_master.start()  # back as group-a's slave, with what it holds
    consumer = SimpleConsumer(config, "JournalReaders", {TOPIC: FilterExpression("*")}, 2)
    consumer.startup()
    got: dict[str, list[int]] = {a: [] for a in ACCOUNTS}
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and any(
            not set(acked[a]) <= set(got[a]) for a in ACCOUNTS
        ):
            for m in consumer.receive(32, 15):
                account, step = m.body.decode().split("/")
                got[account].append(int(step))
                consumer.ack(m)
    finally:
        consumer.shutdown()
    for account in ACCOUNTS:
        seen = [s for i, s in enumerate(got[account]) if i == 0 or s != got[account][i - 1]]
        assert set(acked[account]) <= set(seen), f"{account}: acknowledged messages lost"
        assert seen == sorted(seen), f"{account} out of order: {seen}"
    # Each logic queue's offsets run on without a gap from group-a's item to group-b's.
    for queue in range(QUEUES):
        found = logic_offsets(cluster, queue)
        assert found == list(range(len(found))), f"logic queue {queue}: {found}"
    kept = mapping_from_wire(
        admin.GetQueueMapping(pb.QueueMappingRequest(topic=TOPIC), timeout=5).mapping
    )
    assert [kept.leader(q).group for q in range(QUEUES)] == ["group-b"] * QUEUES
