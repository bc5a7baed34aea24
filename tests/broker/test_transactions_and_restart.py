"""Transactions with the official client, and a broker killed with -9 mid-consumption."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from rocketmq import (
    FilterExpression,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.broker.broker_process import TEST_SETTINGS, BrokerProcess
from tests.broker.test_official_client import config, message, produce, receive_all
from tests.broker.v2_requests import METADATA, send, stub, v2_message
from tests.waiting import wait_until


class Checker(TransactionChecker):
    def __init__(self, answer: TransactionResolution) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self.event = threading.Event()

    def check(self, message):
        self.asked.append(message.message_id)
        self.event.set()
        return self.answer


def transactional_send(producer: Producer, topic: str, body: bytes):
    tx = producer.begin_transaction()
    receipt = producer.send(message(topic, body), tx)
    return tx, receipt.message_id


def visible_bodies(broker, topic: str, wait_s: float, want: int = 10) -> list[bytes]:
    """What a consumer of `topic` receives within `wait_s`; once `want` messages came, one
    more receive (its long poll, 2 s) shows whether anything else would."""
    consumer = SimpleConsumer(
        config(broker), "Reader", {topic: FilterExpression("*")}, await_duration=2
    )
    consumer.startup()
    try:
        got = receive_all(consumer, want, timeout_s=wait_s)
        if len(got) >= want:
            got.extend(consumer.receive(32, 10))
        for m in got:
            consumer.ack(m)
        return sorted(m.body for m in got)
    finally:
        consumer.shutdown()


@pytest.fixture
def patient_broker(tmp_path) -> Iterator[BrokerProcess]:
    """A broker that asks an undecided producer 20 times before giving a transaction up (the
    tests' default, 3 checks 0.5 s apart, gave up while the test still looked, before it
    committed: CI saw the commit find nothing)."""
    transaction = {**TEST_SETTINGS["transaction"], "max_checks": 20}
    process = BrokerProcess(tmp_path, transaction=transaction).start()
    try:
        yield process
    finally:
        process.stop()


def test_commit_makes_the_message_visible_and_rollback_discards_it(patient_broker):
    broker = patient_broker
    broker.create_topic("Pay", kind="TRANSACTION")
    broker.create_group("Reader")
    # Check-backs come while the test looks: the producer has not decided yet.
    undecided = Checker(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)
    producer = Producer(config(broker), ("Pay",), undecided)
    producer.startup()
    try:
        tx1, _ = transactional_send(producer, "Pay", b"committed")
        tx2, _ = transactional_send(producer, "Pay", b"rolled back")
        assert visible_bodies(broker, "Pay", 2) == []  # half messages are invisible
        tx1.commit()
        tx2.rollback()
    finally:
        producer.shutdown()
    assert visible_bodies(broker, "Pay", 30, want=1) == [b"committed"]


def test_unknown_transaction_is_checked_back_and_committed(broker):
    broker.create_topic("Pay", kind="TRANSACTION")
    broker.create_group("Reader")
    checker = Checker(TransactionResolution.COMMIT)
    producer = Producer(config(broker), ("Pay",), checker)
    producer.startup()
    try:
        _, mid = transactional_send(producer, "Pay", b"decided by check-back")
        # Neither commit nor rollback: the broker asks the producer after check_timeout.
        assert checker.event.wait(15), "no check-back arrived"
        assert checker.asked[0] == mid
        assert visible_bodies(broker, "Pay", 30, want=1) == [b"decided by check-back"]
    finally:
        producer.shutdown()


def test_unanswered_transaction_goes_to_the_check_max_topic(broker):
    broker.create_topic("Pay", kind="TRANSACTION")
    broker.create_group("Reader")
    producer = Producer(config(broker), ("Pay",), Checker(TransactionResolution.COMMIT))
    producer.startup()
    transactional_send(producer, "Pay", b"orphan")
    producer.shutdown()  # nobody can answer the check-back now
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sum(broker.queue_ends("TRANS_CHECK_MAX_TIME_TOPIC")) < 1:
        time.sleep(0.3)
    assert sum(broker.queue_ends("TRANS_CHECK_MAX_TIME_TOPIC")) == 1
    assert visible_bodies(broker, "Pay", 2) == []


@pytest.mark.chaos
def test_kill_9_during_consumption_loses_no_acked_message_and_redelivers_in_flight(broker):
    broker.create_topic("T", queues=4)
    broker.create_group("G")
    ids = produce(broker, "T", [f"m{i}".encode() for i in range(200)])
    consumer = SimpleConsumer(config(broker), "G", {"T": FilterExpression("*")}, await_duration=2)
    consumer.startup()
    acked: set[str] = set()
    in_flight: set[str] = set()
    try:
        got = receive_all(consumer, 120, invisible_s=3)
        for m in got[:80]:
            consumer.ack(m)
            acked.add(m.message_id)
        in_flight = {m.message_id for m in got[80:]}
    finally:
        consumer.shutdown()
    broker.kill9()
    broker.start()
    consumer = SimpleConsumer(config(broker), "G", {"T": FilterExpression("*")}, await_duration=2)
    consumer.startup()
    seen: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(seen) < len(ids) - len(acked):
            for m in consumer.receive(32, 10):
                seen[m.message_id] = m.delivery_attempt
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert set(seen) == set(ids) - acked  # every unacked message, and no acked one
    assert all(seen[mid] == 2 for mid in in_flight)  # in-flight ones come back as retries


def test_a_repeated_commit_is_answered_as_decided_after_the_checks_moved_past_it(broker):
    broker.create_topic("Once", kind="TRANSACTION", queues=1)
    s = stub(broker.address)
    prepared = send(s, v2_message("Once", b"once", message_type=pb.TRANSACTION)).entries[0]
    request = svc.EndTransactionRequest(
        topic=pb.Resource(name="Once"),
        message_id=prepared.message_id,
        transaction_id=prepared.transaction_id,
        resolution=pb.COMMIT,
    )
    first = s.EndTransaction(request, metadata=METADATA, timeout=10)
    assert first.status.code == pb.OK and first.status.message == "OK"
    # A check pass (every 0.5 s) moves the low mark past the decided half (the broker's only
    # one, at offset 0) and forgets the decision: the answer now comes from the low mark.
    wait_until(lambda: low_mark(broker) >= 1, 10, "the low mark past the decided half")
    again = s.EndTransaction(request, metadata=METADATA, timeout=10)
    assert again.status.code == pb.OK and again.status.message == "already decided"
    assert broker.queue_ends("Once") == [1]  # stored once


def low_mark(broker: BrokerProcess) -> int:
    """The lowest undecided half offset, as the broker's transaction progress file keeps it."""
    path = broker.root / "data" / "state" / "transaction_progress.json"
    try:
        return int(json.loads(path.read_text())["offset"])
    except (FileNotFoundError, json.JSONDecodeError):
        return -1
