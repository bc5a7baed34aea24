"""`spark.read.format("capstan")` with real PySpark in local mode against real brokers: every
record of a topic, once, in queue-offset order per queue, with its keys, tag, store time and
a body that matches its CRC; from each replica of a group with `replicas=all`; the plan of
partitions by `offsetsPerPartition`; bad options refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.spark.capstan_source import (
    CapstanReader,
    ReadOptions,
    Replica,
    plan_slices,
)
from tests.broker.broker_process import BrokerProcess
from tests.broker.v2_requests import send_to_queue, stub, v2_message
from tests.cli.test_broker_cli import capstan
from tests.cli.up_process import UpProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.spark


def test_slices_cover_each_queue_in_bounded_runs() -> None:
    replica = Replica("g", "b:1", True)
    slices = plan_slices(replica, "T", [(0, 0, 250), (1, 10, 10), (2, 5, 105)], 100)
    assert [(s.queue_id, s.start, s.end) for s in slices] == [
        (0, 0, 100),
        (0, 100, 200),
        (0, 200, 250),
        (2, 5, 105),
    ]
    with pytest.raises(ValueError, match="offsetsPerPartition"):
        plan_slices(replica, "T", [(0, 0, 1)], 0)


def test_bad_options_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="option topic is required"):
        ReadOptions.parse({"controller": "c:1"})
    with pytest.raises(ValueError, match="one of the options controller or brokers"):
        ReadOptions.parse({"topic": "T"})
    with pytest.raises(ValueError, match="replicas must be master or all"):
        ReadOptions.parse({"topic": "T", "brokers": "b:1", "replicas": "some"})
    with pytest.raises(ValueError, match="offsetsPerPartition must be a positive number"):
        ReadOptions.parse({"topic": "T", "brokers": "b:1", "offsetsPerPartition": "-3"})


@pytest.mark.slow
def test_every_record_of_a_topic_once_with_what_it_carries(
    spark: SparkSession, tmp_path: Path
) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        broker.create_topic("Orders", queues=4)
        s = stub(broker.address)
        sent = {}
        for i in range(600):
            m = v2_message("Orders", f"order-{i}".encode(), tag=f"t{i % 3}", keys=[f"k{i % 50}"])
            reply, _ = send_to_queue(s, str(i % 4), m)
            assert reply.status.code == pb.OK
            sent[f"order-{i}".encode()] = (i % 4, f"t{i % 3}", f"k{i % 50}")
        frame = (
            spark.read.format("capstan")
            .option("brokers", broker.address)
            .option("topic", "Orders")
            .option("offsetsPerPartition", "64")
            .load()
        )
        options = {"brokers": broker.address, "topic": "Orders", "offsetsPerPartition": "64"}
        planned = CapstanReader(ReadOptions.parse(options)).partitions()
        assert len(planned) == 4 * 3  # 150 offsets in each of 4 queues, 64 a slice
        rows = frame.collect()
        assert len(rows) == 600
        assert {bytes(r.body) for r in rows} == set(sent)
        for r in rows:
            assert (r.queue_id, r.tag, r.keys) == sent[bytes(r.body)]
            assert r.readable and r.crc_ok and r.topic == "Orders"
            assert r.store_time is not None and r.physical_offset >= 0
        for queue in range(4):
            offsets = sorted(r.queue_offset for r in rows if r.queue_id == queue)
            assert offsets == list(range(150))
        assert len({r.physical_offset for r in rows}) == 600
        # A topic without records plans no slice; Spark still runs a task, which reads none.
        broker.create_topic("Nothing", queues=2)
        empty = spark.read.format("capstan").option("brokers", broker.address)
        assert empty.option("topic", "Nothing").load().count() == 0
    finally:
        broker.stop()


@pytest.mark.slow
def test_every_replica_of_a_group_through_the_controller(
    spark: SparkSession, tmp_path: Path
) -> None:
    up = UpProcess(tmp_path / "up").start()
    try:
        assert capstan("topic", "create", "Orders", "--server", up.access_point).returncode == 0
        sent = capstan(
            "produce", "Orders", "--count", "200", "--body", "o", "--server", up.access_point
        )
        assert sent.returncode == 0, sent.stderr

        def read(replicas: str) -> list[Row]:
            return (
                spark.read.format("capstan")
                .option("controller", up.access_point)
                .option("topic", "Orders")
                .option("replicas", replicas)
                .load()
                .collect()
            )

        masters = read("master")
        assert len(masters) == 200 and all(r.master_replica for r in masters)
        # A slave acknowledges every write (the group's default), so it holds the same.
        wait_until(lambda: len(read("all")) == 400, 30, "both replicas' copies")
        copies: dict[tuple[int, int], set[tuple[str, int, bytes]]] = {}
        for r in read("all"):
            copies.setdefault((r.queue_id, r.queue_offset), set()).add(
                (r.replica, r.body_crc, bytes(r.body))
            )
        assert len(copies) == 200
        for held in copies.values():
            assert len({replica for replica, _, _ in held}) == 2
            assert len({(crc, body) for _, crc, body in held}) == 1  # the same record
    finally:
        assert up.stop() == 0
