"""Static topics made through the controller: one call decides the mapping, records it and
hands it to every group of the topic, whose replicas keep it; bad requests are refused
before anything is recorded."""

from __future__ import annotations

import bisect
import os
import signal
import threading
import time
import zlib
from collections.abc import Iterator

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.edge.v2.send import MOVE_HOLD_S
from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.settings import ConsumeFromWhere, ConsumerOptions, ConsumeStatus
from capstan.client.consumer.simple_consumer import SimpleConsumer as SdkSimpleConsumer
from capstan.client.queue_mapping_wire import mapping_from_wire, mapping_to_wire
from capstan.common.queue_mapping import new_mapping, remap
from capstan.v1 import admin_pb2 as pb
from capstan.v1 import consumer_pb2 as v1_consumer
from capstan.v1 import consumer_pb2_grpc as v1_consumer_grpc
from capstan.v1 import controller_pb2 as cpb
from capstan.v1 import pull_pb2 as v1_pull
from capstan.v1 import pull_pb2_grpc as v1_pull_grpc
from capstan.v1 import replication_pb2 as rpb
from capstan.v1 import replication_pb2_grpc as rpb_grpc
from capstan.v1.handed_message_pb2 import HandedMessage
from tests.broker.test_official_client import message
from tests.broker.test_pull_api import pull
from tests.broker.test_pull_api import queue as pull_queue
from tests.broker.v2_requests import (
    METADATA,
    ack,
    change_invisible,
    receive,
    send,
    send_to_queue,
    v2_message,
)
from tests.broker.v2_requests import stub as v2_stub
from tests.controller.test_admin_front import (
    TwoGroups,
    describe_on,
    read_back,
    receive_and_ack,
    refusal,
    start_two_groups,
    topic,
)
from tests.waiting import wait_until

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoGroups]:
    c = start_two_groups(tmp_path_factory.mktemp("static"), {"group-a": 2, "group-b": 1})
    try:
        yield c
    finally:
        c.stop()


def static(name: str, queues: int = 4, groups: tuple[str, ...] = ()) -> pb.StaticTopicRequest:
    return pb.StaticTopicRequest(topic=topic(name, queues), groups=groups)


def held_by(broker, name: str) -> pb.QueueMappingReply:  # type: ignore[no-untyped-def]
    return broker.admin(here=True).GetQueueMapping(pb.QueueMappingRequest(topic=name), timeout=5)


