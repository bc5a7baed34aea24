"""The LitePullConsumer against a real broker: assign and poll in queue order, auto commit and
commit_sync/commit_async persisting for the group, seek, pause/resume, two subscribed
members sharing a topic, and poll's timeout."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pytest

from capstan.client.consumer.lite_pull_consumer import LitePullConsumer
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import ConsumeFromWhere, ConsumerOptions
from tests.client.broker_calls import committed, produce

FIRST = ConsumerOptions(consume_from_where=ConsumeFromWhere.FIRST_OFFSET, pull_batch_size=16)


def poll_until(
    consumers: Sequence[LitePullConsumer],
    done: Callable[[list[ReceivedMessage]], bool],
    timeout_s: float = 15,
) -> list[ReceivedMessage]:
    """Poll the consumers in turn until `done(everything so far)`, within `timeout_s`."""
    seen: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while not done(seen):
        assert time.monotonic() < deadline, f"timed out with {len(seen)} messages"
        for consumer in consumers:
            batch = consumer.poll(timeout_s=0.2)
            assert len(batch) <= consumer.options.pull_batch_size
            seen.extend(batch)
    return seen


def by_queue(messages: Sequence[ReceivedMessage]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for m in messages:
        found.setdefault(m.queue_id, []).append(m.queue_offset)
    return found


def test_assign_polls_every_message_in_queue_order_and_auto_commit_persists(broker, names):
    topic, group = names
    produce(broker, topic, [f"a{i}" for i in range(120)])
    ends = broker.queue_ends(topic)
    consumer = LitePullConsumer(broker.address, group, options=FIRST, auto_commit_interval_s=0.3)
    queues = consumer.fetch_message_queues(topic)
    assert [q.queue_id for q in queues] == [0, 1, 2, 3]
    consumer.assign(queues)
    with consumer:
        assert consumer.assignment() == queues
        seen = poll_until([consumer], lambda seen: len(seen) >= 120)
        assert by_queue(seen) == {q: list(range(ends[q])) for q in range(4)}
        assert sorted(m.body for m in seen) == sorted(f"a{i}".encode() for i in range(120))
        for q in range(4):  # sent in order, so each queue holds an increasing run
            numbers = [int(m.body[1:]) for m in seen if m.queue_id == q]
            assert numbers == sorted(numbers)
        time.sleep(0.4)
        assert consumer.poll(timeout_s=0) == []  # past the interval: this poll commits
        assert [committed(broker, group, topic, q) for q in range(4)] == ends
        assert [consumer.committed(q) for q in queues] == ends
    produce(broker, topic, [f"b{i}" for i in range(8)])
    again = LitePullConsumer(broker.address, group, options=FIRST)
    again.assign(queues)
    with again:
        seen = poll_until([again], lambda seen: len(seen) >= 8)
        assert again.poll(timeout_s=0.3) == []
    assert sorted(m.body for m in seen) == sorted(f"b{i}".encode() for i in range(8))
    assert [committed(broker, group, topic, q) for q in range(4)] == broker.queue_ends(topic)


def test_commit_sync_and_async_persist_and_a_new_consumer_resumes_after_them(broker, names):
    topic, group = names
    produce(broker, topic, [f"m{i}" for i in range(40)])
    ends = broker.queue_ends(topic)
    consumer = LitePullConsumer(broker.address, group, options=FIRST, auto_commit=False)
    queues = consumer.fetch_message_queues(topic)
    consumer.assign(queues)
    with consumer:
        assert [consumer.committed(q) for q in queues] == [-1] * 4
        poll_until([consumer], lambda seen: len(seen) >= 40)
        consumer.commit_async().result(timeout=5)
        assert [committed(broker, group, topic, q) for q in range(4)] == ends
        consumer.commit_sync({queues[0]: 2})
        assert consumer.committed(queues[0]) == 2
        with pytest.raises(ValueError, match="cannot commit offset -1"):
            consumer.commit_sync({queues[1]: -1})
    assert committed(broker, group, topic, 0) == 2  # no commit at shutdown without auto commit
    again = LitePullConsumer(broker.address, group, options=FIRST, auto_commit=False)
    again.assign(queues)
    with again:
        seen = poll_until([again], lambda seen: len(seen) >= ends[0] - 2)
        assert again.poll(timeout_s=0.3) == []
        again.commit_sync()
    assert by_queue(seen) == {0: list(range(2, ends[0]))}
    assert committed(broker, group, topic, 0) == ends[0]


def test_seek_rereads_from_the_offset_and_an_offset_out_of_range_is_refused(broker, names):
    topic, group = names
    produce(broker, topic, [f"s{i}" for i in range(20)])
    ends = broker.queue_ends(topic)
    consumer = LitePullConsumer(broker.address, group, options=FIRST)
    queues = consumer.fetch_message_queues(topic)
    q0 = queues[0]
    consumer.assign(queues)
    with consumer:
        assert [consumer.offset_range(q) for q in queues] == [(0, end) for end in ends]
        poll_until([consumer], lambda seen: len(seen) >= 20)
        consumer.seek(q0, 2)
        again = poll_until([consumer], lambda seen: len(seen) >= ends[0] - 2)
        assert by_queue(again) == {0: list(range(2, ends[0]))}
        for bad in (-1, ends[0] + 1):
            with pytest.raises(ValueError, match=rf"outside 0\.\.{ends[0]}"):
                consumer.seek(q0, bad)
        consumer.seek_to_begin(queues[1])
        again = poll_until([consumer], lambda seen: len(seen) >= ends[1])
        assert by_queue(again) == {1: list(range(ends[1]))}
        consumer.seek(q0, 0)
        consumer.seek_to_end(q0)  # what the first seek brought is dropped
        assert consumer.poll(timeout_s=0.5) == []
        consumer.commit_sync()
        assert consumer.committed(q0) == ends[0]
        with pytest.raises(ValueError, match="not assigned"):
            consumer.seek(MessageQueue(topic, q0.broker_name, 99), 0)


def test_pause_holds_a_queue_back_and_resume_brings_its_messages(broker, names):
    topic, group = names
    consumer = LitePullConsumer(broker.address, group, options=FIRST)
    queues = consumer.fetch_message_queues(topic)
    consumer.assign(queues)
    with consumer:
        consumer.pause([queues[0]])
        produce(broker, topic, [f"p{i}" for i in range(40)])
        ends = broker.queue_ends(topic)
        seen = poll_until([consumer], lambda seen: len(seen) >= sum(ends[1:]))
        seen += consumer.poll(timeout_s=0.5)
        assert by_queue(seen) == {q: list(range(ends[q])) for q in (1, 2, 3)}
        consumer.resume([queues[0]])
        resumed = poll_until([consumer], lambda seen: len(seen) >= ends[0])
        assert by_queue(resumed) == {0: list(range(ends[0]))}


def pulled(consumer: LitePullConsumer) -> float:
    labels = {"consumer_group": consumer.group, "client_id": consumer.client_id}
    return consumer.metrics.registry.get_sample_value("capstan_pulled_messages_total", labels) or 0


def test_letting_go_of_a_queue_drops_its_buffer_and_commits_what_was_polled(broker, names):
    topic, group = names
    produce(broker, topic, [f"x{i}" for i in range(40)])
    polled_ends = broker.queue_ends(topic)
    consumer = LitePullConsumer(broker.address, group, options=FIRST)
    queues = consumer.fetch_message_queues(topic)
    consumer.assign(queues)
    with consumer:
        poll_until([consumer], lambda seen: len(seen) >= 40)
        produce(broker, topic, [f"y{i}" for i in range(40)])
        ends = broker.queue_ends(topic)
        deadline = time.monotonic() + 10
        while pulled(consumer) < 80:  # buffered, not polled
            assert time.monotonic() < deadline, pulled(consumer)
            time.sleep(0.05)
        consumer.assign(queues[:1])
        assert consumer.assignment() == queues[:1]
        assert [committed(broker, group, topic, q) for q in range(4)] == [-1, *polled_ends[1:]]
        seen = poll_until([consumer], lambda seen: len(seen) >= ends[0] - polled_ends[0])
        assert consumer.poll(timeout_s=0.3) == []
    assert by_queue(seen) == {0: list(range(polled_ends[0], ends[0]))}


def test_two_subscribed_members_split_the_queues_and_read_everything_once(broker, names):
    topic, group = names
    options = ConsumerOptions(consume_from_where=ConsumeFromWhere.FIRST_OFFSET, pull_batch_size=8)
    a = LitePullConsumer(broker.address, group, options=options, client_id="a")
    b = LitePullConsumer(broker.address, group, options=options, client_id="b")
    a.subscribe(topic)
    b.subscribe(topic)
    with pytest.raises(RuntimeError, match="not both"):
        a.assign(a.fetch_message_queues(topic))
    with a, b:
        deadline = time.monotonic() + 15
        while not (len(a.assignment()) == len(b.assignment()) == 2):
            assert time.monotonic() < deadline, (a.assignment(), b.assignment())
            time.sleep(0.05)
        assert set(a.assignment()).isdisjoint(b.assignment())
        produce(broker, topic, [f"g{i}" for i in range(80)])
        from_a: list[ReceivedMessage] = []
        from_b: list[ReceivedMessage] = []
        deadline = time.monotonic() + 15
        while len(from_a) + len(from_b) < 80:
            assert time.monotonic() < deadline, (len(from_a), len(from_b))
            from_a += a.poll(timeout_s=0.1)
            from_b += b.poll(timeout_s=0.1)
        assert a.poll(timeout_s=0.3) == [] and b.poll(timeout_s=0) == []
    bodies = sorted(m.body for m in from_a + from_b)
    assert bodies == sorted(f"g{i}".encode() for i in range(80))  # each exactly once
    assert from_a and from_b
    assert {m.message_queue for m in from_a}.isdisjoint({m.message_queue for m in from_b})
    assert [committed(broker, group, topic, q) for q in range(4)] == broker.queue_ends(topic)


def test_poll_returns_nothing_after_its_timeout_and_misuse_is_refused(broker, names):
    topic, group = names
    consumer = LitePullConsumer(broker.address, group, poll_timeout_s=0.3)
    with pytest.raises(RuntimeError, match="subscribe\\(\\) or assign\\(\\)"):
        consumer.start()
    consumer.assign(consumer.fetch_message_queues(topic))
    with pytest.raises(RuntimeError, match="not both"):
        consumer.subscribe(topic)
    with pytest.raises(RuntimeError, match="not running"):
        consumer.poll()
    with consumer:
        for timeout_s, wait in ((None, 0.3), (0.5, 0.5)):
            started = time.monotonic()
            assert consumer.poll(timeout_s) == []
            assert wait - 0.05 <= time.monotonic() - started < wait + 1.0
    with pytest.raises(RuntimeError, match="not running"):
        consumer.poll()


def test_an_admin_offset_reset_reaches_a_subscribed_member(broker, names):
    """`capstan group reset-offset --earliest` while a subscribed member polls: it reads
    everything again and its auto commit does not put the old offsets back."""
    from tests.cli.test_broker_cli import capstan

    topic, group = names
    produce(broker, topic, [f"r{i}" for i in range(40)])
    ends = broker.queue_ends(topic)
    consumer = LitePullConsumer(broker.address, group, options=FIRST, auto_commit_interval_s=0.2)
    consumer.subscribe(topic)
    with consumer:
        first = poll_until([consumer], lambda seen: len(seen) >= 40)
        deadline = time.monotonic() + 10
        while [committed(broker, group, topic, q) for q in range(4)] != ends:
            assert time.monotonic() < deadline, "auto commit did not reach the queue ends"
            consumer.poll(timeout_s=0.1)
        reset = capstan(
            "group", "reset-offset", group, "--topic", topic, "--earliest",
            "--server", broker.address,
        )  # fmt: skip
        assert reset.returncode == 0, reset.stderr
        second = poll_until([consumer], lambda seen: len(seen) >= 40)
        assert consumer.poll(timeout_s=0.5) == []  # and it commits again
    assert sorted(m.body for m in second) == sorted(m.body for m in first)
    assert [committed(broker, group, topic, q) for q in range(4)] == ends
