"""An orderly member's broker-side queue locks: the broker lets a lock lapse when it is not
renewed (`consumer_groups.queue_lock_expiry_s`, short here), and the SDK renews its locks
every `lock_renew_interval_s`, so nobody else can take a queue it is consuming."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import grpc
import pytest

from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumerOptions,
    ConsumeStatus,
)
from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from tests.broker.broker_process import BrokerProcess
from tests.client.broker_calls import produce
from tests.waiting import wait_until

LOCK_EXPIRY_S = 2.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    groups = {"queue_lock_expiry_s": LOCK_EXPIRY_S}
    process = BrokerProcess(tmp_path_factory.mktemp("broker"), consumer_groups=groups).start()
    try:
        yield process
    finally:
        process.stop()


def intruder_locks(broker: BrokerProcess, group: str, topic: str) -> bool:
    """Whether another client gets the lock of the topic's queue 0 (and keeps it)."""
    request = c.LockQueuesRequest(
        client_id="intruder", group=group, queues=[c.QueueRef(topic=topic, queue_id=0)]
    )
    with grpc.insecure_channel(broker.address) as channel:
        stub = c_grpc.ConsumerStub(channel)  # type: ignore[no-untyped-call]
        return bool(stub.LockQueues(request, timeout=5).locked)


def consumer_with(
    broker: BrokerProcess, group: str, topic: str, renew_s: float
) -> tuple[PushConsumer, list[str]]:
    seen: list[str] = []

    def listener(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        seen.extend(m.body.decode() for m in batch)
        return ConsumeStatus.CONSUME_SUCCESS

    options = ConsumerOptions(
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET, lock_renew_interval_s=renew_s
    )
    consumer = PushConsumer(broker.address, group, listener, orderly=True, options=options)
    consumer.subscribe(topic)
    return consumer, seen


def one_queue(broker: BrokerProcess, name: str) -> tuple[str, str]:
    topic, group = f"{name}-topic", f"{name}-group"
    broker.create_topic(topic, queues=1)
    broker.create_group(group)
    produce(broker, topic, ["a", "b"])
    return topic, group


def test_an_orderly_member_renews_its_locks_before_the_broker_lets_them_lapse(broker):
    topic, group = one_queue(broker, "renewed")
    consumer, seen = consumer_with(broker, group, topic, renew_s=LOCK_EXPIRY_S / 4)
    with consumer:
        wait_until(lambda: len(seen) >= 2, 20, "the first messages")
        # Three lock lifetimes: without renewal the lock would have lapsed twice over.
        deadline = time.monotonic() + 3 * LOCK_EXPIRY_S
        while time.monotonic() < deadline:
            assert not intruder_locks(broker, group, topic), "the member's lock lapsed"
            time.sleep(0.2)
        produce(broker, topic, ["c"])
        wait_until(lambda: len(seen) >= 3, 10, "a message sent after that")
    assert seen == ["a", "b", "c"]
    assert intruder_locks(broker, group, topic)  # released at shutdown, not left to lapse


def test_a_lock_that_is_not_renewed_lapses_on_the_broker(broker):
    """The other side of the previous test: it is the renewal that keeps the lock."""
    topic, group = one_queue(broker, "unrenewed")
    consumer, seen = consumer_with(broker, group, topic, renew_s=3600)
    with consumer:
        wait_until(lambda: len(seen) >= 2, 20, "the first messages")
        assert not intruder_locks(broker, group, topic)
        wait_until(
            lambda: intruder_locks(broker, group, topic), LOCK_EXPIRY_S + 10, "the lock to lapse"
        )
        # The member counts its lock for half the broker's expiry (the reply says how
        # long): while the intruder holds the queue (renewing), the member must not
        # consume it; once the intruder lets its lock lapse, the member takes it back.
        produce(broker, topic, ["c"])
        deadline = time.monotonic() + 3 * LOCK_EXPIRY_S
        while time.monotonic() < deadline:
            assert intruder_locks(broker, group, topic)
            assert "c" not in seen, "two members consumed one orderly queue"
            time.sleep(LOCK_EXPIRY_S / 4)
        wait_until(lambda: "c" in seen, LOCK_EXPIRY_S + 10, "the member to take the queue back")


RENEW_S = 8.0
RESUMED_WITHIN_S = 3.0
"""From the broker serving again to the orderly member consuming: the failed renewal is
retried within a second. Before, the member waited for its next renewal (RENEW_S later)."""


def test_a_failed_renewal_keeps_the_queue_and_is_retried_within_a_second(tmp_path):
    (tmp_path / "broker").mkdir()
    process = BrokerProcess(tmp_path / "broker").start()
    try:
        topic, group = one_queue(process, "failed-renewal")
        consumer, seen = consumer_with(process, group, topic, renew_s=RENEW_S)
        lock_calls: list[float] = []
        locked_at: list[float] = []
        lock = consumer._calls.lock

        def counted_lock(address, queues):  # type: ignore[no-untyped-def]
            lock_calls.append(time.monotonic())
            reply = lock(address, queues)
            held, _ = reply
            if held:
                locked_at.append(time.monotonic())
            return reply

        consumer._calls.lock = counted_lock  # type: ignore[method-assign]
        with consumer:
            wait_until(lambda: len(seen) >= 2, 20, "the first messages")
            wait_until(lambda: len(lock_calls) >= 2, RENEW_S + 10, "the first renewal")
            renewed_at = lock_calls[-1]
            process.kill9()
            killed_at = time.monotonic()
            # The next renewal (RENEW_S after the last) fails: the broker is down.
            time.sleep(max(0.0, renewed_at + RENEW_S + 0.5 - time.monotonic()))
            process.start()
            serving_at = time.monotonic()
            produce(process, topic, ["c"])
            wait_until(lambda: "c" in seen, RENEW_S + 10, "a message sent once it serves")
            assert seen.index("c") == 2
            # The queue stays consumed on its unexpired lease, so "c" may arrive before the
            # retried renewal: wait for the renewal itself.
            wait_until(
                lambda: any(t > killed_at for t in locked_at),
                RESUMED_WITHIN_S + 5,
                "the lock renewed after the restart",
            )
        resumed = next(t for t in locked_at if t > killed_at) - serving_at
        assert resumed < RESUMED_WITHIN_S, f"the lock was renewed {resumed:.1f} s after"
    finally:
        process.stop()