def _holds(broker, name: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether `broker` holds the mapping; False once it answers NOT_FOUND."""
    try:
        held_by(broker, name)
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
            return False
        raise
    return True


def test_a_static_topic_is_decided_once_and_held_by_every_replica_of_its_groups(cluster):
    admin = cluster.admin()
    made = admin.CreateStaticTopic(static("Ledger"), timeout=15)
    expected = new_mapping("Ledger", 4, ["group-a", "group-b"])
    assert mapping_from_wire(made.mapping) == expected
    assert sorted(made.topic.brokers) == ["group-a", "group-b"]
    for group, brokers in cluster.groups.items():
        for broker in brokers:  # group-a's slave too: answered once it held the copy
            reply = held_by(broker, "Ledger")
            assert mapping_from_wire(reply.mapping) == expected, (group, broker.address)
            assert reply.topic.topic.write_queue_nums == 4
    kept = admin.GetQueueMapping(pb.QueueMappingRequest(topic="Ledger"), timeout=5)
    assert mapping_from_wire(kept.mapping) == expected
    # Repeating the call hands the same mapping on again; another one is refused.
    again = admin.CreateStaticTopic(static("Ledger"), timeout=15)
    assert mapping_from_wire(again.mapping) == expected
    other = refusal(lambda: admin.CreateStaticTopic(static("Ledger", 8), timeout=15))
    assert other.code() is Code.ALREADY_EXISTS
    assert "static topic 'Ledger' exists (epoch 1, groups group-a, group-b)" in other.details()


def test_a_static_topic_on_named_groups_only_reaches_those(cluster):
    admin = cluster.admin()
    made = admin.CreateStaticTopic(static("OnB", 3, ("group-b",)), timeout=15)
    assert mapping_from_wire(made.mapping).groups() == ["group-b"]
    assert mapping_from_wire(held_by(cluster.master("group-b"), "OnB").mapping).total_queues == 3
    missing = refusal(lambda: held_by(cluster.master("group-a"), "OnB"))
    assert missing.code() is Code.NOT_FOUND
    assert "no static topic 'OnB' on group 'group-a'" in missing.details()


def test_a_static_topics_settings_change_on_its_groups_but_never_its_queue_count(cluster):
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Tuned", 3, ("group-b",)), timeout=15)
    settings = pb.Topic(name="Tuned", perm=4, attributes={"retention.hours": "12"})
    updated = admin.UpdateTopic(settings, timeout=15).topic.topic
    assert (updated.perm, dict(updated.attributes)) == (4, {"retention.hours": "12"})
    on_b = describe_on(cluster.master("group-b"), "Tuned").topic
    assert (on_b.perm, on_b.write_queue_nums, on_b.read_queue_nums) == (4, 3, 3)
    assert refusal(lambda: describe_on(cluster.master("group-a"), "Tuned")).code() is (
        Code.NOT_FOUND
    )
    for queues in (
        pb.Topic(name="Tuned", write_queue_nums=6),
        pb.Topic(name="Tuned", read_queue_nums=2),
    ):
        resized = refusal(lambda q=queues: admin.UpdateTopic(q, timeout=15))
        assert resized.code() is Code.FAILED_PRECONDITION, resized.details()
        assert (
            "static topic 'Tuned' has 3 logic queues; its queue count cannot change"
            in resized.details()
        )
    assert describe_on(cluster.master("group-b"), "Tuned").topic.write_queue_nums == 3


def test_bad_requests_are_refused_naming_the_problem_and_nothing_is_recorded(cluster):
    admin = cluster.admin()
    unknown = refusal(lambda: admin.CreateStaticTopic(static("X", 2, ("group-z",)), timeout=10))
    assert unknown.code() is Code.NOT_FOUND
    assert "broker group 'group-z' is not registered with this controller" in unknown.details()
    none = refusal(lambda: admin.CreateStaticTopic(static("X", 0), timeout=10))
    assert none.code() is Code.INVALID_ARGUMENT and "1..1024 logic queues" in none.details()
    admin.CreateTopic(topic("Plain"), timeout=10)
    plain = refusal(lambda: admin.CreateStaticTopic(static("Plain"), timeout=10))
    assert plain.code() is Code.FAILED_PRECONDITION
    assert "exists as a normal topic on group-a, group-b" in plain.details()
    bad_name = refusal(lambda: admin.CreateStaticTopic(static("no spaces"), timeout=10))
    assert bad_name.code() is Code.INVALID_ARGUMENT and "may contain only" in bad_name.details()
    for name in ("X", "Plain", "no spaces"):
        gone = refusal(
            lambda n=name: admin.GetQueueMapping(pb.QueueMappingRequest(topic=n), timeout=5)
        )
        assert gone.code() is Code.NOT_FOUND


def fifo_group_led_by(mapping, group: str) -> str:  # type: ignore[no-untyped-def]
    """A message group whose logic queue (CRC32 over every logic queue) `group` leads."""
    led = set(mapping.led_by(group))
    return next(
        name
        for name in (f"orders-{n}" for n in range(1000))
        if zlib.crc32(name.encode()) % mapping.total_queues in led
    )


def test_routes_name_each_logic_queue_at_its_leader_and_sends_stay_on_led_queues(cluster):
    admin = cluster.admin()
    mixed = pb.Topic(name="Routed", type=pb.MIXED, write_queue_nums=4)
    made = mapping_from_wire(
        admin.CreateStaticTopic(pb.StaticTopicRequest(topic=mixed), timeout=15).mapping
    )
    routes = v2_stub(cluster.controller.address).QueryRoute(
        svc.QueryRouteRequest(topic=v2.Resource(name="Routed")), timeout=10
    )
    assert sorted((q.id, q.broker.name, q.permission) for q in routes.message_queues) == [
        (0, "group-a", v2.READ_WRITE),
        (1, "group-b", v2.READ_WRITE),
        (2, "group-a", v2.READ_WRITE),
        (3, "group-b", v2.READ_WRITE),
    ]
    a = v2_stub(cluster.master("group-a").address)
    stored = set()
    for n in range(8):  # sends that name no queue go round the queues this group leads
        reply, trailers = send_to_queue(a, None, v2_message("Routed", f"m{n}".encode()))
        assert reply.status.code == v2.OK, reply.status
        stored.add(int(trailers["x-capstan-queue-ids"]))
    assert stored == {0, 2}
    # A message group always goes to its logic queue: here when this group leads it ...
    mine = fifo_group_led_by(made, "group-a")
    reply = send(a, v2_message("Routed", b"g", message_group=mine, message_type=v2.FIFO))
    assert reply.status.code == v2.OK, reply.status
    # ... and passed on to the group that leads it when another one does.
    b = cluster.master("group-b")
    before = b.queue_ends("Routed", here=True)
    theirs = fifo_group_led_by(made, "group-b")
    passed, trailers = send_to_queue(
        a, None, v2_message("Routed", b"g", message_group=theirs, message_type=v2.FIFO)
    )
    assert passed.status.code == v2.OK, passed.status
    queue = zlib.crc32(theirs.encode()) % 4
    assert trailers["x-capstan-queue-ids"] == str(queue)
    after = b.queue_ends("Routed", here=True)
    assert after[queue] == before[queue] + 1  # stored on group-b, in its logic queue
    named, _ = send_to_queue(a, "1", v2_message("Routed"))
    assert named.status.code == v2.OK and b.queue_ends("Routed", here=True)[1] == after[1] + 1
    # A transactional message is never passed on: its producer ends it where it sent it.
    txn, _ = send_to_queue(a, "1", v2_message("Routed", message_type=v2.TRANSACTION))
    assert txn.status.code == v2.FORBIDDEN
    assert "takes its writes on group 'group-b': send it there" in txn.status.message
    # A request whose messages belong to queues of both groups is refused whole.
    both = send(
        a,
        v2_message("Routed", b"x", message_group=mine, message_type=v2.FIFO),
        v2_message("Routed", b"y", message_group=theirs, message_type=v2.FIFO),
    )
    assert both.status.code == v2.BAD_REQUEST
    assert "that different groups lead (group-b and maybe this one)" in both.status.message
    missing, _ = send_to_queue(a, "7", v2_message("Routed"))
    assert missing.status.code == v2.BAD_REQUEST
    assert "static topic 'Routed' has no logic queue 7 (0..3)" in missing.status.message


def test_after_a_move_logic_offsets_continue_on_the_new_group_and_old_ones_are_read_there(
    cluster,
):
    admin = cluster.admin()
    topic_wire = topic("Moved", 2)
    first = mapping_from_wire(
        admin.CreateStaticTopic(
            pb.StaticTopicRequest(topic=topic_wire, groups=["group-b"]), timeout=15
        ).mapping
    )
    b, a = cluster.master("group-b"), cluster.master("group-a")
    for n in range(5):
        reply, _ = send_to_queue(v2_stub(b.address), "1", v2_message("Moved", f"old{n}".encode()))
        assert reply.status.code == v2.OK and reply.entries[0].offset == n
    # Queue 1 moves to group-a at its end (the controller's remap: each group is handed it).
    moved = remap(first, 1, "group-a", old_end=5, new_start=0)
    given = pb.SetQueueMappingRequest(topic=topic_wire, mapping=mapping_to_wire(moved))
    for broker in (b, a):
        held = broker.admin().SetQueueMapping(given, timeout=10)
        assert mapping_from_wire(held.mapping) == moved
    # A late hand-on of the older mapping changes neither it nor the settings held.
    read_only = pb.Topic(name="Moved", type=pb.NORMAL, perm=4, write_queue_nums=2)
    stale = pb.SetQueueMappingRequest(topic=read_only, mapping=mapping_to_wire(first))
    assert mapping_from_wire(a.admin().SetQueueMapping(stale, timeout=10).mapping) == moved
    assert describe_on(a, "Moved").topic.perm == 6
    # A send for queue 1 to group-b is passed on to group-a, which leads it now.
    passed, _ = send_to_queue(v2_stub(b.address), "1", v2_message("Moved", b"new0"))
    assert passed.status.code == v2.OK and passed.entries[0].offset == 5
    offsets = []
    for n in range(1, 3):
        reply, _ = send_to_queue(v2_stub(a.address), "1", v2_message("Moved", f"new{n}".encode()))
        assert reply.status.code == v2.OK, reply.status
        offsets.append(reply.entries[0].offset)
    assert offsets == [6, 7]  # the logic offsets go on where group-b's item ended
    admin.CreateGroup(pb.Group(name="MovedReaders"), timeout=10)
    # group-a, leading queue 1, hands out group-b's older item first, then its own.
    got: list[tuple[int, int, bytes]] = []
    for _ in range(20):
        _, messages = receive(v2_stub(a.address), "MovedReaders", "Moved", wait_ms=300)
        got += [
            (m.system_properties.queue_id, m.system_properties.queue_offset, m.body)
            for m in messages
        ]
        if len(got) >= 8:
            break
    assert sorted(got[:5]) == [(1, n, f"old{n}".encode()) for n in range(5)]
    assert sorted(got[5:]) == [(1, 5, b"new0"), (1, 6, b"new1"), (1, 7, b"new2")]
    routes = v2_stub(cluster.controller.address).QueryRoute(
        svc.QueryRouteRequest(topic=v2.Resource(name="Moved")), timeout=10
    )
    # Each logic queue is named once, on the group that leads it and serves all its reads.
    assert sorted((q.id, q.broker.name, q.permission) for q in routes.message_queues) == [
        (0, "group-b", v2.READ_WRITE),
        (1, "group-a", v2.READ_WRITE),
    ]


def test_the_leading_group_hands_out_older_items_and_passes_on_what_is_done_with_them(cluster):
    """A logic queue moved with messages unconsumed on its old group: receives at the
    leading group alone (through its slave too) get them, and their acks and changed
    invisible times there reach the old group, which then hands out nothing again."""
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Elder", 2, ("group-b",)), timeout=15)
    b = cluster.master("group-b")
    for n in range(5):
        reply, _ = send_to_queue(v2_stub(b.address), "1", v2_message("Elder", f"old{n}".encode()))
        assert reply.status.code == v2.OK
    admin.RemapStaticQueue(pb.RemapRequest(topic="Elder", queue_id=1, group="group-a"), timeout=15)
    a = cluster.master("group-a")
    a_slave = next(r for r in cluster.groups["group-a"] if r is not a)
    for n in range(3):
        reply, _ = send_to_queue(v2_stub(a.address), "1", v2_message("Elder", f"new{n}".encode()))
        assert reply.status.code == v2.OK
    admin.CreateGroup(pb.Group(name="ElderReaders"), timeout=10)
    handles: dict[bytes, str] = {}
    for address in (a_slave.address, a.address) * 5:
        _, messages = receive(v2_stub(address), "ElderReaders", "Elder", invisible_ms=20_000)
        for m in messages:
            assert m.body not in handles, f"{m.body!r} handed out twice"
            handles[m.body] = m.system_properties.receipt_handle
            assert m.system_properties.queue_offset == int(m.body[3:]) + (
                5 if m.body.startswith(b"new") else 0
            )  # logic offsets, the old item's first
        if len(handles) == 8:
            break
    assert sorted(handles) == sorted(
        [f"old{n}".encode() for n in range(5)] + [f"new{n}".encode() for n in range(3)]
    )
    # Hold one old message longer: the new handle is the leader's too, the old one stale.
    changed = change_invisible(
        v2_stub(a_slave.address), "ElderReaders", "Elder", handles[b"old0"], 30_000
    )
    assert changed.status.code == v2.OK, changed.status
    stale = ack(v2_stub(a.address), "ElderReaders", "Elder", handles[b"old0"])
    assert stale.status.code == v2.INVALID_RECEIPT_HANDLE, stale.status
    handles[b"old0"] = changed.receipt_handle
    for body, handle in sorted(handles.items()):
        answer = ack(v2_stub(a.address), "ElderReaders", "Elder", handle)
        assert answer.status.code == v2.OK, (body, answer.status)
    for forged_handle in ("o1~group-b~c2.1.0.1.00", "o1~nowhere~c2.1.0.1.00"):
        forged = ack(v2_stub(a.address), "ElderReaders", "Elder", forged_handle)
        assert forged.status.code == v2.INVALID_RECEIPT_HANDLE, forged.status
    # Acknowledged on the group that holds them: nothing comes back, at either group.
    for address in (a.address, b.address):
        _, again = receive(v2_stub(address), "ElderReaders", "Elder", wait_ms=300)
        assert again == [], [m.body for m in again]


def test_deleting_a_static_topic_removes_it_and_its_mapping_from_its_groups(cluster):
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Brief", 2, ("group-a",)), timeout=15)
    assert admin.DeleteTopic(pb.TopicRequest(name="Brief"), timeout=10).deleted
    # The answer waited for the in-sync slaves; one a loaded machine let fall out of the
    # SyncStateSet meanwhile catches up on its own.
    for broker in cluster.groups["group-a"]:
        wait_until(lambda b=broker: not _holds(b, "Brief"), 10, f"{broker.address} to drop it")
    gone = refusal(lambda: admin.GetQueueMapping(pb.QueueMappingRequest(topic="Brief"), timeout=5))
    assert gone.code() is Code.NOT_FOUND
    # The name is free again, for a static topic or a normal one.
    admin.CreateStaticTopic(static("Brief", 3, ("group-b",)), timeout=15)
    assert mapping_from_wire(held_by(cluster.master("group-b"), "Brief").mapping).total_queues == 3


def test_a_remap_moves_a_queues_writes_and_its_logic_offsets_go_on(cluster):
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Shifting", 2, ("group-a",)), timeout=15)
    a, b = cluster.master("group-a"), cluster.master("group-b")
    for n in range(4):
        reply, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Shifting", f"a{n}".encode()))
        assert reply.entries[0].offset == n
    request = pb.RemapRequest(topic="Shifting", queue_id=0, group="group-b")
    moved = mapping_from_wire(admin.RemapStaticQueue(request, timeout=15).mapping)
    old, new = moved.items(0)
    assert (old.group, old.end_offset, old.logic_end) == ("group-a", 4, 4)
    assert (new.group, new.logic_offset, new.start_offset, new.is_open) == ("group-b", 4, 0, True)
    assert moved.epoch == 3  # sealed, then opened on group-b: two recorded steps
    kept = admin.GetQueueMapping(pb.QueueMappingRequest(topic="Shifting"), timeout=5)
    assert mapping_from_wire(kept.mapping) == moved
    for broker in (*cluster.groups["group-a"], b):
        assert mapping_from_wire(held_by(broker, "Shifting").mapping) == moved
    for n in range(2):  # to group-a, passed on to group-b: the offsets go on there
        reply, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Shifting", b"b"))
        assert reply.status.code == v2.OK and reply.entries[0].offset == 4 + n
    assert b.queue_ends("Shifting", here=True)[0] == 6  # the logic end: 4..5 are group-b's
    routes = v2_stub(cluster.controller.address).QueryRoute(
        svc.QueryRouteRequest(topic=v2.Resource(name="Shifting")), timeout=10
    )
    assert sorted((q.id, q.broker.name, q.permission) for q in routes.message_queues) == [
        (0, "group-b", v2.READ_WRITE),
        (1, "group-a", v2.READ_WRITE),
    ]
    # Asked again, nothing moves; then back to group-a, where its offsets go on again.
    assert mapping_from_wire(admin.RemapStaticQueue(request, timeout=15).mapping) == moved
    back = pb.RemapRequest(topic="Shifting", queue_id=0, group="group-a")
    returned = mapping_from_wire(admin.RemapStaticQueue(back, timeout=15).mapping)
    assert [(i.group, i.logic_offset, i.start_offset) for i in returned.items(0)] == [
        ("group-a", 0, 0),
        ("group-b", 4, 0),
        ("group-a", 6, 4),
    ]
    reply, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Shifting", b"again"))
    assert reply.status.code == v2.OK and reply.entries[0].offset == 6


def test_a_remap_that_cannot_be_made_is_refused_naming_why(cluster):
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Stuck", 2, ("group-a",)), timeout=15)

    def remap_call(topic_name: str, queue: int, group: str) -> grpc.RpcError:
        request = pb.RemapRequest(topic=topic_name, queue_id=queue, group=group)
        return refusal(lambda: admin.RemapStaticQueue(request, timeout=10))

    nine = remap_call("Stuck", 9, "group-b")
    assert nine.code() is Code.INVALID_ARGUMENT
    assert "static topic 'Stuck' has no logic queue 9 (0..1)" in nine.details()
    nobody = remap_call("Stuck", 0, "group-z")
    assert nobody.code() is Code.NOT_FOUND and "'group-z' is not registered" in nobody.details()
    assert remap_call("Nope", 0, "group-b").code() is Code.NOT_FOUND
    cluster.master("group-b").admin().CreateTopic(topic("Stuck"), timeout=10)  # a normal one
    taken = remap_call("Stuck", 0, "group-b")
    assert taken.code() is Code.FAILED_PRECONDITION
    assert "exists as a normal topic on group-b" in taken.details()
    # Nothing was recorded: the queue still takes writes where it did.
    kept = admin.GetQueueMapping(pb.QueueMappingRequest(topic="Stuck"), timeout=5)
    assert mapping_from_wire(kept.mapping).epoch == 1


def test_a_move_stopped_between_its_steps_is_finished_by_the_controller(cluster):
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Resumed", 2), timeout=15)  # queue 0 on a, 1 on b
    a, b = cluster.master("group-a"), cluster.master("group-b")
    for n in range(3):
        reply, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Resumed", b"a"))
        assert reply.entries[0].offset == n
    request = pb.RemapRequest(topic="Resumed", queue_id=0, group="group-b")
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGSTOP)  # the new group stops answering mid-move
    try:
        failed = refusal(lambda: admin.RemapStaticQueue(request, timeout=5))
        assert failed.code() in (Code.DEADLINE_EXCEEDED, Code.UNAVAILABLE), failed

        # The queue is sealed on group-a (by the remap, or by the controller's keeping if
        # a loaded machine let the caller's deadline pass first): no group takes its writes
        # while it moves. A send is held for the move to finish (2 s), then answered
        # REQUEST_TIMEOUT, which clients retry.
        def sealed_on_a() -> bool:
            return not mapping_from_wire(held_by(a, "Resumed").mapping).leader(0).takes_writes

        wait_until(sealed_on_a, 30, "group-a to hold logic queue 0 sealed")
        asked_at = time.monotonic()
        held, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Resumed"))
        waited = time.monotonic() - asked_at
        assert held.status.code == v2.REQUEST_TIMEOUT, held.status
        assert "is moving to group 'group-b'; retry shortly" in held.status.message
        assert waited >= MOVE_HOLD_S
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)

    def finished() -> bool:
        kept = admin.GetQueueMapping(pb.QueueMappingRequest(topic="Resumed"), timeout=5)
        return mapping_from_wire(kept.mapping).leader(0).takes_writes

    wait_until(finished, 30, "the controller to finish the move itself")
    wait_until(lambda: cluster.settled(), 30, "group-b back in step with the controller")
    reply, _ = send_to_queue(v2_stub(b.address), "0", v2_message("Resumed", b"b"))
    assert reply.status.code == v2.OK and reply.entries[0].offset == 3
    assert mapping_from_wire(held_by(a, "Resumed").mapping).leader(0).group == "group-b"


def test_the_official_fifo_producer_keeps_each_message_group_on_its_logic_queue(cluster):
    """Through the controller's route, whichever broker the official client picks for a
    message group: the group's messages land in its logic queue, at the group that leads
    it, before and after that queue moves; a consumer gets every one once."""
    admin = cluster.admin()
    fifo = pb.Topic(name="Ordered", type=pb.FIFO, write_queue_nums=4)
    admin.CreateStaticTopic(pb.StaticTopicRequest(topic=fifo), timeout=15)
    admin.CreateGroup(pb.Group(name="OrderedReaders"), timeout=10)
    config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=5)
    groups = [f"customer-{n}" for n in range(12)]

    def produce(round_: int) -> list[bytes]:
        producer = Producer(config, ("Ordered",))
        producer.startup()
        sent = []
        try:
            for step in range(4):
                for g in groups:
                    body = f"{g}/{round_}/{step}".encode()
                    producer.send(message("Ordered", body, message_group=g))
                    sent.append(body)
        finally:
            producer.shutdown()
        return sent

    def stored_per_logic_queue() -> list[int]:
        ends = [0, 0, 0, 0]
        for name in cluster.groups:
            described = (
                cluster.master(name)
                .admin(here=True)
                .DescribeTopic(pb.TopicRequest(name="Ordered"), timeout=5)
            )
            for q in described.topic.queues:  # logic offsets: each group's stretch
                ends[q.queue_id] += q.max_offset - q.min_offset
        return ends

    def expected(rounds: int) -> list[int]:
        counts = [0, 0, 0, 0]
        for g in groups:
            counts[zlib.crc32(g.encode()) % 4] += 4 * rounds
        return counts

    sent = produce(0)
    assert stored_per_logic_queue() == expected(1)
    request = pb.RemapRequest(topic="Ordered", queue_id=0, group="group-b")
    admin.RemapStaticQueue(request, timeout=15)
    sent += produce(1)
    assert stored_per_logic_queue() == expected(2)
    got = read_back(config, "OrderedReaders", "Ordered", len(sent), timeout_s=30)
    assert sorted(got) == sorted(sent)  # nothing lost, nothing twice


@pytest.mark.slow
def test_the_official_fifo_producer_sends_across_seals_without_a_failure(cluster):
    """A logic queue moved back and forth six times while the official FIFO producer (the
    pinned Python client, which retries an answer at once and never one of
    TOO_MANY_REQUESTS) sends its message groups: a send that meets the seal is held by the
    broker until the move is done, so none fails, and each is stored once."""
    admin = cluster.admin()
    fifo = pb.Topic(name="Sealed", type=pb.FIFO, write_queue_nums=2)
    admin.CreateStaticTopic(pb.StaticTopicRequest(topic=fifo, groups=["group-a"]), timeout=15)
    admin.CreateGroup(pb.Group(name="SealedReaders"), timeout=10)
    config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=5)
    groups = [f"customer-{n}" for n in range(8)]
    sent: list[bytes] = []
    failures: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        producer = Producer(config, ("Sealed",))
        producer.startup()
        try:
            step = 0
            while not stop.is_set():
                for g in groups:
                    body = f"{g}/{step}".encode()
                    try:
                        producer.send(message("Sealed", body, message_group=g))
                    except Exception as exc:  # noqa: BLE001 - the client's own error types
                        failures.append(repr(exc))
                        continue
                    sent.append(body)
                step += 1
        finally:
            producer.shutdown()

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    try:
        wait_until(lambda: len(sent) >= 50, 30, "sends before the moves")
        for target in ["group-b", "group-a"] * 3:
            request = pb.RemapRequest(topic="Sealed", queue_id=0, group=target)
            admin.RemapStaticQueue(request, timeout=15)
            at = len(sent)
            wait_until(lambda at=at: len(sent) >= at + 20, 30, f"sends after the move to {target}")
    finally:
        stop.set()
        sender.join(30)
    assert failures == []
    got = read_back(config, "SealedReaders", "Sealed", len(sent), timeout_s=60)
    assert sorted(got) == sorted(sent)  # nothing lost, nothing twice


@pytest.mark.slow
def test_the_official_fifo_consumer_reads_queues_moved_back_and_forth_without_a_stall(cluster):
    """Both logic queues of a FIFO static topic moved back and forth under the official
    FIFO producer and SimpleConsumer (its default 20-s long poll): routes name each queue
    on its leader only, which hands out its older items too, so no receive lands where
    there is nothing to give. Every message group comes back whole and in order, and no
    receive waits more than 2 s past the first message stored after it began. (A send held
    while its queue moves pauses the one producer thread, so a receive then waits as long
    with nothing stored: that pause is the move's, not the consumer's.)"""
    admin = cluster.admin()
    fifo = pb.Topic(name="Swayed", type=pb.FIFO, write_queue_nums=2)
    admin.CreateStaticTopic(pb.StaticTopicRequest(topic=fifo, groups=["group-a"]), timeout=15)
    admin.CreateGroup(pb.Group(name="SwayedReaders", fifo=True), timeout=10)
    config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=5)
    accounts = [f"account-{n}" for n in range(8)]
    sent: dict[str, list[bytes]] = {a: [] for a in accounts}
    got: dict[str, list[bytes]] = {a: [] for a in accounts}
    receives: list[tuple[float, float]] = []  # each receive's start and end while sends go on
    stored_at: list[float] = []  # when each send was answered, in order
    producing, consuming = threading.Event(), threading.Event()
    producing.set()
    consuming.set()

    def produce() -> None:
        producer = Producer(config, ("Swayed",))
        producer.startup()
        try:
            step = 0
            while producing.is_set():
                for account in accounts:
                    body = f"{account}/{step}".encode()
                    producer.send(message("Swayed", body, message_group=account))
                    stored_at.append(time.monotonic())
                    sent[account].append(body)
                step += 1
                time.sleep(0.02)
        finally:
            producer.shutdown()

    def consume() -> None:
        consumer = SimpleConsumer(config, "SwayedReaders", {"Swayed": FilterExpression("*")})
        consumer.startup()
        try:
            while consuming.is_set():
                began = time.monotonic()
                messages = consumer.receive(16, 15)
                if producing.is_set():
                    receives.append((began, time.monotonic()))
                for m in messages:
                    consumer.ack(m)
                    got[m.body.decode().split("/")[0]].append(m.body)
        finally:
            consumer.shutdown()

    threads = [threading.Thread(target=f, daemon=True) for f in (produce, consume)]
    for t in threads:
        t.start()
    try:
        time.sleep(2)
        for target in ["group-b", "group-a"] * 2:
            for q in (0, 1):
                request = pb.RemapRequest(topic="Swayed", queue_id=q, group=target)
                admin.RemapStaticQueue(request, timeout=15)
                time.sleep(1.0)
        producing.clear()
        threads[0].join(30)
        want = sum(len(v) for v in sent.values())
        wait_until(lambda: sum(len(v) for v in got.values()) >= want, 60, "every message back")
    finally:
        producing.clear()
        consuming.clear()
        for t in threads:
            t.join(30)
    assert got == sent, order_faults(sent, got)  # every group whole, in order, none twice
    stalls = []  # how long each receive waited with a message stored for it to give
    for began, ended in receives:
        first = bisect.bisect_left(stored_at, began)
        if first < len(stored_at) and stored_at[first] < ended:
            stalls.append(round(ended - stored_at[first], 3))
    assert stalls and max(stalls) < 2.0, sorted(stalls)[-5:]


def order_faults(sent: dict[str, list[bytes]], got: dict[str, list[bytes]]) -> list[str]:
    """Per message group that came back otherwise than sent: what differs first."""
    out = []
    for group, bodies in sent.items():
        back = got.get(group, [])
        if back == bodies:
            continue
        first = next(
            (i for i, (x, y) in enumerate(zip(bodies, back, strict=False)) if x != y), None
        )
        twice = len(back) - len(set(back))
        missing = len(set(bodies) - set(back))
        context = back[first - 2 : first + 3] if first is not None else back[len(bodies) :][:3]
        out.append(
            f"{group}: first differs at {first}, {twice} twice, {missing} missing, {context}"
        )
    return out


def test_a_fifo_group_gets_each_message_group_in_order_across_moves(cluster):
    """Both logic queues move to group-b with messages unconsumed on group-a: the official
    FIFO consumer, receiving from both groups as the route says, gets nothing of the new
    items before it acknowledged the old ones, so every message group stays in order; its
    committed offsets afterwards are logic offsets, continuous across the move, with no lag."""
    admin = cluster.admin()
    fifo = pb.Topic(name="Sequenced", type=pb.FIFO, write_queue_nums=2)
    admin.CreateStaticTopic(pb.StaticTopicRequest(topic=fifo, groups=["group-a"]), timeout=15)
    admin.CreateGroup(pb.Group(name="SequencedReaders", fifo=True), timeout=10)
    config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=5)
    accounts = [f"account-{n}" for n in range(8)]
    sent: dict[str, list[bytes]] = {a: [] for a in accounts}

    def produce(round_: int) -> None:
        producer = Producer(config, ("Sequenced",))
        producer.startup()
        try:
            for step in range(5):
                for account in accounts:
                    body = f"{account}/{round_}/{step}".encode()
                    producer.send(message("Sequenced", body, message_group=account))
                    sent[account].append(body)
        finally:
            producer.shutdown()

    produce(0)
    for q in (0, 1):
        request = pb.RemapRequest(topic="Sequenced", queue_id=q, group="group-b")
        admin.RemapStaticQueue(request, timeout=15)
    produce(1)
    consumer = SimpleConsumer(config, "SequencedReaders", {"Sequenced": FilterExpression("*")}, 2)
    consumer.startup()
    got: dict[str, list[bytes]] = {a: [] for a in accounts}
    try:
        want = sum(len(v) for v in sent.values())
        for body in receive_and_ack(consumer, want, timeout_s=60):
            got[body.decode().split("/")[0]].append(body)
    finally:
        consumer.shutdown()
    assert got == sent  # every message group whole and in order
    per_queue = [0, 0]
    for account in accounts:
        per_queue[zlib.crc32(account.encode()) % 2] += 5
    status = admin.DescribeGroup(pb.GroupRequest(name="SequencedReaders"), timeout=10)
    offsets = sorted(
        (o.queue_id, o.broker, o.committed_offset, o.max_offset, o.lag)
        for o in status.group.offsets
        if o.topic == "Sequenced"
    )
    assert offsets == [
        (0, "group-a", per_queue[0], per_queue[0], 0),
        (0, "group-b", 2 * per_queue[0], 2 * per_queue[0], 0),
        (1, "group-a", per_queue[1], per_queue[1], 0),
        (1, "group-b", 2 * per_queue[1], 2 * per_queue[1], 0),
    ]


def test_the_pull_api_and_committed_offsets_speak_logic_offsets_after_a_move(cluster):
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Pulled", 1, ("group-a",)), timeout=15)
    admin.CreateGroup(pb.Group(name="PullReaders"), timeout=10)
    a, b = cluster.master("group-a"), cluster.master("group-b")
    for n in range(3):
        reply, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Pulled", f"a{n}".encode()))
        assert reply.status.code == v2.OK
    admin.RemapStaticQueue(pb.RemapRequest(topic="Pulled", queue_id=0, group="group-b"), timeout=15)
    for n in range(2):
        reply, _ = send_to_queue(v2_stub(b.address), "0", v2_message("Pulled", f"b{n}".encode()))
        assert reply.entries[0].offset == 3 + n
    on_b = v2_stub(b.address)
    # group-b's item starts at logic offset 3: an older offset is read from there on.
    status, messages, next_offset = pull(on_b, "Pulled", 0, 0, group="PullReaders")
    assert status.code == v2.OK
    assert [(m.system_properties.queue_offset, m.body) for m in messages] == [
        (3, b"b0"),
        (4, b"b1"),
    ]
    assert next_offset == 5
    status, messages, next_offset = pull(v2_stub(a.address), "Pulled", 0, 1, group="PullReaders")
    assert [(m.system_properties.queue_offset, m.body) for m in messages] == [
        (1, b"a1"),
        (2, b"a2"),
    ]
    assert next_offset == 3
    bounds = on_b.QueryOffset(
        svc.QueryOffsetRequest(message_queue=pull_queue("Pulled", 0), query_offset_policy=v2.END),
        metadata=METADATA,
        timeout=5,
    )
    assert bounds.offset == 5
    first = on_b.QueryOffset(
        svc.QueryOffsetRequest(
            message_queue=pull_queue("Pulled", 0), query_offset_policy=v2.BEGINNING
        ),
        metadata=METADATA,
        timeout=5,
    )
    assert first.offset == 3
    update = svc.UpdateOffsetRequest(
        group=v2.Resource(name="PullReaders"), message_queue=pull_queue("Pulled", 0), offset=4
    )
    assert on_b.UpdateOffset(update, metadata=METADATA, timeout=5).status.code == v2.OK
    kept = on_b.GetOffset(
        svc.GetOffsetRequest(
            group=v2.Resource(name="PullReaders"), message_queue=pull_queue("Pulled", 0)
        ),
        metadata=METADATA,
        timeout=5,
    )
    assert kept.offset == 4
    described = admin.DescribeGroup(pb.GroupRequest(name="PullReaders"), timeout=10)
    assert [
        (o.broker, o.committed_offset, o.max_offset, o.lag)
        for o in described.group.offsets
        if o.topic == "Pulled"
    ] == [("group-b", 4, 5, 1)]


def test_the_sdks_simple_consumer_acks_at_a_group_its_refreshed_route_no_longer_names(cluster):
    """A message received from a group, whose only logic queue then moves away: the
    refreshed route names that group nowhere, and the ack still reaches it."""
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Departed", 1, ("group-b",)), timeout=15)
    admin.CreateGroup(pb.Group(name="DepartedReaders"), timeout=10)
    b = cluster.master("group-b")
    send_to_queue(v2_stub(b.address), "0", v2_message("Departed", b"before"))
    with SdkSimpleConsumer(cluster.controller.address, "DepartedReaders", "Departed") as consumer:
        (got,) = consumer.receive(1, invisible_s=30, wait_s=2)
        assert got.broker_name == "group-b"
        request = pb.RemapRequest(topic="Departed", queue_id=0, group="group-a")
        admin.RemapStaticQueue(request, timeout=15)
        consumer._routes.refresh("Departed")  # as the client's next refresh would
        assert consumer.broker_groups() == ["group-a"]
        consumer.ack(got)  # at group-b, where it was handed out
        assert consumer.receive(1, invisible_s=30, wait_s=1) == []  # not handed out again


def test_the_sdks_pulls_and_offsets_read_older_items_through_the_leading_group(cluster):
    """capstan.v1 at the leading group alone: the queue starts at its oldest item, pulls
    from there get the old group's messages then its own, an offset committed inside the
    older item is kept by its group and found again here."""
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Chained", 1, ("group-b",)), timeout=15)
    admin.CreateGroup(pb.Group(name="ChainReaders"), timeout=10)
    b = cluster.master("group-b")
    for n in range(4):
        reply, _ = send_to_queue(v2_stub(b.address), "0", v2_message("Chained", f"b{n}".encode()))
        assert reply.status.code == v2.OK
    admin.RemapStaticQueue(
        pb.RemapRequest(topic="Chained", queue_id=0, group="group-a"), timeout=15
    )
    a = cluster.master("group-a")
    a_slave = next(r for r in cluster.groups["group-a"] if r is not a)
    for n in range(2):
        reply, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Chained", f"a{n}".encode()))
        assert reply.entries[0].offset == 4 + n
    pulls = v1_pull_grpc.PullStub(grpc.insecure_channel(a_slave.address))
    consumer = v1_consumer_grpc.ConsumerStub(grpc.insecure_channel(a.address))
    bounds = consumer.GetQueueBounds(
        v1_consumer.GetQueueBoundsRequest(topic="Chained", queue_id=0), timeout=5
    )
    assert (bounds.min_offset, bounds.max_offset) == (0, 6)
    read, offset = [], 0
    for _ in range(6):
        answer = pulls.PullMessages(
            v1_pull.PullMessagesRequest(
                group="ChainReaders", topic="Chained", queue_id=0, offset=offset, max_messages=3
            ),
            timeout=10,
        )
        read += [(m.queue_offset, m.body) for m in answer.messages]
        assert answer.continues_on == ""
        offset = answer.next_begin_offset
        if len(read) == 6:
            break
    assert read == [(n, f"b{n}".encode()) for n in range(4)] + [(4, b"a0"), (5, b"a1")]
    query = v1_consumer.QueryOffsetRequest(group="ChainReaders", topic="Chained", queue_id=0)
    assert not consumer.QueryOffset(query, timeout=5).found  # committed nowhere yet
    commit = v1_consumer.CommitOffsetsRequest(
        group="ChainReaders",
        offsets=[v1_consumer.QueueOffset(topic="Chained", queue_id=0, offset=2)],
    )
    consumer.CommitOffsets(commit, timeout=10)
    on_b = v1_consumer_grpc.ConsumerStub(grpc.insecure_channel(b.address))
    kept = on_b.QueryOffset(query, timeout=5)
    assert (kept.found, kept.offset) == (True, 2)  # kept by the group of its item
    found = consumer.QueryOffset(query, timeout=5)
    assert (found.found, found.offset) == (True, 2)
    commit.offsets[0].offset = 5  # past the older item: kept here, and found here first
    consumer.CommitOffsets(commit, timeout=10)
    assert consumer.QueryOffset(query, timeout=5).offset == 5
    assert on_b.QueryOffset(query, timeout=5).offset == 2


def test_delayed_and_committed_messages_go_where_their_queue_went(cluster):
    """A transaction committed after its queue moved away lands in a queue the group still
    leads; a delayed message coming due after its group was drained of the topic is handed
    to the group that leads its queue now. Neither is stored past a closed item's end."""
    admin = cluster.admin()
    mixed = pb.Topic(name="Later", type=pb.MIXED, write_queue_nums=2)
    admin.CreateStaticTopic(pb.StaticTopicRequest(topic=mixed, groups=["group-a"]), timeout=15)
    admin.CreateGroup(pb.Group(name="LaterReaders"), timeout=10)
    a, b = cluster.master("group-a"), cluster.master("group-b")
    on_a = v2_stub(a.address)
    half, _ = send_to_queue(on_a, "0", v2_message("Later", b"txn", message_type=v2.TRANSACTION))
    assert half.status.code == v2.OK, half.status
    admin.RemapStaticQueue(pb.RemapRequest(topic="Later", queue_id=0, group="group-b"), timeout=15)
    commit = svc.EndTransactionRequest(
        topic=v2.Resource(name="Later"),
        message_id=half.entries[0].message_id,
        transaction_id=half.entries[0].transaction_id,
        resolution=v2.COMMIT,
    )
    assert on_a.EndTransaction(commit, metadata=METADATA, timeout=10).status.code == v2.OK
    wait_until(lambda: a.queue_ends("Later", here=True)[1] == 1, 10, "the commit in queue 1")
    deliver_at = int(time.time() * 1000) + 3000
    delayed = v2_message("Later", b"later", message_type=v2.DELAY, delivery_timestamp_ms=deliver_at)
    reply, _ = send_to_queue(on_a, "1", delayed)
    assert reply.status.code == v2.OK, reply.status
    admin.RemapStaticQueue(pb.RemapRequest(topic="Later", queue_id=1, group="group-b"), timeout=15)
    got: list[tuple[str, int, int, bytes]] = []
    for name, broker in (("group-a", a), ("group-b", b)):
        for _ in range(10):
            _, messages = receive(v2_stub(broker.address), "LaterReaders", "Later", wait_ms=1000)
            got += [
                (name, m.system_properties.queue_id, m.system_properties.queue_offset, m.body)
                for m in messages
            ]
            if any(g == name for g, *_ in got):
                break
    # The commit took group-a's queue 1 at logic offset 0; the delayed message went on in
    # logic queue 1 on group-b, right after it.
    assert sorted(got) == [("group-a", 1, 0, b"txn"), ("group-b", 1, 1, b"later")]
    physical = held_by(a, "Later").topic.queues
    assert [(q.queue_id, q.max_offset) for q in physical] == [(0, 0), (1, 1)]


def test_messages_handed_on_between_groups_are_checked(cluster):
    a = cluster.master("group-a").admin()
    cluster.admin().CreateStaticTopic(static("Handed", 1, ("group-a",)), timeout=15)
    host = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1]) + bytes(4)
    good = HandedMessage(topic="Handed", queue_id=0, body=b"x", born_host=host)
    reply = a.PlaceMessages(pb.PlaceMessagesRequest(messages=[good], from_group="t"), timeout=10)
    assert (list(reply.queue_ids), list(reply.queue_offsets)) == ([0], [0])
    a.CreateTopic(topic("NotStatic", 1), timeout=10)
    for bad, code, words in (
        (
            HandedMessage(topic="NotStatic", body=b"x", born_host=host),
            Code.FAILED_PRECONDITION,
            "'NotStatic' is not a static topic on group 'group-a'",
        ),
        (
            HandedMessage(topic="Handed", body=b"x", born_host=b"short"),
            Code.INVALID_ARGUMENT,
            "20-byte born_host",
        ),
        (
            HandedMessage(topic="Handed", body=b"x", born_host=host, sys_flag=4),
            Code.INVALID_ARGUMENT,
            "may not be a half message",
        ),
    ):
        refused = refusal(
            lambda m=bad: a.PlaceMessages(pb.PlaceMessagesRequest(messages=[m]), timeout=10)
        )
        assert refused.code() is code and words in refused.details(), refused.details()
    b = cluster.master("group-b").admin()
    cluster.admin().CreateStaticTopic(static("Elsewhere", 1, ("group-a",)), timeout=15)
    cluster.admin().CreateStaticTopic(static("Both", 2, ("group-a", "group-b")), timeout=15)
    # group-b leads queue 1 of Both; a message for queue 0 goes to queue 1 there.
    moved = HandedMessage(topic="Both", queue_id=0, body=b"x", born_host=host)
    reply = b.PlaceMessages(pb.PlaceMessagesRequest(messages=[moved]), timeout=10)
    assert list(reply.queue_ids) == [1]
    away = HandedMessage(topic="Elsewhere", queue_id=0, body=b"x", born_host=host)
    refused = refusal(lambda: b.PlaceMessages(pb.PlaceMessagesRequest(messages=[away]), timeout=10))
    assert refused.code() is Code.FAILED_PRECONDITION
    # An acting master's escape to group-b goes to a queue group-b leads too, whatever
    # queue it names: logic queue 1 takes it after the placed message.
    peers = rpb_grpc.ReplicaPeersStub(grpc.insecure_channel(cluster.master("group-b").address))  # type: ignore[no-untyped-call]
    escaped = HandedMessage(topic="Both", queue_id=0, body=b"y", born_host=host)
    reply = peers.Escape(rpb.EscapeRequest(from_broker="group-c", messages=[escaped]), timeout=10)
    assert reply.status == "PUT_OK", reply
    assert cluster.master("group-b").queue_ends("Both", here=True) == [0, 2]


