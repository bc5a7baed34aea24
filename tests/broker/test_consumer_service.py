"""capstan.v1.Consumer against a real broker: membership and its notifications, queue
locks, offsets, send-back to the retry and dead-letter topics, and bad requests."""

from __future__ import annotations

import queue
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from capstan.v1 import admin_pb2 as a
from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from tests.broker.broker_process import BrokerProcess
from tests.broker.test_batch_pull import pull, puller
from tests.broker.v2_requests import send, stub, v2_message
from tests.waiting import wait_until

LOCK_EXPIRY_S = 1.5
# The broker writes the pop consumers' progress every second; a test that shows those
# writes leave other offsets alone lets a few of them pass (there is no sign of a round).
HOUSEKEEPING_ROUNDS_S = 2.5


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        consumer_groups={"member_expiry_s": 2, "queue_lock_expiry_s": LOCK_EXPIRY_S},
    ).start()
    process.create_topic("T", queues=4)
    process.create_topic("U", queues=2)
    for g in ("G", "W", "X", "L", "O", "R", "D", "Z"):
        process.create_group(g)
    try:
        yield process
    finally:
        process.stop()


def consumer(address: str) -> c_grpc.ConsumerStub:
    return c_grpc.ConsumerStub(grpc.insecure_channel(address))  # type: ignore[no-untyped-call]


def beat(s: c_grpc.ConsumerStub, group: str, client: str, *subs: tuple[str, str]) -> int:
    request = c.HeartbeatRequest(
        client_id=client,
        group=group,
        message_model=c.CLUSTERING,
        consume_type=c.PUSH,
        subscriptions=[c.Subscription(topic=t, expression=e) for t, e in subs or [("T", "*")]],
    )
    return s.Heartbeat(request, timeout=5).members_version


