"""What routes name for a broker group: its replicas, or the one endpoint it was given."""

from __future__ import annotations

from pathlib import Path

import yaml
from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.edge.v2.route import group_endpoints
from tests.broker.broker_process import BrokerProcess
from tests.broker.test_official_client import produce, receive_all
from tests.broker.v2_requests import METADATA, stub


def test_replicas_known_by_address_are_all_named_and_by_host_name_only_the_first() -> None:
    by_ip = group_endpoints(["10.0.0.1:8081", "10.0.0.2:8081"])
    assert by_ip.scheme == pb.IPv4
    assert [(a.host, a.port) for a in by_ip.addresses] == [("10.0.0.1", 8081), ("10.0.0.2", 8081)]

    by_name = group_endpoints(["orders-0.orders-hl:8081", "orders-1.orders-hl:8081"])
    assert by_name.scheme == pb.DOMAIN_NAME
    assert [(a.host, a.port) for a in by_name.addresses] == [("orders-0.orders-hl", 8081)]


def _named(reply: svc.QueryRouteResponse) -> set[tuple[int, str, int]]:
    return {
        (q.broker.endpoints.scheme, a.host, a.port)
        for q in reply.message_queues
        for a in q.broker.endpoints.addresses
    }


def test_a_broker_given_a_route_endpoint_routes_clients_there_unless_they_came_another_way(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path)
    settings = yaml.safe_load(broker.config.read_text())
    settings["route_endpoint"] = f"localhost:{broker.port}"
    broker.config.write_text(yaml.safe_dump(settings))
    broker.start()
    try:
        broker.create_topic("Orders")
        broker.create_group("G")
        reply = stub(broker.address).QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name="Orders")), metadata=METADATA, timeout=10
        )
        assert _named(reply) == {(pb.DOMAIN_NAME, "localhost", broker.port)}

        # A client that says how it came (a NodePort, a port-forward) is sent back that way.
        came_by = pb.Endpoints(
            scheme=pb.IPv4, addresses=[pb.Address(host="198.19.0.1", port=30881)]
        )
        reply = stub(broker.address).QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name="Orders"), endpoints=came_by),
            metadata=METADATA,
            timeout=10,
        )
        assert _named(reply) == {(pb.IPv4, "198.19.0.1", 30881)}

        # The official client follows the route to the name and gets through.
        ids = produce(broker, "Orders", [b"one", b"two"])
        consumer = SimpleConsumer(
            ClientConfiguration(broker.address, Credentials(), request_timeout=5),
            "G",
            {"Orders": FilterExpression("*")},
            await_duration=3,
        )
        consumer.startup()
        try:
            assert sorted(m.message_id for m in receive_all(consumer, 2)) == sorted(ids)
        finally:
            consumer.shutdown()
    finally:
        broker.stop()