def test_an_ordered_pull_waits_for_the_old_item_to_be_committed_on_its_group(cluster):
    """The pull API keeps FIFO order across a move too: a FIFO group (or one holding the
    queue's lock, as the SDK's orderly consumers do) pulling the new item gets nothing until
    its committed offset on the old group reaches the old item's end."""
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Pulled2", 1, ("group-a",)), timeout=15)
    admin.CreateGroup(pb.Group(name="OrderedPullers", fifo=True), timeout=10)
    admin.CreateGroup(pb.Group(name="AnyPullers"), timeout=10)
    a, b = cluster.master("group-a"), cluster.master("group-b")
    for n in range(3):
        send_to_queue(v2_stub(a.address), "0", v2_message("Pulled2", f"a{n}".encode()))
    admin.RemapStaticQueue(
        pb.RemapRequest(topic="Pulled2", queue_id=0, group="group-b"), timeout=15
    )
    send_to_queue(v2_stub(b.address), "0", v2_message("Pulled2", b"b0"))
    on_b = v2_stub(b.address)
    _, unordered, _ = pull(on_b, "Pulled2", 0, 0, group="AnyPullers")
    assert [m.body for m in unordered] == [b"b0"]  # no order promised: nothing held
    _, held, next_offset = pull(on_b, "Pulled2", 0, 0, wait_ms=300, group="OrderedPullers")
    assert held == [] and next_offset == 3
    commit = svc.UpdateOffsetRequest(
        group=v2.Resource(name="OrderedPullers"), message_queue=pull_queue("Pulled2", 0), offset=3
    )
    assert (
        v2_stub(a.address).UpdateOffset(commit, metadata=METADATA, timeout=5).status.code == v2.OK
    )

    def released() -> bool:
        _, got, _ = pull(on_b, "Pulled2", 0, 3, wait_ms=500, group="OrderedPullers")
        return [m.body for m in got] == [b"b0"]

    wait_until(released, 15, "the ordered pull released once group-a's item was committed")


