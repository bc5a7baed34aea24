"""The PushConsumer against a real broker: consumption and committed offsets, ackIndex and
RECONSUME_LATER through the retry topic to the DLQ, flow control, orderly consumption,
broadcasting with local offsets, and subscription inconsistency."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumerOptions,
    ConsumeStatus,
    MessageModel,
)
from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from tests.broker.broker_process import BrokerProcess
from tests.broker.test_batch_pull import pull, puller
from tests.broker.v2_requests import send, stub, v2_message
from tests.cli.test_broker_cli import capstan
from tests.client.broker_calls import committed, produce
from tests.waiting import wait_until

FIRST = ConsumeFromWhere.FIRST_OFFSET
# How long a test watches, once what it expects has come, for a message that must not come
# (a duplicate, an old one, one too many): nothing signals that something did not happen.
QUIET_S = 0.5


class Recorder:
    """A listener that records what it saw and answers with `decide`."""

    def __init__(
        self,
        decide: Callable[[Sequence[ReceivedMessage], ConsumeContext], ConsumeStatus] | None = None,
    ) -> None:
        self.seen: list[ReceivedMessage] = []
        self.lock = threading.Lock()
        self.decide = decide

    def __call__(self, batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        with self.lock:
            self.seen.extend(batch)
        if self.decide is not None:
            return self.decide(batch, ctx)
        return ConsumeStatus.CONSUME_SUCCESS

    def bodies(self) -> list[str]:
        with self.lock:
            return [m.body.decode() for m in self.seen]


def test_every_message_is_consumed_and_a_restart_resumes_after_the_committed_offset(broker, names):
    topic, group = names
    produce(broker, topic, [f"a{i}" for i in range(200)])
    first = Recorder()
    options = ConsumerOptions(consume_from_where=FIRST)
    consumer = PushConsumer(broker.address, group, first, options=options)
    consumer.subscribe(topic)
    with consumer:
        wait_until(lambda: len(first.bodies()) >= 200, 20, "200 messages")
    assert sorted(first.bodies()) == sorted(f"a{i}" for i in range(200))
    ends = broker.queue_ends(topic)
    assert [committed(broker, group, topic, q) for q in range(4)] == ends
    produce(broker, topic, [f"b{i}" for i in range(20)])
    second = Recorder()
    consumer = PushConsumer(broker.address, group, second)
    consumer.subscribe(topic)
    with consumer:
        wait_until(lambda: len(second.bodies()) >= 20, 20, "the 20 new messages")
        time.sleep(QUIET_S)  # and no old one after them
    assert sorted(second.bodies()) == sorted(f"b{i}" for i in range(20))


def test_a_new_group_consuming_from_last_offset_skips_what_was_there(broker, names):
    topic, group = names
    produce(broker, topic, ["old"] * 10)
    seen = Recorder()
    consumer = PushConsumer(broker.address, group, seen)
    consumer.subscribe(topic)
    with consumer:
        # A queue is owned once its start offset (the end, for a new group) is known.
        wait_until(lambda: len(consumer.owned_queues()) == 5, 10, "queues assigned")
        produce(broker, topic, ["new"] * 5)
        wait_until(lambda: len(seen.bodies()) >= 5, 10, "the new messages")
        time.sleep(QUIET_S)  # and no old one after them
    assert seen.bodies() == ["new"] * 5


def test_ack_index_and_reconsume_later_bring_failures_back_until_the_dlq(broker, names):
    topic, group = names
    produce(broker, topic, ["ok", "flaky", "poison"])

    def decide(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        ctx.delay_level_when_next_consume = 1  # retry after 1 s, not the default 10 s
        body = batch[0].body
        if body == b"poison":
            return ConsumeStatus.RECONSUME_LATER
        if body == b"flaky" and batch[0].reconsume_times < 2:
            ctx.ack_index = -1  # "success", but nothing of the batch acknowledged
            return ConsumeStatus.CONSUME_SUCCESS
        return ConsumeStatus.CONSUME_SUCCESS

    seen = Recorder(decide)
    options = ConsumerOptions(consume_from_where=FIRST, max_reconsume_times=2)
    consumer = PushConsumer(broker.address, group, seen, options=options)
    consumer.subscribe(topic)
    dlq = f"%DLQ%{group}"
    with consumer:
        wait_until(
            lambda: seen.bodies().count("poison") >= 3 and seen.bodies().count("flaky") >= 3,
            20,
            "three deliveries of each failing message",
        )
        wait_until(lambda: broker.dead_letters(group) == 1, 10, "the poison message in the DLQ")
        time.sleep(3 * QUIET_S)  # no fourth delivery of either
    attempts = {
        body: [m.reconsume_times for m in seen.seen if m.body.decode() == body]
        for body in ("ok", "flaky", "poison")
    }
    assert attempts == {"ok": [0], "flaky": [0, 1, 2], "poison": [0, 1, 2]}
    retried = [m for m in seen.seen if m.reconsume_times > 0]
    assert {m.topic for m in retried} == {topic}  # the listener sees the original topic
    assert {m.message_queue.topic for m in retried} == {f"%RETRY%{group}"}
    ids = {m.message_id for m in seen.seen if m.body == b"poison"}
    assert len(ids) == 1  # one message id across its retries
    dead = pull(puller(broker.address), 0, topic=dlq, group=group).messages
    assert [m.body for m in dead] == [b"poison"]


@pytest.mark.parametrize(
    ("reason", "limits", "hold"),
    [
        ("count", {"pull_threshold_for_queue": 20}, "all"),
        ("size", {"pull_threshold_size_for_queue_mib": 1}, "all"),
        ("span", {"consume_concurrently_max_span": 10}, "first"),
    ],
)
def test_flow_control_trips_each_threshold_and_pulling_resumes(broker, names, reason, limits, hold):
    topic, group = names
    big = "x" * 60_000  # 25 messages and 1.5 MB per queue
    produce(broker, topic, [f"{i}-{big}" for i in range(100)])
    gate = threading.Event()

    def decide(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        if hold == "all" or batch[0].queue_offset == 0:
            gate.wait(90)  # held until the threshold is seen, however slow the machine
        return ConsumeStatus.CONSUME_SUCCESS

    seen = Recorder(decide)
    options = ConsumerOptions(consume_from_where=FIRST, pull_batch_size=4, **limits)
    consumer = PushConsumer(broker.address, group, seen, options=options)
    consumer.subscribe(topic)

    def hits() -> dict[str, float]:
        found = {}
        for metric in consumer.metrics.registry.collect():
            if metric.name == "capstan_flow_control":
                for sample in metric.samples:
                    if sample.name.endswith("_total"):
                        found[sample.labels["reason"]] = sample.value
        return found

    with consumer:
        # A bound, not a speed: CI's loaded machine once took over 20 s to trip the span.
        wait_until(lambda: reason in hits(), 60, f"the {reason} threshold")
        assert set(hits()) == {reason}
        paused = len(seen.bodies())
        gate.set()
        wait_until(lambda: len(seen.bodies()) >= 100, 30, "everything after the gate opened")
    assert paused < 100
    assert len(set(seen.bodies())) == 100


def test_orderly_consumption_keeps_queue_order_and_suspends_in_place(broker, names):
    _, group = names
    topic = f"{group}-fifo"
    broker.create_topic(topic, "FIFO", queues=4)
    keys = [f"k{n}" for n in range(6)]
    bodies = [f"{key}-{i}" for i in range(30) for key in keys]
    produce_fifo(broker, topic, bodies)
    failed_once: set[str] = set()

    def decide(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        body = batch[0].body.decode()
        if body.endswith("-7") and body not in failed_once:
            failed_once.add(body)
            ctx.suspend_ms = 100
            return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeStatus.CONSUME_SUCCESS

    seen = Recorder(decide)
    options = ConsumerOptions(consume_from_where=FIRST)
    consumer = PushConsumer(broker.address, group, seen, orderly=True, options=options)
    consumer.subscribe(topic)
    with consumer:
        wait_until(lambda: len(seen.bodies()) >= len(bodies) + 6, 30, "every message")
        time.sleep(QUIET_S)  # and nothing more
    per_key: dict[str, list[int]] = {}
    for body in seen.bodies():
        key, i = body.split("-")
        per_key.setdefault(key, []).append(int(i))
    for key in keys:
        # In order; the suspended message comes again at once after its pause, nothing
        # later overtakes it.
        assert per_key[key] == [*range(8), *range(7, 30)], (key, per_key[key])


def produce_fifo(broker: BrokerProcess, topic: str, bodies: Sequence[str]) -> None:
    s = stub(broker.address)
    for body in bodies:
        key = body.split("-")[0]
        message = v2_message(topic, body.encode(), message_type=pb.FIFO, message_group=key)
        reply = send(s, message)
        assert reply.status.code == 20000, reply


def test_broadcasting_gives_every_member_everything_and_offsets_survive_restart(
    broker, names, tmp_path: Path
):
    topic, group = names
    produce(broker, topic, [f"m{i}" for i in range(40)])
    recorders = [Recorder(), Recorder()]
    consumers = []
    for n, rec in enumerate(recorders):
        options = ConsumerOptions(
            message_model=MessageModel.BROADCASTING,
            consume_from_where=FIRST,
            offset_file=tmp_path / f"member{n}.json",
        )
        pc = PushConsumer(broker.address, group, rec, options=options)
        pc.subscribe(topic)
        consumers.append(pc.start())
    try:
        for rec in recorders:
            wait_until(lambda rec=rec: len(rec.bodies()) >= 40, 20, "all 40 on each member")
    finally:
        for pc in consumers:
            pc.shutdown()
    for rec in recorders:
        assert sorted(rec.bodies()) == sorted(f"m{i}" for i in range(40))
    produce(broker, topic, ["after"] * 3)
    again = Recorder()
    options = ConsumerOptions(
        message_model=MessageModel.BROADCASTING,
        consume_from_where=FIRST,
        offset_file=tmp_path / "member0.json",
    )
    pc = PushConsumer(broker.address, group, again, options=options)
    pc.subscribe(topic)
    with pc:
        wait_until(lambda: len(again.bodies()) >= 3, 10, "the 3 new messages")
        time.sleep(QUIET_S)  # and no old one after them
    assert again.bodies() == ["after"] * 3  # resumed from the local file, not from FIRST


def both_own_some_of(a: PushConsumer, b: PushConsumer, queues: int) -> bool:
    owned = len(a.owned_queues()), len(b.owned_queues())
    return min(owned) > 0 and sum(owned) == queues


def test_members_subscribing_differently_lose_messages_and_are_reported(broker, names):
    """Seed 000's scenario: one group, two members, different tags. The queues are split
    between them, so each misses its own tag's messages in the other's queues."""
    topic, group = names
    alice, bob = Recorder(), Recorder()
    a = PushConsumer(broker.address, group, alice, client_id="alice")
    a.subscribe(topic, "red")
    b = PushConsumer(broker.address, group, bob, client_id="bob")
    b.subscribe(topic, "blue")
    with a, b:
        # Each owns some: both have rebalanced (a queue is owned once its offset is known).
        wait_until(lambda: both_own_some_of(a, b, 5), 10, "queues shared")
        produce(broker, topic, [f"red{i}" for i in range(8)], tag="red")
        produce(broker, topic, [f"blue{i}" for i in range(8)], tag="blue")
        wait_until(lambda: alice.bodies() and bob.bodies(), 10, "both consume")
        time.sleep(2 * QUIET_S)  # the rest of what each may take, and no more
        assert 0 < len(alice.bodies()) < 8 and 0 < len(bob.bodies()) < 8
        assert all(b.startswith("red") for b in alice.bodies())
        s = c_grpc.ConsumerStub(grpc.insecure_channel(broker.address))  # type: ignore[no-untyped-call]
        members = s.GetMembers(c.GetMembersRequest(group=group), timeout=5)
        assert not members.subscriptions_consistent
        assert f"alice subscribe to %RETRY%{group} '*', {topic} 'red'" in members.inconsistency
        assert f"bob subscribe to %RETRY%{group} '*', {topic} 'blue'" in members.inconsistency
        shown = capstan("group", "describe", group, "--server", broker.address)
        assert shown.returncode == 0, shown.stderr
        assert "WARNING: members subscribe differently" in shown.stdout
        assert f"member alice: subscribes to %RETRY%{group} '*', {topic} 'red'" in shown.stdout
        as_json = json.loads(
            capstan("group", "describe", group, "--server", broker.address, "--json").stdout
        )
        assert as_json["members"]["subscriptions_consistent"] is False
    log = broker.log.read_text()
    assert f"consumer group {group} subscribes inconsistently" in log


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_an_admin_offset_reset_reaches_running_members(broker, names, orderly):
    """`capstan group reset-offset` while the group consumes: the members consume again
    from the reset offsets and do not commit their old, higher offsets over them."""
    topic, group = names
    bodies = [f"g{i % 4}-{i}" for i in range(80)]
    if orderly:
        topic = f"{group}-fifo"
        broker.create_topic(topic, "FIFO", queues=4)
        produce_fifo(broker, topic, bodies)
    else:
        produce(broker, topic, bodies)
    seen = Recorder()
    options = ConsumerOptions(consume_from_where=FIRST, persist_offset_interval_s=0.2)
    consumer = PushConsumer(broker.address, group, seen, orderly=orderly, options=options)
    consumer.subscribe(topic)
    ends = broker.queue_ends(topic)
    with consumer:
        wait_until(lambda: len(seen.bodies()) >= 80, 20, "the first 80 messages")
        used = [q for q in range(4) if ends[q] > 0]  # message groups may share a queue

        def at_ends() -> bool:
            return all(committed(broker, group, topic, q) == ends[q] for q in used)

        wait_until(at_ends, 10, "the offsets committed at the queue ends")
        reset = capstan(
            "group", "reset-offset", group, "--topic", topic, "--earliest", "--json",
            "--server", broker.address,
        )  # fmt: skip
        assert reset.returncode == 0, reset.stderr
        wait_until(lambda: len(seen.bodies()) >= 160, 20, "every message a second time")
        wait_until(at_ends, 10, "the offsets committed at the queue ends again")
    assert sorted(seen.bodies()) == sorted(bodies * 2)
    if orderly:
        second = seen.bodies()[80:]
        for key in ("g0", "g1", "g2", "g3"):
            numbers = [int(b.split("-")[1]) for b in second if b.startswith(key + "-")]
            assert numbers == sorted(numbers), f"message group {key} out of order: {numbers}"
