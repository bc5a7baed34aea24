"""Failover the official client does not notice: routes name every replica of the group,
a replica that is not the master passes calls on to it, and when the master is killed -9
the client's sends succeed again within seconds, without restarting the client."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from tests.broker.replication.test_controlled_group import start_cluster, stop_cluster
from tests.broker.test_official_client import message, receive_all

FAILOVER_TARGET_S = 15.0


@pytest.mark.parametrize("access_point", ["slave", "controller"])
def test_the_official_client_sends_through_a_master_kill_and_reads_every_acked_message(
    tmp_path: Path, access_point: str
):
    cluster = start_cluster(tmp_path)
    try:
        master, slave = cluster.ready()
        # The client asks the slave (which answers routes and passes sends on) or the
        # controller (which gathers routes from the groups) for its routes.
        address = slave.address if access_point == "slave" else cluster.controller.address
        config = ClientConfiguration(address, Credentials(), request_timeout=3)
        producer = Producer(config, ("T",))
        producer.startup()
        acked: list[bytes] = []
        try:
            for i in range(20):
                body = f"before-{i}".encode()
                producer.send(message("T", body))
                acked.append(body)
            master.kill9()
            killed_at = time.monotonic()
            recovered_at = None
            failures = 0
            for i in range(400):
                body = f"after-{i}".encode()
                try:
                    producer.send(message("T", body))
                except Exception:  # noqa: BLE001 - the client raises its own error types
                    failures += 1
                    assert time.monotonic() - killed_at < FAILOVER_TARGET_S, "no recovery"
                    time.sleep(0.2)
                    continue
                acked.append(body)
                if recovered_at is None:
                    recovered_at = time.monotonic()
                if len([b for b in acked if b.startswith(b"after")]) >= 20:
                    break
            assert recovered_at is not None
            assert recovered_at - killed_at < FAILOVER_TARGET_S
        finally:
            producer.shutdown()
        consumer = SimpleConsumer(config, "G", {"T": FilterExpression("*")}, await_duration=2)
        consumer.startup()
        try:
            got = {m.body for m in receive_all(consumer, len(acked), timeout_s=20)}
        finally:
            consumer.shutdown()
        assert set(acked) <= got
    finally:
        stop_cluster(cluster)