def test_an_ordered_sdk_pull_held_past_an_older_item_is_answered_at_once_asking_a_commit(cluster):
    """capstan.v1 at the leading group: a FIFO group's pull reads the older item through
    it, is held where the new item starts, answered at once asking for a commit (not left
    to its long poll), and a commit there frees it."""
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Held1", 1, ("group-a",)), timeout=15)
    admin.CreateGroup(pb.Group(name="HeldReaders", fifo=True), timeout=10)
    a = cluster.master("group-a")
    for n in range(3):
        send_to_queue(v2_stub(a.address), "0", v2_message("Held1", f"a{n}".encode()))
    admin.RemapStaticQueue(pb.RemapRequest(topic="Held1", queue_id=0, group="group-b"), timeout=15)
    b = cluster.master("group-b")
    send_to_queue(v2_stub(b.address), "0", v2_message("Held1", b"b0"))
    pulls = v1_pull_grpc.PullStub(grpc.insecure_channel(b.address))

    def pull_at(offset: int) -> v1_pull.PullMessagesResponse:
        request = v1_pull.PullMessagesRequest(
            group="HeldReaders",
            topic="Held1",
            queue_id=0,
            offset=offset,
            max_messages=10,
            long_polling_ms=5000,
        )
        return pulls.PullMessages(request, timeout=10)

    older = pull_at(0)
    assert [m.body for m in older.messages] == [b"a0", b"a1", b"a2"]
    began = time.monotonic()
    held = pull_at(older.next_begin_offset)
    assert (list(held.messages), held.next_begin_offset, held.commit_wanted) == ([], 3, True)
    assert time.monotonic() - began < 1.0  # answered at once, not after its 5-s long poll
    consumer = v1_consumer_grpc.ConsumerStub(grpc.insecure_channel(b.address))
    consumer.CommitOffsets(
        v1_consumer.CommitOffsetsRequest(
            group="HeldReaders", offsets=[v1_consumer.QueueOffset(topic="Held1", offset=3)]
        ),
        timeout=10,
    )
    freed = pull_at(3)
    assert ([m.body for m in freed.messages], freed.commit_wanted) == ([b"b0"], False)


