"""Each broker tells the controller its zone (rack), from its `zone` setting or from the
file a BrokerGroup's operator fills from the node's topology label; `capstan cluster status`
shows it. A file that is missing, late or holds no label value is an unknown zone, never a
broker that cannot register; a controller refuses a zone that is no label value."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from capstan.v1 import controller_pb2 as cpb
from tests.broker.broker_process import BrokerProcess
from tests.broker.replication.test_controlled_group import (
    GROUP,
    cluster_cli,
    start_cluster,
    stop_cluster,
)
from tests.waiting import wait_until


def zones(cluster) -> dict[str, str | None]:
    done = cluster_cli(cluster, "status", "--json")
    assert done.returncode == 0, done.stderr
    (group,) = json.loads(done.stdout)["groups"]
    return {r["address"]: r["zone"] for r in group["replicas"]}


def test_each_broker_reports_its_zone_from_its_setting_or_its_zone_file(tmp_path: Path):
    zone_file = tmp_path / "rack" / "zone"
    cluster = start_cluster(tmp_path, each=[{"zone": "zone-a"}, {"zone_file": str(zone_file)}])
    try:
        a, b = cluster.brokers
        wait_until(lambda: cluster.settled(2), 20, "a master with its slave in sync")
        # No file yet (the operator has not filled it): registered, zone unknown.
        assert zones(cluster) == {a.address: "zone-a", b.address: None}
        zone_file.parent.mkdir()
        zone_file.write_text("zone-b\n")
        wait_until(lambda: zones(cluster)[b.address] == "zone-b", 10, "the zone from the file")
        human = cluster_cli(cluster, "status")
        assert "ZONE" in human.stdout and "zone-a" in human.stdout and "zone-b" in human.stdout
        # A file that holds no label value: reported once in the log, the zone unknown.
        zone_file.write_text("not a zone!\n")
        wait_until(lambda: zones(cluster)[b.address] is None, 10, "the bad zone dropped")
        assert cluster.settled(2)  # the broker kept its place all along
        log = b.log.read_text(errors="replace")
        assert log.count("no zone to report") == 1, log[-3000:]
        assert "is not a label value" in log
    finally:
        stop_cluster(cluster)


@pytest.mark.parametrize("zone", ["a" * 64, "-starts-with-a-dash", "has space", "ends.", "zone\n"])
def test_the_controller_refuses_a_zone_that_is_no_label_value(tmp_path: Path, zone: str):
    cluster = start_cluster(tmp_path, replicas=1)
    try:
        wait_until(lambda: cluster.settled(1), 20, "a master")
        with pytest.raises(grpc.RpcError) as refused:
            cluster.controller.stub().RegisterBroker(
                cpb.RegisterBrokerRequest(
                    group=GROUP, address="127.0.0.1:1", identity="hostile", zone=zone
                ),
                timeout=5,
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert len(cluster.info().replicas) == 1  # nothing registered
    finally:
        stop_cluster(cluster)


def test_a_broker_with_a_bad_zone_setting_does_not_start(tmp_path: Path):
    broker = BrokerProcess(tmp_path, zone="zone a")
    with pytest.raises(RuntimeError, match="zone 'zone a' is not a label value"):
        broker.start()
