"""Where the SDK sends a message and which replica it calls: pure decisions.

A keyed message of a compact topic goes to its key's queue, over every writable queue of
the route, and the broker picks the same queue for a client that names none; a message
group keeps its queue; anything else takes turns. A call goes to the replica that served
last and moves on past one that could not."""

from __future__ import annotations

import zlib

import grpc.aio
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.client import wire
from capstan.client.message import Message, MessageType
from capstan.client.producer.queue_selectors import DefaultSelector, routed_by_key
from capstan.client.replica_choice import ReplicaChoice
from capstan.client.route import RouteQueue
from capstan.common.key_routing import (
    BY_KEYS,
    KEY_ROUTING_METADATA,
    queue_index,
    routes_by_key,
    routing_key,
)


def route(by_key: bool, groups: tuple[str, ...] = ("a", "b"), queues: int = 4) -> list[RouteQueue]:
    return [
        RouteQueue(
            "T",
            group,
            qid,
            (f"{group}-1:1", f"{group}-2:1", f"{group}-3:1"),
            True,
            True,
            frozenset({MessageType.NORMAL}),
            by_key=by_key,
        )
        for group in groups
        for qid in range(queues)
    ]


def test_a_keyed_message_of_a_compact_topic_always_takes_its_keys_queue():
    queues = route(by_key=True)
    selector = DefaultSelector()
    for keys in (["user-1"], ["user-2"], ["order-9", "region-eu"]):
        m = Message("T", b"v", keys=keys)
        picked = {selector.select(queues, m) for _ in range(20)}
        expected = queues[zlib.crc32(" ".join(keys).encode()) % len(queues)]
        assert picked == {expected}
    # Many keys spread over every queue of both groups.
    spread = {selector.select(queues, Message("T", b"v", keys=[f"k{i}"])) for i in range(400)}
    assert spread == set(queues)


def test_the_key_is_the_keys_as_the_broker_stores_them():
    assert routing_key(["a", "b"]) == "a b"  # the KEYS property a compaction groups by
    assert queue_index("a b", 8) == zlib.crc32(b"a b") % 8


def test_keys_do_not_steer_a_topic_that_is_not_compact_and_a_group_wins_over_keys():
    plain = route(by_key=False)
    selector = DefaultSelector()
    keyed = Message("T", b"v", keys=["same"])
    assert not routed_by_key(plain, keyed)
    assert len({selector.select(plain, keyed) for _ in range(8)}) == 8  # round robin
    grouped = Message("T", b"v", keys=["k"], message_group="g")
    compact = route(by_key=True)
    assert not routed_by_key(compact, grouped)
    assert selector.select(compact, grouped) == compact[zlib.crc32(b"g") % len(compact)]


def test_a_route_says_it_routes_by_key_in_a_trailer():
    assert routes_by_key([(KEY_ROUTING_METADATA, BY_KEYS)])
    assert routes_by_key(grpc.aio.Metadata((KEY_ROUTING_METADATA, BY_KEYS)))
    assert not routes_by_key([("x-capstan-queue-ids", "1")])
    assert not routes_by_key(None)


def test_a_route_names_every_replica_of_a_group():
    endpoints = pb.Endpoints(
        scheme=pb.IPv4,
        addresses=[pb.Address(host="127.0.0.1", port=1), pb.Address(host="::1", port=2)],
    )
    assert wire.addresses(endpoints) == ("127.0.0.1:1", "[::1]:2")


def test_calls_stay_on_the_replica_that_served_and_move_past_one_that_could_not():
    queues = route(by_key=False)
    a0, a1, b0 = queues[0], queues[1], queues[4]
    choice = ReplicaChoice()
    assert choice.address(a0) == "a-1:1"
    choice.failed(a0, "a-1:1")
    assert choice.address(a1) == "a-2:1"  # the whole group moves on, not one queue
    assert choice.address(b0) == "b-1:1"  # other groups stay
    choice.failed(a0, "a-1:1")  # a late report of the same failure changes nothing
    assert choice.address(a0) == "a-2:1"
    choice.failed(a0, "a-2:1")
    choice.failed(a0, "a-3:1")
    assert choice.address(a0) == "a-1:1"  # round the group again
    # A replica the route no longer names is not called.
    moved = RouteQueue("T", "a", 0, ("a-9:1",), True, True, frozenset())
    choice.failed(a0, "a-1:1")
    assert choice.address(moved) == "a-9:1"