def test_the_sdks_orderly_consumer_keeps_a_moved_queue_in_order(cluster):
    """Capstan's SDK consumes in order by holding queue locks (its group is no FIFO group on
    the brokers): its pulls of the new item wait until its offset on the old group is
    committed past the old item, so the queue is consumed in order across the move."""
    admin = cluster.admin()
    admin.CreateStaticTopic(static("SdkOrdered", 1, ("group-a",)), timeout=15)
    admin.CreateGroup(pb.Group(name="SdkOrderly"), timeout=10)
    a, b = cluster.master("group-a"), cluster.master("group-b")
    for n in range(20):
        send_to_queue(v2_stub(a.address), "0", v2_message("SdkOrdered", f"a{n}".encode()))
    request = pb.RemapRequest(topic="SdkOrdered", queue_id=0, group="group-b")
    admin.RemapStaticQueue(request, timeout=15)
    for n in range(5):
        send_to_queue(v2_stub(b.address), "0", v2_message("SdkOrdered", f"b{n}".encode()))
    seen: list[str] = []
    lock = threading.Lock()

    def listener(batch, context):  # type: ignore[no-untyped-def]
        with lock:
            seen.extend(m.body.decode() for m in batch)
        time.sleep(0.1)  # the old item takes a while: time enough to reach the new one
        return ConsumeStatus.CONSUME_SUCCESS

    options = ConsumerOptions(
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET, heartbeat_interval_s=1.0
    )
    consumer = PushConsumer(
        cluster.controller.address, "SdkOrderly", listener, orderly=True, options=options
    )
    consumer.subscribe("SdkOrdered")
    with consumer:
        wait_until(lambda: len(seen) >= 25, 60, "the whole queue, from both groups")
    assert seen == [f"a{n}" for n in range(20)] + [f"b{n}" for n in range(5)]


