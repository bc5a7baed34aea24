"""The offset audit and compaction (real PySpark local mode) on static topics: a logic queue
that went from group-a to group-b and back has a stretch group-a never held, which is no
gap; compaction keeps each group's latest record per key, in logic offsets as clients read
them, and the audit stays clean afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from rocketmq.grpc_protocol import definition_pb2 as v2

from capstan.spark.audit import audit, summary
from capstan.spark.compaction import compact
from capstan.v1 import admin_pb2 as pb
from tests.broker.test_pull_api import pull
from tests.broker.v2_requests import send_to_queue, v2_message
from tests.broker.v2_requests import stub as v2_stub
from tests.controller.test_admin_front import TwoGroups, start_two_groups

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoGroups]:
    c = start_two_groups(tmp_path_factory.mktemp("static-jobs"), {"group-a": 1, "group-b": 1})
    try:
        yield c
    finally:
        c.stop()


def there_and_back(cluster: TwoGroups, topic: pb.Topic, rounds: list[list[str]]) -> None:
    """A one-queue static topic on group-a, moved to group-b and back to group-a, with the
    keys of `rounds[i]` sent (value v<i>) while the queue was on its i-th group."""
    admin = cluster.admin()
    admin.CreateStaticTopic(pb.StaticTopicRequest(topic=topic, groups=["group-a"]), timeout=15)
    for i, (keys, group) in enumerate(zip(rounds, ("group-a", "group-b", "group-a"), strict=True)):
        if i:
            request = pb.RemapRequest(topic=topic.name, queue_id=0, group=group)
            admin.RemapStaticQueue(request, timeout=15)
        s = v2_stub(cluster.master(group).address)
        for key in keys:
            m = v2_message(topic.name, f"{key}=v{i}".encode(), keys=[key])
            reply, _ = send_to_queue(s, "0", m)
            assert reply.status.code == v2.OK, reply.status


def read_group(cluster: TwoGroups, group: str, topic: str) -> list[tuple[int, bytes]]:
    s = v2_stub(cluster.master(group).address)
    found, offset = [], 0
    while True:
        _, messages, next_offset = pull(s, topic, 0, offset, group="StaticJobs")
        found += [(m.system_properties.queue_offset, m.body) for m in messages]
        if next_offset is None or next_offset <= offset:  # the end (a compacted queue's
            return found  # reads may skip dropped offsets and return nothing)
        offset = next_offset


def test_the_audit_and_compaction_know_a_static_topics_logic_queues(
    cluster: TwoGroups, spark: SparkSession, tmp_path: Path
):
    cluster.admin().CreateGroup(pb.Group(name="StaticJobs"), timeout=10)
    plain = pb.Topic(name="Ledger", type=pb.NORMAL, write_queue_nums=1)
    there_and_back(cluster, plain, [["a", "b"], ["c", "d", "e"], ["f"]])
    # group-a holds logic offsets 0..1 and 5; group-b 2..4, which group-a never had.
    assert read_group(cluster, "group-a", "Ledger") == [(0, b"a=v0"), (1, b"b=v0"), (5, b"f=v2")]
    assert [o for o, _ in read_group(cluster, "group-b", "Ledger")] == [2, 3, 4]
    controller = cluster.controller.address
    report = audit(spark, controller=controller, topics=("Ledger",))
    assert report.ok, summary(report)
    assert report.records_checked == 6

    keyed = pb.Topic(
        name="Accounts",
        type=pb.NORMAL,
        write_queue_nums=1,
        attributes={"cleanup.policy": "COMPACT"},
    )
    there_and_back(cluster, keyed, [["k1", "k2", "k3"], ["k1", "k2"], ["k1", "k3"]])
    result = compact(spark, "Accounts", controller=controller, tombstone_retention_ms=0)
    assert result.ok, result.to_json()
    # Each group keeps its latest record per key: group-a's k1 and k3 of the third round
    # supersede its own first ones, its k2 stays; group-b's are all its latest.
    assert read_group(cluster, "group-a", "Accounts") == [
        (1, b"k2=v0"),
        (5, b"k1=v2"),
        (6, b"k3=v2"),
    ]
    assert read_group(cluster, "group-b", "Accounts") == [(3, b"k1=v1"), (4, b"k2=v1")]
    after = audit(spark, controller=controller, topics=("Accounts", "Ledger"))
    assert after.ok, summary(after)
