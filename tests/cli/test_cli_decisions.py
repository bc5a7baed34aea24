"""The CLI's pure decisions: which queue a message goes to, how a route reads, what an
address's first bytes say it is, which addresses it accepts, and which command lines are
children of `capstan up`."""

from __future__ import annotations

import zlib

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.commands.local_preflight import child_config
from capstan.commands.output import CommandError
from capstan.commands.probe import Transport, classify, describe
from capstan.commands.reach import split_address
from capstan.commands.routes import (
    BrokerRoute,
    QueueRoute,
    parse_route,
    pick_queue,
    readable_brokers,
    writable_queues,
)
from capstan.common.grpc_services import BROKER_SERVICES, CONTROLLER_SERVICES, REFLECTION

A = BrokerRoute("broker-a", ("127.0.0.1:1", "127.0.0.1:2"))
B = BrokerRoute("broker-b", ("127.0.0.1:3",))


def queue(broker: BrokerRoute, qid: int, permission: int = pb.READ_WRITE) -> pb.MessageQueue:
    endpoints = pb.Endpoints(
        scheme=pb.IPv4,
        addresses=[
            pb.Address(host=a.rsplit(":", 1)[0], port=int(a.rsplit(":", 1)[1]))
            for a in broker.addresses
        ],
    )
    return pb.MessageQueue(
        topic=pb.Resource(name="T"),
        id=qid,
        permission=permission,
        broker=pb.Broker(name=broker.name, endpoints=endpoints),
    )


def test_a_route_reads_as_queues_of_named_groups_with_every_replica():
    route = parse_route(
        [queue(B, 0), queue(A, 1, pb.READ), queue(A, 0, pb.WRITE), queue(B, 1, pb.NONE)]
    )
    assert route == [
        QueueRoute(A, 0, readable=False, writable=True),
        QueueRoute(A, 1, readable=True, writable=False),
        QueueRoute(B, 0, readable=True, writable=True),
        QueueRoute(B, 1, readable=False, writable=False),
    ]
    assert [(q.broker.name, q.queue_id) for q in writable_queues(route)] == [
        ("broker-a", 0),
        ("broker-b", 0),
    ]
    assert readable_brokers(route) == [A, B]


def test_a_message_group_keeps_its_queue_and_others_take_turns():
    queues = writable_queues(parse_route([queue(A, i) for i in range(4)]))
    for group in ("order-1", "order-2", "x"):
        picked = {pick_queue(queues, group, turn).queue_id for turn in range(10)}
        # The broker's own choice for a group when the sender names no queue.
        assert picked == {zlib.crc32(group.encode()) % 4}
    assert [pick_queue(queues, "", turn).queue_id for turn in range(6)] == [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize(
    ("first", "transport", "detail"),
    [
        (b"HTTP/1.0 404 Not Found\r\nServer: BaseHTTP", Transport.HTTP1, "HTTP/1.0"),
        (b"HTTP/1.1 200 OK\r\n", Transport.HTTP1, "HTTP/1.1"),
        (b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04", Transport.GRPC, ""),
        (b"\x15\x03\x01\x00\x02\x02\x46", Transport.TLS, ""),
        (b"", Transport.OTHER, "it closed the connection without a word"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", Transport.OTHER, "it answered b'SSH-2.0-OpenSSH_'"),
    ],
)
def test_the_first_bytes_tell_what_answers(first, transport, detail):
    probe = classify(first)
    assert (probe.transport, probe.detail) == (transport, detail)


def test_servers_are_told_apart_by_the_services_they_list():
    assert describe([*CONTROLLER_SERVICES, REFLECTION]) == "a Capstan controller"
    assert describe([*BROKER_SERVICES, REFLECTION]) == "a Capstan broker"
    assert describe(["acme.Orders", REFLECTION, "grpc.health.v1.Health"]) == (
        "a gRPC server serving acme.Orders"
    )


@pytest.mark.parametrize(
    ("server", "expected"),
    [("127.0.0.1:9876", ("127.0.0.1", 9876)), ("[::1]:81", ("::1", 81)), ("h.x:1", ("h.x", 1))],
)
def test_addresses_are_host_and_port(server, expected):
    assert split_address(server) == expected


@pytest.mark.parametrize("server", ["localhost", ":9876", "h:", "h:x", "h:0", "h:70000"])
def test_other_addresses_are_refused(server):
    with pytest.raises(CommandError, match="expected HOST:PORT"):
        split_address(server)


PY = "/x/.venv/bin/python"


@pytest.mark.parametrize(
    ("argv", "config"),
    [
        ([PY, "-m", "capstan.cli", "broker", "--config", "d/b-1.yaml", ""], "d/b-1.yaml"),
        ([PY, "-m", "capstan.cli", "controller", "--config", "/d/c.yaml"], "/d/c.yaml"),
        ([PY, "-m", "capstan.cli", "up", "--config", "/d/broker.yaml"], None),
        ([PY, "-m", "capstan.cli", "broker", "--set", "grpc_port=1"], None),
        ([PY, "-m", "capstan.cli", "broker", "--config"], None),
        ([PY, "-c", "capstan.cli", "broker", "--config", "/d/b.yaml"], None),
        ([""], None),
        ([], None),
    ],
)  # fmt: skip
def test_a_child_of_capstan_up_is_known_by_its_command_line(argv, config):
    assert child_config(argv) == config