MOVED_QUEUE_CONSUMED_WITHIN_S = 6.0
"""From a send to a logic queue just moved to another group to its consumption by an SDK
push consumer that was consuming the queue before the move. Before, the consumer pulled
the old group until its next route refresh (30 s) and then started the new group's item at
its end (its consume-from-where, the default LAST_OFFSET), never consuming what was sent
meanwhile."""


ORDERED_MOVED_QUEUE_CONSUMED_WITHIN_S = 3.0
"""The same for the SDK's orderly consumer, whose pulls of the new item wait until its
offset on the old group is committed past the old item: it commits a queue consumed to the
end of a moved item at once, not at its next persist (1.4 s; 2.6 s with the 5-s persist
before, and as long as the persist interval at worst)."""


@pytest.mark.slow
@pytest.mark.parametrize("orderly", [False, True], ids=["concurrently", "orderly"])
def test_an_sdk_consumer_follows_a_moved_queue_within_seconds_missing_nothing(cluster, orderly):
    admin = cluster.admin()
    name = "FollowsInOrder" if orderly else "Follows"
    admin.CreateStaticTopic(static(name, 1, ("group-a",)), timeout=15)
    admin.CreateGroup(pb.Group(name=f"{name}Follower"), timeout=10)
    a, b = cluster.master("group-a"), cluster.master("group-b")
    seen: dict[str, float] = {}
    lock = threading.Lock()

    def listener(batch, context):  # type: ignore[no-untyped-def]
        with lock:
            for m in batch:
                seen.setdefault(m.body.decode(), time.monotonic())
        return ConsumeStatus.CONSUME_SUCCESS

    # Offsets persisted every 30 s (not 5): the move's commit must not wait for it.
    options = ConsumerOptions(persist_offset_interval_s=30.0)  # LAST_OFFSET
    consumer = PushConsumer(
        cluster.controller.address, f"{name}Follower", listener, orderly=orderly, options=options
    )
    consumer.subscribe(name)
    with consumer:
        time.sleep(3)  # started, its route taken, its pull long-polling at group-a
        for n in range(5):
            send_to_queue(v2_stub(a.address), "0", v2_message(name, f"a{n}".encode()))
        wait_until(lambda: len(seen) >= 5, 20, "the messages sent before the move")
        request = pb.RemapRequest(topic=name, queue_id=0, group="group-b")
        admin.RemapStaticQueue(request, timeout=15)
        sent = {}
        for n in range(5):
            send_to_queue(v2_stub(b.address), "0", v2_message(name, f"b{n}".encode()))
            sent[f"b{n}"] = time.monotonic()
            time.sleep(0.5)
        wait_until(lambda: set(sent) <= set(seen), 40, "the messages sent after the move")
    waits = {body: seen[body] - at for body, at in sent.items()}
    limit = ORDERED_MOVED_QUEUE_CONSUMED_WITHIN_S if orderly else MOVED_QUEUE_CONSUMED_WITHIN_S
    assert max(waits.values()) < limit, waits
    if orderly:
        assert list(seen) == [f"a{n}" for n in range(5)] + list(sent)


