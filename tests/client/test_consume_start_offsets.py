"""Where a PushConsumer starts on a queue, against real brokers: consume-from TIMESTAMP for
a group without offsets, and OFFSET_ILLEGAL (seed 004) when the offset it holds is below
the queue's minimum (retention deleted the messages) or past its maximum (a local offset
file outliving the broker's data): the queue is dropped, its offset corrected to what the
broker names, written down, and the queue consumed again from there."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.pull_service import OFFSET_ILLEGAL_DROP_DELAY_S
from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.settings import ConsumeFromWhere, ConsumerOptions, MessageModel
from capstan.v1 import admin_pb2 as admin
from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from tests.broker.broker_process import TEST_SETTINGS, BrokerProcess
from tests.client.broker_calls import committed, produce
from tests.client.test_push_consumer import Recorder
from tests.waiting import wait_until


def test_consume_from_timestamp_starts_at_the_first_message_stored_after_it(broker, names):
    topic, group = names
    produce(broker, topic, [f"before{i}" for i in range(12)])
    time.sleep(0.05)
    timestamp_ms = int(time.time() * 1000)
    time.sleep(0.05)
    produce(broker, topic, [f"after{i}" for i in range(12)])
    seen = Recorder()
    options = ConsumerOptions(
        consume_from_where=ConsumeFromWhere.TIMESTAMP, consume_timestamp_ms=timestamp_ms
    )
    consumer = PushConsumer(broker.address, group, seen, options=options)
    consumer.subscribe(topic)
    with consumer:
        wait_until(lambda: len(seen.bodies()) >= 12, 20, "the 12 later messages")
        time.sleep(0.5)
    assert sorted(seen.bodies()) == sorted(f"after{i}" for i in range(12))
    # Every queue got a share, so each started in its own middle, not at its start or end.
    ends = broker.queue_ends(topic)
    assert [committed(broker, group, topic, q) for q in range(4)] == ends


# -- OFFSET_ILLEGAL ------------------------------------------------------------------------

BODY = "x" * 4000


@pytest.fixture
def short_retention_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose CommitLog segments hold ~15 messages of 4 KB and are deleted about
    a second after their last write (the two newest are always kept)."""
    store = {
        **TEST_SETTINGS["store"],
        "commitlog_segment_bytes": 64 * 1024,
        "max_message_bytes": 16 * 1024,
        "file_reserved_hours": 0.0003,
        "clean_interval_ms": 300,
    }
    process = BrokerProcess(tmp_path, store=store, max_message_body_bytes=8 * 1024).start()
    try:
        yield process
    finally:
        process.stop()


def queue_bounds(broker: BrokerProcess, topic: str) -> tuple[int, int]:
    reply = broker.admin().DescribeTopic(admin.TopicRequest(name=topic), timeout=10)
    return reply.topic.queues[0].min_offset, reply.topic.queues[0].max_offset


def commit(broker: BrokerProcess, group: str, topic: str, offset: int) -> None:
    stub = c_grpc.ConsumerStub(grpc.insecure_channel(broker.address))  # type: ignore[no-untyped-call]
    request = c.CommitOffsetsRequest(
        group=group, offsets=[c.QueueOffset(topic=topic, offset=offset)]
    )
    stub.CommitOffsets(request, timeout=5)


def stable_min(broker: BrokerProcess, topic: str, above: int) -> int:
    """Wait until retention has moved the queue's minimum past `above` and stopped."""
    wait_until(lambda: queue_bounds(broker, topic)[0] > above, 30, "retention to delete")
    last, since = queue_bounds(broker, topic)[0], time.monotonic()
    while time.monotonic() - since < 2.0:
        time.sleep(0.2)
        now = queue_bounds(broker, topic)[0]
        if now != last:
            last, since = now, time.monotonic()
    return last


@pytest.mark.slow
def test_a_committed_offset_below_the_queue_minimum_moves_up_to_it(short_retention_broker):
    broker = short_retention_broker
    topic, group = "Illegal", "IllegalGroup"
    broker.create_topic(topic, queues=1)
    broker.create_group(group)
    produce(broker, topic, [f"m{i}-{BODY}" for i in range(5)])
    commit(broker, group, topic, 5)  # the group consumed 5, then stopped while retention ran
    produce(broker, topic, [f"m{i}-{BODY}" for i in range(5, 100)])
    low = stable_min(broker, topic, above=5)
    high = queue_bounds(broker, topic)[1]
    assert 5 < low < high == 100
    seen = Recorder()
    options = ConsumerOptions(persist_offset_interval_s=0.2)
    consumer = PushConsumer(broker.address, group, seen, options=options)
    consumer.subscribe(topic)
    started = time.monotonic()
    with consumer:
        wait_until(lambda: seen.bodies(), 30, "consumption after the correction")
        corrected_after = time.monotonic() - started
        wait_until(lambda: len(seen.bodies()) >= high - low, 20, "the rest of the queue")
        wait_until(lambda: committed(broker, group, topic, 0) == high, 10, "the offset at the end")
        time.sleep(0.5)
    assert corrected_after >= OFFSET_ILLEGAL_DROP_DELAY_S - 1  # dropped, then taken up again
    # Everything the broker still holds, from its new minimum, once; nothing below it.
    numbers = sorted(int(b.split("-")[0][1:]) for b in seen.bodies())
    assert numbers == list(range(low, high))
    assert queue_bounds(broker, topic)[0] == low


