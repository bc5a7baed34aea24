"""The controller's view of a group, by pod name: master, epoch, in-sync set, lag."""

from __future__ import annotations

from capstan.operator.group_status import pod_of, report
from capstan.v1 import controller_pb2 as pb

PODS = {"g-0", "g-1", "g-2"}


def replica(i: int, alive: bool = True, offset: int = 100) -> pb.BrokerReplica:
    address = f"g-{i - 1}.g-brokers.ns.svc:8081"
    return pb.BrokerReplica(broker_id=i, address=address, alive=alive, max_offset=offset)


def test_pod_names_come_from_stable_dns_names_only() -> None:
    assert pod_of("g-1.g-brokers.ns.svc.cluster.local:8081", PODS) == "g-1"
    assert pod_of("g-1:8081", PODS) is None  # not a DNS name of the StatefulSet
    assert pod_of("other-0.x.ns.svc:8081", PODS) is None


def test_report_names_the_master_pod_the_set_and_each_lag() -> None:
    info = pb.ReplicaInfo(
        group="g",
        master_id=2,
        master_epoch=5,
        sync_state_set=[2, 3],
        replicas=[replica(1, alive=False, offset=40), replica(2), replica(3, offset=90)],
    )
    got = report(info, PODS)
    assert got.view.master == "g-1" and got.view.epoch == 5
    assert got.view.sync_state_set == {"g-1", "g-2"}
    assert got.view.alive == {"g-1", "g-2"}
    assert got.status["master"] == "g-1"
    assert got.status["syncStateSet"] == ["g-1", "g-2"]
    assert [(r["pod"], r["lagBytes"], r["alive"]) for r in got.status["replicas"]] == [
        ("g-0", 60, False),
        ("g-1", 0, True),
        ("g-2", 10, True),
    ]


def test_a_group_without_master() -> None:
    got = report(pb.ReplicaInfo(group="g", replicas=[replica(1)]), PODS)
    assert got.view.master is None and got.status["master"] == ""


def test_each_replicas_zone_is_shown_where_its_broker_reports_one() -> None:
    zoned = replica(2)
    zoned.zone = "zone-b"
    got = report(pb.ReplicaInfo(group="g", master_id=2, replicas=[replica(1), zoned]), PODS)
    assert [r.get("zone") for r in got.status["replicas"]] == [None, "zone-b"]