def test_a_send_passed_on_follows_the_other_groups_master_when_it_changes(cluster):
    """group-b passes sends for a queue group-a leads to group-a's master, whose address it
    keeps for a couple of seconds: when group-a's master changes meanwhile, the send that
    meets the old master (a slave now, taking no writes) goes on to the new one: no client
    is told a slave took its send. (A send the new master stored while the old one was not
    yet its slave may be refused for the slave's missing acknowledgement: the switchover's
    own wait, as for a send made to the new master directly.)"""
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Follow", 2, ("group-b",)), timeout=15)
    admin.RemapStaticQueue(pb.RemapRequest(topic="Follow", queue_id=1, group="group-a"), timeout=15)
    at_b = v2_stub(cluster.master("group-b").address)
    refused: list[str] = []
    for _ in range(2):
        old = cluster.master("group-a")
        other = next(r for r in cluster.groups["group-a"] if r is not old)
        reply, _ = send_to_queue(at_b, "1", v2_message("Follow", b"before"))
        assert reply.status.code == v2.OK, reply.status  # group-b knows the old master now
        other_id = next(
            r.broker_id
            for r in cluster.controller.group("group-a").replicas
            if r.address == other.address
        )

        def switched(other_id: int = other_id, old: object = old) -> bool:
            # Refused until `other` is in the SyncStateSet of the current epoch: ask again.
            cluster.controller.stub().ElectMaster(
                cpb.ElectMasterRequest(group="group-a", preferred_broker_id=other_id), timeout=10
            )
            return cluster.master("group-a") is not old

        wait_until(switched, 30, "group-a's switchover")
        until = time.monotonic() + 3  # past the 2 s group-b keeps an address
        while time.monotonic() < until:
            reply, _ = send_to_queue(at_b, "1", v2_message("Follow", b"during"))
            if "takes no writes" in reply.status.message:
                refused.append(reply.status.message)
            time.sleep(0.05)
        wait_until(cluster.settled, 30, "group-a whole again")
    assert refused == []


