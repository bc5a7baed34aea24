"""A broker told to stop (SIGTERM) keeps its port open for `shutdown_delay_s` after the
signal: kube-proxy still sends new connections to a deleted pod for a moment, and a port
already closed refuses them (an official client's send then fails at once). It answers
them, health NOT_SERVING, stores what they send, and only then stops."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from tests.broker.broker_process import BrokerProcess
from tests.broker.v2_requests import send, stub, v2_message


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:  # a new connection, as kube-proxy makes
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2
        )
        return int(reply.status)


def test_new_connections_are_answered_until_the_shutdown_delay_ends(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, shutdown_delay_s=3).start()
    try:
        broker.create_topic("Orders", queues=1)
        assert broker.proc is not None
        signalled = time.monotonic()
        broker.proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        assert health(broker.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        sent = send(stub(broker.address), v2_message("Orders", b"during the delay"))
        assert sent.status.code == pb.OK, sent.status
        assert broker.proc.wait(30) == 0
        assert time.monotonic() - signalled >= 3
        assert "still taking connections" in broker.log.read_text()
    finally:
        broker.stop()


def test_without_a_delay_the_port_closes_as_the_broker_stops(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        assert broker.proc is not None
        signalled = time.monotonic()
        broker.proc.send_signal(signal.SIGTERM)
        assert broker.proc.wait(30) == 0
        assert time.monotonic() - signalled < 3
        try:
            health(broker.address)
            raise AssertionError("a stopped broker's port answered")
        except grpc.RpcError as refused:
            assert refused.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        broker.stop()