@pytest.mark.slow
def test_a_queue_taken_back_while_its_offset_waits_for_correction_is_consumed_once(
    short_retention_broker,
):
    """Member A meets the illegal offset; within the 10 s before A corrects it, member B
    joins, takes the queue (and commits the illegal offset again when it leaves), and A
    takes the queue back and meets the illegal offset once more. A's first, stale
    correction must not act on the queue A holds now: it once dropped the live
    ProcessQueue from A's table without stopping it, and A pulled the queue twice over,
    consuming every message two times."""
    broker = short_retention_broker
    topic, group = "Regained", "RegainedGroup"
    broker.create_topic(topic, queues=1)
    broker.create_group(group)
    produce(broker, topic, [f"m{i}-{BODY}" for i in range(5)])
    commit(broker, group, topic, 5)
    produce(broker, topic, [f"m{i}-{BODY}" for i in range(5, 100)])
    low = stable_min(broker, topic, above=5)
    high = queue_bounds(broker, topic)[1]
    seen = Recorder()
    options = ConsumerOptions(persist_offset_interval_s=0.2)
    # Client ids sort so that the averaging strategy gives the one queue to B while it is in.
    a = PushConsumer(broker.address, group, seen, options=options, client_id="m2-a")
    a.subscribe(topic)
    q0 = MessageQueue(topic, "broker-a", 0)
    with a:

        def a_dropped() -> bool:
            pq = a.process_queue(q0)
            return pq is not None and pq.dropped

        wait_until(a_dropped, 10, "A's pull answered OFFSET_ILLEGAL")
        b = PushConsumer(broker.address, group, Recorder(), options=options, client_id="m1-b")
        b.subscribe(topic)
        with b:
            wait_until(
                lambda: q0 in b.owned_queues() and q0 not in a.owned_queues(),
                10,
                "the queue moved to B",
            )
        wait_until(lambda: q0 in a.owned_queues(), 10, "the queue back with A")
        wait_until(lambda: len(seen.bodies()) >= high - low, 40, "the queue consumed")
        time.sleep(OFFSET_ILLEGAL_DROP_DELAY_S + 2)  # every correction pending has fired
        produce(broker, topic, [f"m{i}-{BODY}" for i in range(high, high + 10)])
        wait_until(lambda: committed(broker, group, topic, 0) == high + 10, 20, "all committed")
        time.sleep(1.0)
    numbers = sorted(int(b.split("-")[0][1:]) for b in seen.bodies())
    assert numbers == list(range(low, high + 10))  # each once


@pytest.mark.slow
def test_a_local_offset_past_the_queue_end_moves_back_to_it(broker, names, tmp_path: Path):
    """Broadcasting: the member's offset file says 1000 for each queue, but the broker's
    queues end far lower (its data was rebuilt). The member moves to each queue's end as
    the broker names it when answering, and consumes what arrives from then on, including
    what arrives while the queue is dropped, before it is taken up again."""
    topic, group = names
    produce(broker, topic, [f"old{i}" for i in range(8)])
    offset_file = tmp_path / "member.json"
    rows = [{"topic": topic, "broker": "broker-a", "queue_id": q, "offset": 1000} for q in range(4)]
    offset_file.write_text(json.dumps({"offsets": rows}))
    seen = Recorder()
    options = ConsumerOptions(
        message_model=MessageModel.BROADCASTING,
        offset_file=offset_file,
        persist_offset_interval_s=0.2,
    )
    consumer = PushConsumer(broker.address, group, seen, options=options)
    consumer.subscribe(topic)
    with consumer:
        wait_until(lambda: len(consumer.owned_queues()) == 4, 10, "the queues taken up")
        queues = consumer.owned_queues()
        assert {q.broker_name for q in queues} == {"broker-a"}

        def all_dropped() -> bool:
            pqs = [consumer.process_queue(q) for q in queues]
            return all(pq is not None and pq.dropped for pq in pqs)

        wait_until(all_dropped, 10, "every queue answered OFFSET_ILLEGAL and dropped")
        ends = broker.queue_ends(topic)
        produce(broker, topic, [f"meanwhile{i}" for i in range(8)])
        wait_until(lambda: len(seen.bodies()) >= 8, 30, "the messages sent meanwhile")
        produce(broker, topic, [f"later{i}" for i in range(8)])
        wait_until(lambda: len(seen.bodies()) >= 16, 10, "the later messages")
        time.sleep(0.5)
    expected = [f"meanwhile{i}" for i in range(8)] + [f"later{i}" for i in range(8)]
    assert sorted(seen.bodies()) == sorted(expected)
    stored = {
        row["queue_id"]: row["offset"] for row in json.loads(offset_file.read_text())["offsets"]
    }
    assert stored == dict(enumerate(broker.queue_ends(topic)))
    assert all(e < 1000 for e in ends)