def test_older_items_of_a_group_slow_to_answer_come_at_a_later_receive_not_after_their_time(
    cluster,
):
    """The group keeping a moved queue's older items stops answering (SIGSTOP) while the
    leading group asks it for them: once it answers, its messages reach the consumer at a
    later receive within seconds, each once, not after their 20-s invisible time."""
    admin = cluster.admin()
    admin.CreateStaticTopic(static("Slow", 2, ("group-b",)), timeout=15)
    b = cluster.master("group-b")
    for n in range(3):
        reply, _ = send_to_queue(v2_stub(b.address), "1", v2_message("Slow", f"old{n}".encode()))
        assert reply.status.code == v2.OK
    admin.RemapStaticQueue(pb.RemapRequest(topic="Slow", queue_id=1, group="group-a"), timeout=15)
    admin.CreateGroup(pb.Group(name="SlowReaders"), timeout=10)
    at_a = v2_stub(cluster.master("group-a").address)
    got: list[bytes] = []
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        _, messages = receive(at_a, "SlowReaders", "Slow", invisible_ms=20_000, wait_ms=1500)
        got += [m.body for m in messages]
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    answering = time.monotonic()
    while len(got) < 3 and time.monotonic() < answering + 10:
        _, messages = receive(at_a, "SlowReaders", "Slow", invisible_ms=20_000, wait_ms=500)
        got += [m.body for m in messages]
    took = time.monotonic() - answering
    assert sorted(got) == [b"old0", b"old1", b"old2"], got
    assert took < 5, f"the older items came {took:.1f} s after their group answered again"