class Watch:
    """A WatchGroup stream read on a thread; member lists arrive on `.lists`."""

    def __init__(self, s: c_grpc.ConsumerStub, group: str, client: str) -> None:
        self.call = s.WatchGroup(c.WatchGroupRequest(client_id=client, group=group))
        self.lists: queue.Queue[list[str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for update in self.call:
                self.lists.put([m.client_id for m in update.members])
        except grpc.RpcError:
            pass

    def wait_for(self, members: list[str], timeout_s: float) -> float:
        start = time.monotonic()
        deadline = start + timeout_s
        seen: list[str] = []
        while time.monotonic() < deadline:
            try:
                seen = self.lists.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if seen == members:
                return time.monotonic() - start
        raise AssertionError(f"watch never showed {members}; last {seen}")

    def close(self) -> None:
        self.call.cancel()


def code_of(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code()


def test_members_learn_at_once_when_a_member_joins_or_its_stream_ends(b):
    s = consumer(b.address)
    beat(s, "G", "a")
    watch_a = Watch(s, "G", "a")
    watch_a.wait_for(["a"], 5)
    beat(s, "G", "b")
    watch_b = Watch(s, "G", "b")
    assert watch_a.wait_for(["a", "b"], 5) < 1.0
    watch_b.wait_for(["a", "b"], 5)
    watch_b.close()  # what a killed client's connection looks like to the broker
    assert watch_a.wait_for(["a"], 5) < 1.0
    watch_a.close()


def test_a_silent_member_expires_and_the_others_are_told(b):
    s = consumer(b.address)
    beat(s, "W", "keeps-beating")
    beat(s, "W", "goes-quiet")
    watch = Watch(s, "W", "keeps-beating")
    watch.wait_for(["goes-quiet", "keeps-beating"], 5)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        beat(s, "W", "keeps-beating")
        try:
            watch.wait_for(["keeps-beating"], 0.5)
            break
        except AssertionError:
            continue
    else:
        raise AssertionError("the silent member was never expired")
    members = s.GetMembers(c.GetMembersRequest(group="W"), timeout=5)
    assert [m.client_id for m in members.members] == ["keeps-beating"]
    watch.close()


def test_members_that_subscribe_differently_are_reported(b):
    s = consumer(b.address)
    beat(s, "X", "x1", ("T", "a||b"))
    beat(s, "X", "x2", ("T", "a||b"))
    assert s.GetMembers(c.GetMembersRequest(group="X"), timeout=5).subscriptions_consistent
    beat(s, "X", "x3", ("T", "c"))
    members = s.GetMembers(c.GetMembersRequest(group="X"), timeout=5)
    assert not members.subscriptions_consistent
    assert "x1, x2 subscribe to T 'a||b'" in members.inconsistency
    assert "x3 subscribe to T 'c'" in members.inconsistency
    # Each member keeps its own subscription (RocketMQ would keep only the last one).
    assert {m.client_id: m.subscriptions[0].expression for m in members.members} == {
        "x1": "a||b",
        "x2": "a||b",
        "x3": "c",
    }
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{b.http_port}/metrics", timeout=5)
    text = metrics.read().decode()
    assert 'capstan_consumer_subscription_inconsistent{cluster="broker-a"' in text
    line = next(
        row
        for row in text.splitlines()
        if row.startswith("capstan_consumer_subscription_inconsistent")
        and 'consumer_group="X"' in row
    )
    assert line.endswith(" 1.0")
    assert (b.log.read_text().count("consumer group X subscribes inconsistently")) == 1


def _refs(*qids: int) -> list[c.QueueRef]:
    return [c.QueueRef(topic="T", queue_id=q) for q in qids]


def _locked(reply: c.LockQueuesReply) -> list[int]:
    return sorted(r.queue_id for r in reply.locked)


def test_a_queue_lock_has_one_holder_until_released_or_lapsed(b):
    s = consumer(b.address)
    lock = s.LockQueues
    assert _locked(lock(c.LockQueuesRequest(client_id="a", group="L", queues=_refs(0, 1)))) == [
        0,
        1,
    ]
    b_got = lock(c.LockQueuesRequest(client_id="b", group="L", queues=_refs(1, 2)))
    assert _locked(b_got) == [2]
    s.UnlockQueues(c.UnlockQueuesRequest(client_id="a", group="L", queues=_refs(1)))
    assert _locked(lock(c.LockQueuesRequest(client_id="b", group="L", queues=_refs(1)))) == [1]
    # Renewing keeps a lock alive past the expiry; without renewal it lapses.
    for _ in range(3):
        time.sleep(0.6)
        lock(c.LockQueuesRequest(client_id="a", group="L", queues=_refs(0)))
    assert _locked(lock(c.LockQueuesRequest(client_id="b", group="L", queues=_refs(0)))) == []
    wait_until(
        lambda: _locked(lock(c.LockQueuesRequest(client_id="b", group="L", queues=_refs(0)))),
        LOCK_EXPIRY_S + 1,
        "the unrenewed lock to lapse",
    )


def test_unregistering_releases_the_clients_locks(b):
    s = consumer(b.address)
    beat(s, "O", "leaver")
    s.LockQueues(c.LockQueuesRequest(client_id="leaver", group="O", queues=_refs(0, 3)))
    taken = s.LockQueues(c.LockQueuesRequest(client_id="other", group="O", queues=_refs(0, 3)))
    assert _locked(taken) == []
    s.Unregister(c.UnregisterRequest(client_id="leaver", group="O"))
    taken = s.LockQueues(c.LockQueuesRequest(client_id="other", group="O", queues=_refs(0, 3)))
    assert _locked(taken) == [0, 3]
    assert [m.client_id for m in s.GetMembers(c.GetMembersRequest(group="O")).members] == []


def test_offsets_commit_query_search_and_bounds(b):
    s = consumer(b.address)
    v2 = stub(b.address)
    before = int(time.time() * 1000)
    for i in range(5):
        send(v2, v2_message("U", f"m{i}".encode()))
    bounds = [
        s.GetQueueBounds(c.GetQueueBoundsRequest(topic="U", queue_id=q), timeout=5) for q in (0, 1)
    ]
    assert sum(x.max_offset - x.min_offset for x in bounds) == 5
    q = 0 if bounds[0].max_offset else 1
    assert not s.QueryOffset(c.QueryOffsetRequest(group="G", topic="U", queue_id=q)).found
    s.CommitOffsets(
        c.CommitOffsetsRequest(group="G", offsets=[c.QueueOffset(topic="U", queue_id=q, offset=1)])
    )
    reply = s.QueryOffset(c.QueryOffsetRequest(group="G", topic="U", queue_id=q))
    assert (reply.found, reply.offset) == (True, 1)
    search = s.SearchOffset(c.SearchOffsetRequest(topic="U", queue_id=q, timestamp_ms=before))
    assert search.offset == 0
    future = s.SearchOffset(
        c.SearchOffsetRequest(topic="U", queue_id=q, timestamp_ms=before + 3_600_000)
    )
    assert future.offset == bounds[q].max_offset
    beyond = c.QueueOffset(topic="U", queue_id=q, offset=bounds[q].max_offset + 1)
    assert (
        code_of(lambda: s.CommitOffsets(c.CommitOffsetsRequest(group="G", offsets=[beyond])))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    reply = s.QueryOffset(c.QueryOffsetRequest(group="G", topic="U", queue_id=q))
    assert reply.offset == 1  # the refused commit changed nothing


def test_an_admin_reset_does_not_overrule_later_commits_of_a_pulling_group(b):
    """A group that commits through CommitOffsets and never pops: after an admin reset, its
    next commits are what the broker keeps, across several rounds of the broker's own
    offset housekeeping (which writes the pop consumers' progress)."""
    s = consumer(b.address)
    v2 = stub(b.address)
    for i in range(6):
        send(v2, v2_message("U", f"r{i}".encode()))
    ends = [
        s.GetQueueBounds(c.GetQueueBoundsRequest(topic="U", queue_id=q), timeout=5).max_offset
        for q in (0, 1)
    ]
    q = 0 if ends[0] else 1
    commit = c.QueueOffset(topic="U", queue_id=q, offset=ends[q])
    s.CommitOffsets(c.CommitOffsetsRequest(group="Z", offsets=[commit]), timeout=5)
    reset = b.admin().ResetOffset(
        a.ResetOffsetRequest(group="Z", topic="U", earliest=True), timeout=5
    )
    assert [o.committed_offset for o in reset.offsets] == [0, 0]
    s.CommitOffsets(c.CommitOffsetsRequest(group="Z", offsets=[commit]), timeout=5)
    time.sleep(HOUSEKEEPING_ROUNDS_S)
    reply = s.QueryOffset(c.QueryOffsetRequest(group="Z", topic="U", queue_id=q), timeout=5)
    assert (reply.found, reply.offset) == (True, ends[q])


def _stored(b: BrokerProcess, topic: str, body: bytes):  # type: ignore[no-untyped-def]
    v2 = stub(b.address)
    send(v2, v2_message(topic, body, keys=["the-key"]))
    p = puller(b.address)
    for qid in range(4):
        for m in pull(p, 0, 64, topic=topic, queue_id=qid).messages:
            if m.body == body:
                return m
    raise AssertionError("sent message not found")


def test_send_back_delays_by_level_then_dead_letters_past_the_maximum(b):
    s = consumer(b.address)
    failed = _stored(b, "T", b"fails")
    before_ms = int(time.time() * 1000)
    reply = s.SendBack(c.SendBackRequest(group="R", commit_log_offset=failed.commit_log_offset))
    after_ms = int(time.time() * 1000)
    assert reply.topic == "%RETRY%R"
    assert reply.reconsume_times == 1
    # The broker's choice for a first retry is level 3: 10 s from when it answered, which is
    # between the call and its reply (a loaded CI machine took 2.7 s over one).
    assert before_ms + 9_500 <= reply.deliver_at_ms <= after_ms + 10_500
    quick = s.SendBack(
        c.SendBackRequest(group="D", commit_log_offset=failed.commit_log_offset, delay_level=1)
    )
    sent_at = time.monotonic()
    p = puller(b.address)
    retried = pull(p, 0, topic="%RETRY%D", group="D", wait_ms=5000)
    waited = time.monotonic() - sent_at
    assert [m.body for m in retried.messages] == [b"fails"]
    assert 0.5 < waited < 6.0, waited  # level 1 is 1 s; level 3 would be 10 s
    copy = retried.messages[0]
    assert copy.reconsume_times == quick.reconsume_times == 1
    assert copy.properties["RETRY_TOPIC"] == "T"
    assert copy.properties["ORIGIN_MESSAGE_ID"] == failed.message_id
    assert copy.properties["KEYS"] == "the-key"
    # The retry copy fails again; with at most one reconsumption it is a dead letter now.
    dead = s.SendBack(
        c.SendBackRequest(
            group="D", commit_log_offset=copy.commit_log_offset, max_reconsume_times=1
        )
    )
    assert (dead.topic, dead.reconsume_times, dead.deliver_at_ms) == ("%DLQ%D", 2, 0)
    dlq = pull(p, 0, topic="%DLQ%D", group="D")
    assert [m.body for m in dlq.messages] == [b"fails"]
    assert dlq.messages[0].properties["DLQ_ORIGIN_TOPIC"] == "T"


@pytest.mark.parametrize(
    ("name", "call", "code"),
    [
        (
            "unknown group",
            lambda s: beat(s, "nope", "a"),
            grpc.StatusCode.NOT_FOUND,
        ),
        ("empty client id", lambda s: beat(s, "G", ""), grpc.StatusCode.INVALID_ARGUMENT),
        (
            "illegal tag expression",
            lambda s: beat(s, "G", "a", ("T", "a||\x01")),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "lock of a queue the topic lacks",
            lambda s: s.LockQueues(
                c.LockQueuesRequest(client_id="a", group="G", queues=_refs(0, 9))
            ),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            "negative offset",
            lambda s: s.CommitOffsets(
                c.CommitOffsetsRequest(
                    group="G", offsets=[c.QueueOffset(topic="T", queue_id=0, offset=-1)]
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "send-back of no stored message",
            lambda s: s.SendBack(c.SendBackRequest(group="G", commit_log_offset=7)),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            "send-back with a negative reconsume limit",
            lambda s: s.SendBack(
                c.SendBackRequest(group="G", commit_log_offset=0, max_reconsume_times=-1)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
)
def test_bad_requests_get_a_precise_code_and_change_nothing(b, name, call, code):
    s = consumer(b.address)
    before = s.GetMembers(c.GetMembersRequest(group="G"), timeout=5)
    assert code_of(lambda: call(s)) == code, name
    after = s.GetMembers(c.GetMembersRequest(group="G"), timeout=5)
    assert [m.client_id for m in after.members] == [m.client_id for m in before.members]
    probe = s.LockQueues(c.LockQueuesRequest(client_id="probe", group="G", queues=_refs(0)))
    assert _locked(probe) == [0]  # the refused lock request took nothing
    s.UnlockQueues(c.UnlockQueuesRequest(client_id="probe", group="G", queues=_refs(0)))


def test_a_member_subscribing_a_topic_this_group_does_not_hold_still_joins(b):
    # A consumer of two topics on different broker groups beats both groups with both
    # subscriptions; the group lacking one topic takes the member all the same.
    b.create_group("TwoTopics")
    s = consumer(b.address)
    beat(s, "TwoTopics", "a", ("T", "*"), ("held-by-another-group", "*"))
    members = s.GetMembers(c.GetMembersRequest(group="TwoTopics"), timeout=5).members
    assert [m.client_id for m in members] == ["a"]


def test_the_stream_ends_cleanly_when_the_broker_stops(tmp_path: Path):
    process = BrokerProcess(tmp_path).start()
    process.create_group("G")
    process.create_topic("T")
    s = consumer(process.address)
    beat(s, "G", "a")
    watch = Watch(s, "G", "a")
    watch.wait_for(["a"], 5)
    started = time.monotonic()
    assert process.stop() == 0
    # The broker ends the stream itself: it does not wait out its shutdown grace (2 s).
    assert time.monotonic() - started < 2
